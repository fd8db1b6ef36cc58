"""`compat.py`: the previous release's spellings still work, each with one
DeprecationWarning naming the caller's line, and compute what today's spellings compute:
a call without `return_carry` (the layer, `Bidirectional`, `StackedRNN`,
`LanguageModel`), the execution fields of `RecurrentLayer` (`remat=` ...), a cell
without `max_length`. The config keys `model.remat` etc. are today's spelling and warn
about nothing."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import bn_rnn_jax as br
from bn_rnn_jax import compat
from bn_rnn_jax import models
from bn_rnn_jax import nnx_cells
from bn_rnn_jax import policy
from bn_rnn_jax import stack
from bn_rnn_jax import train
from bn_rnn_jax import variants
import helpers
import training_fixtures as fx

B, T, I, H = 4, 6, 3, 5
X, MASK = helpers.uneven_batch(features=I)


def _modules():
  """(name, module, args): every module whose call takes `return_carry`."""
  layer = lambda: variants.make_layer('bn_lstm', H, max_length=T)
  tokens = np.arange(B * T).reshape(B, T) % 7
  return [('layer', layer(), (X, MASK)),
          ('bidirectional', stack.Bidirectional(layer(), layer()), (X, MASK)),
          ('stack', br.StackedRNN('bn_lstm', H, num_layers=2,
                                  layer_options={'max_length': T}), (X, MASK)),
          ('language_model', models.LanguageModel(vocab_size=7, hidden_size=H,
                                                  layer_options={'max_length': T}),
           (tokens, MASK))]


@pytest.mark.parametrize('name,module,args', _modules(), ids=lambda v: v
                         if isinstance(v, str) else '')
def test_a_call_without_return_carry_is_the_old_pair_with_a_warning(name, module, args):
  with warnings.catch_warnings():
    warnings.simplefilter('error')             # init discards the outputs: no warning
    variables = module.init(jax.random.key(0), *args, train=False)
  run = lambda **kw: module.apply(variables, *args, train=True, mutable=['batch_stats'],
                                  **kw)[0]
  with pytest.warns(DeprecationWarning, match='called without return_carry') as record:
    old = run()
  assert [w.filename for w in record] == [__file__], name   # the caller's line
  new = run(return_carry=True)
  helpers.assert_trees_equal(old, new)
  helpers.assert_trees_equal(run(return_carry=False), new[1])


def test_the_estimate_discards_the_outputs_and_warns_about_nothing():
  layer = variants.make_layer('bn_lstm', H, max_length=T)
  variables = layer.init(jax.random.key(0), X, MASK, train=False)
  with warnings.catch_warnings():
    warnings.simplefilter('error', DeprecationWarning)
    stats = br.estimate_population_stats(layer, variables, [(X,)] * 2)
  assert not br.batch_stats.untrained_sites(stats)


SETTINGS = dict(hoist_input=True, remat='full', unroll=2, backward='scan',
                batch_sums='reduce')


def test_old_execution_fields_become_the_execution_value_with_a_warning():
  execution = policy.Execution(**SETTINGS)
  with pytest.warns(DeprecationWarning, match='are deprecated; pass execution='):
    built = variants.make_layer('bn_lstm', H, **SETTINGS)
  assert built.execution == execution
  assert built == variants.make_layer('bn_lstm', H, execution=execution)
  with pytest.warns(DeprecationWarning, match=re.escape("Execution(remat='full')")):
    options = variants.LayerOptions(remat='full', max_length=T)
  assert options == variants.LayerOptions(max_length=T,
                                          execution=policy.Execution(remat='full'))
  # An old field overrides the value it is merged into; defaults are not "set".
  with pytest.warns(DeprecationWarning):
    merged = variants.LayerOptions(execution=execution, backward='layer', remat='auto')
  assert merged['execution'] == policy.Execution(**{**SETTINGS, 'backward': 'layer'})
  # `RecurrentLayer` built directly (no make_layer) merges them when it runs.
  direct = br.RecurrentLayer(H, hoist_input=None, remat=True)
  with pytest.warns(DeprecationWarning, match="remat='full'"):
    assert direct.execution_settings() == policy.Execution(remat='full')
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert br.RecurrentLayer(H).execution_settings() == policy.Execution()


def test_old_execution_fields_compute_what_the_value_computes():
  new = variants.make_layer('bn_lstm', H, max_length=T,
                            execution=policy.Execution(**SETTINGS))
  old = br.RecurrentLayer(H, **variants.VARIANTS['bn_lstm'], max_length=T, **SETTINGS)
  variables = new.init(jax.random.key(0), X, MASK, train=False)
  run = lambda layer: layer.apply(variables, X, MASK, train=True, mutable=['batch_stats'],
                                  return_carry=True)
  with pytest.warns(DeprecationWarning):
    got = run(old)
  helpers.assert_trees_equal(got, run(new))
  with pytest.warns(DeprecationWarning):
    assert old.execution_policy(B) == new.execution_policy(B)


def test_execution_values_are_checked_in_one_line():
  for name, bad in (('hoist_input', None), ('remat', 'sometimes'), ('unroll', 0),
                    ('backward', 'both'), ('batch_sums', 'sum')):
    with pytest.raises(ValueError, match=f'{name} must be') as error:
      policy.Execution(**{name: bad})
    assert repr(bad) in helpers.one_line(error)


def test_config_keys_reach_the_execution_value_without_a_warning():
  config = fx.tiny_config('bn_lstm', **{'model.remat': 'dots', 'model.unroll': 2,
                                        'model.hoist_input': True})
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    options = train.layer_options(config, 5)
  assert options['execution'] == policy.Execution(hoist_input=True, remat='dots', unroll=2)
  assert not set(options) & set(compat.OLD_EXECUTION_DEFAULTS)


def test_a_cell_without_max_length_gets_the_old_rows_with_a_warning():
  x = jnp.ones((2, 4, I))
  with pytest.warns(DeprecationWarning, match='BNLSTMCell without max_length'):
    variables = nn.RNN(br.BNLSTMCell(H, use_running_average=False),
                       variable_carry='batch_stats').init(
        jax.random.key(0), x)
  assert variables['batch_stats']['cell']['cell']['count'].shape == (
      compat.OLD_CELL_MAX_LENGTH,)
  with pytest.warns(DeprecationWarning, match='BNLSTMCell without max_length'):
    cell = nnx_cells.BNLSTMCell(I, H, rngs=nnx.Rngs(0))
  assert cell.max_length == compat.OLD_CELL_MAX_LENGTH
  with warnings.catch_warnings():   # layer norm keeps no statistics: nothing to size
    warnings.simplefilter('error')
    nn.RNN(br.LNLSTMCell(H)).init(jax.random.key(0), x)
    nnx_cells.LNLSTMCell(I, H, rngs=nnx.Rngs(0))


def test_a_cause_warns_once_however_often_the_code_is_traced(monkeypatch):
  """A cell without `max_length` in `init` and `apply` (traced several times, with JAX
  resetting Python's record of the warnings shown) is one warning under Python's default
  filters; filters that ask for every occurrence get every one."""
  x = jnp.ones((2, 4, I))
  rnn = nn.RNN(br.BNLSTMCell(H, use_running_average=False), variable_carry='batch_stats')

  layer = variants.make_layer('bn_lstm', H, max_length=T)
  layer_variables = layer.init(jax.random.key(0), X, MASK, train=False)

  def warned(action):
    monkeypatch.setattr(compat, '_SHOWN', set())
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter(action)
      variables = rnn.init(jax.random.key(0), x)
      rnn.apply(variables, x, mutable=['batch_stats'])
      rnn.apply(variables, x, mutable=['batch_stats'])
      for _ in range(2):   # another cause: a layer called without return_carry
        layer.apply(layer_variables, X, MASK, train=True, mutable=['batch_stats'])
    return [str(w.message).split(' ')[0:2] for w in caught
            if issubclass(w.category, DeprecationWarning)]

  assert warned('default') == [['BNLSTMCell', 'without'], ['RecurrentLayer', 'called']]
  assert len(warned('always')) > 4
