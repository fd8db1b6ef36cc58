"""The NNX modules (`nnx_bridge.py`, `nnx_cells.py`): `FromLinen` against the Linen modules it wraps, and
the native cells (`nnx_cells.py`) against the float64 reference (at the end).

The same BN-LSTM classifier is trained from Linen (`models.SequenceClassifier`, `apply`
with `mutable=['batch_stats']`) and from NNX (`FromLinen` + `nnx.Linear`, `nnx.Optimizer`,
`model.train()`), from the same initial values on the same batches, with the same
optimizer: parameters, running statistics, the papers' estimate and evaluation outputs
must agree. The two are different compiled programs (NNX's graph bookkeeping around the
same operations), so they agree to float32 rounding: `RTOL`, `ATOL` below.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bn_rnn_jax import batch_stats
from bn_rnn_jax import models
from bn_rnn_jax import nnx_bridge as br_nnx
from bn_rnn_jax import nnx_cells
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from bn_rnn_jax import stack
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T, I, H, C = 8, 6, 2, 8, 3
STEPS = 4
RTOL, ATOL = 1e-5, 1e-6
LAYER = variants.make_layer('bn_lstm', H, max_length=T)


def _batches(count, seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    x = rng.normal(size=(B, T, I)).astype(np.float32)
    lengths = rng.integers(2, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    labels = rng.integers(0, C, size=B).astype(np.int32)
    out.append((x, mask, labels))
  return out


TRAIN = _batches(STEPS, 0)
ESTIMATE = _batches(2, 1)
VALID = _batches(1, 2)[0]


class Classifier(nnx.Module):
  """`models.SequenceClassifier(C, LAYER)` in NNX."""

  def __init__(self, rngs: nnx.Rngs):
    rnn = stack.StackedRNN(LAYER)
    self.rnn = br_nnx.FromLinen(rnn, jnp.zeros((1, T, I)), rngs=rngs)
    self.head = nnx.Linear(H, C, rngs=rngs)

  def __call__(self, x, mask=None):
    carries, _ = self.rnn(x, mask, return_carry=True)
    return self.head(models.last_hidden(carries[-1]))


def _loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _train_linen(model, variables, tx):
  @jax.jit
  def step(params, stats, opt_state, x, mask, labels):
    def loss_fn(params):
      logits, updates = model.apply({'params': params, 'batch_stats': stats}, x, mask,
                                    use_running_average=False, deterministic=False,
                                    mutable=['batch_stats'])
      return _loss(logits, labels), updates['batch_stats']
    (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state

  params, stats = variables['params'], variables['batch_stats']
  opt_state = tx.init(params)
  for x, mask, labels in TRAIN:
    params, stats, opt_state = step(params, stats, opt_state, x, mask, labels)
  return {'params': params, 'batch_stats': stats}


def _train_nnx(model, tx):
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, x, mask, labels):
    grads = nnx.grad(lambda model: _loss(model(x, mask), labels))(model)
    optimizer.update(model, grads)

  model.train()
  for x, mask, labels in TRAIN:
    step(model, optimizer, x, mask, labels)


def _close(got, want, what):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w),
                                                       rtol=RTOL, atol=ATOL, err_msg=what),
               got, want)


@pytest.fixture(scope='module')
def trained():
  """Linen and NNX classifiers trained from the same initial values."""
  linen = models.SequenceClassifier(C, LAYER)
  x, mask, _ = TRAIN[0]
  initial = linen.init(jax.random.key(0), x, mask, use_running_average=True,
                       deterministic=True)
  model = Classifier(nnx.Rngs(0))
  # The same initial values: the Linen ones copied into the NNX model.
  model.rnn.load_linen_variables({'params': initial['params']['rnn']})
  model.head.kernel[...] = initial['params']['classifier']['kernel']
  model.head.bias[...] = initial['params']['classifier']['bias']
  tx = optax.adam(1e-2)
  variables = _train_linen(linen, initial, tx)
  _train_nnx(model, tx)
  return linen, variables, model, initial


def test_training_gives_the_same_parameters_and_statistics(trained):
  _, variables, model, initial = trained
  params = variables['params']
  _close(model.rnn.linen_variables()['params'], params['rnn'], 'recurrent parameters')
  _close(model.head.kernel[...], params['classifier']['kernel'], 'softmax kernel')
  _close(model.head.bias[...], params['classifier']['bias'], 'softmax bias')
  stats = model.rnn.linen_variables()['batch_stats']
  _close(stats, variables['batch_stats']['rnn'], 'running statistics')
  # Row 0 counts the sequences of every training batch (all valid at step 0).
  assert float(stats['layer_0']['recurrent']['count'][0]) == STEPS * B
  # Training moved the parameters (the comparison is not of two initial states).
  moved = jnp.abs(params['classifier']['kernel'] - initial['params']['classifier']['kernel'])
  assert float(moved.max()) > 1e-2


def test_evaluation_with_running_and_estimated_statistics_agrees(trained):
  linen, variables, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  assert model.rnn.use_running_average
  evaluate = nnx.jit(lambda model, x, mask: model(x, mask))
  _close(evaluate(model, x, mask), linen.apply(variables, x, mask, use_running_average=True,
                                               deterministic=True),
         'outputs with the running average')

  estimate = population.estimate_population_stats(
      linen, variables, [(x, m) for x, m, _ in ESTIMATE])
  br_nnx.estimate_population_stats(model, [(x, m) for x, m, _ in ESTIMATE])
  _close(model.rnn.linen_variables()['batch_stats'], estimate['rnn'], 'estimated statistics')
  assert float(estimate['rnn']['layer_0']['cell']['count'][0]) == len(ESTIMATE) * B
  _close(evaluate(model, x, mask),
         linen.apply({**variables, 'batch_stats': estimate}, x, mask,
                     use_running_average=True, deterministic=True),
         'outputs with the estimate')
  assert model.rnn.use_running_average  # the estimate left the mode alone


@pytest.mark.slow
def test_train_and_eval_switch_batch_and_population_statistics(trained):
  _, _, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  before = model.rnn.linen_variables()['batch_stats']
  population_out = model(x, mask)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), before,
                                   model.rnn.linen_variables()['batch_stats']))
  model.train()
  batch_out = model(x, mask)
  after = model.rnn.linen_variables()['batch_stats']
  assert float(after['layer_0']['input']['count'][0]) == (
      float(before['layer_0']['input']['count'][0]) + B)
  assert not np.allclose(np.asarray(batch_out), np.asarray(population_out))
  model.eval()


@pytest.mark.slow
def test_step_through_the_wrapped_stack(trained):
  _, _, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  carries, outputs = model.rnn(x, mask, return_carry=True)
  step_carries = None
  for t in range(T):
    step_carries, out = model.rnn.step(step_carries, x[:, t], t, mask[:, t])
    np.testing.assert_allclose(out, outputs[:, t], rtol=RTOL, atol=ATOL)
  _close(step_carries, carries, 'stepped carry')


def test_an_untrained_nnx_model_refuses_to_evaluate():
  """Eagerly at once; under `nnx.jit` (statistics traced) the outputs are NaN."""
  model = Classifier(nnx.Rngs(1))
  model.eval()
  x, mask, _ = VALID
  with pytest.raises(ValueError, match='no training batch reached'):
    model(x, mask)
  assert np.isnan(nnx.jit(lambda model, x, mask: model(x, mask))(model, x, mask)).all()
  with batch_stats.allow_untrained_statistics():
    assert model(x, mask).shape == (B, C)


class TwoCells(nnx.Module):
  """Two native cells under `nnx_cells.RNN`; the call runs the first only."""

  def __init__(self, rngs: nnx.Rngs):
    cell = lambda: nnx_cells.BNLSTMCell(I, H, max_length=T, rngs=rngs)
    self.used, self.unused = nnx_cells.RNN(cell()), nnx_cells.RNN(cell())

  def __call__(self, inputs, seq_lengths=None):
    return self.used(inputs, seq_lengths=seq_lengths)


def test_the_nnx_estimate_warns_of_padding_and_unreached_sites():
  """As the Linen estimate: a zero-padded batch without lengths warns; a wrapped module
  no batch ran is set to statistics no batch reached (count 0, which evaluation
  refuses), with a warning naming its sites."""
  model = TwoCells(nnx.Rngs(0))
  trained = jax.tree.map(jnp.ones_like, model.unused.cell.linen_variables()['batch_stats'])
  model.unused.cell.load_linen_variables({'batch_stats': trained})
  x, mask, _ = VALID
  padded = np.where(mask[..., None] > 0, x, 0.0).astype(np.float32)
  with pytest.warns(UserWarning) as record:
    br_nnx.estimate_population_stats(model, [{'inputs': padded}])
  messages = [str(w.message) for w in record]
  assert any('Pass the lengths or mask the model trains with' in m for m in messages)
  unreached = [m for m in messages if 'no batch reached site(s)' in m]
  assert len(unreached) == 1 and all(f"'unused/cell/{site}'" in unreached[0]
                                     for site in ('recurrent', 'input', 'cell')), messages
  assert "'used/" not in unreached[0]
  assert sorted(batch_stats.untrained_sites(
      model.unused.cell.linen_variables()['batch_stats'])) == ['cell', 'input', 'recurrent']
  assert not batch_stats.untrained_sites(model.used.cell.linen_variables()['batch_stats'])


def test_the_nnx_estimate_checks_lengths_and_warns_of_batches_with_no_valid_step():
  """As the Linen estimate: concrete lengths outside 0..T are the layer's line before the
  pass is traced, and batches whose lengths are all 0 leave the sites the call ran with
  no supported row, named in a warning."""
  model = TwoCells(nnx.Rngs(0))
  x, _, _ = VALID
  with pytest.raises(ValueError) as error:
    br_nnx.estimate_population_stats(model, [{'inputs': x, 'seq_lengths': np.full(B, T + 1)}])
  assert helpers.one_line(error) == ('estimate_population_stats: batch 0: seq_lengths[0] = '
                                     f'{T + 1} is outside 0..{T} (the time steps of the inputs).')
  with pytest.warns(UserWarning) as record:
    br_nnx.estimate_population_stats(model, [{'inputs': x, 'seq_lengths': np.zeros(B, int)}])
  empty = [str(w.message) for w in record if 'no supported row' in str(w.message)]
  assert len(empty) == 1 and all(f"'used/cell/{site}'" in empty[0]
                                 for site in ('recurrent', 'input', 'cell')), empty


# ----------------------------------------------------------------------------- native cells
# `nnx_cells.py` in `nnx_cells.RNN` / `nnx.Bidirectional` against the float64 reference
# (`reference.py`), with the uneven lengths and tolerances of test_flax_cells.py.
CELL_LENGTHS = (5, 2, 4, 5)
CELL_T, CELL_H, MAX_LEN, MOMENTUM = 5, 4, 7, 0.9
CELL_RTOL, CELL_GRAD_RTOL = 1e-4, 2e-4


def _cell_case(variant, seed):
  """Reference parameters in the layer's layout, fresh statistics, x with junk padding."""
  layer = variants.make_layer(variant, CELL_H, max_length=MAX_LEN)
  params, stats = helpers.reference_params(layer, (4, CELL_T, I), seed)
  fresh = {site: ref.init_population(*s['mean'].shape) for site, s in stats.items()}
  rng = np.random.default_rng(seed)
  mask = helpers.prefix_mask(CELL_LENGTHS, CELL_T, np.float64)
  x = np.where(mask[..., None] > 0, rng.normal(size=(4, CELL_T, I)),
               30.0 * rng.normal(size=(4, CELL_T, I)))
  return params, fresh, x, mask


def _nnx_cell(variant, params, fresh):
  cell = NNX_CELLS[variant](I, CELL_H, max_length=MAX_LEN, momentum=MOMENTUM,
                            rngs=nnx.Rngs(0))
  cell.load_linen_variables(helpers.float32({'params': params, 'batch_stats': fresh}))
  return cell


NNX_CELLS = {'bn_lstm': nnx_cells.BNLSTMCell, 'bn_input_only': nnx_cells.BNInputLSTMCell,
             'ln_lstm': nnx_cells.LNLSTMCell}


@pytest.mark.parametrize('variant', helpers.core_cases(list(NNX_CELLS), core=['bn_lstm']))
def test_nnx_cell_in_rnn_matches_reference(variant):
  """Outputs, last carry, gradients and the running statistics after one update."""
  params, fresh, x, mask = _cell_case(variant, 30)
  rnn = nnx_cells.RNN(_nnx_cell(variant, params, fresh), return_carry=True)
  rnn.train()
  w_out = np.random.default_rng(3).normal(size=(4, CELL_T, CELL_H))

  @nnx.jit
  def value_and_grad(rnn, x, lengths):
    def loss(rnn, x):
      carry, out = rnn(x, seq_lengths=lengths)
      return jnp.sum(out * w_out) + jnp.sum(carry.h), (carry, out)
    return nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(rnn, x)

  (_, (carry, out)), (g_rnn, g_x) = value_and_grad(rnn, jnp.asarray(x, jnp.float32),
                                                   jnp.asarray(CELL_LENGTHS))
  want_carry, want_out, moments = ref.run_layer(params, x, mask, variant)
  helpers.assert_close(out, want_out, rtol=CELL_RTOL, what='outputs')
  helpers.assert_close(carry.h, want_carry[1], rtol=CELL_RTOL, what='h')
  np.testing.assert_array_equal(carry.step, CELL_LENGTHS)

  def ref_loss(arrays):
    p = {k: v for k, v in arrays.items() if k != '__x'}
    carry, out, _ = ref.run_layer(p, arrays['__x'], mask, variant)
    return np.sum(out * w_out) + np.sum(carry[1])
  grads = ref.numerical_grad(ref_loss, {**params, '__x': x})
  helpers.assert_close(g_x, grads.pop('__x'), rtol=CELL_GRAD_RTOL, what='d loss / d x')
  for name, want in grads.items():
    helpers.assert_close(getattr(g_rnn.cell, name)[...], want, rtol=CELL_GRAD_RTOL,
                         what=f'd loss / d {name}')

  got = rnn.cell.linen_variables().get('batch_stats', {})
  assert set(got) == set(ref.batch_sites(variant))
  for site in got:
    want = ref.ema_update(fresh[site], ref.minibatch_record(moments[site], False, MAX_LEN),
                          MOMENTUM)
    for key in ('mean', 'var', 'count'):
      helpers.assert_close(got[site][key], want[key], rtol=CELL_RTOL, what=f'{site} {key}')


class CellTagger(nnx.Module):
  """A bidirectional BN-LSTM of native cells and a softmax at every step."""

  def __init__(self, rngs: nnx.Rngs):
    cell = lambda: nnx_cells.BNLSTMCell(I, CELL_H, max_length=MAX_LEN, rngs=rngs)
    self.rnn = nnx.Bidirectional(nnx_cells.RNN(cell()), nnx_cells.RNN(cell()))
    self.head = nnx.Linear(2 * CELL_H, C, rngs=rngs)

  def __call__(self, x, lengths):
    return self.head(self.rnn(x, seq_lengths=lengths))


def test_nnx_cells_train_eval_and_estimate_in_bidirectional():
  """nnx.Bidirectional with seq_lengths: training outputs, the papers' estimate
  (`estimate_population_stats`) and evaluation with it past max_length, each against the
  reference; `model.eval()` keeps the statistics, an untrained model refuses to evaluate."""
  params, fresh, x, mask = _cell_case('bn_lstm', 31)
  params_b, _, _, _ = _cell_case('bn_lstm', 32)
  model = CellTagger(nnx.Rngs(0))
  model.eval()
  with pytest.raises(ValueError, match='no training batch reached'):
    model(jnp.asarray(x, jnp.float32), jnp.asarray(CELL_LENGTHS))
  model.rnn.forward_rnn.cell.load_linen_variables(helpers.float32({'params': params}))
  model.rnn.backward_rnn.cell.load_linen_variables(helpers.float32({'params': params_b}))
  lengths = jnp.asarray(CELL_LENGTHS)
  model.train()
  hidden = nnx.jit(lambda model, x, lengths: model.rnn(x, seq_lengths=lengths))
  out = hidden(model, jnp.asarray(x, jnp.float32), lengths)
  _, out_f, _ = ref.run_layer(params, x, mask, 'bn_lstm')
  _, out_b, _ = ref.run_layer(params_b, ref.reverse_each(x, mask), mask, 'bn_lstm')
  helpers.assert_close(out, np.concatenate([out_f, ref.reverse_each(out_b, mask)], -1),
                       rtol=CELL_RTOL, what='bidirectional outputs')

  batches = [_cell_case('bn_lstm', seed)[2:] for seed in (33, 34)]
  br_nnx.estimate_population_stats(
      model, [(jnp.asarray(b[0], jnp.float32), lengths) for b in batches])
  estimate = model.rnn.forward_rnn.cell.linen_variables()['batch_stats']
  for site in ('recurrent', 'input', 'cell'):
    records = [ref.minibatch_record(ref.run_layer(params, bx, bm, 'bn_lstm')[2][site],
                                    False, MAX_LEN) for bx, bm in batches]
    want = ref.average_records(records)
    for key in ('mean', 'var', 'count'):
      helpers.assert_close(estimate[site][key], want[key], rtol=CELL_RTOL, what=site)

  model.eval()
  long_lengths = (9, 3, 8, 6)
  long_mask = helpers.prefix_mask(long_lengths, 9, np.float64)
  long_x = np.random.default_rng(35).normal(size=(4, 9, I)) * long_mask[..., None]
  before = model.rnn.forward_rnn.cell.linen_variables()['batch_stats']
  out = hidden(model, jnp.asarray(long_x, jnp.float32), jnp.asarray(long_lengths))
  lookup = {site: ref.population_lookup(helpers.float64(before[site]), 9,
                                        normalization.DEFAULT_MIN_ROW_SUPPORT)
            for site in before}
  _, want, _ = ref.run_layer(params, long_x, long_mask, 'bn_lstm', train=False,
                             population=lookup)
  helpers.assert_close(out[..., :CELL_H], want, rtol=CELL_RTOL, what='evaluation')
  _close(model.rnn.forward_rnn.cell.linen_variables()['batch_stats'], before,
         'statistics in evaluation')
