r"""Attentive Reader (Cooijmans et al. 2016 sec. 5.4, App. C; Hermann et al. 2015).

  python experiments/main.py --config experiments/configs/attentive_reader.py:bn_e_star \
      --workdir runs/ar_bn_e_star --config.data.path=cnn.tgz   # under the data root
  # the reduced CPU preset of this project's runs on brown_cloze_large:
  python experiments/main.py --config experiments/configs/attentive_reader.py:lstm,cpu \
      --workdir runs/ar_lstm_cpu
  # all six variants, two seeds, and the table / figure:
  python experiments/attentive_reader_runs.py && \
      python experiments/attentive_reader_runs.py --report

The argument is `variant[,cpu]`; variants (`config.model.variant`, `models.READER_VARIANTS`):
  lstm                the baseline
  bn_lstm             LSTMs replaced by BN-LSTMs, per-step statistics biased by the zero
                      padding as in the paper (`RecurrentLayer.padded_statistics`)
  bn_everywhere       bn_lstm + batch norm on W_ym y_d, W_um u, W_rg r, W_ug u
  bn_e_star           BN-everywhere with sequence-wise masked statistics for the input terms
                      and per-step masked ones for the recurrent terms and the cell
  bn_e_star_star      bn_e_star, bidirectional (only each document's valid part reversed)
  lstm_bidirectional  Hermann et al.'s bidirectional baseline (Table 4)

The paper's setup (App. C and its arXiv version): 240 hidden units, Adam, learning rate
8e-5 for lstm / bn_lstm / bn_everywhere and 8e-4 with minibatches of 40 for BN-e* and
BN-e** (64 otherwise), gradient clipping at 10, examples sampled with replacement with the
entity ids shuffled per example, a vocabulary of 65,829 words, the 4 most relevant
sentences of each CNN story; 120 units for BN-e** on the full CNN task (Table 4). Ours
(the paper gives none): embedding width = hidden units, the step budget, the evaluation
schedule, population statistics by the papers' estimate from 20 training batches, the
initialisers (orthogonal W_x, W_h; Flax's defaults for the embedding and dense layers),
gamma 0.1 also for the attention's batch norms, and the data defaults below.

The `cpu` preset (ours, for the 2-core CPU VM; README "Attentive Reader"): 64 hidden
units, 10,000-symbol vocabulary, batches drawn within 8 document-length groups, 3,000
steps, validation every 250 steps on all 3,174 questions (population statistics
estimated from 5 training batches), the paper's learning rates and batch sizes.
"""

from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import reading

# The names of `models.READER_VARIANTS` (a config loads without the model code).
VARIANTS = ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star', 'bn_e_star_star',
            'lstm_bidirectional')
FAST_VARIANTS = ('bn_e_star', 'bn_e_star_star')   # batch 40, learning rate 8e-4 (App. C)


def get_config(arg: str = 'bn_e_star'):
  variant, *preset = arg.split(',')
  if variant not in VARIANTS:
    raise ValueError(f'attentive_reader.py: variant must be one of {VARIANTS}; '
                     f'got {variant!r}.')
  if preset not in ([], ['cpu']):
    raise ValueError(f"attentive_reader.py: the only preset is 'cpu'; got {preset}.")
  config = config_lib.default_config()
  config.data = reading.default_data_config('brown_cloze_large')
  config.data.vocab_size = 65_829 + 3 + 32  # App. C's words (+ ours: specials, entities)
  config.data.top_k_sentences = 0           # ours: 4 on CNN (App. C); Brown has 4 already
  config.data.length_multiple = 32          # ours: pad T and Q to a multiple of 32

  config.model.variant = variant
  config.model.hidden_size = 240            # App. C
  config.model.embed_size = None            # ours: embedding width = hidden units
  config.model.num_layers = 1               # ours (the paper does not say; Hermann: 1)
  config.model.dropout_rate = 0.0           # ours
  config.model.max_length = None            # T_max = the longest training document
  config.model.gamma_init = 0.1             # Cooijmans sec. 4
  config.model.recurrent_init = 'orthogonal'
  # Ours: a per-step masked statistic over fewer than 8 valid sequences (the tail of the
  # longest queries and documents in a batch) is replaced by the population row of that
  # step. Without it BN-e* and BN-e** stopped on non-finite gradients: a question drawn
  # twice left two identical rows at late query steps, zero variance there, and the
  # gradient grew about 32x per such step (RecurrentLayer.min_step_count, README). The
  # padding-biased variants average the whole batch at every step and need no guard.
  config.model.min_step_count = 8 if variant in ('bn_e_star', 'bn_e_star_star') else 1

  fast = variant in FAST_VARIANTS
  config.optimizer.name = 'adam'            # App. C
  config.optimizer.learning_rate = 8e-4 if fast else 8e-5   # arXiv App. C
  config.optimizer.clip_norm = 10.0         # App. C
  config.train.batch_size = 40 if fast else 64               # App. C
  config.train.num_steps = 100_000          # ours (the paper early-stops, no budget)
  config.train.log_every = 100
  config.eval.every = 1000                  # ours
  config.eval.batch_size = 128              # ours
  config.eval.splits = ('valid',)
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = 20       # ours
  config.checkpoint.every = 1000
  config.checkpoint.best_metric = 'valid/error'
  config.checkpoint.best_mode = 'min'

  if preset:
    # The reduced size of this project's CPU runs (ours, all of it).
    config.data.vocab_size = 10_000
    # Batches drawn within one of 8 document-length groups: less padding, and fewer late
    # steps where only a few documents of a batch are valid (min_step_count covers the
    # rest; queries are not grouped).
    config.data.length_groups = 8
    config.data.length_multiple = 64        # fewer XLA programs (lengths 64 ... 384)
    config.model.hidden_size = 64
    config.train.num_steps = 3000           # ~25 min per run for BN-e** on one core
    config.train.log_every = 10
    config.eval.every = 250
    config.eval.population_batches = 5
    config.checkpoint.every = 250
    config.checkpoint.keep = 1
  config.variants = VARIANTS
  return config
