r"""Sequential MNIST (Cooijmans et al. 2016, sec. 5.1): pixels in scan-line order.

  python experiments/main.py --config experiments/configs/seq_mnist.py \
      --workdir runs/seq_mnist_bn_lstm --config.model.variant=bn_lstm
  experiments/seq_mnist_long_run.sh runs/seq_mnist 3600   # in launches of an hour each

Hardware and time: sized for a GPU. On 2 CPU cores a training step of the BN-LSTM (batch
100, 784 steps) takes about 0.5 s (benchmarks/results/trainer_overhead_cpu.json), so
the 50,000 steps are about 7 hours of steps, plus a validation on 5,000 images every
1,000 steps; `experiments/seq_mnist_long_run.sh` trains in launches of a fixed wall-clock
budget, each resuming the last.
Expected: the paper's test accuracy, 99.0 % (BN-LSTM) and 98.9 % (LSTM), Table 1; not
run to the end here. The first 10k steps of both models, where Fig. 2's claim is decided:
the `mnist_fig2` campaign (about 2.5 h on 2 CPU cores, or minutes on a GPU;
experiments/results/mnist_fig2.json, `python -m experiments.campaign report mnist_fig2`,
quoted in docs/experiments/sequential_mnist.md). At 14x14 pixels and 600 steps, on 2 CPU
cores, the `init_options` campaign (experiments/results/init_options.json; `python -m
experiments.campaign report init_options`).
Tiny (the whole run in well under a minute on 2 CPU cores: an 8-unit model, four steps,
a validation on two batches and the test on all 10,000 images; a smoke test, not a
result):

  python experiments/main.py --config experiments/configs/seq_mnist.py:tiny \
      --workdir /tmp/seq_mnist_tiny

Data: the four MNIST IDX files under the data root (`<root>/mnist`; the root is
`--config.data.root=/path/to/datasets` or `$BN_RNN_JAX_DATA`).

Paper setup: one LSTM layer of 100 units, softmax on the last hidden state; orthogonal
initialisation except the identity hidden-to-hidden matrix; RMSProp, learning rate 1e-3;
gradient clipping at 1.0; batch 100 (their Table 3 grid: 32-128); BN gamma initialised
to 0.1; Gaussian noise (std 0.1) on the initial hidden state in training (the first rows
of MNIST are black, so without it the recurrent term's batch variance is exactly zero);
validation = 5,000 held-out training images; evaluation with population statistics,
estimated from 1,000-example batches (see below), and with batch statistics beside them
(`eval.compare`: the curves the authors plotted were made with batch statistics).

Choices the paper leaves open, taken from the authors' released code:
* RMSProp decay 0.9 and no momentum. The paper's "momentum 0.9" (and its Table 3 grid
  "RMSProp momentum: 0.5, 0.9") is the decay rate of the RMSProp rule of their code (its
  separate momentum rule is commented out): `optimizer.decay=0.9`,
  `optimizer.momentum=0.0`.
* W_h is the identity on the candidate block only, the f, i, o blocks orthogonal
  (`recurrent_init='identity_candidate'`), and the forget-gate bias starts at 1
  (`forget_bias=1.0`), for the LSTM and the BN-LSTM alike. On 14x14 MNIST this was the
  BN-LSTM's best of four combinations (the `init_options` campaign, its 'authors' row;
  `python -m experiments.campaign report init_options`).

`config.model.variant`: 'lstm', 'bn_lstm', 'ln_lstm', 'bn_input_only' (or any name in
`bn_rnn_jax.variants.VARIANTS`). The paper trains for far longer than a CPU allows
(their curves run to 100k steps on a GPU); `num_steps` here is a GPU-sized budget. The
`mnist_fig2` and `pmnist_fig2` campaigns train both models to the steps where Fig. 2's
claim is decided.
"""

from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import config as config_lib


def get_config(arg: str = ''):
  _, presets = config_lib.parse_arg(arg, 'seq_mnist.py')
  config = config_lib.default_config()
  config.data = mnist.default_data_config('mnist')
  config.data.resolution = 28         # 784 steps of 1 pixel
  config.data.num_valid = 5000

  m = config.model
  m.variant = 'bn_lstm'
  m.hidden_size = 100
  m.num_layers = 1
  m.recurrent_init = 'identity_candidate'   # the authors' code (see the docstring)
  m.forget_bias = 1.0                       # the authors' code; the paper gives none
  m.initial_state = 'noise'
  m.initial_state_noise = 0.1
  # gamma 0.1 (Cooijmans sec. 4) for the BN sites; it also sets ln_lstm's gains unless
  # overridden with --config.model.gamma_init=1.0.
  m.gamma_init = 0.1

  o = config.optimizer
  o.name = 'rmsprop'
  o.learning_rate = 1e-3
  o.momentum = 0.0                  # the authors' code: RMSProp alone (docstring)
  o.decay = 0.9
  o.clip_norm = 1.0

  config.train.batch_size = 100
  config.train.num_steps = 50_000
  config.train.log_every = 100
  config.eval.every = 1000
  config.eval.batch_size = 1000
  config.eval.population_stats = 'estimate'
  config.eval.compare = ('batch',)   # also accuracy_batch: batch statistics, no noise
  # The papers' estimate from training-size batches trails batch statistics early in
  # training on this task (0.19 vs 0.32 valid accuracy after 300 steps); two batches of
  # 1,000 match the population-mode network (0.31): see
  # `python -m experiments.analysis.estimate_batch_size` and the README.
  config.eval.population_batches = 2
  config.eval.population_batch_size = 1000
  config.eval.test_at_end = True
  config.checkpoint.every = 1000
  config.checkpoint.keep = 2
  config.checkpoint.best_metric = 'valid/accuracy'
  config.checkpoint.best_mode = 'max'
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    config.train.batch_size = 16
    config.eval.batch_size = 500     # the test at the end reads all 10,000 images
  return config
