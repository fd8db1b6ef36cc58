r"""Laurent et al. 2016, sec. 5.1: frame classification on WSJ with a deep bidirectional LSTM.

  python experiments/main.py --config experiments/configs/laurent_speech.py:bn_input_only_seq \
      --workdir runs/wsj_bn \
      --config.data.root=/path/to/kaldi/egs/wsj/s5 \
      --config.data.train_feats=data/train_si284/feats.scp \
      --config.data.train_labels=ali_si284.txt \
      --config.data.valid_feats=data/test_dev93/feats.scp \
      --config.data.valid_labels=ali_dev93.txt \
      --config.eval.test_at_end=False   # no test split: the paper reports dev93 only

Hardware and time: sized for a GPU (5 x 250 bidirectional units, utterances of up to
1,300 frames, 150,000 steps); WSJ (LDC) is not available here, so this config has not been
run on it. `brown_tagger.py` is the same experiment transposed to Brown POS tagging, run
on 2 CPU cores.
Expected: the paper's Table 1 (best FCE / FER): BL train 0.95 / 0.28, dev 1.11 / 0.33; BN
train 0.73 / 0.22, dev 1.19 / 0.34.
Tiny (the whole run in well under a minute on 2 CPU cores on small features: 2 x 8 units,
four steps, one length bucket, evaluations of two batches; a smoke test, not a result;
`tests/test_tiny_presets.py` runs it on Kaldi files it writes):

  python experiments/main.py --config experiments/configs/laurent_speech.py:tiny \
      --workdir /tmp/wsj_tiny --config.data.root=... (the data flags above)

Paper setup: WSJ si284 for training, dev93 for evaluation; 40 log mel filter banks plus
energy, with deltas and delta-deltas (123 dims); per-frame labels from Kaldi's tri4b forced
alignments (3,546 clustered triphone states); training utterances longer than 1,300
frames removed (4.6 %, leaving 35,746). Model: 5 bidirectional LSTM layers of 250 units,
a 3,546-way softmax at every frame; "All the weights were initialized using the Glorot
scheme and all the biases were set to zero"; SGD, momentum 0.9, fixed learning rate 1e-4,
batch 24. BN: sequence-wise normalisation (eq. 20-21) of each LSTM's input term W_x x.

The features and alignments come from Kaldi (e.g. its egs/wsj/s5 recipe after tri4b;
`ali-to-pdf exp/tri4b_ali_si284/final.mdl "ark:gunzip -c exp/tri4b_ali_si284/ali.*.gz|"
ark,t:ali_si284.txt`, and the same for dev93).

The paths are relative to the data root; the arks that a feats.scp names are read as
Kaldi's tools read them (Kaldi's own scripts write absolute paths there).

Features must already hold the deltas (e.g. `add-deltas scp:feats.scp ark,scp:d.ark,d.scp`);
they are mean/variance normalised per dimension with training-set statistics.

The argument is `[variant][,tiny]`. Variants (`laurent_speech.py:lstm`, or
`--config.model.variant`):
  lstm               BL, the baseline
  bn_input_only_seq  BN, sequence-wise statistics over batch and time (the paper's)
  bn_input_only      frame-wise statistics per step over the batch: the ablation that
                     shows why frame-wise statistics fail on padded batches (sec. 4.1)

Choices the paper leaves open, made here: the BN gamma starts at 1.0 and beta (the LSTM
bias) at 0 (standard BN; the paper predates Cooijmans' gamma = 0.1); Glorot uniform
for W_x, W_h (over the whole `[H, 4H]` kernel) and the softmax; no gradient clipping; the
loss is the mean FCE over the batch's valid frames; validation uses the papers' population
estimate (moments averaged over 10 training batches) and early stopping on validation FCE;
length buckets of 100 frames so that few programs compile.
"""

from bn_rnn_jax.input_pipeline import tagging
from bn_rnn_jax.training import config as config_lib

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')


def get_config(arg: str = ''):
  variant, presets = config_lib.parse_arg(arg, 'laurent_speech.py', VARIANTS)
  config = config_lib.default_config()
  config.data = tagging.default_data_config('kaldi')

  m = config.model
  m.variant = variant or 'bn_input_only_seq'
  m.hidden_size = 250
  m.num_layers = 5
  m.bidirectional = True
  m.gamma_init = 1.0
  m.kernel_init = 'glorot_uniform'
  m.recurrent_init = 'glorot_uniform'
  m.input_init = 'glorot_uniform'
  m.forget_bias = 0.0            # "all the biases were set to zero"
  m.min_row_support = 0.0        # the papers' rule: each step its own population row

  o = config.optimizer
  o.name = 'sgd'
  o.learning_rate = 1e-4
  o.momentum = 0.9
  o.clip_norm = None

  config.train.batch_size = 24
  config.train.num_steps = 150_000   # ~100 epochs of 35,746 utterances / 24
  config.train.log_every = 100
  config.eval.every = 1500           # ~one epoch
  config.eval.batch_size = 24
  config.eval.splits = ('train_eval', 'valid')   # a fixed training subset
  config.eval.population_batches = 10
  config.checkpoint.every = 1500
  config.checkpoint.best_metric = 'valid/fce'
  config.checkpoint.best_mode = 'min'
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    m.num_layers = 2
    config.data.buckets = (config.data.max_frames,)   # one length: one program of each kind
    config.train.batch_size = config.eval.batch_size = 4
  return config
