r"""Character-level Penn Treebank (Cooijmans et al. 2016, sec. 5.2).

  python experiments/main.py --config experiments/configs/ptb_char.py:bn_lstm \
      --workdir runs/ptb_char_bn_lstm
  python -m experiments.campaign run ptb_char_256 --parallel=2   # this project's runs

Hardware and time: sized for a GPU. On 2 CPU cores a training step of the 1000-unit
BN-LSTM takes 1.4 s, the LSTM's 1.2 s, with XLA on both cores: 2.7 and 2.4 s of CPU time
(experiments/results/ptb_char_1000_speed.json). Two runs side by side, one core each
(the `ptb_char_1000` campaign), take about that CPU time a step: 20,000 steps are about
14 hours of steps, plus a validation every 500 steps. On one H200 both arms side by side
take minutes, not hours (experiments/results/h200/ptb_char_1000.json).
Expected: the paper's test bpc, 1.32 (BN-LSTM) and 1.38 (LSTM), Table 2. What this config
gives at 1000 units (`ptb_char_1000`) and at 256 units for 400 steps (`ptb_char_256`):
docs/experiments/language_modelling.md, from experiments/results/ptb_char_1000.json and
ptb_char_256.json (`python -m experiments.campaign report ptb_char_1000`).
Tiny (the whole run in well under a minute on 2 CPU cores: an 8-unit model on 20-character
rows, four steps, a validation on two batches and the test on the whole test text; a
smoke test, not a result):

  python experiments/main.py --config experiments/configs/ptb_char.py:bn_lstm,tiny \
      --workdir /tmp/ptb_char_tiny

Data: Mikolov's PTB files under the data root (`<root>/ptb/ptb.{train,valid,test}.txt`;
the root is `--config.data.root=/path/to/datasets` or `$BN_RNN_JAX_DATA`).

The paper's setup: one LSTM layer of 1000 units on one-hot characters, a softmax over
the 50 symbols, Adam (learning rate 2e-3), minibatches of 64, gradient clipping at 1.0
(global norm), orthogonal initialisation of W_x and W_h, training examples of 100
characters cut from the training stream at a random crop offset every epoch (see
`bn_rnn_jax/input_pipeline/text.py` for the exact symbol table: 50 symbols, spaces as
'_', line ends as '\\n', 5,017,482 training characters). Validation bits per character
use population statistics (the papers' estimate by default; `--config.eval.population_stats=running`
for the running average); the best checkpoint is chosen on validation bpc (the paper
early-stops on it).

The argument is `[variant][,tiny]`. Variants (`ptb_char.py:lstm`, or
`--config.model.variant`):
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

from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib

VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only')


def get_config(arg: str = ''):
  variant, presets = config_lib.parse_arg(arg, 'ptb_char.py', VARIANTS)
  variant = variant or 'bn_lstm'
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
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    config.data.seq_length = config.model.max_length = 20
    config.train.batch_size = 16
    config.eval.batch_size = 1024   # rows of 20: 22 batches cover the test text
  return config
