"""text8 (Cooijmans et al. 2016, sec. 5.3).

The paper's setup: one LSTM layer of 2000 units on one-hot characters (27 symbols: a-z
and space), Adam (learning rate 1e-3), minibatches of 128, gradient clipping at 1.0,
orthogonal initialisation, non-overlapping training examples of 180 characters; first 90M
characters train, next 5M valid, last 5M test. The unzipped 100,000,000-character file is
read from `<data root>/text8`, or from `--config.data.path=/path/to/text8`.

Variants as in `ptb_char.py` (`--config.model.variant` or `text8.py:lstm`), with the same
initialisation choices: orthogonal W_h, forget bias 0 (the paper gives none), gamma 0.1 for
every variant (for `bn_input_only`: Cooijmans' gamma on Laurent's method).

Not from the paper: the step budget (the paper gives none; 50,000 steps is 12.8 epochs
of 3,906 steps) and the softmax initialiser (Flax's LeCun normal).
"""

from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import text

VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only')


def get_config(variant: str = 'bn_lstm'):
  if variant not in VARIANTS:
    raise ValueError(f'text8.py: variant must be one of {VARIANTS}; got {variant!r}.')
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
  return config
