"""`flax_cells.py`: the cells under `RNN` / `nn.Bidirectional` against the float64 NumPy
reference (`reference.py`) and against `RecurrentLayer` with the same variables.

Outputs, final state, gradients (reference gradients by central finite differences) and
the statistics written to `batch_stats` / `minibatch_moments` in training, with fixed and
uneven `seq_lengths`; inference with the population statistics (running average, and the
papers' estimate through `population.estimate_population_stats`) past `max_length`; the
misuse errors. Shapes are tiny (B=4, T=5, I=3, H=4), as in test_recurrent.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bn_rnn_jax import flax_cells
from bn_rnn_jax import nnx_cells
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T, I, H = 4, 5, 3, 4
MAX_LEN = 7
MOMENTUM = 0.9
GARBAGE = 30.0
UNEVEN, FIXED = (5, 2, 4, 5), (5, 5, 5, 5)
CELLS = {'bn_lstm': flax_cells.BNLSTMCell, 'bn_input_only': flax_cells.BNInputLSTMCell,
         'ln_lstm': flax_cells.LNLSTMCell}
# float32 against float64 (`helpers.assert_close`), as test_recurrent.py.
assert_close = functools.partial(helpers.assert_close, rtol=1e-4)
GRAD_RTOL = 2e-4


class Encoder(nn.Module):
  """A cell under `flax_cells.RNN` (or both directions of `nn.Bidirectional`), as a user's
  module holds it: `(x [B, T, I], lengths [B], train=...)` -> `(carry, outputs)`."""
  variant: str
  bidirectional: bool = False

  @nn.compact
  def __call__(self, x, lengths, *, train):
    def rnn(name):
      cell = CELLS[self.variant](H, max_length=MAX_LEN, momentum=MOMENTUM,
                                 use_running_average=not train, name=name)
      return flax_cells.RNN(cell)
    if self.bidirectional:
      return nn.Bidirectional(rnn('forward'), rnn('backward'))(
          x, seq_lengths=lengths, return_carry=True)
    return rnn('cell')(x, seq_lengths=lengths, return_carry=True)


def _inputs(seed, lengths, length=T):
  rng = np.random.default_rng(seed)
  mask = helpers.prefix_mask(lengths, length, np.float64)
  x = rng.normal(size=(len(lengths), length, I))
  return np.where(mask[..., None] > 0, x, GARBAGE * rng.normal(size=x.shape)), mask


_rng = np.random.default_rng(1)
W_OUT = _rng.normal(size=(B, T, H))
W_CARRY = _rng.normal(size=(2, B, H))


def _layer(variant):
  return variants.make_layer(variant, H, max_length=MAX_LEN, momentum=MOMENTUM)


@functools.cache
def variant_params(variant):
  """Random float64 parameters in `RecurrentLayer`'s layout, and its fresh statistics."""
  params, stats = helpers.reference_params(_layer(variant), (B, T, I),
                                           list(CELLS).index(variant) + 20)
  return params, {site: ref.init_population(*s['mean'].shape) for site, s in stats.items()}


def _variables(variant, name='cell'):
  params, stats = variant_params(variant)
  variables = {'params': {name: params}}
  if stats:
    variables['batch_stats'] = {name: stats}
  return helpers.float32(variables)


@functools.cache
def train_fn(variant):
  """jit(value_and_grad) of a weighted loss of the outputs and the final (c, h)."""
  model = Encoder(variant)

  def loss(variables, x, lengths):
    (carry, out), new = model.apply(variables, x, lengths, train=True,
                                    mutable=['batch_stats', 'minibatch_moments'])
    value = jnp.sum(out * W_OUT) + sum(jnp.sum(a * w) for a, w in zip(carry, W_CARRY))
    return value, (carry, out, new)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def ref_loss(variant, params, x, mask):
  carry, out, _ = ref.run_layer(params, x, mask, variant)
  return np.sum(out * W_OUT) + sum(np.sum(a * w) for a, w in zip(carry, W_CARRY))


@pytest.mark.parametrize('variant,lengths', helpers.core_cases(
    [(v, lengths) for v in CELLS for lengths in (FIXED, UNEVEN)],
    core=[('bn_lstm', UNEVEN), ('bn_input_only', FIXED), ('ln_lstm', UNEVEN)]))
def test_training_matches_reference(variant, lengths):
  """RNN(cell)(x, seq_lengths=...): outputs, last carry, gradients, statistics."""
  params, fresh = variant_params(variant)
  x, mask = _inputs(0, lengths)
  (_, (carry, out, new)), (g_vars, g_x) = train_fn(variant)(
      _variables(variant), jnp.asarray(x, jnp.float32), jnp.asarray(lengths))
  want_carry, want_out, moments = ref.run_layer(params, x, mask, variant)
  assert_close(out, want_out, what='outputs')
  assert np.all(np.asarray(out)[mask == 0] == 0.0), 'padded outputs must be exactly 0'
  assert_close(carry.c, want_carry[0], what='c')
  assert_close(carry.h, want_carry[1], what='h')
  np.testing.assert_array_equal(carry.step, lengths)

  arrays = {**params, '__x': x}
  grads = ref.numerical_grad(lambda a: ref_loss(
      variant, {k: v for k, v in a.items() if k != '__x'}, a['__x'], mask), arrays)
  assert_close(g_x, grads.pop('__x'), rtol=GRAD_RTOL, what='d loss / d x')
  assert np.all(np.asarray(g_x)[mask == 0] == 0.0), 'padded inputs must get no gradient'
  assert set(g_vars['params']['cell']) == set(grads)
  for name, g in g_vars['params']['cell'].items():
    assert_close(g, grads[name], rtol=GRAD_RTOL, what=f'd loss / d {name}')

  assert set(new.get('batch_stats', {}).get('cell', {})) == set(fresh)
  for site, shared in ref.batch_sites(variant).items():
    record = ref.minibatch_record(moments[site], shared, MAX_LEN)
    expected = ref.ema_update(fresh[site], record, MOMENTUM)
    for key in ('mean', 'var', 'count'):
      assert_close(new['batch_stats']['cell'][site][key], expected[key],
                   what=f'batch_stats {site} {key}')
      assert_close(new['minibatch_moments']['cell'][site][key], record[key],
                   what=f'minibatch_moments {site} {key}')


@pytest.mark.parametrize('variant', helpers.core_cases(list(CELLS), core=['bn_lstm']))
def test_equals_the_layer_with_the_same_variables(variant):
  """The cell's parameters and statistics are the layer's: same tree, same outputs."""
  x, mask = _inputs(2, UNEVEN)
  x, lengths = jnp.asarray(x, jnp.float32), jnp.asarray(UNEVEN)
  variables = _variables(variant)
  (carry, out), new = Encoder(variant).apply(variables, x, lengths, train=True,
                                             mutable=['batch_stats'])
  layer_vars = {collection: tree['cell'] for collection, tree in variables.items()}
  (layer_carry, layer_out), layer_new = _layer(variant).apply(
      layer_vars, x, jnp.asarray(mask, jnp.float32), use_running_average=False,
      deterministic=False, mutable=['batch_stats'], return_carry=True)
  np.testing.assert_allclose(out, layer_out, rtol=1e-5, atol=1e-6)
  helpers.assert_trees_close(tuple(carry), layer_carry, rtol=1e-5, atol=1e-6)
  helpers.assert_trees_close(new.get('batch_stats', {}).get('cell', {}),
                             layer_new.get('batch_stats', {}), rtol=1e-5, atol=1e-6)


def test_bidirectional_matches_reference():
  """nn.Bidirectional of two RNNs reverses each sequence's valid part; the backward cell's
  statistics are those of the reversed sequences."""
  variant = 'bn_lstm'
  params, fresh = variant_params(variant)
  params_b = ref.random_params({k: v.shape for k, v in params.items()},
                               np.random.default_rng(7))
  x, mask = _inputs(3, UNEVEN)
  variables = helpers.float32({'params': {'forward': params, 'backward': params_b},
                               'batch_stats': {'forward': fresh, 'backward': fresh}})
  (_, out), new = jax.jit(lambda v, x, n: Encoder(variant, bidirectional=True).apply(
      v, x, n, train=True, mutable=['batch_stats']))(
          variables, jnp.asarray(x, jnp.float32), jnp.asarray(UNEVEN))
  _, out_f, _ = ref.run_layer(params, x, mask, variant)
  _, out_b, moments_b = ref.run_layer(params_b, ref.reverse_each(x, mask), mask, variant)
  assert_close(out, np.concatenate([out_f, ref.reverse_each(out_b, mask)], -1))
  for site in ('recurrent', 'input', 'cell'):
    expected = ref.ema_update(fresh[site], ref.minibatch_record(moments_b[site], False,
                                                                MAX_LEN), MOMENTUM)
    assert_close(new['batch_stats']['backward'][site]['mean'], expected['mean'], what=site)
    assert_close(new['batch_stats']['backward'][site]['count'], expected['count'],
                 what=site)


@pytest.mark.parametrize('variant', helpers.core_cases(['bn_lstm', 'bn_input_only'],
                                                       core=['bn_lstm']))
def test_population_inference_past_max_length(variant):
  """Running average after two batches, then the papers' estimate, each evaluated on
  sequences longer than max_length (rows past the last trained one reuse it)."""
  params, fresh = variant_params(variant)
  model = Encoder(variant)
  batches = [_inputs(4, (5, 3, 5, 2)), _inputs(5, (4, 5, 1, 5))]
  variables = _variables(variant)
  stats = variables['batch_stats']
  want = fresh
  for x, mask in batches:
    _, new = model.apply({**variables, 'batch_stats': stats}, jnp.asarray(x, jnp.float32),
                         jnp.asarray(mask.sum(1), jnp.int32), train=True,
                         mutable=['batch_stats'])
    stats = new['batch_stats']
    moments = ref.run_layer(params, x, mask, variant)[2]
    want = {site: ref.ema_update(want[site], ref.minibatch_record(moments[site], False,
                                                                  MAX_LEN), MOMENTUM)
            for site in want}
  helpers.assert_trees_close(helpers.float64(stats['cell']), want, rtol=1e-4, atol=1e-5)

  estimate = population.estimate_population_stats(
      model, variables, [(jnp.asarray(x, jnp.float32), jnp.asarray(m.sum(1), jnp.int32))
                         for x, m in batches], train=True)
  records = [ref.minibatch_record(ref.run_layer(params, x, m, variant)[2][site], False,
                                  MAX_LEN) for x, m in batches for site in ['input']]
  assert_close(estimate['cell']['input']['mean'], ref.average_records(records)['mean'])

  lengths = (10, 3, 9, 6)
  x, mask = _inputs(6, lengths, length=10)
  for population_stats in (stats, estimate):
    _, out = model.apply({**variables, 'batch_stats': population_stats},
                         jnp.asarray(x, jnp.float32), jnp.asarray(lengths), train=False)
    lookup = {site: ref.population_lookup(helpers.float64(population_stats['cell'][site]),
                                          10, normalization.DEFAULT_MIN_ROW_SUPPORT)
              for site in fresh}
    _, want_out, _ = ref.run_layer(params, x, mask, variant, train=False, population=lookup)
    assert_close(out, want_out)


def test_a_batch_normalised_cell_needs_max_length():
  """A cell makes its statistics before it sees a sequence: without `max_length` a cell
  with batch statistics is a one-line error (Linen and NNX); layer norm keeps none."""
  x = jnp.ones((B, T, I))
  with pytest.raises(ValueError, match='BNLSTMCell.*pass max_length') as error:
    flax_cells.RNN(flax_cells.BNLSTMCell(H, use_running_average=False)).init(
        jax.random.key(0), x)
  helpers.one_line(error)
  with pytest.raises(ValueError, match='BNInputLSTMCell.*pass max_length') as error:
    nnx_cells.BNInputLSTMCell(I, H, rngs=nnx.Rngs(0))
  helpers.one_line(error)
  flax_cells.RNN(flax_cells.LNLSTMCell(H)).init(jax.random.key(0), x)
  nnx_cells.LNLSTMCell(I, H, rngs=nnx.Rngs(0))


def test_misuse_is_a_one_line_error():
  x, lengths = jnp.ones((B, T, I)), jnp.asarray(UNEVEN)
  cell = flax_cells.BNLSTMCell(H, max_length=MAX_LEN, use_running_average=False)
  rnn = flax_cells.RNN(cell)
  variables = rnn.init(jax.random.key(0), x)
  with pytest.raises(ValueError, match='silently') as error:      # training, read-only
    rnn.apply(variables, x)
  helpers.one_line(error)
  with pytest.raises(ValueError, match='no training batch') as error:
    flax_cells.RNN(cell.clone(use_running_average=True)).apply(variables, x)
  helpers.one_line(error)
  with pytest.raises(ValueError, match='max_length') as error:
    rnn.apply(variables, jnp.ones((B, 9, I)), mutable=['batch_stats'])
  helpers.one_line(error)
  with pytest.raises(ValueError, match='needs mask=') as error:   # plain nn.RNN training
    nn.RNN(cell, variable_carry='batch_stats').apply(variables, x, mutable=['batch_stats'])
  helpers.one_line(error)
  with pytest.raises(ValueError, match='cell_norm') as error:
    flax_cells.NormalizedLSTMCell(H, cell_norm='group').init(
        jax.random.key(0), cell.initialize_carry(None, (B, I)), x[:, 0])
  helpers.one_line(error)
  for bad, match in ((jnp.ones((1, B), jnp.int32), 'batch shape'),
                     (jnp.full((B,), 2.0), 'integers'),
                     (jnp.asarray([1, 9, 2, 3]), r'seq_lengths\[1\] = 9 is outside 0..5'),
                     (jnp.asarray([1, -1, 2, 3]), 'outside')):
    with pytest.raises(ValueError, match=match) as error:
      rnn.apply(variables, x, seq_lengths=bad, mutable=['batch_stats'])
    helpers.one_line(error)
  with pytest.raises(TypeError, match=r'LSTMCarry\(c, h, step\) or \(c, h\)') as error:
    rnn.apply(variables, x, initial_carry=jnp.zeros((B, H)), mutable=['batch_stats'])
  helpers.one_line(error)
  with pytest.raises(ValueError, match=r'BNLSTMCell: the carry must be \[\*batch, H\]') as error:
    rnn.apply(variables, x, initial_carry=(jnp.zeros((B, H + 1)),) * 2, mutable=['batch_stats'])
  helpers.one_line(error)
  with pytest.raises(ValueError, match='run the cell with bn_rnn_jax.RNN') as error:
    nn.RNN(cell.clone(use_running_average=True)).init(jax.random.key(0), x)  # Flax's own
  helpers.one_line(error)
  for field, value in (('variable_broadcast', ['params', 'batch_stats']), ('unroll', 2)):
    with pytest.raises(ValueError, match=f'RNN.*{field}') as error:
      flax_cells.RNN(cell, **{field: value}).init(jax.random.key(0), x)
    helpers.one_line(error)


def test_the_carry_indexes_as_flax_and_restarts_its_rows_with_state():
  """`LSTMCarry` is Flax's `(c, h)` to index and unpack, with each row's `step` beside it;
  `carry.state` drops the steps (a new segment starts at statistics row 0)."""
  cell = flax_cells.BNLSTMCell(H, max_length=MAX_LEN, use_running_average=False)
  rnn = flax_cells.RNN(cell, return_carry=True)
  x, lengths = jnp.ones((B, T, I)), jnp.asarray(UNEVEN)
  variables = rnn.init(jax.random.key(0), x)
  (carry, _), _ = rnn.apply(variables, x, seq_lengths=lengths, mutable=['batch_stats'])
  c, h = carry
  assert carry[0] is c is carry.c and carry[1] is h is carry.h and len(carry) == 2
  np.testing.assert_array_equal(carry.step, UNEVEN)
  restarted = flax_cells.as_carry(carry.state, (B,))
  np.testing.assert_array_equal(restarted.step, np.zeros(B))
  assert restarted.c is c and restarted.h is h


def test_truncated_backprop_segments_are_the_papers_segment_training():
  """Training in segments, each started from the last one's `carry.state` (the state, its
  statistics rows restarted at 0): every segment's outputs and recorded moments are the
  reference's run of that segment from the carried state (Cooijmans et al. sec. 5.2),
  and the running average moves once per segment."""
  params, fresh = variant_params('bn_lstm')
  rnn = flax_cells.RNN(flax_cells.BNLSTMCell(H, max_length=MAX_LEN, momentum=MOMENTUM),
                       return_carry=True)
  apply = jax.jit(lambda v, x, carry: rnn.apply(
      v, x, initial_carry=carry, use_running_average=False,
      mutable=['batch_stats', 'minibatch_moments']))
  segments = [_inputs(seed, FIXED)[0] for seed in (3, 4)]   # two [B, T, I] segments
  variables = helpers.float32({'params': {'cell': params}, 'batch_stats': {'cell': fresh}})
  carry, want_carry, stats = None, None, fresh
  for x in segments:
    (carry, out), new = apply(variables, helpers.float32(x),
                              None if carry is None else carry.state)
    want_carry, want, moments = ref.run_layer(params, x, None, 'bn_lstm',
                                              initial_carry=want_carry)
    assert_close(out, want, what='segment outputs')
    np.testing.assert_array_equal(carry.step, [T] * B)   # rows 0..T-1 in every segment
    for site, steps in moments.items():
      record = ref.minibatch_record(steps, False, MAX_LEN)
      assert_close(new['minibatch_moments']['cell'][site]['mean'], record['mean'],
                   what=f'{site} moments')
      stats = {**stats, site: ref.ema_update(stats[site], record, MOMENTUM)}
      assert_close(new['batch_stats']['cell'][site]['mean'], stats[site]['mean'],
                   what=f'{site} running average')
    variables = {**variables, 'batch_stats': new['batch_stats']}
