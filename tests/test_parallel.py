"""`parallel.py` on the 8 fake CPU devices of `conftest.py`: splitting batches over
devices, replicated state, the two device-map backends (pmap, jit + shard_map) and their
errors. That N devices compute what one computes is `test_eight_devices_equal_one.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax.training import loop
from bn_rnn_jax.training import parallel
import helpers
import training_fixtures as fx


def test_eight_devices_see_eight():
  assert jax.local_device_count() == 8, 'tests/conftest.py should set 8 CPU devices'


def test_shard_rejects_uneven_split():
  with pytest.raises(ValueError, match='does not split over 8 devices'):
    parallel.shard({'x': np.zeros((12, 3))}, 8)
  assert parallel.shard({'x': np.zeros((16, 3))}, 8)['x'].shape == (8, 2, 3)
  tree = {'x': np.arange(48).reshape(16, 3), 'y': [np.arange(16)]}
  helpers.assert_trees_equal(parallel.unshard(parallel.shard(tree, 8)), tree)


def test_check_divisible_and_local_devices_name_the_numbers():
  assert parallel.check_divisible(16, 8) == 2
  with pytest.raises(ValueError, match='batch size 12 does not divide evenly over 8 devices'):
    parallel.check_divisible(12, 8)
  with pytest.raises(ValueError, match='eval batch size must be positive; got 0'):
    parallel.check_divisible(0, 8, 'eval batch size')
  assert parallel.local_devices(3) == jax.local_devices()[:3]
  with pytest.raises(ValueError, match='num_devices=9 but this process has 8 local devices'):
    parallel.local_devices(9)
  with pytest.raises(ValueError, match="backend must be one of .*'pjit'"):
    parallel.check_backend('pjit')


def test_batch_not_divisible_by_devices_is_one_clear_error():
  config = fx.tiny_config(**{'train.batch_size': 12, 'train.num_devices': 8})
  with pytest.raises(ValueError, match='batch_size 12 does not divide evenly over 8 devices'):
    loop.Trainer(config, None, fx.synthetic_dataset(config))


@pytest.mark.parametrize('backend', ['pmap', 'shard_map'])
def test_device_map_gives_each_device_its_slice_and_psums(backend):
  """A replicated value, a split batch, and the sum over devices of each one's share."""
  devices = jax.local_devices()[:4]
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  scale = parallel.replicate(np.float32(2.0), devices, backend)
  def fn(scale, x):
    return scale * x, jax.lax.psum(jnp.sum(x), parallel.AXIS)
  scaled, total = parallel.device_map(fn, devices, backend)(
      scale, parallel.put_sharded(parallel.shard(x, 4), devices, backend))
  np.testing.assert_array_equal(parallel.unshard(scaled), 2.0 * x)
  np.testing.assert_array_equal(np.asarray(total), np.full(4, x.sum()))
  assert float(parallel.unreplicate(scale)) == 2.0
  # A value mapped with in_axes None reaches every device as it is.
  offset = parallel.device_map(lambda x, b: x + b, devices, backend, in_axes=(0, None))(
      parallel.put_sharded(parallel.shard(x, 4), devices, backend), np.float32(1.0))
  np.testing.assert_array_equal(parallel.unshard(offset), x + 1.0)


def _backend_run(config, dataset, backend, steps, workdir=None, dataset_for_run=None):
  """`steps` train steps (or a whole run in `workdir`) under `backend` on 8 devices."""
  config = config.copy_and_resolve_references()
  config.parallel.backend = backend
  config.train.num_devices = 8
  if workdir is not None:
    loop.train_and_evaluate(config, workdir, dataset_for_run or dataset)
    return None
  trainer = loop.Trainer(config, None, dataset)
  state = trainer.to_devices(trainer.initial_state())
  for step in range(steps):
    state, metrics = trainer.p_train_step(state, trainer.train_batch(step))
  return (trainer.to_host(state), {k: float(v[0]) for k, v in metrics.items()},
          trainer.evaluate(state, 'valid'))


# A shard_map run resuming a pmap run: tests/test_loop.py.
@pytest.mark.exhaustive
@pytest.mark.parametrize('make_dataset', ['classification', 'language_model'])
def test_shard_map_backend_equals_pmap(make_dataset):
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'zeros',
                                        'optimizer.name': 'adam'})
  dataset = (fx.synthetic_dataset(config) if make_dataset == 'classification'
             else fx.LanguageModelDataset())
  (state_p, metrics_p, valid_p), (state_s, metrics_s, valid_s) = (
      _backend_run(config, dataset, backend, steps=2) for backend in ('pmap', 'shard_map'))
  assert int(state_s.step) == 2
  helpers.assert_trees_close(state_s, state_p, rtol=1e-6, atol=1e-7)
  for name in metrics_p:
    np.testing.assert_allclose(metrics_s[name], metrics_p[name], rtol=1e-6, err_msg=name)
  for name in valid_p:
    np.testing.assert_allclose(valid_s[name], valid_p[name], rtol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------- donation
@pytest.mark.parametrize('backend', ['pmap', 'shard_map'])
def test_copy_on_devices_outlives_a_donation(backend):
  devices = jax.local_devices()[:4]
  tree = {'w': parallel.replicate(np.arange(3, dtype=np.float32), devices, backend),
          'none': None}
  kept = parallel.copy_on_devices(tree, devices, backend)
  double = parallel.device_map(lambda t: jax.tree.map(lambda x: 2 * x, t), devices, backend,
                               donate_argnums=(0,))
  doubled = double(tree)
  assert tree['w'].is_deleted() and not kept['w'].is_deleted()
  assert kept['w'].sharding == doubled['w'].sharding and kept['none'] is None
  np.testing.assert_array_equal(parallel.unreplicate(kept)['w'], np.arange(3))
  np.testing.assert_array_equal(parallel.unreplicate(doubled)['w'], 2 * np.arange(3))


def _donation_run(config, dataset, backend, donate, steps=3):
  """`steps` train steps on 8 devices: `(host state, host metrics of each step, whether
  the first state's buffers were deleted, the host state a `copy_state` of it holds)`."""
  config = config.copy_and_resolve_references()
  config.parallel.backend = backend
  config.train.num_devices = 8
  config.train.donate_state = donate
  trainer = loop.Trainer(config, None, dataset)
  state = first = trainer.to_devices(trainer.initial_state())
  kept = trainer.copy_state(first)
  metrics = []
  for step in range(steps):
    state, m = trainer.p_train_step(state, trainer.train_batch(step))
    metrics.append(m)
  deleted = [x.is_deleted() for x in jax.tree.leaves(first)]
  return trainer.to_host(state), jax.device_get(metrics), deleted, trainer.to_host(kept)


@pytest.mark.parametrize('backend', ['pmap', 'shard_map'])
def test_donated_steps_equal_undonated_ones_and_delete_their_input(backend):
  """With the state donated, k steps end bitwise where they end without (the carried
  state of a language model included); only the donated run's input is deleted, and the
  copy kept of it still reads the initial state."""
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'noise',
                                        'optimizer.name': 'adam'})
  dataset = fx.LanguageModelDataset()
  state_on, metrics_on, deleted_on, kept_on = _donation_run(config, dataset, backend, True)
  state_off, metrics_off, deleted_off, kept_off = _donation_run(config, dataset, backend,
                                                                False)
  assert int(state_on.step) == 3 and state_on.carry is not None
  helpers.assert_trees_equal(state_on, state_off)
  helpers.assert_trees_equal(metrics_on, metrics_off)
  assert all(deleted_on) and not any(deleted_off)
  helpers.assert_trees_equal(kept_on, kept_off)
  assert int(kept_on.step) == 0
