"""Character-level Penn Treebank (Cooijmans et al. 2016, sec. 5.2).

The paper's setup: one LSTM layer of 1000 units on one-hot characters, a softmax over
the 50 symbols, Adam (learning rate 2e-3), minibatches of 64, gradient clipping at 1.0
(global norm), orthogonal initialisation of W_x and W_h, training examples of 100
characters cut from the training stream at a random crop offset every epoch (see
`bn_rnn_jax/input_pipeline/text.py` for the exact symbol table: 50 symbols, spaces as
'_', line ends as '\\n', 5,017,482 training characters). Validation bits per character
use population statistics (the papers' estimate by default; `--config.eval.population_stats=running`
for the running average); the best checkpoint is chosen on validation bpc (the paper
early-stops on it).

Variants (`--config.model.variant`, or the config argument `ptb_char.py:lstm`):
  lstm           the baseline
  bn_lstm        Cooijmans et al.: BN on W_h h, W_x x and c_t, per-step statistics, gamma 0.1
  bn_input_only  Laurent et al.: BN on W_x x only, frame-wise (per-step) statistics

Initialisation: W_x and W_h orthogonal per gate block (the paper: "orthogonal
initialization for all weight matrices"); forget-gate bias 0 (the paper gives none; the
authors' code used 1, `--config.model.forget_bias=1.0`); gamma 0.1 for every variant, so
`bn_input_only` here is Laurent et al.'s method with Cooijmans' gamma (Laurent et al. used
standard batch norm, gamma 1).

Not from the paper: the step budget (the paper early-stops and gives none; 20,000 steps
is ~25.5 epochs of 783 steps) and the softmax layer's initialiser (Flax's LeCun normal;
the paper says "orthogonal initialization for all weight matrices").
"""

from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import text

VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only')


def get_config(variant: str = 'bn_lstm'):
  if variant not in VARIANTS:
    raise ValueError(f'ptb_char.py: variant must be one of {VARIANTS}; got {variant!r}.')
  config = config_lib.default_config()
  config.data = text.default_data_config('ptb_char')   # <data root>/ptb, T = 100

  config.model.variant = variant
  config.model.hidden_size = 1000
  config.model.num_layers = 1
  config.model.embed_size = None           # one-hot characters
  config.model.dropout_rate = 0.0
  config.model.recurrent_init = 'orthogonal'  # the paper: all weight matrices orthogonal
  config.model.forget_bias = 0.0     # the paper gives none (the authors' code: 1)
  config.model.max_length = 100            # T_max; longer evaluations reuse row 99
  # 0.1 for every variant: Cooijmans' choice (sec. 4). For bn_input_only it is Cooijmans'
  # initialisation applied to Laurent's method (Laurent et al. used standard BN, gamma 1).
  config.model.gamma_init = 0.1

  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = 2e-3
  config.optimizer.clip_norm = 1.0
  config.optimizer.schedule = 'constant'

  config.train.batch_size = 64
  config.train.num_steps = 20_000
  config.train.log_every = 100
  config.eval.every = 1000
  config.eval.batch_size = 64              # 62 batches of 64 x 100 cover the 393,041 predictions
  config.eval.splits = ('valid',)
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = 50
  config.checkpoint.every = 1000
  config.checkpoint.best_metric = 'valid/bpc'
  config.checkpoint.best_mode = 'min'
  config.variants = VARIANTS
  return config
