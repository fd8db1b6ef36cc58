"""bn_rnn_jax: batch-normalised recurrent networks in JAX/Flax.

Cooijmans et al. 2016 (BN-LSTM) and Laurent et al. 2016 (input-only BN), with per-step
statistics in the Flax `batch_stats` collection, scanned with `lax.scan`, mapped over
devices with exact cross-device moments.

The layers, cells, models and statistics (which import only jax, flax and numpy) are the
modules of this package; the data pipelines are `bn_rnn_jax.input_pipeline`, and the trainer
(config, steps, loop, checkpoints, metrics) is `bn_rnn_jax.training`. The public names below
load on first use, so that `from bn_rnn_jax.training import config` (what experiment configs
import) does not import JAX.

  Layers     RecurrentLayer, make_layer, VARIANTS, Execution, StackedRNN,
             Bidirectional, MaskedBatchNorm, reverse_valid
  Cells      BNLSTMCell, BNInputLSTMCell, LNLSTMCell, NormalizedLSTMCell, LSTMCarry, and
             RNN (Flax's nn.RNN, passing the cells their lengths)
  Models     SequenceClassifier, LanguageModel, SequenceTagger, AttentiveReader
  Statistics estimate_population_stats, batch_norm, batch_moments, layer_norm, normalize
  Training   default_config, train_and_evaluate, Trainer (from `bn_rnn_jax.training`)
  Modules    nnx_cells (the cells and RNN in Flax NNX), nnx_bridge (any layer or model
             as an NNX module, the estimate in NNX), export (`jax.export` of a trained
             model), batch_stats (statistics sites and their misuse checks), checks
             (`checks.checkify`: the checks of traced values), policy (`Execution`,
             `policy.targets`), ...
  Packages   input_pipeline (the datasets), training (the trainer)
"""

import importlib

__version__ = '0.2.0'

_NAMES = {
    'RecurrentLayer': 'recurrent',
    'make_layer': 'variants', 'VARIANTS': 'variants',
    'Execution': 'policy',
    'StackedRNN': 'stack', 'Bidirectional': 'stack',
    'MaskedBatchNorm': 'batch_stats',
    'BNLSTMCell': 'flax_cells', 'BNInputLSTMCell': 'flax_cells', 'LNLSTMCell': 'flax_cells',
    'NormalizedLSTMCell': 'flax_cells', 'LSTMCarry': 'flax_cells', 'RNN': 'flax_cells',
    'reverse_valid': 'sequence',
    'SequenceClassifier': 'models', 'LanguageModel': 'models',
    'SequenceTagger': 'models', 'AttentiveReader': 'models',
    'estimate_population_stats': 'population',
    'batch_norm': 'normalization', 'batch_moments': 'normalization',
    'layer_norm': 'normalization', 'normalize': 'normalization',
    'default_config': 'training.config',
    'train_and_evaluate': 'training.loop', 'Trainer': 'training.trainer',
}
_MODULES = ('batch_stats', 'checks', 'export', 'extras', 'flax_cells', 'fused', 'fused_step',
            'initializers', 'input_pipeline', 'layer_vjp', 'models', 'modes', 'nnx_bridge',
            'nnx_cells', 'normalization', 'persistent', 'policy', 'population', 'recurrent',
            'scans', 'sequence', 'stack', 'steps', 'training', 'variants')

__all__ = sorted(_NAMES) + list(_MODULES)


def __getattr__(name):
  if name in _NAMES:
    return getattr(importlib.import_module(f'{__name__}.{_NAMES[name]}'), name)
  if name in _MODULES:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return __all__
