"""N devices compute what one device computes: the property the multi-device code keeps.

Layers (`jax.pmap` over the 8 fake CPU devices of `conftest.py`): the global batch (16
rows) is split 2 rows per device with uneven padding: device 0 holds only padding from
step 1 on, device 4 from step 2 on, and the last step has valid rows on three devices
only. Cross-device moments must psum sums *and* counts (a mean of per-device means would
be wrong here), and the batch-norm backward pass must psum its sums too. The loss on each
device is its masked, weighted output sum divided by the GLOBAL number of valid entries,
so the psum of the per-device gradients is the gradient of the single-device loss on the
whole batch.

Trainer steps: one step (or two, with a carried state) of `loop.Trainer` on 8 devices,
with h0 noise and dropout drawn per global example, and on 2 processes x 2 devices over
`jax.distributed`, equals the step on one device.
"""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import normalization
from bn_rnn_jax import variants
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import parallel
import helpers
from helpers import assert_close
import reference as ref
import training_fixtures as fx

NUM_DEVICES = 8
T, I, H = 5, 3, 4
LENGTHS = np.array([1, 1, 2, 5, 3, 3, 5, 4, 2, 1, 4, 4, 1, 3, 5, 5])
B = LENGTHS.size                                   # global batch, 2 rows per device
MASK = helpers.prefix_mask(LENGTHS, T)
_rng = np.random.default_rng(0)
X = np.where(MASK[..., None] > 0, _rng.normal(size=(B, T, I)),
             30.0 * _rng.normal(size=(B, T, I))).astype(np.float32)
W_OUT = _rng.normal(size=(B, T, H)).astype(np.float32)
NUM_VALID = float(MASK.sum())

# (variant, hoist_input): per-step sites in the step and hoisted (frame-wise moments of a
# [T, B, F] block), and time-shared statistics with sequence-wise input moments. The other
# variants use the same `batch_norm` calls (test_recurrent.py checks them on one
# device); they are left out to keep compile time down.
FORMS = [('bn_lstm', False), ('bn_lstm', True), ('bn_lstm_shared', True)]
# The whole-layer backward pass (`backward='layer'`) psums the batch-norm cotangent sums
# inside its own reverse scan: one in-step form checks it; the fused step ('fused', as
# plain JAX) psums its moments and its backward pass's sums inside each step.
FORMS_BACKWARD = [form + ('scan',) for form in FORMS] + [('bn_lstm', False, 'layer'),
                                                         ('bn_lstm', True, 'fused')]


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
  execution = (dict(fused_step='xla') if backward == 'fused'
               else dict(hoist_input=hoist, backward=backward))
  return variants.make_layer(variant, H, max_length=T + 2, momentum=0.9, axis_name=axis_name,
                              **helpers.with_execution(execution))


def _params(variant):
  params, shapes = helpers.reference_params(_layer(variant, None), (2, T, I), 3)
  stats = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), shapes)
  return jax.tree.map(jnp.float32, params), stats


def _loss_fn(layer):
  def loss(params, stats, x, mask, w):
    (carry, out), new = layer.apply({'params': params, 'batch_stats': stats}, x, mask,
                                    use_running_average=False, deterministic=False,
                                    mutable=['batch_stats', 'minibatch_moments'],
                                    return_carry=True)
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


@pytest.mark.parametrize('variant,hoist,backward', helpers.core_cases(
    FORMS_BACKWARD, core=[('bn_lstm', False, 'scan')], also=[('bn_lstm', True, 'fused')]))
def test_pmap_equals_single_device(variant, hoist, backward):
  (value, (out, carry, new)), (g_params, g_x) = single_device(variant, hoist)
  (p_value, (p_out, p_carry, p_new)), (p_g_params, p_g_x) = eight_devices(variant, hoist,
                                                                          backward)
  assert_close(p_value[0], value, what='loss')
  assert_close(unshard(p_out), out, what='outputs')
  for a, b in zip(jax.tree.leaves(p_carry), jax.tree.leaves(carry)):
    assert_close(unshard(a), b, what='final carry')
  # Gradients: the psum over devices of the parameter gradients (float32 sums in another
  # order: a looser tolerance), and each device's input gradient.
  for name, g in g_params.items():
    for d in range(NUM_DEVICES):
      assert_close(p_g_params[name][d], g, rtol=1e-4, what=f'd loss / d {name}, device {d}')
  assert_close(unshard(p_g_x), g_x, rtol=1e-4, what='d loss / d x')
  # One running-average update and this batch's moment records: every device holds the
  # statistics of the global batch.
  for collection in ('batch_stats', 'minibatch_moments'):
    for site, stats in new[collection].items():
      for key, value in stats.items():
        for d in range(NUM_DEVICES):
          assert_close(p_new[collection][site][key][d], value, what=f'{collection} {site} {key}')


@pytest.mark.slow
@pytest.mark.parametrize('variant,hoist', FORMS[:1])
def test_pmap_outputs_and_moments_match_reference(variant, hoist):
  """The same run against the float64 reference on the global batch (independent check)."""
  params, _ = _params(variant)
  (_, (p_out, _, p_new)), _ = eight_devices(variant, hoist)
  _, want_out, moments = ref.run_layer(jax.tree.map(np.asarray, params), X, MASK, variant)
  assert_close(unshard(p_out), want_out, rtol=1e-4, what='outputs')
  for site, steps in moments.items():
    record = ref.minibatch_record(steps, False, T + 2)
    for key in ('mean', 'var', 'count'):
      assert_close(p_new['minibatch_moments'][site][key][NUM_DEVICES - 1], record[key], rtol=1e-4,
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
      assert_close(mean[d, t], want_mean, what=f'mean step {t}')
      assert_close(var[d, t], want_var, what=f'var step {t}')
      assert count[d, t] == want_count
  want_mean, want_var, want_count = ref.masked_moments(z.reshape(B * T, -1),
                                                       MASK.reshape(-1) > 0)
  for d in range(NUM_DEVICES):
    assert_close(s_mean[d], want_mean)
    assert_close(s_var[d], want_var)
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
  assert_close(p_scale[0], g_scale, rtol=1e-4)
  assert_close(p_bias[0], g_bias, rtol=1e-4)
  assert_close(unshard(p_z), g_z, rtol=1e-4)


# ====================================================================== trainer steps
TREES = dict(rtol=2e-5, atol=1e-6)   # float32 sums in another order


# hidden 16: with 2 examples per device, backward='auto' takes the whole-layer pass on
# 8 CPU devices (H >= 8 B) and the autodiff of the scan on 1 (B16): the same step.
@pytest.mark.parametrize('variant,hidden', helpers.core_cases(
    [('bn_lstm', 8), ('bn_lstm', 16)], core=[]))
def test_pmapped_step_equals_single_device(variant, hidden):
  # h0 noise is drawn per global example (`sequence.per_example_keys`): 8 devices draw 1
  # device's.
  config = fx.tiny_config(variant, **{'model.initial_state': 'noise',
                                      'model.hidden_size': hidden})
  layer = variants.make_layer(variant, hidden)
  per_device = config.train.batch_size // 8
  assert (layer.execution_policy(per_device).backward == 'layer') == (hidden == 16)
  assert layer.execution_policy(config.train.batch_size).backward == 'scan'
  dataset = fx.synthetic_dataset(config)
  _, state8, metrics8, valid8 = fx.one_step(config, dataset, 8)
  init, state1, metrics1, valid1 = fx.one_step(config, dataset, 1)
  # The step moved the parameters and filled the statistics (the comparison is not vacuous).
  moved = max(float(np.max(np.abs(a - b))) for a, b in
              zip(jax.tree.leaves(state1.params), jax.tree.leaves(init.params)))
  assert moved > 1e-4
  # Row 0 holds the moments of every sequence of the global batch.
  assert float(state1.batch_stats['rnn']['layer_0']['recurrent']['count'][0]) == (
      config.train.batch_size)
  helpers.assert_trees_close(state8.params, state1.params, **TREES)
  helpers.assert_trees_close(state8.batch_stats, state1.batch_stats, **TREES)
  helpers.assert_trees_close(state8.opt_state, state1.opt_state, **TREES)
  for name in ('loss', 'accuracy', 'grad_norm'):
    np.testing.assert_allclose(metrics8[name], metrics1[name], rtol=2e-6, err_msg=name)
  for name in ('loss', 'accuracy'):
    np.testing.assert_allclose(valid8[name], valid1[name], rtol=2e-5, err_msg=name)


@pytest.mark.slow
def test_language_model_step_with_carry_equals_single_device():
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'zeros',
                                        'optimizer.name': 'adam'})
  dataset = fx.LanguageModelDataset()
  results = {}
  for n in (8, 1):
    cfg = config.copy_and_resolve_references()
    cfg.train.num_devices = n
    trainer = loop.Trainer(cfg, None, dataset)
    state = trainer.to_devices(trainer.initial_state())
    for step in range(2):  # the second step starts from the first's carried state
      state, metrics = trainer.p_train_step(state, trainer.train_batch(step))
    host = trainer.to_host(state)
    results[n] = host, float(metrics['loss'][0]), parallel.unshard(host.carry)
  (s8, loss8, carry8), (s1, loss1, carry1) = results[8], results[1]
  assert carry1[0][1].shape == (16, 8)  # layer 0's h for the whole batch
  assert np.abs(carry1[0][1]).max() > 0  # the state was carried, not reset
  np.testing.assert_allclose(loss8, loss1, rtol=2e-6)
  helpers.assert_trees_close(s8.params, s1.params, **TREES)
  helpers.assert_trees_close(carry8, carry1, **TREES)


@pytest.mark.slow
def test_eight_devices_equal_one_with_noise_and_dropout():
  # One layer: dropout on its input and on its output; one step.
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'noise',
                                        'model.dropout_rate': 0.3})
  dataset = fx.synthetic_dataset(config)
  results = {}
  for n in (8, 1):
    cfg = config.copy_and_resolve_references()
    cfg.train.num_devices = n
    trainer = loop.Trainer(cfg, None, dataset)
    init = trainer.initial_state()  # on the host: the step donates its device state
    state, metrics = trainer.p_train_step(trainer.to_devices(init), trainer.train_batch(0))
    results[n] = trainer.to_host(state), float(metrics['loss'][0])
    if n == 1:  # the randomness matters: another key gives another step
      other, _ = trainer.p_train_step(trainer.to_devices(init.replace(rng=init.rng + 1)),
                                      trainer.train_batch(0))
      assert not np.allclose(trainer.to_host(other).params['rnn']['layer_0']['bias'],
                             trainer.to_host(state).params['rnn']['layer_0']['bias'])
  (s8, loss8), (s1, loss1) = results[8], results[1]
  np.testing.assert_allclose(loss8, loss1, rtol=2e-6)
  for (path, a), b in zip(jax.tree.leaves_with_path((s8.params, s8.batch_stats)),
                          jax.tree.leaves((s1.params, s1.batch_stats))):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


# Two processes through main.py, lost and resumed: tests/test_multiprocess_main.py.
@pytest.mark.exhaustive
def test_two_processes_over_jax_distributed_equal_one_device(tmp_path):
  """2 processes x 2 CPU devices on 127.0.0.1 (gloo collectives), each feeding its half
  of the global batch, take the same step as one device on the whole batch."""
  out = str(tmp_path / 'two_processes.npz')
  port = str(helpers.free_port())
  worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'distributed_worker.py')
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  procs = [subprocess.Popen([sys.executable, worker, str(i), port, out], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = [p.communicate(timeout=300)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  result = np.load(out)
  assert int(result['global_devices']) == 4
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'zeros',
                                        'train.num_devices': 1})
  trainer = loop.Trainer(config, None, fx.synthetic_dataset(config))
  state = trainer.to_devices(trainer.initial_state())
  state, metrics = trainer.p_train_step(state, trainer.train_batch(0))
  host = trainer.to_host(state)
  expected = jax.tree_util.tree_leaves_with_path({'params': host.params,
                                                  'batch_stats': host.batch_stats})
  for path, value in expected:
    np.testing.assert_allclose(result[jax.tree_util.keystr(path)], value, rtol=2e-5,
                               atol=1e-6, err_msg=jax.tree_util.keystr(path))
  np.testing.assert_allclose(float(result['loss']), float(metrics['loss'][0]), rtol=2e-6)
