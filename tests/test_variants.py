"""`variants.py`: the papers' layers by name (each preset against the reference's own
spelling of the paper) and `make_layer` (an unknown field refused in one line)."""

import pytest

from bn_rnn_jax import initializers
from bn_rnn_jax import models
from bn_rnn_jax import policy
from bn_rnn_jax import variants
import reference as ref


def test_every_variant_normalises_the_sites_the_paper_names():
  assert set(variants.VARIANTS) == set(ref.VARIANT_SPECS) - {'bn_lstm_sequence_input'}
  for name in variants.VARIANTS:
    layer, spec = variants.make_layer(name, 4), ref.spec(name)
    assert (layer.cell, layer.recurrent_norm, layer.input_norm, layer.cell_norm) == (
        spec['cell'], spec['recurrent'], spec['input'], spec['cell_site']), name
    statistics = {(False, 'frame'): 'per_step', (False, 'sequence'): 'sequence',
                  (True, 'sequence'): 'shared'}[spec['shared'], spec['input_stats']]
    assert layer.statistics == statistics, name


def test_make_layer_overrides_fields_and_names_the_layer():
  layer = variants.make_layer('bn_lstm', 7, max_length=9, momentum=0.5, name='encoder')
  assert (layer.features, layer.max_length, layer.momentum, layer.name) == (
      7, 9, 0.5, 'encoder')
  assert variants.make_layer('ln_lstm', 3).scale_init == initializers.Constant(1.0)  # Ba et al.
  with pytest.raises(ValueError, match=r"Unknown RNN variant 'bn_gru'"):
    variants.make_layer('bn_gru', 4)
  with pytest.raises(ValueError, match='Unknown RecurrentLayer fields'):
    variants.make_layer('bn_lstm', 4, hidden=3)


def test_unknown_layer_field_names_a_close_match():
  with pytest.raises(ValueError, match="did you mean 'max_length'"):
    variants.make_layer('bn_lstm', 4, max_lenght=3)


def test_layers_and_models_holding_them_are_hashable_values():
  """A layer and a model holding it as its template compare and hash by their fields, so
  either is a static argument of `jax.jit` (the estimate compiles once per model)."""
  full = policy.Execution(remat='full')
  a = variants.make_layer('bn_lstm', 7, max_length=9, execution=full)
  b = variants.make_layer('bn_lstm', 7, execution=policy.Execution(remat='full'), max_length=9)
  assert a == b and hash(a) == hash(b)
  assert a != a.clone(execution=policy.Execution(remat='none'))
  assert hash(models.SequenceClassifier(3, a)) == hash(models.SequenceClassifier(3, b))
