r"""Laurent et al.'s speech experiment (sec. 5.1) transposed to Brown POS tagging.

  python experiments/main.py --config experiments/configs/brown_tagger.py:bn_input_only_seq \
      --workdir runs/brown_bn
  python -m experiments.campaign run brown_tagger --parallel=2   # all three variants

Hardware and time: 2 CPU cores, 15-18 minutes a run (the `brown_tagger` campaign: the
three runs' clocks sum to 50 minutes, about 25 minutes two at a time).
Expected: validation frame error rate 0.097 (BN, sequence-wise), 0.128 (frame-wise BN),
0.187 (BL); only sequence-wise BN beats the most-frequent-tag baseline, 0.108
(experiments/results/brown_tagger.json; `python -m experiments.campaign report
brown_tagger`).
Tiny (the whole run in well under a minute on 2 CPU cores: 8 units, four steps, one
sentence-length bucket, evaluations of two batches and the test on every test sentence;
a smoke test, not a result):

  python experiments/main.py --config experiments/configs/brown_tagger.py:tiny \
      --workdir /tmp/brown_tagger_tiny

Data: the Brown corpus files under the data root (`<root>/brown/ca01 ... cr09`; the root
is `--config.data.root=/path/to/datasets` or `$BN_RNN_JAX_DATA`).

WSJ cannot be had here; Brown part-of-speech tagging is a real variable-length labelling
task that is (split and tag set in `bn_rnn_jax/input_pipeline/tagging.py`: 47,582 / 4,970
/ 4,744 sentences, 104 base tags). Tokens go through an embedding and play the part of
frames. The architecture is the paper's (a stack of bidirectional LSTMs, a softmax at
every step, BN on each LSTM's input term with sequence-wise statistics), at a size a
2-core CPU trains in minutes.

The argument is `[variant][,tiny]`. Variants (`brown_tagger.py:lstm`, or
`--config.model.variant`): 'lstm' (BL), 'bn_input_only_seq' (BN, sequence-wise; the
default), 'bn_input_only' (frame-wise statistics, the ablation).

The paper's values kept: bidirectional LSTM stack, Glorot weights, zero biases, SGD with
momentum 0.9, no clipping, BN only on W_x x, evaluation with population statistics, early
stopping on validation FCE. Values that are ours (commented below) scale it to this CPU.
"""

from bn_rnn_jax.input_pipeline import tagging
from bn_rnn_jax.training import config as config_lib

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')


def get_config(arg: str = ''):
  variant, presets = config_lib.parse_arg(arg, 'brown_tagger.py', VARIANTS)
  config = config_lib.default_config()
  config.data = tagging.default_data_config('brown')   # <data root>/brown

  m = config.model
  m.variant = variant or 'bn_input_only_seq'
  m.embed_size = 64              # ours: the token embedding stands in for the 123-dim frames
  m.hidden_size = 64             # ours (paper 250): a size this CPU trains in minutes
  m.num_layers = 2               # ours (paper 5)
  m.bidirectional = True
  m.gamma_init = 1.0             # standard BN init (as laurent_speech.py)
  m.kernel_init = 'glorot_uniform'
  m.recurrent_init = 'glorot_uniform'
  m.input_init = 'glorot_uniform'
  m.forget_bias = 0.0
  m.min_row_support = 0.0         # the papers' rule: each step its own population row

  o = config.optimizer
  o.name = 'sgd'
  o.learning_rate = 0.1          # ours (paper 1e-4): the budget is a few thousand steps
  o.momentum = 0.9
  o.clip_norm = None

  config.train.batch_size = 32   # ours (paper 24): divides over 8 devices in the tests
  config.train.num_steps = 1500  # ours: the same budget for every variant (~1 epoch)
  config.train.log_every = 50
  config.eval.every = 150
  config.eval.batch_size = 256
  config.eval.splits = ('train_eval', 'valid')   # 2,000 fixed training sentences
  config.eval.population_batches = 10
  if m.variant == 'bn_input_only_seq':
    # Also <metric>_batch: the default path against batch statistics. Frame-wise
    # statistics keep one row per training step (90), fewer than the longest validation
    # sentence has, so that variant is evaluated with population statistics only.
    config.eval.compare = ('batch',)
  config.checkpoint.every = 150
  config.checkpoint.best_metric = 'valid/fce'
  config.checkpoint.best_mode = 'min'
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    m.embed_size = 8
    config.data.buckets = (200,)   # one length: one program of each kind
  return config
