"""Cross-device batch statistics: `jax.pmap` over the 8 fake CPU devices equals one device.

The global batch (16 rows) is split 2 rows per device with uneven padding: device 0 holds
only padding from step 1 on, device 4 from step 2 on, and the last step has valid rows on
three devices only. Cross-device moments must psum sums *and* counts (a mean of per-device
means would be wrong here), and the batch-norm backward pass must psum its sums too.

The loss on each device is its masked, weighted output sum divided by the GLOBAL number of
valid entries, so the psum of the per-device gradients is the gradient of the single-device
loss on the whole batch.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import normalization
from bn_rnn_jax import variants
import reference as ref

NUM_DEVICES = 8
T, I, H = 5, 3, 4
LENGTHS = np.array([1, 1, 2, 5, 3, 3, 5, 4, 2, 1, 4, 4, 1, 3, 5, 5])
B = LENGTHS.size                                   # global batch, 2 rows per device
MASK = (np.arange(T)[None, :] < LENGTHS[:, None]).astype(np.float32)
_rng = np.random.default_rng(0)
X = np.where(MASK[..., None] > 0, _rng.normal(size=(B, T, I)),
             30.0 * _rng.normal(size=(B, T, I))).astype(np.float32)
W_OUT = _rng.normal(size=(B, T, H)).astype(np.float32)
NUM_VALID = float(MASK.sum())

# (variant, hoist_input): per-step sites in the step and hoisted (frame-wise moments of a
# [T, B, F] block), and time-shared statistics with sequence-wise input moments. The other
# variants use the same `batch_norm` calls (tests/test_recurrent.py checks them on one
# device); they are left out to keep compile time down.
FORMS = [('bn_lstm', False), ('bn_lstm', True), ('bn_lstm_shared', True)]
# The whole-layer backward pass (`backward='layer'`) psums the batch-norm cotangent sums
# inside its own reverse scan: one in-step form checks it.
FORMS_BACKWARD = [form + ('scan',) for form in FORMS] + [('bn_lstm', False, 'layer')]


@pytest.fixture(scope='module', autouse=True)
def _eight_devices():
  if jax.local_device_count() < NUM_DEVICES:
    pytest.skip(f'needs {NUM_DEVICES} devices (tests/conftest.py sets XLA_FLAGS); '
                f'got {jax.local_device_count()}')


def shard(a):
  """`[B, ...]` -> `[devices, B / devices, ...]`."""
  return a.reshape((NUM_DEVICES, -1) + a.shape[1:])


def unshard(a):
  a = np.asarray(a)
  return a.reshape((-1,) + a.shape[2:])


def _layer(variant, hoist, axis_name=None, backward='scan'):
  return variants.make_layer(variant, H, max_length=T + 2, momentum=0.9,
                              hoist_input=hoist, axis_name=axis_name, backward=backward)


def _params(variant):
  shapes = jax.eval_shape(lambda: _layer(variant, None).init(
      jax.random.key(0), jnp.zeros((2, T, I)), train=False))
  params = ref.random_params({k: s.shape for k, s in shapes['params'].items()},
                             np.random.default_rng(3))
  stats = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), shapes['batch_stats'])
  return jax.tree.map(jnp.float32, params), stats


def _loss_fn(layer):
  def loss(params, stats, x, mask, w):
    (carry, out), new = layer.apply({'params': params, 'batch_stats': stats}, x, mask,
                                    train=True, mutable=['batch_stats', 'minibatch_moments'])
    return jnp.sum(out * w) / NUM_VALID, (out, carry, new)
  return jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)


@functools.cache
def single_device(variant, hoist):
  params, stats = _params(variant)
  return jax.jit(_loss_fn(_layer(variant, hoist)))(params, stats, X, MASK, W_OUT)


@functools.cache
def eight_devices(variant, hoist, backward='scan'):
  params, stats = _params(variant)
  grad_fn = _loss_fn(_layer(variant, hoist, axis_name='batch', backward=backward))

  def step(params, stats, x, mask, w):
    (value, aux), (g_params, g_x) = grad_fn(params, stats, x, mask, w)
    return (jax.lax.psum(value, 'batch'), aux), (jax.lax.psum(g_params, 'batch'), g_x)

  return jax.pmap(step, axis_name='batch', in_axes=(None, None, 0, 0, 0))(
      params, stats, shard(X), shard(MASK), shard(W_OUT))


def _close(a, b, rtol=1e-5, what=''):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(float(np.max(np.abs(b))), 1e-3)
  np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=what)


@pytest.mark.parametrize('variant,hoist,backward', FORMS_BACKWARD)
def test_pmap_equals_single_device(variant, hoist, backward):
  (value, (out, carry, new)), (g_params, g_x) = single_device(variant, hoist)
  (p_value, (p_out, p_carry, p_new)), (p_g_params, p_g_x) = eight_devices(variant, hoist,
                                                                          backward)
  _close(p_value[0], value, what='loss')
  _close(unshard(p_out), out, what='outputs')
  for a, b in zip(jax.tree.leaves(p_carry), jax.tree.leaves(carry)):
    _close(unshard(a), b, what='final carry')
  # Gradients: the psum over devices of the parameter gradients (float32 sums in another
  # order: a looser tolerance), and each device's input gradient.
  for name, g in g_params.items():
    for d in range(NUM_DEVICES):
      _close(p_g_params[name][d], g, rtol=1e-4, what=f'd loss / d {name}, device {d}')
  _close(unshard(p_g_x), g_x, rtol=1e-4, what='d loss / d x')
  # One running-average update and this batch's moment records: every device holds the
  # statistics of the global batch.
  for collection in ('batch_stats', 'minibatch_moments'):
    for site, stats in new[collection].items():
      for key, value in stats.items():
        for d in range(NUM_DEVICES):
          _close(p_new[collection][site][key][d], value, what=f'{collection} {site} {key}')


@pytest.mark.parametrize('variant,hoist', FORMS[:1])
def test_pmap_outputs_and_moments_match_reference(variant, hoist):
  """The same run against the float64 reference on the global batch (independent check)."""
  params, _ = _params(variant)
  (_, (p_out, _, p_new)), _ = eight_devices(variant, hoist)
  _, want_out, moments = ref.run_layer(jax.tree.map(np.asarray, params), X, MASK, variant)
  _close(unshard(p_out), want_out, rtol=1e-4, what='outputs')
  for site, steps in moments.items():
    record = ref.minibatch_record(steps, False, T + 2)
    for key in ('mean', 'var', 'count'):
      _close(p_new['minibatch_moments'][site][key][NUM_DEVICES - 1], record[key], rtol=1e-4,
             what=f'{site} {key}')


def test_batch_moments_across_devices_are_global_masked_moments():
  """`batch_moments(axis_name=)`: per-step and sequence-wise, uneven valid counts."""
  z = np.random.default_rng(1).normal(2.0, 3.0, size=(B, T, 6)).astype(np.float32)

  def moments(z, mask):
    per_step = normalization.batch_moments(z, mask[..., None], reduce_axes=(0,),
                                           axis_name='batch')
    sequence = normalization.batch_moments(z, mask[..., None], reduce_axes=(0, 1),
                                           axis_name='batch')
    return per_step, sequence

  (mean, var, count), (s_mean, s_var, s_count) = jax.pmap(moments, axis_name='batch')(
      shard(z), shard(MASK))
  for t in range(T):
    want_mean, want_var, want_count = ref.masked_moments(z[:, t], MASK[:, t] > 0)
    for d in range(NUM_DEVICES):
      _close(mean[d, t], want_mean, what=f'mean step {t}')
      _close(var[d, t], want_var, what=f'var step {t}')
      assert count[d, t] == want_count
  want_mean, want_var, want_count = ref.masked_moments(z.reshape(B * T, -1),
                                                       MASK.reshape(-1) > 0)
  for d in range(NUM_DEVICES):
    _close(s_mean[d], want_mean)
    _close(s_var[d], want_var)
    assert s_count[d] == want_count == NUM_VALID
  # The biased alternative the design rules out: the mean of per-device means.
  per_device = [ref.masked_moments(z[2 * d:2 * d + 2, T - 1], MASK[2 * d:2 * d + 2, T - 1] > 0)
                for d in range(NUM_DEVICES)]
  naive = np.mean([m for m, _, c in per_device if c > 0], axis=0)
  assert np.max(np.abs(naive - np.asarray(mean[0, T - 1]))) > 1e-2


def test_batch_norm_gradient_across_devices():
  """The closed-form backward pass psums its sums: pmap gradients = one-device gradients."""
  rng = np.random.default_rng(2)
  z = rng.normal(size=(B, T, 6)).astype(np.float32)
  w = rng.normal(size=(B, T, 6)).astype(np.float32)
  scale = rng.uniform(0.5, 1.5, 6).astype(np.float32)
  bias = rng.normal(size=6).astype(np.float32)

  def loss(scale, bias, z, mask, w, axis_name):
    y, _, _, _ = normalization.batch_norm(z, scale, bias, mask=mask[..., None],
                                          reduce_axes=(0,), axis_name=axis_name)
    return jnp.sum(y * w * mask[..., None]) / NUM_VALID

  grad = jax.grad(loss, argnums=(0, 1, 2))
  g_scale, g_bias, g_z = jax.jit(functools.partial(grad, axis_name=None))(
      scale, bias, z, MASK, w)

  def per_device(scale, bias, z, mask, w):
    gs, gb, gz = grad(scale, bias, z, mask, w, 'batch')
    return jax.lax.psum(gs, 'batch'), jax.lax.psum(gb, 'batch'), gz

  p_scale, p_bias, p_z = jax.pmap(per_device, axis_name='batch', in_axes=(None, None, 0, 0, 0))(
      scale, bias, shard(z), shard(MASK), shard(w))
  _close(p_scale[0], g_scale, rtol=1e-4)
  _close(p_bias[0], g_bias, rtol=1e-4)
  _close(unshard(p_z), g_z, rtol=1e-4)
