"""Quickstart: LSTM vs BN-LSTM on real data, offline, in about a minute on 2 CPU cores.

Default data: scikit-learn's bundled 8x8 digits as 64-step pixel sequences (no download).
The BN-LSTM's head start shows early in training (the first few hundred steps); both
models end up close on this small task. `--config.data.name=mnist` (with
`--config.data.resolution=14`, the default here) switches to sequential MNIST at 14x14
(196 steps) from the IDX files in `config.data.mnist_dir` or from tfds
(`--config.data.source=tfds`), where the gap is large (experiments/results/init_options.json,
the 'ours' rows; `python experiments/report.py seq_mnist14`).

Same hyperparameters as `seq_mnist.py` (Cooijmans et al. sec. 5.1) but a smaller batch
and a short budget. `experiments/quickstart.py` trains `variants` one after the other.
"""

from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import mnist


def get_config():
  config = config_lib.default_config()
  config.data = mnist.default_data_config('digits')
  config.data.resolution = 14       # used when data.name = 'mnist'
  config.data.num_valid = 5000

  config.model.variant = 'bn_lstm'
  config.model.hidden_size = 100
  config.model.recurrent_init = 'identity'   # as seq_mnist.py: all four gate blocks
  config.model.forget_bias = 0.0             # as seq_mnist.py (the authors' code: 1)
  config.model.initial_state = 'noise'
  config.model.gamma_init = 0.1

  config.optimizer.name = 'rmsprop'
  config.optimizer.learning_rate = 1e-3
  config.optimizer.momentum = 0.9
  config.optimizer.clip_norm = 1.0

  config.train.batch_size = 64
  config.train.num_steps = 300
  config.train.log_every = 25
  config.eval.every = 25
  config.eval.batch_size = 250
  config.eval.max_batches = 4       # <= 1000 validation examples per evaluation
  config.eval.population_batches = 8
  config.eval.test_at_end = False
  config.checkpoint.every = 300
  config.checkpoint.keep = 1

  # experiments/quickstart.py trains these in turn with the same budget.
  config.variants = ('lstm', 'bn_lstm')
  return config
