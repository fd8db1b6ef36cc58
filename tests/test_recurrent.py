"""`recurrent.py`: `RecurrentLayer` against the float64 NumPy reference (`reference.py`).

Every variant in `variants.VARIANTS` is run in float32 JAX and compared with a naive
float64 step-by-step loop: outputs, final state, gradients (reference gradients by central
finite differences), the statistics written to `batch_stats` / `minibatch_moments`, and
inference with population statistics (running average and the papers' average of
minibatch moments), including sequences longer than `max_length`; in every execution form
(hoisted input projection, remat modes, both backward passes) and with the execution
policy the CPU resolves. The core tier runs a few forms of each sweep, the default run
every variant in one form and every form of the BN-LSTM, the exhaustive tier the cross
products (`helpers.core_cases`).

Shapes are tiny (B=4, T=5, I=3, H=4) and every jitted function is built once per
(variant, form, length) and shared between tests through `functools.cache`.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import batch_stats
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T, I, H = 4, 5, 3, 4
MAX_LEN = 7           # T_max: rows of per-step statistics
MOMENTUM = 0.9        # far from 1, so that one EMA step visibly moves the statistics
LENGTHS = (5, 2, 4, 5)   # uneven; the last step has only two valid rows
GARBAGE = 30.0        # scale of the junk put into padded positions

VARIANTS = tuple(variants.VARIANTS)
BATCH_VARIANTS = tuple(v for v in VARIANTS if ref.batch_sites(v))
# Sequence-wise input statistics always hoist the input projection: one form only.
ALWAYS_HOISTED = tuple(v for v in VARIANTS if ref.spec(v)['input_stats'] == 'sequence')
FORMS = tuple((v, hoist) for v in VARIANTS for hoist in (False, True)
              if not (hoist is False and v in ALWAYS_HOISTED))
# `RecurrentLayer.backward`: autodiff of the scan, or the whole-layer backward pass.
BACKWARDS = ('scan', 'layer')
# The default run's execution forms: every variant in its first form with the scan's
# backward pass, and every (hoist, backward) form of the BN-LSTM.
PAIRWISE = tuple(sorted({(v, ALWAYS_HOISTED.count(v) > 0, 'scan') for v in VARIANTS} |
                        {('bn_lstm', hoist, backward) for hoist in (False, True)
                         for backward in BACKWARDS}))


def _inputs(seed, lengths, length):
  """`x [B, T, I]` with large junk in the padded positions, and its mask."""
  rng = np.random.default_rng(seed)
  mask = helpers.prefix_mask(lengths, length, np.float64)
  x = rng.normal(size=(len(lengths), length, I))
  junk = GARBAGE * rng.normal(size=x.shape)
  return np.where(mask[..., None] > 0, x, junk), mask


X, MASK = _inputs(0, LENGTHS, T)
_rng = np.random.default_rng(1)
W_OUT = _rng.normal(size=(B, T, H))        # loss weights on the outputs
W_CARRY = _rng.normal(size=(2, B, H))      # loss weights on the final (c, h) / h


def _layer(variant, hoist=None, **overrides):
  return variants.make_layer(variant, H, max_length=MAX_LEN, momentum=MOMENTUM,
                              **helpers.with_execution(dict(overrides, hoist_input=hoist)))


@functools.cache
def variant_params(variant):
  """Random float64 parameters in the layer's layout, and fresh batch_stats shapes."""
  params, stats = helpers.reference_params(_layer(variant), (B, T, I),
                                           VARIANTS.index(variant) + 10)
  sites = {site: ref.init_population(s['mean'].shape[0], s['mean'].shape[1])
           for site, s in stats.items()}
  return params, sites


@functools.cache
def train_fn(variant, hoist, overrides=()):
  """jit(value_and_grad) of the weighted loss; aux = (carry, outputs, new collections)."""
  layer = _layer(variant, hoist, **dict(overrides))

  def loss(params, x, mask, batch_stats, w_out, w_carry):
    (carry, out), new = layer.apply(
        {'params': params, 'batch_stats': batch_stats}, x, mask, use_running_average=False,
        deterministic=False, mutable=['batch_stats', 'minibatch_moments'], return_carry=True)
    value = jnp.sum(out * w_out)
    for leaf, w in zip(jax.tree.leaves(carry), w_carry):
      value = value + jnp.sum(leaf * w)
    return value, (carry, out, new)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


@functools.cache
def eval_fn(variant, hoist):
  layer = _layer(variant, hoist)
  return jax.jit(lambda v, x, mask: layer.apply(v, x, mask, use_running_average=True,
                                                deterministic=True, return_carry=True))


def run_train(variant, hoist, x=X, mask=MASK, stats=None, w_out=W_OUT, overrides=()):
  params, fresh = variant_params(variant)
  stats = fresh if stats is None else stats
  (value, (carry, out, new)), (g_params, g_x) = train_fn(variant, hoist, overrides)(
      *helpers.float32((params, x, mask, stats, w_out, W_CARRY)))
  return dict(value=float(value), carry=helpers.float64(carry),
              out=np.asarray(out, np.float64),
              stats=helpers.float64(new.get('batch_stats', {})),
              moments=helpers.float64(new.get('minibatch_moments', {})),
              g_params=helpers.float64(g_params), g_x=np.asarray(g_x, np.float64))


@functools.cache
def cached_train(variant, hoist, backward='scan'):
  return run_train(variant, hoist, overrides=(('backward', backward),))


def ref_loss(variant, params, x, mask, w_out=W_OUT, **kw):
  carry, out, _ = ref.run_layer(params, x, mask, variant, **kw)
  value = np.sum(out * w_out)
  for leaf, w in zip(jax.tree.leaves(carry), W_CARRY):
    value += np.sum(leaf * w)
  return value


@functools.cache
def reference_train(variant):
  """Reference forward, moments and finite-difference gradients on (X, MASK)."""
  params, _ = variant_params(variant)
  carry, out, moments = ref.run_layer(params, X, MASK, variant)
  arrays = {**params, '__x': X}
  grads = ref.numerical_grad(
      lambda a: ref_loss(variant, {k: v for k, v in a.items() if k != '__x'}, a['__x'],
                         MASK), arrays)
  g_x = grads.pop('__x')
  return dict(carry=carry, out=out, moments=moments, g_params=grads, g_x=g_x)


# float32 against float64 (`helpers.assert_close`) at this suite's default tolerance.
assert_close = functools.partial(helpers.assert_close, rtol=1e-4)


def ref_records(variant, moments):
  return {site: ref.minibatch_record(moments[site], shared, 1 if shared else MAX_LEN)
          for site, shared in ref.batch_sites(variant).items()}


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize('variant,hoist,backward', helpers.core_cases(
    [form + (backward,) for backward in BACKWARDS for form in FORMS],
    core=[('bn_lstm', False, 'scan'), ('bn_lstm_shared', True, 'layer'),
          ('rnn_bn_input', True, 'scan')], also=PAIRWISE))
def test_training_matches_reference(variant, hoist, backward):
  """Outputs, final state, gradients and statistics in training mode, uneven mask."""
  got = cached_train(variant, hoist, backward)
  want = reference_train(variant)
  assert_close(got['out'], want['out'], what='outputs')
  assert np.all(got['out'][MASK == 0] == 0.0), 'padded outputs must be exactly 0'
  for g, w in zip(jax.tree.leaves(got['carry']), jax.tree.leaves(want['carry'])):
    assert_close(g, w, what='final carry')
  assert set(got['g_params']) == set(want['g_params'])
  for name, g in got['g_params'].items():
    assert_close(g, want['g_params'][name], rtol=2e-4, what=f'd loss / d {name}')
  assert_close(got['g_x'], want['g_x'], rtol=2e-4, what='d loss / d x')
  assert np.all(got['g_x'][MASK == 0] == 0.0), 'padded inputs must get no gradient'

  # One update from fresh statistics: every row this batch reached takes the batch value.
  records = ref_records(variant, want['moments'])
  assert set(got['stats']) == set(records)
  assert set(got['moments']) == set(records)
  for site, record in records.items():
    fresh = ref.init_population(*record['mean'].shape)
    expected = ref.ema_update(fresh, record, MOMENTUM)
    for key in ('mean', 'var', 'count'):
      assert_close(got['stats'][site][key], expected[key], what=f'batch_stats {site} {key}')
      assert_close(got['moments'][site][key], record[key], what=f'batch_moments {site} {key}')


@pytest.mark.parametrize('variant', helpers.core_cases(
    [v for v in VARIANTS if v not in ALWAYS_HOISTED], core=['bn_lstm']))
def test_hoisted_equals_in_step(variant):
  """The hoisted input projection computes the same function as the in-step one.

  Both also match the naive loop of the reference (test above); here they are compared
  with each other directly. They differ only by float32 rounding, which the two-row batch
  statistics of the last step amplify (up to ~4e-4 relative, measured, on d loss / d x).
  """
  a, b = cached_train(variant, False), cached_train(variant, True)
  assert_close(a['out'], b['out'], rtol=1e-5, what='outputs')
  assert_close(a['g_x'], b['g_x'], rtol=5e-4, what='d loss / d x')
  for name in a['g_params']:
    assert_close(a['g_params'][name], b['g_params'][name], rtol=5e-4, what=name)
  for site in a['stats']:
    for key in ('mean', 'var', 'count'):
      assert_close(a['stats'][site][key], b['stats'][site][key], rtol=1e-5, what=site)


@pytest.mark.slow
@pytest.mark.parametrize('backward', BACKWARDS)
def test_remat_and_unroll_match_reference(backward):
  """The other forms of the scan (recomputed activations, unrolled steps) compute the
  same function, gradients included."""
  got = run_train('bn_lstm', False,
                  overrides=(('remat', 'full'), ('unroll', 2), ('backward', backward)))
  want = reference_train('bn_lstm')
  assert_close(got['out'], want['out'], what='outputs')
  for name, g in got['g_params'].items():
    assert_close(g, want['g_params'][name], rtol=2e-4, what=f'd loss / d {name}')
  assert_close(got['g_x'], want['g_x'], rtol=2e-4, what='d loss / d x')


@functools.cache
def remat_train(remat, backward):
  return run_train('bn_lstm', False, overrides=(('remat', remat), ('backward', backward)))


@pytest.mark.parametrize('remat,backward', helpers.core_cases(
    [(remat, backward) for backward in BACKWARDS for remat in ('none', 'dots', 'full')],
    core=[('dots', 'layer')]))
def test_remat_modes_give_the_same_gradients(remat, backward):
  """Each (remat, backward) form has the float64 reference's gradients; every form but
  the baseline (the autodiff of a scan that stores everything, remat 'none') also has the
  baseline's gradients up to float32 rounding."""
  got = remat_train(remat, backward)
  want = reference_train('bn_lstm')
  for name, g in got['g_params'].items():
    assert_close(g, want['g_params'][name], rtol=2e-4, what=f'd loss / d {name}')
  assert_close(got['g_x'], want['g_x'], rtol=2e-4, what='d loss / d x')
  if (remat, backward) == ('none', 'scan'):
    return
  base = remat_train('none', 'scan')
  for name, g in got['g_params'].items():
    np.testing.assert_allclose(g, base['g_params'][name], rtol=1e-5, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(got['g_x'], base['g_x'], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('backward', helpers.core_cases(BACKWARDS, core=['scan']))
def test_initial_carry_and_its_gradient(backward):
  """A given initial state (e.g. carried over truncated-BPTT segments) is used as h_0, c_0."""
  variant = 'bn_lstm'
  layer = _layer(variant, backward=backward)
  params, fresh = variant_params(variant)
  rng = np.random.default_rng(5)
  c0, h0 = rng.normal(size=(B, H)), rng.normal(size=(B, H))

  def loss(carry0):
    (carry, out), _ = layer.apply({'params': helpers.float32(params),
                                   'batch_stats': helpers.float32(fresh)},
                                  helpers.float32(X), helpers.float32(MASK),
                                  use_running_average=False, deterministic=False,
                                  initial_carry=carry0, mutable=['batch_stats'],
                                  return_carry=True)
    return jnp.sum(out * W_OUT) + jnp.sum(carry[0] * W_CARRY[0]) + jnp.sum(
        carry[1] * W_CARRY[1])

  value, (g_c, g_h) = jax.jit(jax.value_and_grad(loss))(helpers.float32((c0, h0)))
  want = ref.numerical_grad(
      lambda a: ref_loss(variant, params, X, MASK, initial_carry=(a['c'], a['h'])),
      {'c': c0, 'h': h0})
  assert_close(value, ref_loss(variant, params, X, MASK, initial_carry=(c0, h0)))
  assert_close(g_c, want['c'], rtol=2e-4, what='d loss / d c0')
  assert_close(g_h, want['h'], rtol=2e-4, what='d loss / d h0')


@pytest.mark.slow
def test_learned_initial_state_is_a_trained_parameter():
  x, mask = helpers.uneven_batch(I)       # lengths 6, 4, 2, 5
  hidden, length = 5, x.shape[1]
  layer = variants.make_layer('bn_lstm', hidden, max_length=length, initial_state='learned')
  variables = layer.init(jax.random.key(0), x, mask, use_running_average=False,
                         deterministic=False)
  assert variables['params']['initial_hidden'].shape == (hidden,)
  assert variables['params']['initial_cell'].shape == (hidden,)
  params = helpers.float64(variables['params'])
  params['initial_hidden'] = np.linspace(-0.5, 0.5, hidden)
  params['initial_cell'] = np.linspace(0.3, -0.3, hidden)
  start = tuple(np.tile(params[name], (len(x), 1)) for name in ('initial_cell',
                                                                 'initial_hidden'))
  _, expected, _ = ref.run_layer(params, x, mask, 'bn_lstm', initial_carry=start)
  out, _ = layer.apply({**variables, 'params': jax.tree.map(jnp.asarray, params)}, x,
                       mask, use_running_average=False, deterministic=False,
                       mutable=['batch_stats'])
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)

  def loss(p):
    y, _ = layer.apply({**variables, 'params': p}, x, mask, use_running_average=False,
                       deterministic=False, mutable=['batch_stats'])
    return jnp.sum(y ** 2)
  grads = jax.grad(loss)(variables['params'])
  assert float(jnp.linalg.norm(grads['initial_hidden'])) > 0.0


# ----------------------------------------------------------------------------- inference

# Two training batches of length T: in batch A the last step is all padding (its row must
# not be updated and does not count as seen); batch B reaches it, so there the row's first
# update takes the batch value while rows 0..3 get an EMA step.
LENGTHS_A = (4, 2, 3, 4)
X_A, MASK_A = _inputs(2, LENGTHS_A, T)
X_B, MASK_B = _inputs(3, LENGTHS, T)
# Inference on T_EVAL > MAX_LEN steps: past the last trained row (4), and past T_max.
T_EVAL = 9
#: The layers' inference rule for thinly supported rows (`RecurrentLayer.min_row_support`).
SUPPORT = normalization.DEFAULT_MIN_ROW_SUPPORT
LENGTHS_EVAL = (9, 3, 7, 6)
X_EVAL, MASK_EVAL = _inputs(4, LENGTHS_EVAL, T_EVAL)


def _population_inputs(variant, stats):
  """`{site: (mean [T_EVAL, F], var [T_EVAL, F])}` for the reference, rows looked up."""
  return {site: ref.population_lookup(stats[site], T_EVAL, SUPPORT)
          for site in ref.batch_sites(variant)}


@functools.cache
def population_runs(variant, hoist):
  """Two training batches through the layer: running average and the moment records."""
  _, fresh = variant_params(variant)
  run_a = run_train(variant, hoist, X_A, MASK_A, fresh)
  run_b = run_train(variant, hoist, X_B, MASK_B, run_a['stats'])
  return run_a, run_b


def _check_inference(variant, hoist, stats):
  params, _ = variant_params(variant)
  variables = {'params': helpers.float32(params), 'batch_stats': helpers.float32(stats)}
  carry, out = eval_fn(variant, hoist)(variables, helpers.float32(X_EVAL),
                                       helpers.float32(MASK_EVAL))
  want_carry, want_out, _ = ref.run_layer(params, X_EVAL, MASK_EVAL, variant, train=False,
                                          population=_population_inputs(variant, stats))
  assert_close(out, want_out, what='inference outputs')
  for g, w in zip(jax.tree.leaves(helpers.float64(carry)), jax.tree.leaves(want_carry)):
    assert_close(g, w, what='inference final carry')


POPULATION_FORMS = helpers.core_cases([f for f in FORMS if f[0] in BATCH_VARIANTS],
                                      core=[('bn_lstm', False)])


@pytest.mark.parametrize('variant,hoist', POPULATION_FORMS)
def test_running_average_population_inference(variant, hoist):
  params, fresh = variant_params(variant)
  _, run_b = population_runs(variant, hoist)
  _, _, moments_a = ref.run_layer(params, X_A, MASK_A, variant)
  _, _, moments_b = ref.run_layer(params, X_B, MASK_B, variant)
  rec_a, rec_b = ref_records(variant, moments_a), ref_records(variant, moments_b)
  want = {site: ref.ema_update(ref.ema_update(fresh[site], rec_a[site], MOMENTUM),
                               rec_b[site], MOMENTUM) for site in rec_a}
  for site, stats in want.items():
    if not ref.batch_sites(variant)[site]:
      # The per-step rows count the valid sequences of both batches: row 4 was
      # padding-only in batch A (not updated there) and first reached by batch B; rows
      # 5, 6 were never reached.
      steps = np.asarray(MASK_A).sum(0) + np.asarray(MASK_B).sum(0)
      assert steps[4] == np.asarray(MASK_B).sum(0)[4] > 0
      np.testing.assert_array_equal(stats['count'], list(steps[:5]) + [0, 0])
    for key in ('mean', 'var', 'count'):
      assert_close(run_b['stats'][site][key], want[site][key], what=f'{site} {key}')
  _check_inference(variant, hoist, run_b['stats'])


@pytest.mark.parametrize('variant,hoist', POPULATION_FORMS)
def test_average_of_minibatch_moments_population_inference(variant, hoist):
  """The papers' estimate: minibatch moments averaged by `average_minibatch_moments`."""
  params, _ = variant_params(variant)
  run_a, run_b = population_runs(variant, hoist)
  records = [run_a['moments'], run_b['moments']]
  estimate = helpers.float64(population.average_minibatch_moments(helpers.float32(records)))
  want_records = [ref_records(variant, ref.run_layer(params, x, m, variant)[2])
                  for x, m in ((X_A, MASK_A), (X_B, MASK_B))]
  for site in want_records[0]:
    want = ref.average_records([r[site] for r in want_records])
    for key in ('mean', 'var', 'count'):
      assert_close(estimate[site][key], want[key], what=f'{site} {key}')
  _check_inference(variant, hoist, estimate)


@pytest.mark.parametrize('variant', helpers.core_cases(
    [v for v in VARIANTS if v not in BATCH_VARIANTS], core=['ln_lstm']))
def test_inference_without_batch_statistics(variant):
  """Variants with no batch norm compute the same function in inference, at any length."""
  params, _ = variant_params(variant)
  carry, out = eval_fn(variant, False)({'params': helpers.float32(params)},
                                       helpers.float32(X_EVAL), helpers.float32(MASK_EVAL))
  want_carry, want_out, _ = ref.run_layer(params, X_EVAL, MASK_EVAL, variant, train=False)
  assert_close(out, want_out)
  for g, w in zip(jax.tree.leaves(helpers.float64(carry)), jax.tree.leaves(want_carry)):
    assert_close(g, w)


def test_fresh_statistics_are_mean0_var1_unseen():
  layer = _layer('bn_lstm')
  variables = jax.jit(functools.partial(layer.init, use_running_average=True,
                                        deterministic=True))(
      jax.random.key(0), jnp.zeros((B, T, I)))
  for site in ('recurrent', 'input', 'cell'):
    stats = helpers.float64(variables['batch_stats'][site])
    features = H if site == 'cell' else 4 * H
    np.testing.assert_array_equal(stats['mean'], np.zeros((MAX_LEN, features)))
    np.testing.assert_array_equal(stats['var'], np.ones((MAX_LEN, features)))
    np.testing.assert_array_equal(stats['count'], np.zeros(MAX_LEN))


# ----------------------------------------------------------------------------- few valid rows
MIN_STEP_COUNT = 3   # with LENGTHS (5, 2, 4, 5), step 4 (two valid rows) falls back
# Variants with per-step training moments (all batch variants but sequence-wise input only).
GUARDED_FORMS = tuple(
    (v, hoist) for v, hoist in FORMS if v in BATCH_VARIANTS
    and any(site != 'input' or ref.spec(v)['input_stats'] == 'frame'
            for site in ref.batch_sites(v)))


def _per_step_training(variant, site):
  return site != 'input' or ref.spec(variant)['input_stats'] == 'frame'


@functools.cache
def earlier_population(variant):
  """Population statistics as after some training: random rows; the per-step rows 0-3
  seen (twice), rows 4-6 never, so that step 4 reads row 3 (Cooijmans' reuse rule)."""
  _, fresh = variant_params(variant)
  rng = np.random.default_rng(5)
  stats = {}
  for site, site_stats in fresh.items():
    rows, features = site_stats['mean'].shape
    count = np.full(rows, 2.0) if rows == 1 else np.array([2, 2, 2, 2, 0, 0, 0], float)
    stats[site] = {'mean': rng.normal(size=(rows, features)) * (count[:, None] > 0),
                   'var': np.where(count[:, None] > 0,
                                   rng.uniform(0.5, 2.0, size=(rows, features)), 1.0),
                   'count': count}
  return stats


@pytest.mark.parametrize('variant,hoist,backward', helpers.core_cases(
    [form + (backward,) for backward in BACKWARDS for form in GUARDED_FORMS],
    core=[('bn_lstm', False, 'scan')]))
def test_steps_with_too_few_valid_rows_use_the_population_rows(variant, hoist, backward):
  """`min_step_count`: a training step with fewer valid rows normalises with the
  population rows (row min(t, last seen)), not its own moments, and writes no statistics."""
  params, _ = variant_params(variant)
  stats = earlier_population(variant)
  got = run_train(variant, hoist, stats=stats, overrides=(
      ('min_step_count', MIN_STEP_COUNT), ('backward', backward)))
  fallback = {site: ref.population_lookup(stats[site], T, SUPPORT) for site in stats
              if _per_step_training(variant, site)}
  guard = dict(min_step_count=MIN_STEP_COUNT, fallback=fallback)
  carry, out, moments = ref.run_layer(params, X, MASK, variant, **guard)
  arrays = {**params, '__x': X}
  grads = ref.numerical_grad(lambda a: ref_loss(
      variant, {k: v for k, v in a.items() if k != '__x'}, a['__x'], MASK, **guard), arrays)
  g_x = grads.pop('__x')

  assert_close(got['out'], out, what='outputs')
  # The guard changed something: the unguarded run normalises step 4 by its own moments.
  assert np.max(np.abs(got['out'][:, 4] - cached_train(variant, hoist)['out'][:, 4])) > 1e-3
  for g, w in zip(jax.tree.leaves(got['carry']), jax.tree.leaves(carry)):
    assert_close(g, w, what='final carry')
  for name, g in got['g_params'].items():
    assert_close(g, grads[name], rtol=2e-4, what=f'd loss / d {name}')
  assert_close(got['g_x'], g_x, rtol=2e-4, what='d loss / d x')
  for site, shared in ref.batch_sites(variant).items():
    min_count = MIN_STEP_COUNT if _per_step_training(variant, site) else 1
    record = ref.minibatch_record(moments[site], shared, 1 if shared else MAX_LEN, min_count)
    expected = ref.ema_update(stats[site], record, MOMENTUM)
    if not shared:
      np.testing.assert_array_equal(got['stats'][site]['count'], expected['count'])
      if min_count > 1:  # the steps that fell back wrote nothing
        assert not np.any(np.asarray(got['stats'][site]['count'])[4:])
    for key in ('mean', 'var', 'count'):
      assert_close(got['stats'][site][key], expected[key], what=f'batch_stats {site} {key}')


@pytest.mark.slow
def test_coinciding_rows_at_late_steps_keep_the_gradient_bounded():
  """Two identical sequences outlast the rest of the batch (a question drawn twice): their
  per-step moments have zero variance, and every such step multiplies the gradient by
  about gamma / sqrt(epsilon) = 32 (the Attentive Reader's BN-e* stopped on an infinite
  gradient that way). With `min_step_count` those steps use the population rows."""
  length, lengths = 24, (24, 24, 3, 2)
  rng = np.random.default_rng(11)
  x = rng.normal(size=(B, length, I))
  x[1] = x[0]
  mask = helpers.prefix_mask(lengths, length, np.float64)
  w_out = rng.normal(size=(B, length, H))   # different losses: the two rows' gradients differ

  def largest_gradient(min_step_count):
    layer = variants.make_layer('bn_lstm', H, max_length=length,
                                 min_step_count=min_step_count)
    variables = layer.init(jax.random.key(0), jnp.zeros((B, length, I)),
                           use_running_average=True, deterministic=True)
    # The statistics are traced and never trained, as in a training loop's first step.
    def loss(params, stats, x):
      out, _ = layer.apply({'params': params, 'batch_stats': stats},
                           x, jnp.asarray(mask), use_running_average=False,
                           deterministic=False, mutable=['batch_stats'])
      return jnp.sum(out * w_out)
    grads = jax.jit(jax.grad(loss, argnums=(0, 2)))(
        variables['params'], variables['batch_stats'], jnp.asarray(x))
    largest = [float(np.max(np.abs(g))) for g in jax.tree.leaves(grads)]
    return max(largest) if np.all(np.isfinite(largest)) else np.inf   # max() skips NaN

  unguarded, guarded = largest_gradient(1), largest_gradient(3)
  assert unguarded > 1e8, unguarded   # inf when not finite
  assert np.isfinite(guarded) and guarded < 1e3, guarded


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize('variant', helpers.core_cases(BATCH_VARIANTS, core=['bn_lstm']))
def test_padding_invariance(variant):
  """Extra all-padding steps and different junk in padded positions change nothing.

  Only the variants with batch statistics: there padding could leak through the moments;
  the per-row state handling of the others is the same code, and the reference test above
  already feeds them junk in padded positions.
  """
  hoist = variant in ALWAYS_HOISTED
  base = cached_train(variant, hoist)
  extra = 2                                        # T + extra <= MAX_LEN: still trainable
  rng = np.random.default_rng(7)
  mask = np.concatenate([MASK, np.zeros((B, extra))], axis=1)
  x = GARBAGE * rng.normal(size=(B, T + extra, I))
  x[mask > 0] = X[MASK > 0]
  w_out = rng.normal(size=(B, T + extra, H))
  w_out[:, :T] = W_OUT
  got = run_train(variant, hoist, x, mask, w_out=w_out)
  np.testing.assert_allclose(got['out'][:, :T], base['out'], rtol=1e-6, atol=1e-6)
  assert np.all(got['out'][:, T:] == 0.0)
  for a, b in zip(jax.tree.leaves(got['carry']), jax.tree.leaves(base['carry'])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  for name, g in got['g_params'].items():
    np.testing.assert_allclose(g, base['g_params'][name], rtol=1e-5, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(got['g_x'][:, :T], base['g_x'], rtol=1e-5, atol=1e-6)
  assert np.all(got['g_x'][mask == 0] == 0.0)
  for collection in ('stats', 'moments'):
    for site, stats in got[collection].items():
      for key, value in stats.items():
        np.testing.assert_allclose(value, base[collection][site][key], rtol=1e-6,
                                   atol=1e-7, err_msg=f'{collection} {site} {key}')


# ----------------------------------------------------------------------------- zero variance


@pytest.mark.slow
@pytest.mark.parametrize('initial_state', ['noise', 'zeros'])
def test_constant_input_gradients_with_and_without_noise(initial_state):
  """Cooijmans sec. 5.1: inputs identical across the batch (black MNIST rows) give the
  hidden state zero batch variance; normalising it divides 0 by sqrt(epsilon), which leaves
  the forward pass alone but blows up the backward pass. Noise on h_0 prevents it.

  Measured at (bn_lstm at its initial parameters, B=4, H=4, input 1.0 everywhere,
  epsilon 1e-5, loss = weighted sum of the outputs), with zero h_0: largest parameter
  gradient ~5e2 after 4 steps, ~3e12 after 8, inf/NaN from 16 steps on (input gradient
  ~4e9 after 4 steps, ~2e19 after 8); so after 128 steps the gradients are not finite.
  With noise (std 0.1) they are finite; the largest parameter gradient depends on the draw
  (B=4 only): 1e2 to 1.2e5 over the noise keys 0-7 (per-example draws), far below the
  explosion without noise.
  """
  length = 128
  layer = variants.make_layer('bn_lstm', H, max_length=length, initial_state=initial_state)
  x = jnp.ones((B, length, 1))
  w = jax.random.normal(jax.random.key(1), (B, length, H))

  @jax.jit
  def grads(x):
    # Initial parameters (gamma 0.1), initialised in the same jit: one compilation.
    variables = layer.init(jax.random.key(0), x, use_running_average=True,
                           deterministic=True)
    def loss(params, x):
      out, _ = layer.apply({'params': params, 'batch_stats': variables['batch_stats']},
                           x, use_running_average=False, deterministic=False,
                           mutable=['batch_stats'], rngs={'noise': jax.random.key(3)})
      return jnp.sum(out * w)
    return jax.grad(loss, argnums=(0, 1))(variables['params'], x)

  g_params, g_x = grads(x)
  leaves = [np.asarray(a) for a in jax.tree.leaves((g_params, g_x))]
  all_finite = all(np.all(np.isfinite(a)) for a in leaves)
  if initial_state == 'noise':
    assert all_finite
    assert max(float(np.max(np.abs(a))) for a in jax.tree.leaves(g_params)) < 1e6
  else:
    assert not all_finite, 'expected the zero-variance gradient explosion of the paper'


# ----------------------------------------------------------------------------- errors


def test_training_longer_than_max_length_is_an_error():
  layer = _layer('bn_lstm')
  x = jnp.zeros((B, MAX_LEN + 2, I))
  with pytest.raises(ValueError, match=rf'{MAX_LEN + 2} time steps.*max_length={MAX_LEN}'):
    layer.init(jax.random.key(0), x, use_running_average=False, deterministic=False)


@pytest.mark.parametrize('variant', ['bn_input_only_seq', 'bn_lstm_shared'])
def test_statistics_without_per_step_rows_take_any_length(variant):
  """Sequence-wise and shared statistics keep one row: batch statistics run on sequences
  longer than `max_length` (a batch-statistics evaluation of long sentences) and give
  what a layer with room for every step gives."""
  x = jax.random.normal(jax.random.key(1), (B, 3 * MAX_LEN, I))
  results = []
  for max_length in (MAX_LEN, 3 * MAX_LEN):
    layer = variants.make_layer(variant, H, max_length=max_length)
    variables = layer.init(jax.random.key(0), x[:, :MAX_LEN], use_running_average=True,
                           deterministic=True)
    results.append(layer.apply(variables, x, use_running_average=False,
                               deterministic=True, mutable=['batch_stats']))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               results[0], results[1])


def test_max_length_none_is_the_length_of_the_init_input():
  """Without `max_length` the per-step statistics get the rows of `init`'s input; a
  training sequence longer than that is the same error, inference past it reuses the
  last row."""
  layer = variants.make_layer('bn_input_only_seq', H, cell_norm='batch')
  variables = layer.init(jax.random.key(0), jnp.zeros((B, T, I)), use_running_average=True,
                         deterministic=True)
  rows = jax.tree.map(lambda a: a.shape[0], variables['batch_stats'])
  assert rows == {'cell': {'count': T, 'mean': T, 'var': T},
                  'input': {'count': 1, 'mean': 1, 'var': 1}}  # sequence-wise: one row
  train = lambda x: layer.apply(variables, x, use_running_average=False, deterministic=False,
                                mutable=['batch_stats'])
  _, updated = train(jnp.ones((B, T, I)))
  with pytest.raises(ValueError, match=rf'{T + 1} time steps.*max_length={T} rows'):
    train(jnp.ones((B, T + 1, I)))
  out = layer.apply({**variables, **updated}, jnp.ones((B, 3 * T, I)),
                    use_running_average=True, deterministic=True)
  assert out.shape == (B, 3 * T, H)
  norm = batch_stats.MaskedBatchNorm()
  assert norm.init(jax.random.key(0), jnp.ones((B, T, 2)),
                   use_running_average=True)['batch_stats']['stats']['count'].shape == (T,)


def test_bad_inputs_are_clear_errors():
  layer = _layer('bn_lstm')
  x = jnp.zeros((B, T, I))
  with pytest.raises(ValueError, match=r'mask must be \[batch, time\].*\(4, 6\)'):
    layer.init(jax.random.key(0), x, jnp.ones((B, T + 1)), use_running_average=True,
               deterministic=True)
  with pytest.raises(ValueError, match=r'\[batch, time, features\].*\(4, 5\)'):
    layer.init(jax.random.key(0), jnp.zeros((B, T)), use_running_average=True,
               deterministic=True)
  with pytest.raises(ValueError, match='min_step_count must be at least 1; got 0'):
    _layer('bn_lstm', min_step_count=0).init(jax.random.key(0), x, use_running_average=True,
                                             deterministic=True)
  with pytest.raises(ValueError, match='min_step_count guards masked per-step'):
    _layer('bn_lstm', min_step_count=2, padded_statistics=True).init(
        jax.random.key(0), x, use_running_average=True, deterministic=True)
  with pytest.raises(ValueError, match=r'initial_carry must be \(c, h\), each \[batch, '
                     r'features\] = \(4, 4\); got shapes \[\(3, 4\), \(3, 4\)\]') as error:
    layer.init(jax.random.key(0), x, use_running_average=True, deterministic=True,
               initial_carry=(jnp.zeros((3, H)), jnp.zeros((3, H))))
  helpers.one_line(error)


def test_bad_remat_mode_is_a_clear_error():
  with pytest.raises(ValueError, match='remat'):
    _layer('bn_lstm', remat='sometimes').init(jax.random.key(0), jnp.zeros((B, T, I)),
                                              use_running_average=False, deterministic=False)


def test_training_on_what_looks_padded_without_a_mask_warns():
  """Rows ending in all-zero frames of different lengths, with no mask: the padding would
  count as data, so a training call warns (once per place); with the mask it does not, nor
  evaluation, nor data with zeros inside its rows."""
  layer = _layer('bn_lstm')
  x = np.random.default_rng(0).normal(size=(B, T, I)).astype(np.float32)
  padded = np.where(helpers.prefix_mask((5, 3, 4, 5), T)[..., None] > 0, x, 0.0)
  variables = layer.init(jax.random.key(0), x, use_running_average=True, deterministic=True)
  train = lambda x, *mask: layer.apply(variables, x, *mask, use_running_average=False,
                                       deterministic=False, mutable=['batch_stats'])
  with pytest.warns(UserWarning, match='the padding counts in the batch statistics as data'):
    train(padded)
  inside = padded.copy()
  inside[0, 1] = 0.0                                  # a zero frame that is data
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    train(padded, helpers.prefix_mask((5, 3, 4, 5), T))
    train(inside)
