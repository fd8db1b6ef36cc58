"""pmap over 8 fake CPU devices (and 2 processes) equals one device on the same global batch."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from bn_rnn_jax import parallel
from bn_rnn_jax import config as config_lib
from bn_rnn_jax import loop
from bn_rnn_jax import variants
import training_fixtures as fx
from training_fixtures import compilation_cache  # pylint: disable=unused-import


def _assert_trees_close(a, b, rtol=2e-5, atol=1e-6):
  for (path, x), y in zip(jax.tree.leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_eight_devices_see_eight():
  assert jax.local_device_count() == 8, 'tests/conftest.py should set 8 CPU devices'


# hidden 16: with 2 examples per device, backward='auto' takes the whole-layer pass on
# 8 CPU devices (H >= 8 B) and the autodiff of the scan on 1 (B16): the same step.
@pytest.mark.parametrize('variant,hidden', [('bn_lstm', 8), ('bn_lstm', 16)])
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
  assert float(state1.batch_stats['rnn']['layer_0']['recurrent']['count'][0]) == 1.0
  _assert_trees_close(state8.params, state1.params)
  _assert_trees_close(state8.batch_stats, state1.batch_stats)
  _assert_trees_close(state8.opt_state, state1.opt_state)
  for name in ('loss', 'accuracy', 'grad_norm'):
    np.testing.assert_allclose(metrics8[name], metrics1[name], rtol=2e-6, err_msg=name)
  for name in ('loss', 'accuracy'):
    np.testing.assert_allclose(valid8[name], valid1[name], rtol=2e-5, err_msg=name)


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
  _assert_trees_close(s8.params, s1.params)
  _assert_trees_close(carry8, carry1)


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


@pytest.mark.parametrize('make_dataset', ['classification', 'language_model'])
def test_shard_map_backend_equals_pmap(make_dataset):
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'zeros',
                                        'optimizer.name': 'adam'})
  dataset = (fx.synthetic_dataset(config) if make_dataset == 'classification'
             else fx.LanguageModelDataset())
  (state_p, metrics_p, valid_p), (state_s, metrics_s, valid_s) = (
      _backend_run(config, dataset, backend, steps=2) for backend in ('pmap', 'shard_map'))
  assert int(state_s.step) == 2
  _assert_trees_close(state_s, state_p, rtol=1e-6, atol=1e-7)
  for name in metrics_p:
    np.testing.assert_allclose(metrics_s[name], metrics_p[name], rtol=1e-6, err_msg=name)
  for name in valid_p:
    np.testing.assert_allclose(valid_s[name], valid_p[name], rtol=1e-6, err_msg=name)


def test_unknown_backend_is_one_clear_error():
  config = fx.tiny_config('lstm', **{'parallel.backend': 'pjit'})
  with pytest.raises(ValueError, match=r"config.parallel.backend must be one of .*'pjit'"):
    config_lib.validate_config(config)


def test_batch_not_divisible_by_devices_is_one_clear_error():
  config = fx.tiny_config(**{'train.batch_size': 12})
  with pytest.raises(ValueError, match='batch_size 12 does not divide evenly over 8 devices'):
    loop.Trainer(config, None, fx.synthetic_dataset(config))


def test_shard_rejects_uneven_split():
  with pytest.raises(ValueError, match='does not split over 8 devices'):
    parallel.shard({'x': np.zeros((12, 3))}, 8)
  assert parallel.shard({'x': np.zeros((16, 3))}, 8)['x'].shape == (8, 2, 3)


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_two_processes_over_jax_distributed_equal_one_device(tmp_path):
  """2 processes x 2 CPU devices on 127.0.0.1 (gloo collectives), each feeding its half
  of the global batch, take the same step as one device on the whole batch."""
  out = str(tmp_path / 'two_processes.npz')
  port = str(_free_port())
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
