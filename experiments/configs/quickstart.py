r"""Quickstart: LSTM vs BN-LSTM on real data, offline, a run in under a minute on a CPU.

  python experiments/main.py --config experiments/configs/quickstart.py \
      --workdir /tmp/quickstart_bn_lstm        # one run: the BN-LSTM, 300 steps
  python experiments/quickstart.py     # both variants, five seeds (experiments/quickstart.py)

Hardware and time: 2 CPU cores. Both variants over five seeds (`experiments/quickstart.py`,
the `quickstart` campaign) take about 3.5 minutes there, a run 19-39 s of training
(experiments/results/quickstart.json).
Expected: in every seed the BN-LSTM is ahead of the LSTM in validation accuracy at step
75 (+0.11 to +0.20 on the 250 validation digits, where one gap has a binomial standard
error of about 0.04), and at the end by less (+0.02 to +0.06); `python -m
experiments.campaign report quickstart` prints the table from
experiments/results/quickstart.json.
Tiny (the whole run in well under a minute on 2 CPU cores: an 8-unit model, four steps,
an evaluation of two batches; a smoke test, not a result):

  python experiments/main.py --config experiments/configs/quickstart.py:tiny \
      --workdir /tmp/quickstart_tiny

Default data: scikit-learn's bundled 8x8 digits as 64-step pixel sequences (no download,
no data root). The BN-LSTM's head start shows early in training (the first few hundred
steps); both models end up close on this small task. `--config.data.name=mnist` (with
`--config.data.resolution=14`, the default here) switches to sequential MNIST at 14x14
(196 steps) from the IDX files under the data root (`<root>/mnist`) or from tfds
(`--config.data.source=tfds`), where the gap is large (the `init_options` campaign,
its 'ours' rows: `python -m experiments.campaign report init_options`).

Same hyperparameters as `seq_mnist.py` (Cooijmans et al. sec. 5.1) but a smaller batch
and a short budget. `experiments/quickstart.py` trains `variants` one after the other.
"""

from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import config as config_lib


def get_config(arg: str = ''):
  _, presets = config_lib.parse_arg(arg, 'quickstart.py')
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
  config.eval.max_batches = 4       # all 250 validation digits (1,000 images on MNIST)
  config.eval.population_batches = 8
  config.eval.compare = ('batch',)  # also accuracy_batch: the default path against it
  config.eval.test_at_end = False
  config.checkpoint.every = 300
  config.checkpoint.keep = 1

  # experiments/quickstart.py trains these in turn with the same budget.
  config.variants = ('lstm', 'bn_lstm')
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
  return config
