"""StackedRNN (depth, dropout, bidirectional), learned initial state, bfloat16 compute
and the remat modes, against the float64 reference in tests/reference.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bn_rnn_jax as br
import reference
from bn_rnn_jax import population

B, T, I, H = 4, 6, 3, 5
LENGTHS = np.array([6, 4, 2, 5])


def _make_data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, T, I)).astype(np.float32)
  mask = (np.arange(T)[None] < LENGTHS[:, None]).astype(np.float32)
  return x, mask


_DATA = _make_data()
W64 = np.random.default_rng(4).normal(size=(B, T, H))   # loss weights of the float64 test


@pytest.fixture(scope='module')
def data():
  return _DATA


def _np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def test_stack_equals_reference_layers_in_sequence(data):
  """Two stacked bn_lstm layers (no dropout) = the reference run twice, output to input."""
  x, mask = data
  stack = br.StackedRNN('bn_lstm', H, num_layers=2, layer_options={'max_length': T})
  variables = stack.init(jax.random.key(0), x, mask, train=True)
  (carries, out), _ = stack.apply(variables, x, mask, train=True, mutable=['batch_stats'])
  params = _np(variables['params'])
  hidden = np.asarray(x, np.float64)
  for index in range(2):
    carry, hidden, _ = reference.run_layer(params[f'layer_{index}'], hidden, mask, 'bn_lstm')
    np.testing.assert_allclose(np.asarray(carries[index][1]), carry[1], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out), hidden, rtol=1e-4, atol=1e-5)


def test_stack_dropout_is_active_only_in_training(data):
  x, mask = data
  stack = br.StackedRNN('lstm', H, num_layers=2, dropout_rate=0.5)
  variables = stack.init(jax.random.key(0), x, mask, train=False)
  _, eval_a = stack.apply(variables, x, mask, train=False)
  _, eval_b = stack.apply(variables, x, mask, train=False)
  np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))
  _, train_a = stack.apply(variables, x, mask, train=True, rngs={'dropout': jax.random.key(1)})
  _, train_b = stack.apply(variables, x, mask, train=True, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(np.asarray(train_a), np.asarray(train_b))
  # The output dropout zeroes about half of the valid entries.
  valid = np.broadcast_to(mask[..., None] > 0, train_a.shape)
  zero_fraction = np.mean(np.asarray(train_a)[valid] == 0.0)
  assert 0.3 < zero_fraction < 0.7


def test_bidirectional_stack_shapes_and_halves(data):
  x, mask = data
  stack = br.StackedRNN('bn_input_only_seq', H, num_layers=2, bidirectional=True)
  variables = stack.init(jax.random.key(0), x, mask, train=True)
  (carries, out), _ = stack.apply(variables, x, mask, train=True, mutable=['batch_stats'])
  assert out.shape == (B, T, 2 * H)
  assert len(carries) == 2 and len(carries[0]) == 2  # (forward, backward) per layer
  # Padded steps output zeros in both halves.
  np.testing.assert_array_equal(np.asarray(out)[mask == 0], 0.0)


def test_stack_rejects_carries_when_bidirectional(data):
  x, mask = data
  stack = br.StackedRNN('lstm', H, bidirectional=True)
  with pytest.raises(ValueError, match='initial_carries'):
    stack.init(jax.random.key(0), x, mask, train=False, initial_carries=[None])


def test_learned_initial_state_is_a_trained_parameter(data):
  x, mask = data
  layer = br.make_layer('bn_lstm', H, max_length=T, initial_state='learned')
  variables = layer.init(jax.random.key(0), x, mask, train=True)
  assert variables['params']['initial_hidden'].shape == (H,)
  assert variables['params']['initial_cell'].shape == (H,)
  params = _np(variables['params'])
  params['initial_hidden'] = np.linspace(-0.5, 0.5, H)
  params['initial_cell'] = np.linspace(0.3, -0.3, H)
  start = (np.tile(params['initial_cell'], (B, 1)), np.tile(params['initial_hidden'], (B, 1)))
  _, expected, _ = reference.run_layer(params, x, mask, 'bn_lstm', initial_carry=start)
  (_, out), _ = layer.apply({**variables, 'params': jax.tree.map(jnp.asarray, params)}, x,
                            mask, train=True, mutable=['batch_stats'])
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)

  def loss(p):
    (_, y), _ = layer.apply({**variables, 'params': p}, x, mask, train=True,
                            mutable=['batch_stats'])
    return jnp.sum(y ** 2)
  grads = jax.grad(loss)(variables['params'])
  assert float(jnp.linalg.norm(grads['initial_hidden'])) > 0.0


def test_bfloat16_compute_keeps_float32_statistics(data):
  x, mask = data
  layer32 = br.make_layer('bn_lstm', H, max_length=T)
  layer16 = br.make_layer('bn_lstm', H, max_length=T, dtype=jnp.bfloat16)
  variables = layer32.init(jax.random.key(0), x, mask, train=True)
  (_, y32), stats32 = layer32.apply(variables, x, mask, train=True, mutable=['batch_stats'])
  (_, y16), stats16 = layer16.apply(variables, x, mask, train=True, mutable=['batch_stats'])
  assert y16.dtype == jnp.float32
  for leaf in jax.tree.leaves(stats16):
    assert leaf.dtype == jnp.float32
  # bf16 matmuls carry ~3 significant digits.
  np.testing.assert_allclose(np.asarray(y16), np.asarray(y32), atol=3e-2)
  assert not np.array_equal(np.asarray(y16), np.asarray(y32))
  np.testing.assert_allclose(np.asarray(stats16['batch_stats']['cell']['mean']),
                             np.asarray(stats32['batch_stats']['cell']['mean']), atol=3e-2)


def test_auto_remat_on_cpu_follows_the_measured_rule():
  # policy.py: batch-normalised layers recompute the whole step up to H128 and store
  # the matmul outputs above; layers without batch norm store everything.
  assert jax.default_backend() == 'cpu'
  mode = lambda variant, hidden: br.make_layer(
      variant, hidden, max_length=T).execution_policy(64).remat
  assert [mode('bn_lstm', h) for h in (100, 128, 129, 240, 1000)] == [
      'full', 'full', 'dots', 'dots', 'dots']
  assert mode('bn_input_only', 100) == 'full'
  assert mode('lstm', 100) == mode('lstm', 1000) == 'none'


def test_auto_backward_on_cpu_follows_the_measured_rule():
  # policy.py: on CPU, LSTM layers take the whole-layer backward pass from H = 8 B.
  assert jax.default_backend() == 'cpu'
  uses_layer = lambda variant, hidden, batch: br.make_layer(
      variant, hidden, max_length=T).execution_policy(batch).backward == 'layer'
  assert [uses_layer('bn_lstm', h, 64) for h in (100, 511, 512, 1000)] == [
      False, False, True, True]
  assert uses_layer('lstm', 650, 32) and uses_layer('bn_input_only_seq', 250, 24)
  assert not uses_layer('lstm', 240, 40)
  assert not uses_layer('rnn', 1000, 8)
  assert br.make_layer('lstm', 1000, backward='scan').execution_policy(8).backward == 'scan'
  assert br.make_layer('lstm', 10, backward='layer').execution_policy(64).backward == 'layer'


@pytest.mark.parametrize('backward', ['scan', 'layer'])
@pytest.mark.parametrize('remat', ['none', 'dots', 'full'])
def test_remat_modes_give_the_same_gradients(data, remat, backward):
  x, mask = data
  base = br.make_layer('bn_lstm', H, max_length=T, remat='none', backward='scan')
  layer = br.make_layer('bn_lstm', H, max_length=T, remat=remat, backward=backward)
  variables = base.init(jax.random.key(0), x, mask, train=True)

  def loss(module, p):
    (_, y), _ = module.apply({**variables, 'params': p}, x, mask, train=True,
                             mutable=['batch_stats'])
    return jnp.sum(y ** 2)
  expected = jax.grad(lambda p: loss(base, p))(variables['params'])
  got = jax.grad(lambda p: loss(layer, p))(variables['params'])
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def _float64_layer(variant, backward):
  return br.make_layer(variant, H, max_length=T, backward=backward)


@functools.cache
def _float64_reference(variant):
  """Float64 parameters (the layer's init, cast), and the reference's outputs and
  finite-difference gradients of `sum(outputs * W64)` for them."""
  x, mask = (np.asarray(a, np.float64) for a in _DATA)
  with jax.enable_x64(True):
    variables = _float64_layer(variant, 'scan').init(jax.random.key(0), jnp.asarray(x),
                                                     jnp.asarray(mask), train=True)
  params = _np(variables['params'])
  _, want_out, _ = reference.run_layer(params, x, mask, variant)
  ref_loss = lambda a: np.sum(reference.run_layer(
      {k: v for k, v in a.items() if k != '__x'}, a['__x'], mask, variant)[1] * W64)
  return variables, want_out, reference.numerical_grad(ref_loss, {**params, '__x': x})


@pytest.mark.parametrize('variant', ['bn_lstm', 'rnn_bn_recurrence'])
@pytest.mark.parametrize('backward', ['scan', 'layer'])
def test_float64_end_to_end(variant, backward):
  """With `jax_enable_x64`, float64 parameters and inputs keep every matmul, output and
  gradient in float64: the layer then matches the float64 reference far below float32's
  precision (outputs to 1e-12, gradients to central finite differences' own ~1e-7)."""
  x, mask = (np.asarray(a, np.float64) for a in _DATA)
  variables, want_out, want = _float64_reference(variant)
  with jax.enable_x64(True):
    layer = _float64_layer(variant, backward)
    # Flax creates float32 parameters; a float64 model casts them.
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), variables['params'])

    def loss(p, x):
      (_, y), _ = layer.apply({**variables, 'params': p}, x, mask, train=True,
                              mutable=['batch_stats'])
      return jnp.sum(y * W64), y
    (_, out), (g_params, g_x) = jax.jit(jax.value_and_grad(
        loss, argnums=(0, 1), has_aux=True))(params, jnp.asarray(x))
  assert out.dtype == jnp.float64 and g_x.dtype == jnp.float64
  assert all(a.dtype == jnp.float64 for a in jax.tree.leaves(g_params))
  np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-12, atol=1e-12)
  for name, g in {**_np(g_params), '__x': np.asarray(g_x)}.items():
    scale = np.max(np.abs(want[name]))
    np.testing.assert_allclose(g, want[name], rtol=1e-6, atol=1e-6 * scale, err_msg=name)


def test_matmul_follows_float64_operands():
  with jax.enable_x64(True):
    a64, k64 = jnp.ones((2, 3), jnp.float64), jnp.ones((3, 4), jnp.float64)
    assert br.cells.matmul(a64, k64, jnp.float32).dtype == jnp.float64
    assert br.cells.matmul(a64.astype(jnp.float32), k64.astype(jnp.float32),
                           jnp.float32).dtype == jnp.float32
    # A narrower compute dtype is kept; the result is float32 or wider.
    assert br.cells.matmul(a64, k64, jnp.bfloat16).dtype == jnp.float64


def test_bad_remat_mode_is_a_clear_error(data):
  x, mask = data
  with pytest.raises(ValueError, match='remat'):
    br.make_layer('bn_lstm', H, max_length=T, remat='sometimes').init(
        jax.random.key(0), x, mask, train=True)


def test_estimate_population_stats_averages_minibatch_moments(data):
  """Input-term rows = the mean over batches of the float64 per-step moments of W_x x."""
  x, mask = data
  x2 = np.asarray(x)[::-1] * 1.5 + 0.3
  layer = br.make_layer('bn_lstm', H, max_length=T + 2)
  variables = layer.init(jax.random.key(0), x, mask, train=True)
  stats = br.estimate_population_stats(layer, variables, [(x, mask), (x2, mask)])
  kernel = np.asarray(variables['params']['input_kernel'], np.float64)
  expected_mean, expected_var = [], []
  for batch in (x, x2):
    z = np.asarray(batch, np.float64) @ kernel                       # [B, T, 4H]
    mean, var = [], []
    for t in range(T):
      rows = z[mask[:, t] > 0, t]
      mean.append(rows.mean(0))
      var.append(rows.var(0))
    expected_mean.append(mean)
    expected_var.append(var)
  site = stats['input']
  np.testing.assert_allclose(np.asarray(site['mean'])[:T], np.mean(expected_mean, 0),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(site['var'])[:T], np.mean(expected_var, 0),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(site['count']), [2.0] * T + [0.0, 0.0])
  # The running averages of `variables` were not touched.
  for leaf in jax.tree.leaves(variables['batch_stats']):
    assert not np.any(np.isnan(np.asarray(leaf)))
  # The estimate drives inference: rows past the last seen one reuse row T-1.
  _, out = layer.apply({**variables, 'batch_stats': stats}, x, mask, train=False)
  assert np.all(np.isfinite(np.asarray(out)))


def test_estimate_population_stats_compiles_once_per_model(data):
  """Repeated estimates (one per evaluation in a training loop) reuse the compiled pass,
  also for a model with an unhashable dict field; a noisy-h0 model draws fresh noise per
  batch from `rng`, so two equal batches give two different records."""
  x, mask = data
  model = br.SequenceClassifier(num_classes=2, variant='bn_lstm', hidden_size=H,
                                layer_options={'max_length': T, 'initial_state': 'noise'})
  variables = model.init({'params': jax.random.key(0), 'noise': jax.random.key(1)},
                         x, mask, train=False)
  before = population._minibatch_moments_jit._cache_size()
  first = br.estimate_population_stats(model, variables, [(x, mask)], rng=jax.random.key(2))
  for seed in range(3):
    br.estimate_population_stats(model, variables, [(x, mask)] * 2,
                                 rng=jax.random.key(seed))
  assert population._minibatch_moments_jit._cache_size() == before + 1
  # The recurrent term sees h0 noise from step 0: its row-0 mean depends on the draw,
  # and the two-batch average differs from either single draw.
  again = br.estimate_population_stats(model, variables, [(x, mask)] * 2,
                                       rng=jax.random.key(2))
  site_first = np.asarray(first['rnn']['layer_0']['recurrent']['mean'])[0]
  site_again = np.asarray(again['rnn']['layer_0']['recurrent']['mean'])[0]
  assert not np.allclose(site_first, site_again)
  with pytest.raises(Exception, match='noise'):
    br.estimate_population_stats(model, variables, [(x, mask)])
