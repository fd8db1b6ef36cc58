"""Checkpoints: exact resume after a kill, K latest + best, NaN stop, run artifacts."""

import json
import os

import jax
import numpy as np
import pytest

from bn_rnn_jax import checkpoint
from bn_rnn_jax import metric_writer
from bn_rnn_jax import loop
import training_fixtures as fx
from training_fixtures import compilation_cache  # pylint: disable=unused-import


class _NaNAt(fx.KillAt):
  def train_batch(self, step):
    batch = self._dataset.train_batch(step)
    if step == self._kill_step:
      batch = dict(batch, inputs=np.full_like(batch['inputs'], np.nan))
    return batch


def _config():
  # h0 noise makes the result depend on the checkpointed rng as well. The model is
  # test_train.py's (same compiled programs, shared through the compilation cache).
  return fx.tiny_config('bn_lstm', **{
      'model.initial_state': 'noise', 'train.num_steps': 7, 'train.log_every': 3, 'eval.every': 3,
      'checkpoint.every': 2, 'checkpoint.keep': 2, 'train.num_devices': 2,
      'eval.population_batches': 2, 'eval.test_at_end': True})


def _final_state(config, workdir, dataset):
  trainer = loop.Trainer(config, workdir, dataset)
  ckpt = checkpoint.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    state, meta = ckpt.restore(trainer.initial_state())
  finally:
    ckpt.close()
  return state, meta


def _metrics_without_time(workdir):
  return [{k: v for k, v in r.items() if k != 'time_s'} for r in metric_writer.read_metrics(workdir)]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """A straight 7-step run and one killed before step 6 (index 5) then restarted."""
  config = _config()
  dataset = fx.synthetic_dataset(config)
  straight = str(tmp_path_factory.mktemp('straight'))
  resumed = str(tmp_path_factory.mktemp('resumed'))
  loop.train_and_evaluate(config, straight, dataset)
  with pytest.raises(fx.Killed):
    loop.train_and_evaluate(config, resumed, fx.KillAt(dataset, 5))
  killed_records = metric_writer.read_metrics(resumed)
  loop.train_and_evaluate(config, resumed, dataset)
  return config, dataset, straight, resumed, killed_records


def test_resume_after_kill_is_exact(runs):
  config, dataset, straight, resumed, killed_records = runs
  # The kill came after the step-4 checkpoint and the step-3 log: the restart had work
  # to redo, and a partial training-metric window (step 4) to carry over.
  assert max(r['step'] for r in killed_records) == 3
  state_a, meta_a = _final_state(config, straight, dataset)
  state_b, meta_b = _final_state(config, resumed, dataset)
  assert int(state_a.step) == int(state_b.step) == 7
  for (path, a), b in zip(jax.tree.leaves_with_path(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  assert meta_a['best'] == meta_b['best']
  assert _metrics_without_time(straight) == _metrics_without_time(resumed)


def test_shard_map_backend_resumes_the_pmap_run(runs, tmp_path):
  """Killed and resumed under jit + shard_map, the run ends where the pmap run ends."""
  config, dataset, straight, _, _ = runs
  config = config.copy_and_resolve_references()
  config.parallel.backend = 'shard_map'
  resumed = str(tmp_path / 'shard_map')
  with pytest.raises(fx.Killed):
    loop.train_and_evaluate(config, resumed, fx.KillAt(dataset, 5))
  loop.train_and_evaluate(config, resumed, dataset)
  state_a, _ = _final_state(config, straight, dataset)
  state_b, _ = _final_state(config, resumed, dataset)
  assert int(state_b.step) == 7
  for (path, a), b in zip(jax.tree.leaves_with_path(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  records_a, records_b = _metrics_without_time(straight), _metrics_without_time(resumed)
  assert [(r['step'], r['split']) for r in records_a] == \
      [(r['step'], r['split']) for r in records_b]
  for a, b in zip(records_a, records_b):
    assert a.keys() == b.keys()
    for key in a:
      if isinstance(a[key], str):
        assert a[key] == b[key]
      else:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, err_msg=f'{a["step"]} {key}')


def test_run_leaves_artifacts(runs):
  config, _, straight, _, _ = runs
  assert sorted(os.listdir(os.path.join(straight, 'checkpoints'))) == ['6', '7']  # keep 2
  assert len(os.listdir(os.path.join(straight, 'best'))) == 1
  with open(os.path.join(straight, 'config.json')) as f:
    assert json.load(f)['model']['variant'] == config.model.variant
  records = metric_writer.read_metrics(straight)
  assert {(r['step'], r['split']) for r in records} == {
      (3, 'train'), (3, 'valid'), (6, 'train'), (6, 'valid'), (7, 'train'), (7, 'valid'),
      (7, 'test')}
  for r in records:
    assert {'step', 'split', 'loss', 'accuracy', 'time_s'} <= set(r)
  events = os.listdir(os.path.join(straight, 'tensorboard'))
  assert any(name.startswith('events.out.tfevents') for name in events)


def test_best_checkpoint_holds_the_best_validation_accuracy(runs):
  config, dataset, straight, _, _ = runs
  valid = [r for r in metric_writer.read_metrics(straight) if r['split'] == 'valid']
  best = max(valid, key=lambda r: r['accuracy'])  # first of equal values wins: strict >
  first_best = next(r for r in valid if r['accuracy'] == best['accuracy'])
  assert os.listdir(os.path.join(straight, 'best')) == [str(first_best['step'])]
  test = [r for r in metric_writer.read_metrics(straight) if r['split'] == 'test']
  assert len(test) == 1 and test[0]['checkpoint_step'] == first_best['step']


def test_rerunning_a_finished_run_changes_nothing(runs):
  config, dataset, straight, _, _ = runs
  before = _metrics_without_time(straight)
  loop.train_and_evaluate(config, straight, dataset)
  assert _metrics_without_time(straight) == before


def test_non_finite_loss_stops_and_keeps_last_good_state(tmp_path):
  config = _config()
  dataset = fx.synthetic_dataset(config)
  with pytest.raises(FloatingPointError, match='at step 4'):
    loop.train_and_evaluate(config, str(tmp_path), _NaNAt(dataset, 3))
  state, _ = _final_state(config, str(tmp_path), dataset)
  assert int(state.step) == 3
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))
