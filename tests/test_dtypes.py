"""Compute dtypes of a recurrent layer against the float64 reference: with
`jax_enable_x64`, float64 parameters and inputs keep the whole layer (outputs and
gradients, both backward passes) in float64; bfloat16 matmuls keep float32 outputs and
statistics, and on thin rows only the matmuls take bfloat16 operands."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bn_rnn_jax as br
from bn_rnn_jax import normalization
import helpers
import reference

B, T, I, H = 4, 6, 3, 5   # `helpers.uneven_batch`
_DATA = helpers.uneven_batch(features=I)
W64 = np.random.default_rng(4).normal(size=(B, T, H))   # loss weights of the float64 test


@pytest.fixture(scope='module')
def data():
  return _DATA


def _float64_layer(variant, backward):
  return br.make_layer(variant, H, max_length=T, execution=br.Execution(backward=backward))


@functools.cache
def _float64_reference(variant):
  """Float64 parameters (the layer's init, cast), and the reference's outputs and
  finite-difference gradients of `sum(outputs * W64)` for them."""
  x, mask = (np.asarray(a, np.float64) for a in _DATA)
  with jax.enable_x64(True):
    variables = _float64_layer(variant, 'scan').init(jax.random.key(0), jnp.asarray(x),
                                                     jnp.asarray(mask),
                                                     use_running_average=False,
                                                     deterministic=False)
  params = helpers.float64(variables['params'])
  _, want_out, _ = reference.run_layer(params, x, mask, variant)
  ref_loss = lambda a: np.sum(reference.run_layer(
      {k: v for k, v in a.items() if k != '__x'}, a['__x'], mask, variant)[1] * W64)
  return variables, want_out, reference.numerical_grad(ref_loss, {**params, '__x': x})


@pytest.mark.parametrize('backward,variant', helpers.core_cases(
    [(backward, variant) for variant in ('bn_lstm', 'rnn_bn_recurrence')
     for backward in ('scan', 'layer')],
    core=[('layer', 'rnn_bn_recurrence')]))
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
      y, _ = layer.apply({**variables, 'params': p}, x, mask, use_running_average=False,
                         deterministic=False, mutable=['batch_stats'])
      return jnp.sum(y * W64), y
    (_, out), (g_params, g_x) = jax.jit(jax.value_and_grad(
        loss, argnums=(0, 1), has_aux=True))(params, jnp.asarray(x))
  assert out.dtype == jnp.float64 and g_x.dtype == jnp.float64
  assert all(a.dtype == jnp.float64 for a in jax.tree.leaves(g_params))
  np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-12, atol=1e-12)
  for name, g in {**helpers.float64(g_params), '__x': np.asarray(g_x)}.items():
    scale = np.max(np.abs(want[name]))
    np.testing.assert_allclose(g, want[name], rtol=1e-6, atol=1e-6 * scale, err_msg=name)


def test_float32_model_stays_float32_under_x64(data):
  """`jax_enable_x64` does not widen a float32 model (Flax's `param_dtype` rule): its
  parameters, carry and outputs stay float32 and match the same call without x64."""
  x, mask = data
  layer = br.make_layer('bn_lstm', H, max_length=T)

  def train(x64):
    with jax.enable_x64(x64):
      variables = layer.init(jax.random.key(0), x, mask, use_running_average=True)
      (carry, out), _ = layer.apply(variables, x, mask, use_running_average=False,
                                    return_carry=True, mutable=['batch_stats'])
    return variables['params'], carry, out
  params, carry, out = train(True)
  assert {a.dtype for a in jax.tree.leaves((params, carry, out))} == {jnp.dtype('float32')}
  np.testing.assert_allclose(out, train(False)[2], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_bfloat16_compute_gives_bfloat16_outputs_and_keeps_float32_statistics(data):
  x, mask = data
  layer32 = br.make_layer('bn_lstm', H, max_length=T)
  layer16 = br.make_layer('bn_lstm', H, max_length=T, dtype=jnp.bfloat16)
  variables = layer32.init(jax.random.key(0), x, mask, use_running_average=False,
                           deterministic=False)
  run = lambda layer: layer.apply(variables, x, mask, use_running_average=False,
                                  deterministic=False, mutable=['batch_stats'])
  (y32, stats32), (y16, stats16) = run(layer32), run(layer16)
  assert y16.dtype == jnp.bfloat16 and y32.dtype == jnp.float32
  for leaf in jax.tree.leaves(stats16):
    assert leaf.dtype == jnp.float32
  # bf16 matmuls carry ~3 significant digits.
  np.testing.assert_allclose(np.asarray(y16), np.asarray(y32), atol=3e-2)
  assert not np.array_equal(np.asarray(y16), np.asarray(y32))
  np.testing.assert_allclose(np.asarray(stats16['batch_stats']['cell']['mean']),
                             np.asarray(stats32['batch_stats']['cell']['mean']), atol=3e-2)


def test_batch_norm_gradient_has_the_dtype_of_x():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(6, 4)), jnp.bfloat16)
  dx = jax.grad(lambda x: jnp.sum(normalization.batch_norm(x, jnp.ones(4))[0] ** 2))(x)
  assert dx.dtype == jnp.bfloat16


def test_layer_norm_statistics_are_float32():
  """A bfloat16 input far from zero: statistics computed in bfloat16 (spacing 2 at 256)
  would get the mean and the deviations wrong; in float32 they are those of the exact
  float32 values of the bfloat16 input."""
  x = jnp.asarray([[256.0, 257.0, 258.0, 259.0]], jnp.float32)
  got = normalization.layer_norm(x.astype(jnp.bfloat16))
  assert got.dtype == jnp.float32
  want = normalization.layer_norm(x.astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_float64_statistics_follow_their_dtype():
  """With `jax_enable_x64`, a float64 layer's running average (counts and rates included)
  is float64 and matches the float64 reference's two updates to 1e-12."""
  x, mask = (np.asarray(a, np.float64) for a in _DATA)
  variables, _, _ = _float64_reference('bn_lstm')
  params = helpers.float64(variables['params'])
  momentum = 0.9
  with jax.enable_x64(True):
    layer = br.make_layer('bn_lstm', H, max_length=T, momentum=momentum)
    f64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), variables)
    stats = f64['batch_stats']
    for scale in (1.0, 2.0):
      _, new = layer.apply({**f64, 'batch_stats': stats}, jnp.asarray(scale * x),
                           jnp.asarray(mask), use_running_average=False, deterministic=False,
                           mutable=['batch_stats'])
      stats = new['batch_stats']
  assert all(a.dtype == jnp.float64 for a in jax.tree.leaves(stats))
  want = {site: reference.init_population(*s['mean'].shape)
          for site, s in variables['batch_stats'].items()}
  for scale in (1.0, 2.0):
    moments = reference.run_layer(params, scale * x, mask, 'bn_lstm')[2]
    want = {site: reference.ema_update(want[site], reference.minibatch_record(
        moments[site], False, T), momentum) for site in want}
  for site in want:
    for key in ('mean', 'var', 'count'):
      np.testing.assert_allclose(np.asarray(stats[site][key]), want[site][key], rtol=1e-12,
                                 atol=1e-12, err_msg=f'{site} {key}')


def _bfloat16_consumers(fn, *args) -> set[str]:
  """The primitives of `fn`'s jaxpr (scan bodies and nested calls included) that take a
  bfloat16 operand."""
  found = set()
  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      if any(getattr(v.aval, 'dtype', None) == jnp.bfloat16 for v in eqn.invars
             if hasattr(v, 'aval')):
        found.add(eqn.primitive.name)
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            visit(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            visit(sub)
  visit(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def test_bfloat16_thin_rows_keep_statistics_and_normalisation_float32():
  """`dtype=bfloat16` on a thin-row model (lengths [6, 2, 2, 2]: rows 2-5 rest on one
  sequence per batch, variance 0): in training and in inference only the matmuls take
  bfloat16 operands, so every statistic and normalisation runs in float32. Variance-0
  rows still multiply the matmuls' bfloat16 rounding by gamma / sqrt(epsilon) (a
  statistics problem, not a precision one); with those rows left out of the estimate
  (`min_step_count=2`) the bfloat16 outputs are within bfloat16's tolerance of float32."""
  mask = helpers.prefix_mask([6, 2, 2, 2], T)
  rng = np.random.default_rng(5)
  batches = [(rng.normal(size=(B, T, I)).astype(np.float32) * mask[..., None], mask)
             for _ in range(8)]
  x = rng.normal(size=(16, T, I)).astype(np.float32)
  layer = lambda **fields: br.make_layer('bn_lstm', H, max_length=T, min_step_count=2,
                                         **fields)
  variables = layer().init(jax.random.key(0), *batches[0], use_running_average=True,
                           deterministic=True)
  with pytest.warns(UserWarning, match='rows 2-5 rest on 1 sequence'):
    stats = br.estimate_population_stats(layer(), variables, batches)
  variables = {**variables, 'batch_stats': stats}
  evaluate = lambda module: lambda v, x: module.apply(v, x, use_running_average=True,
                                                      deterministic=True)
  train = lambda v, x: layer(dtype=jnp.bfloat16).apply(
      v, x, mask, use_running_average=False, deterministic=True, mutable=['batch_stats'])
  bf16 = layer(dtype=jnp.bfloat16)
  for fn, args in ((evaluate(bf16), (variables, x)), (train, (variables, batches[0][0]))):
    assert _bfloat16_consumers(fn, *args) == {'dot_general'}
  y16 = np.asarray(evaluate(bf16)(variables, x), np.float32)
  y32 = np.asarray(evaluate(layer())(variables, x))
  np.testing.assert_allclose(y16, y32, atol=1e-2)
