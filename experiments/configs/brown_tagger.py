"""Laurent et al.'s speech experiment (sec. 5.1) transposed to Brown POS tagging.

WSJ cannot be had here; Brown part-of-speech tagging is a real variable-length labelling
task that is (`brown/` under the data root, split and tag set in
`bn_rnn_jax/input_pipeline/tagging.py`: 47,582 / 4,970 / 4,744 sentences, 104 base tags).
Tokens go through an embedding and play the part of frames. The architecture is the
paper's (a stack of bidirectional LSTMs, a softmax at every step, BN on each LSTM's input
term with sequence-wise statistics), at a size this 2-core CPU trains in a few minutes.

  python experiments/main.py --config experiments/configs/brown_tagger.py \
      --workdir /tmp/brown_bn --config.model.variant=bn_input_only_seq

`experiments/brown_tagger_runs.py` trains the three variants with the same budget and
writes the table and figure of the README.

Variants: 'lstm' (BL), 'bn_input_only_seq' (BN, sequence-wise), 'bn_input_only'
(frame-wise statistics, the ablation).

The paper's values kept: bidirectional LSTM stack, Glorot weights, zero biases, SGD with
momentum 0.9, no clipping, BN only on W_x x, evaluation with population statistics, early
stopping on validation FCE. Values that are ours (commented below) scale it to this CPU.
"""

from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import tagging

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')


def get_config():
  config = config_lib.default_config()
  config.data = tagging.default_data_config('brown')   # <data root>/brown

  m = config.model
  m.variant = 'bn_input_only_seq'
  m.embed_size = 64              # ours: the token embedding stands in for the 123-dim frames
  m.hidden_size = 64             # ours (paper 250): a size this CPU trains in minutes
  m.num_layers = 2               # ours (paper 5)
  m.bidirectional = True
  m.gamma_init = 1.0             # standard BN init (as laurent_speech.py)
  m.kernel_init = 'glorot_uniform'
  m.recurrent_init = 'glorot_uniform'
  m.input_init = 'glorot_uniform'
  m.forget_bias = 0.0

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
  config.checkpoint.every = 150
  config.checkpoint.best_metric = 'valid/fce'
  config.checkpoint.best_mode = 'min'
  return config
