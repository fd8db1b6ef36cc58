"""bn_rnn_jax: batch-normalised recurrent networks in JAX/Flax.

Cooijmans et al. 2016 (BN-LSTM) and Laurent et al. 2016 (input-only BN), with per-step
statistics in the Flax `batch_stats` collection, scanned with `lax.scan`, pmap-ready.
"""

from bn_rnn_jax import cells
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from bn_rnn_jax import recurrent
from bn_rnn_jax.models import (AttentiveReader, LanguageModel, SequenceClassifier,
                               SequenceTagger)
from bn_rnn_jax.normalization import (average_moment_records, batch_moments, batch_norm,
                                      layer_norm, normalize, population_estimate,
                                      population_rows)
from bn_rnn_jax.recurrent import (VARIANTS, Bidirectional, RecurrentLayer, StackedRNN,
                                  estimate_population_stats, make_layer, reverse_valid)

__version__ = '0.1.0'
