"""`loop.py`: the Trainer and `train_and_evaluate` on tiny runs.

A straight run and one killed before a step then restarted end in bitwise the same
state with the same metrics records (exact resume, also across the pmap and shard_map
backends); a run keeps its K latest checkpoints and the best one, stops on a non-finite
loss keeping the last good state, and evaluates with population statistics (the running
averages or the papers' estimate, checked against float64 moments of the parameters).
A run on a dataset object logs its progress, records the dataset in config.json and keeps
every launch's test metrics.
"""

import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from bn_rnn_jax.training import workdir as workdir_lib
import helpers
import training_fixtures as fx


def _config():
  # h0 noise makes the result depend on the checkpointed rng as well.
  return fx.tiny_config('bn_lstm', **{
      'model.initial_state': 'noise', 'train.num_steps': 7, 'train.log_every': 3, 'eval.every': 3,
      'checkpoint.every': 2, 'checkpoint.keep': 2, 'train.num_devices': 2,
      'eval.population_batches': 2, 'eval.test_at_end': True})


# ----------------------------------------------------------------------------- resume, best
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
  state_a, meta_a = fx.restore(config, straight, dataset)
  state_b, meta_b = fx.restore(config, resumed, dataset)
  assert int(state_a.step) == int(state_b.step) == 7
  helpers.assert_trees_equal(state_a, state_b)
  assert meta_a['best'] == meta_b['best']
  assert fx.records_without_time(straight) == fx.records_without_time(resumed)


@pytest.mark.slow
def test_shard_map_backend_resumes_the_pmap_run(runs, tmp_path):
  """Killed and resumed under jit + shard_map, the run ends where the pmap run ends."""
  config, dataset, straight, _, _ = runs
  config = config.copy_and_resolve_references()
  config.parallel.backend = 'shard_map'
  resumed = str(tmp_path / 'shard_map')
  with pytest.raises(fx.Killed):
    loop.train_and_evaluate(config, resumed, fx.KillAt(dataset, 5))
  loop.train_and_evaluate(config, resumed, dataset)
  state_a, _ = fx.restore(config, straight, dataset)
  state_b, _ = fx.restore(config, resumed, dataset)
  assert int(state_b.step) == 7
  helpers.assert_trees_close(state_a, state_b, rtol=1e-6, atol=1e-7)
  records_a, records_b = fx.records_without_time(straight), fx.records_without_time(resumed)
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
  before = fx.records_without_time(straight)
  loop.train_and_evaluate(config, straight, dataset)
  assert fx.records_without_time(straight) == before


def test_a_run_on_a_dataset_object_shows_progress_records_it_and_keeps_each_test(
    runs, tmp_path, caplog):
  """`train_and_evaluate(..., dataset=...)` in a program that set up no logging (here
  pytest's root handler at WARNING): its INFO lines are logged. config.json records the
  dataset given (name, lengths, example shapes), not the config's; a longer relaunch
  keeps the first launch's test record beside its own; loading the run without the
  dataset is one line."""
  config, dataset, straight, _, _ = runs
  with open(os.path.join(straight, 'config.json')) as f:
    assert json.load(f)['data'] == workdir_lib.dataset_fields(dataset)
  assert workdir_lib.dataset_fields(dataset)['example'] == {
      'inputs': 'float32[6, 2]', 'labels': 'int32[]', 'weights': 'float32[]'}
  run = str(tmp_path / 'run')
  shutil.copytree(straight, run)
  longer = config.copy_and_resolve_references()
  longer.train.num_steps = 9
  loop.train_and_evaluate(longer, run, dataset)
  info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
  for line in ('Resumed from the checkpoint of step 7.', 'Training steps 8 to 9 (batch 16, 2 '
               'devices)', 'step 9/9: ', 'step 9 test: accuracy='):
    assert any(m.startswith(line) for m in info), (line, info)
  test = [(r['step'], r['checkpoint_step']) for r in metric_writer.read_metrics(run)
          if r['split'] == 'test']
  assert len(test) == 2 and [step for step, _ in test] == [7, 9]
  with pytest.raises(ValueError) as error:
    loop.Trainer(workdir_lib.load_config(run), run)
  assert helpers.one_line(error).startswith(
      "The run was trained on a dataset object (config.data.name='SequenceDataset', given "
      'to train_and_evaluate), which config.json cannot hold')


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_state(tmp_path):
  config = _config()
  dataset = fx.synthetic_dataset(config)
  with pytest.raises(FloatingPointError, match='at step 4'):
    loop.train_and_evaluate(config, str(tmp_path), fx.NaNAt(dataset, 3))
  state, _ = fx.restore(config, str(tmp_path), dataset)
  assert int(state.step) == 3
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))
  last = metric_writer.read_metrics(str(tmp_path))[-1]
  assert last == {'step': 4, 'split': metric_writer.STOPPED,
                  'reason': 'non-finite state or training metrics'}


def test_replay_after_a_non_finite_step_starts_from_the_checked_copy(tmp_path):
  """The step donates its state (the default), so the state a replay starts from is a
  copy: metrics fetched every 6 steps, NaN inputs at step 5; the replay re-runs steps 1
  to 4 from the copy of the initial state and saves bitwise the state 4 plain steps give."""
  config = fx.tiny_config('bn_lstm', **{
      'model.initial_state': 'noise', 'train.num_steps': 7, 'train.log_every': 6,
      'eval.every': 100, 'checkpoint.every': 100, 'train.num_devices': 2})
  assert config.train.donate_state
  dataset = fx.synthetic_dataset(config)
  with pytest.raises(FloatingPointError, match=r'at step 5 .*last good state \(step 4\)'):
    loop.train_and_evaluate(config, str(tmp_path), fx.NaNAt(dataset, 4))
  saved, _ = fx.restore(config, str(tmp_path), dataset)
  trainer = loop.Trainer(config, None, dataset)
  state = trainer.to_devices(trainer.initial_state())
  for step in range(4):
    state, _ = trainer.p_train_step(state, trainer.train_batch(step))
  assert int(saved.step) == 4
  helpers.assert_trees_equal(saved, trainer.to_host(state))


# ----------------------------------------------------------------------------- evaluation
def test_config_errors_are_one_clear_line():
  bad = {'model.hidden_size': -3, 'train.batch_size': 0,
         'eval.population_stats': 'median', 'checkpoint.best_mode': 'maximum'}
  for key, value in bad.items():
    config = fx.tiny_config(**{key: value})
    with pytest.raises(ValueError) as info:
      loop.Trainer(config, None, fx.synthetic_dataset(fx.tiny_config()))
    message = str(info.value)
    assert key.split('.')[-1] in message and '\n' not in message
  config = fx.tiny_config(**{'model.max_length': 4})  # sequences have 6 steps
  with pytest.raises(ValueError, match=r'T=6 steps but config.model.max_length=4'):
    loop.Trainer(config, None, fx.synthetic_dataset(config))


@pytest.fixture(scope='module')
def trained():
  """A tiny BN-LSTM trained a few steps on 2 devices, and its Trainer."""
  config = fx.tiny_config('bn_lstm', **{'train.num_devices': 2,
                                        'model.initial_state': 'noise',
                                        'eval.population_batches': 2})
  trainer = loop.Trainer(config, None, fx.synthetic_dataset(config))
  state = trainer.to_devices(trainer.initial_state())
  for step in range(3):
    state, _ = trainer.p_train_step(state, trainer.train_batch(step))
  return config, trainer, state


def test_population_estimate_averages_batch_moments_of_current_params(trained):
  """The input site's statistics at step t are moments of W_x x_t: recompute them in
  float64 from the parameters for the batches the pass uses, and average them."""
  config, trainer, state = trained
  estimate = trainer.population_stats(state, 'estimate')
  host = trainer.to_host(state)
  kernel = np.asarray(host.params['rnn']['layer_0']['input_kernel'], np.float64)
  means, variances = [], []
  step = int(host.step)
  for i in range(config.eval.population_batches):
    x = trainer.dataset.train_batch(step + i)['inputs'].astype(np.float64)  # [B, T, I]
    z = x @ kernel                                                         # [B, T, 4H]
    means.append(z.mean(0))
    variances.append(z.var(0))
  site = jax.tree.map(lambda a: np.asarray(a[0]), estimate)['rnn']['layer_0']['input']
  length = x.shape[1]
  np.testing.assert_allclose(site['mean'][:length], np.mean(means, 0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(site['var'][:length], np.mean(variances, 0), rtol=1e-4,
                             atol=1e-5)
  # Each row counts the sequences of every estimate batch (all of them valid).
  np.testing.assert_array_equal(site['count'][:length],
                                config.eval.population_batches * config.train.batch_size)
  assert not site['count'][length:].any()
  # It is not the running average that training kept.
  running = host.batch_stats['rnn']['layer_0']['input']
  assert np.abs(running['mean'][:length] - site['mean'][:length]).max() > 1e-4
  assert trainer.population_stats(state, 'running') is state.batch_stats


def test_population_estimate_of_joined_batches_uses_pooled_moments(trained):
  """With `population_batch_size` = 2 training batches, each record holds the moments of
  the two consecutive batches joined (pooled, in float64 here), not their average."""
  config, _, state = trained
  config = fx.tiny_config('bn_lstm', **{'train.num_devices': 2,
                                        'model.initial_state': 'noise',
                                        'eval.population_batches': 2,
                                        'eval.population_batch_size': 32})
  trainer = loop.Trainer(config, None, fx.synthetic_dataset(config))
  site = jax.tree.map(lambda a: np.asarray(a[0]), trainer.population_stats(
      state, 'estimate'))['rnn']['layer_0']['input']
  host = trainer.to_host(state)
  kernel = np.asarray(host.params['rnn']['layer_0']['input_kernel'], np.float64)
  step, means, variances = int(host.step), [], []
  for record in range(2):
    x = np.concatenate([trainer.dataset.train_batch(step + 2 * record + j)['inputs']
                        for j in range(2)]).astype(np.float64)           # [2B, T, I]
    z = x @ kernel
    means.append(z.mean(0))
    variances.append(z.var(0))
  length = x.shape[1]
  np.testing.assert_allclose(site['mean'][:length], np.mean(means, 0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(site['var'][:length], np.mean(variances, 0), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_array_equal(site['count'][:length], 2 * 32)


def test_evaluation_uses_population_statistics(trained):
  """With batch statistics an example's logits would depend on its batch mates; with
  population statistics (use_running_average=True) they do not, and metrics do not
  depend on how a split is cut into (padded) batches."""
  config, trainer, state = trained
  stats = trainer.population_stats(state)
  variables = {'params': jax.tree.map(lambda x: x[0], state.params),
               'batch_stats': jax.tree.map(lambda x: x[0], stats)}
  inputs = next(trainer.dataset.eval_batches('valid'))['inputs']
  full = trainer.model.apply(variables, jnp.asarray(inputs), use_running_average=True,
                             deterministic=True)
  half = trainer.model.apply(variables, jnp.asarray(inputs[:4]), use_running_average=True,
                             deterministic=True)
  np.testing.assert_allclose(np.asarray(full[:4]), np.asarray(half), rtol=1e-5, atol=1e-6)
  whole = trainer.evaluate(state, 'valid')  # 12 examples: batches of 8, padded
  config4 = config.copy_and_resolve_references()
  config4.eval.batch_size = 4                # 12 examples: 3 batches, no padding
  other = loop.Trainer(config4, None, fx.synthetic_dataset(config4))
  result = other.evaluate(state, 'valid')
  np.testing.assert_allclose(result['loss'], whole['loss'], rtol=1e-5)
  assert result['accuracy'] == whole['accuracy']
