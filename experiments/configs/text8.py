r"""text8 (Cooijmans et al. 2016, sec. 5.3).

  python experiments/main.py --config experiments/configs/text8.py:bn_lstm \
      --workdir runs/text8_bn_lstm

Hardware and time: sized for a GPU (2000 units, batch 128, 180 steps); not run here, and
its step time was not measured.
Expected: the paper's test bits per character (Table 3); this project has no run of it.
Tiny (the whole run in well under a minute on 2 CPU cores: an 8-unit model on 20-character
rows, four steps, a validation on two batches and the test on the last 5M characters; a
smoke test, not a result):

  python experiments/main.py --config experiments/configs/text8.py:bn_lstm,tiny \
      --workdir /tmp/text8_tiny

Data: the unzipped text8 file under the data root (`<root>/text8`; the root is
`--config.data.root=/path/to/datasets` or `$BN_RNN_JAX_DATA`), or
`--config.data.path=/path/to/text8`. `tests/test_tiny_presets.py` runs the tiny preset
on a small text8-like file (`--config.data.text8_split_sizes` sets its three parts).

The paper's setup: one LSTM layer of 2000 units on one-hot characters (27 symbols: a-z
and space), Adam (learning rate 1e-3), minibatches of 128, gradient clipping at 1.0,
orthogonal initialisation, non-overlapping training examples of 180 characters; first 90M
characters train, next 5M valid, last 5M test. The unzipped 100,000,000-character file is
read from `<data root>/text8`, or from `--config.data.path=/path/to/text8`.

The argument is `[variant][,tiny]`. Variants as in `ptb_char.py` (`text8.py:lstm`, or
`--config.model.variant`), with the same initialisation choices: orthogonal W_h, forget
bias 0 (the paper gives none), gamma 0.1 for every variant (for `bn_input_only`:
Cooijmans' gamma on Laurent's method).

Not from the paper: the step budget (the paper gives none; 50,000 steps is 12.8 epochs
of 3,906 steps) and the softmax initialiser (Flax's LeCun normal).
"""

from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib

VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only')


def get_config(arg: str = ''):
  variant, presets = config_lib.parse_arg(arg, 'text8.py', VARIANTS)
  variant = variant or 'bn_lstm'
  config = config_lib.default_config()
  config.data = text.default_data_config('text8')      # <data root>/text8, T = 180

  config.model.variant = variant
  config.model.hidden_size = 2000
  config.model.num_layers = 1
  config.model.embed_size = None
  config.model.dropout_rate = 0.0
  config.model.recurrent_init = 'orthogonal'  # the paper: all weight matrices orthogonal
  config.model.forget_bias = 0.0     # the paper gives none (the authors' code: 1)
  config.model.max_length = 180
  # 0.1 for every variant: Cooijmans' choice (sec. 4). For bn_input_only it is Cooijmans'
  # initialisation applied to Laurent's method (Laurent et al. used standard BN, gamma 1).
  config.model.gamma_init = 0.1

  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = 1e-3
  config.optimizer.clip_norm = 1.0
  config.optimizer.schedule = 'constant'

  config.train.batch_size = 128
  config.train.num_steps = 50_000
  config.train.log_every = 100
  config.eval.every = 2000
  config.eval.batch_size = 128             # 218 batches cover the 5M validation characters
  config.eval.splits = ('valid',)
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = 50
  config.checkpoint.every = 2000
  config.checkpoint.best_metric = 'valid/bpc'
  config.checkpoint.best_mode = 'min'
  config.variants = VARIANTS
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    config.data.seq_length = config.model.max_length = 20
    config.train.batch_size = 16
    config.eval.batch_size = 4096   # rows of 20: 62 batches cover the 5M test characters
  return config
