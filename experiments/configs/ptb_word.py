r"""Word-level Penn Treebank (Laurent et al. 2016, sec. 5.2, after Zaremba et al. 2014).

  python experiments/main.py --config experiments/configs/ptb_word.py:small \
      --workdir runs/ptb_word_small_lstm                     # or medium, large
  python -m experiments.campaign run ptb_word_small --parallel=2   # Table 2, small row

Hardware and time: the small model on 2 CPU cores takes 2.3-2.5 hours a run (15 epochs;
the `ptb_word_small` campaign runs LSTM and BN side by side in about 2.5 hours); medium
and large are sized for a GPU; no result of theirs is committed.
Expected (small): best validation perplexity 122.6 (LSTM, epoch 7) and 123.7 (BN, epoch 4)
against Laurent et al.'s 119.2 and 120.9 (experiments/results/ptb_word_small.json;
`python -m experiments.campaign report ptb_word_small`).
Tiny (the whole run in well under a minute on 2 CPU cores: 8 units, four steps, a
validation on two batches and the test on the whole test text; a smoke test, not a
result):

  python experiments/main.py --config experiments/configs/ptb_word.py:small,tiny \
      --workdir /tmp/ptb_word_tiny

Data: Mikolov's PTB files under the data root (`<root>/ptb/ptb.{train,valid,test}.txt`;
the root is `--config.data.root=/path/to/datasets` or `$BN_RNN_JAX_DATA`). Metrics:
nats per word (`loss`, `nats`) and `perplexity`, for training and validation alike.

The argument is `[size][,tiny]`, the size `small` unless named. Laurent et al.: "All
models consist of two stacked LSTM layers and are trained with stochastic gradient
descent (SGD) with a learning rate of 1 and a mini-batch size of 32."

| size   | units | init U(-s, s) | dropout | BPTT | clip (global) | epochs | lr decay              |
|--------|-------|---------------|---------|------|---------------|--------|-----------------------|
| small  | 200   | 0.1           | none    | 20   | 10            | 15     | / 2 after epoch 6     |
| medium | 650   | 0.05          | 0.5     | 35   | 5             | 40     | / 1.2 after epoch 6   |
| large  | 1500  | 0.04          | 0.65 *  | 35   | 5             | 55     | / 1.15 after epoch 15 |

(the decay divides the rate once per epoch after the one named)

* Laurent et al. write "we apply dropout between all layers" for the large model without a
rate; 0.65 is Zaremba et al.'s large model, which Laurent et al. say they follow.

From Zaremba et al. (which Laurent et al. follow and do not restate): a 10,000-word
vocabulary, word embeddings as wide as the LSTM (`embed_size = units`), the stream cut
into 32 contiguous rows read in consecutive segments with the hidden state carried from
one segment to the next (reset at every epoch), every parameter (embedding, LSTM, softmax,
biases) drawn from U(-s, s), dropout on the non-recurrent connections only (embedding
output, between the layers, before the softmax). Epoch e (1-based) trains at
`lr = decay ** max(0, e - after)`.

Variants (`--config.model.variant`):
  lstm           the baseline ("Small LSTM", Table 2)
  bn_input_only  Laurent et al.'s BN-LSTM: BN on W_x x only, frame-wise statistics
                 ("Small LSTM (BN)", Table 2)
  bn_lstm        Cooijmans et al.'s BN-LSTM (not in Laurent's table)

Loss scale: Zaremba's code (which the numbers above assume) minimises the *sum over the T
steps* of the batch-mean cross-entropy, and clips the gradient of that sum. The trainer
minimises the per-token mean (T times smaller), so this config sets
`learning_rate = 1 * T` and `clip_norm = clip / T`: for plain SGD the updates are then
identical, `lr * clip(T g, c) = (lr T) * clip(g, c / T)`. The decay multiplies that rate.

Choices Laurent et al. leave open, made here: the BN gamma starts at 1.0 (their paper
predates Cooijmans' gamma = 0.1 advice; 1.0 is the standard BN initialisation, and the
uniform initialisation leaves BN scales alone); population statistics for validation are
the papers' estimate (average of 20 training-batch moments, each batch run from the zero
state rather than the carried one, so the first steps' second-layer statistics see a
slightly different input than in training); the perplexities are of the
`eval.batch_size = 32` rows layout (the last `N mod 32` valid tokens are not scored), and
training perplexity is exp of the mean training loss of each epoch (`train.log_every`
= one epoch, dropout on, as in Zaremba's code).

Laurent et al. Table 2 (best perplexity, train / valid): small LSTM 78.5 / 119.2, small
LSTM (BN) 62.5 / 120.9; medium 49.1 / 89.0 and 41.0 / 90.6; large 49.3 / 81.8 and
35.0 / 97.4.
"""

from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib

VARIANTS = ('lstm', 'bn_input_only', 'bn_lstm')
PTB_TRAIN_TOKENS = 929_589   # ptb.train.txt words + one <eos> per line

SIZES = {
    #         units  init   dropout steps clip epochs decay      decay after
    'small': (200, 0.1, 0.0, 20, 10.0, 15, 0.5, 6),
    'medium': (650, 0.05, 0.5, 35, 5.0, 40, 1 / 1.2, 6),
    'large': (1500, 0.04, 0.65, 35, 5.0, 55, 1 / 1.15, 15),
}


def steps_per_epoch(batch_size: int, seq_length: int) -> int:
  """Training steps of one epoch of the contiguous rows layout (see text.py)."""
  return (PTB_TRAIN_TOKENS // batch_size - 1) // seq_length


def get_config(arg: str = ''):
  size, presets = config_lib.parse_arg(arg, 'ptb_word.py', tuple(SIZES), kind='size')
  size = size or 'small'
  units, init, dropout, seq_length, clip, epochs, decay, after = SIZES[size]
  config = config_lib.default_config()
  config.data = text.default_data_config('ptb_word')   # <data root>/ptb
  config.data.seq_length = seq_length
  config.size = size

  config.model.variant = 'lstm'
  config.model.hidden_size = units
  config.model.num_layers = 2
  config.model.embed_size = units
  config.model.dropout_rate = dropout
  config.model.uniform_init_scale = init   # every parameter but BN scales ~ U(-init, init)
  config.model.gamma_init = 1.0
  # Zaremba's code draws every bias from U(-s, s), the forget gate's too: no forget bias.
  config.model.forget_bias = 0.0
  config.model.max_length = seq_length

  config.optimizer.name = 'sgd'
  # Zaremba's loss is a sum over T steps; see "Loss scale" in the module docstring.
  config.optimizer.learning_rate = 1.0 * seq_length
  config.optimizer.momentum = 0.0
  config.optimizer.clip_norm = clip / seq_length
  config.optimizer.schedule = 'step_decay'
  config.optimizer.decay_rate = decay
  config.optimizer.decay_after_epochs = after

  batch_size = 32
  epoch = steps_per_epoch(batch_size, seq_length)
  config.train.batch_size = batch_size
  config.train.num_steps = epochs * epoch
  config.train.log_every = epoch           # one training record per epoch
  config.eval.every = epoch                # validate after every epoch
  config.eval.batch_size = batch_size
  config.eval.splits = ('valid',)
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = 20
  config.checkpoint.every = epoch
  config.checkpoint.best_metric = 'valid/perplexity'
  config.checkpoint.best_mode = 'min'
  config.variants = VARIANTS
  if 'tiny' in presets:
    config_lib.apply_tiny(config)
    config.model.embed_size = 8
    config.eval.batch_size = 256    # rows of 20 words: 17 batches cover the test text
  return config
