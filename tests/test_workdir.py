"""The workdir keeps the config of its first launch (`bn_rnn_jax.training.workdir`): a relaunch that
changes the run's meaning is refused (workdir untouched) unless allowed and recorded; a
failed first launch leaves nothing; a best checkpoint that is not the run's own is moved
aside. Tiny runs on synthetic data (`training_fixtures`), one device."""

import hashlib
import json
import logging
import os
import shutil

import pytest

from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from bn_rnn_jax.training import workdir as workdir_lib
import helpers
import training_fixtures as fx

BASE = {'train.num_steps': 4, 'train.num_devices': 1, 'checkpoint.every': 2,
        'eval.every': 2, 'train.log_every': 2}


def _config(**extra):
  return fx.tiny_config('bn_lstm', **{**BASE, **extra})


def _snapshot(folder) -> dict:
  """Every file under `folder` with the SHA-256 of its bytes."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope='module')
def first(tmp_path_factory):
  """A finished 4-step run: `(config, dataset, workdir)`."""
  config = _config()
  dataset = fx.synthetic_dataset(config)
  workdir = str(tmp_path_factory.mktemp('first') / 'run')
  loop.train_and_evaluate(config, workdir, dataset)
  return config, dataset, workdir


def _copy(first_run, tmp_path):
  target = str(tmp_path / 'copy')
  shutil.copytree(first_run[2], target)
  return target


def test_a_change_of_the_runs_meaning_is_refused_and_the_workdir_is_untouched(first,
                                                                              tmp_path):
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  before = _snapshot(run)
  changed = _config(**{'seed': 1, 'model.hidden_size': 16, 'train.num_steps': 6})
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(changed, run, dataset)
  line = helpers.one_line(error)
  assert line.startswith(f'The run in {run} was started with another config: '
                         'model.hidden_size (8 -> 16), seed (0 -> 1).'), line
  assert 'allow_config_change=True' in line
  assert _snapshot(run) == before


def test_num_steps_below_the_newest_checkpoint_is_one_line(first, tmp_path):
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  before = _snapshot(run)
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(_config(**{'train.num_steps': 3}), run, dataset)
  assert helpers.one_line(error) == (
      f'config.train.num_steps=3 is below the newest checkpoint of {run} (step 4); pass '
      '--config.train.num_steps=4 or more, or use another --workdir.')
  assert _snapshot(run) == before


def test_harmless_changes_pass_and_config_json_stays_the_first_launchs(first, tmp_path):
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  with open(os.path.join(run, 'config.json'), 'rb') as f:
    saved = f.read()
  longer = _config(**{'train.num_steps': 6, 'train.log_every': 3, 'eval.every': 3,
                      'checkpoint.every': 3, 'checkpoint.keep': 3,
                      'train.time_budget_s': 1e6, 'eval.max_batches': 1,
                      'train.donate_state': False})
  loop.train_and_evaluate(longer, run, dataset)
  with open(os.path.join(run, 'config.json'), 'rb') as f:
    assert f.read() == saved
  assert not os.path.exists(os.path.join(run, workdir_lib.CHANGES))
  assert max(r['step'] for r in metric_writer.read_metrics(run)) == 6


def test_an_allowed_change_is_recorded_with_its_step_and_becomes_the_runs(first, tmp_path):
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  lower = {'optimizer.learning_rate': 1e-4, 'train.num_steps': 6}
  loop.train_and_evaluate(_config(**lower, **{'train.allow_config_change': True}), run,
                          dataset)
  with open(os.path.join(run, workdir_lib.CHANGES)) as f:
    records = [json.loads(line) for line in f]
  assert [(r['step'], r['changed']) for r in records] == [
      (4, {'optimizer.learning_rate': [0.001, 0.0001]})]
  # The run's config is now the changed one: the same flags pass, the first ones do not.
  as_run = workdir_lib.with_dataset(_config(**lower), dataset)  # what config.json records
  assert workdir_lib.check(as_run, run).changed == {}
  with pytest.raises(ValueError, match=r'optimizer.learning_rate \(0.0001 -> 0.001\)'):
    loop.train_and_evaluate(_config(**{'train.num_steps': 10}), run, dataset)


@pytest.mark.parametrize('change', [{'model.hidden_size': 16}, {'model.variant': 'lstm'},
                                    {'optimizer.name': 'adam'}], ids=lambda c: next(iter(c)))
def test_an_allowed_change_the_checkpoint_refuses_leaves_the_workdir_untouched(
    first, tmp_path, change):
  """The checkpoint has no place for the new shapes: the launch fails, records no change,
  and the first command still continues the run."""
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  before = _snapshot(run)
  changed = _config(**change, **{'train.allow_config_change': True, 'train.num_steps': 6})
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(changed, run, dataset)
  assert helpers.one_line(error).startswith('The checkpoint of step 4 in ')
  assert _snapshot(run) == before
  assert not os.path.exists(os.path.join(run, workdir_lib.CHANGES))
  as_run = workdir_lib.with_dataset(_config(), dataset)
  assert workdir_lib.check(as_run, run).changed == {}
  loop.train_and_evaluate(_config(**{'train.num_steps': 6}), run, dataset)
  assert max(r['step'] for r in metric_writer.read_metrics(run)) == 6


def test_a_damaged_config_json_is_one_line_naming_it(first, tmp_path):
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  path = os.path.join(run, 'config.json')
  with open(path, 'w') as f:
    f.write('{"seed": 0,')
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(_config(), run, dataset)
  assert helpers.one_line(error).startswith(f"Cannot read the run's config {path} (not JSON")


def test_a_failed_first_launch_leaves_no_folder_and_no_lock(tmp_path):
  # best_metric names no metric of the task: found once the trainer is built.
  config = _config(**{'checkpoint.best_metric': 'valid/bpc'})
  dataset = fx.synthetic_dataset(config)
  missing = str(tmp_path / 'new')
  with pytest.raises(ValueError, match='names no metric'):
    loop.train_and_evaluate(config, missing, dataset)
  assert not os.path.exists(missing)
  empty = tmp_path / 'empty'
  empty.mkdir()
  (empty / 'notes.txt').write_text('mine')
  with pytest.raises(ValueError, match='names no metric'):
    loop.train_and_evaluate(config, str(empty), dataset)
  assert os.listdir(empty) == ['notes.txt']


def test_a_best_checkpoint_past_the_resumed_step_is_moved_aside(first, tmp_path, caplog):
  """checkpoints/ and config.json deleted, relaunched with another seed: the old best is
  not this run's; it is moved aside and the test uses the new run's best."""
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  old, = os.listdir(os.path.join(run, 'best'))
  shutil.rmtree(os.path.join(run, 'checkpoints'))
  os.remove(os.path.join(run, 'config.json'))
  config = _config(**{'seed': 5, 'eval.test_at_end': True, 'eval.every': 4})
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(config, run, dataset)
  assert f"The best checkpoint {os.path.join(run, 'best', old)} is not this run's" in caplog.text
  assert (f"{os.path.join(run, 'metrics.jsonl')} holds 4 records (steps 2 to 4) but the run "
          'starts from step 0 (no checkpoint to resume from): they are dropped.') in caplog.text
  assert os.path.isdir(os.path.join(run, 'other_runs', f'best_{old}'))
  test = [r for r in metric_writer.read_metrics(run) if r['split'] == 'test']
  assert [r['checkpoint_step'] for r in test] == [4]
  assert os.listdir(os.path.join(run, 'best')) == ['4']  # the new run's own


def test_a_best_checkpoint_of_another_config_is_moved_aside(first, tmp_path, caplog):
  _, dataset, workdir = first
  other = str(tmp_path / 'other')
  config = _config(**{'seed': 2})
  loop.train_and_evaluate(config, other, dataset)
  shutil.rmtree(os.path.join(other, 'best'))
  shutil.copytree(os.path.join(workdir, 'best'), os.path.join(other, 'best'))
  old, = os.listdir(os.path.join(other, 'best'))
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(_config(**{'seed': 2, 'train.num_steps': 6}), other, dataset)
  assert 'it was saved under another config.json' in caplog.text
  assert os.path.isdir(os.path.join(other, 'other_runs', f'best_{old}'))


def test_a_deleted_config_json_is_a_warning_and_the_runs_best_stays_its_own(first, tmp_path,
                                                                          caplog):
  """Resumed without config.json: a warning says so, the file is written again from this
  launch, and the run's own best checkpoint (its lineage travels with the checkpoints)
  is not moved aside though the new file's bytes differ (another num_steps)."""
  _, dataset, _ = first
  run = _copy(first, tmp_path)
  best = os.listdir(os.path.join(run, 'best'))
  os.remove(os.path.join(run, 'config.json'))
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(_config(**{'train.num_steps': 6}), run, dataset)
  assert caplog.messages[0] == (
      f"{os.path.join(run, 'config.json')} is missing, though the workdir holds checkpoints "
      "up to step 4: written again from this launch's config, which could not be checked "
      "against the run's.")
  assert "is not this run's" not in caplog.text and not os.path.exists(
      os.path.join(run, 'other_runs'))
  assert set(best) <= set(os.listdir(os.path.join(run, 'best'))) | {'4'} and os.listdir(
      os.path.join(run, 'best'))
  assert workdir_lib.run_config(run)['train.num_steps'] == 6


def test_no_best_checkpoint_at_the_end_is_a_warning_naming_the_step_tested(tmp_path, caplog):
  config = _config(**{'eval.splits': (), 'eval.test_at_end': True})
  run = str(tmp_path / 'run')
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(config, run, fx.synthetic_dataset(config))
  assert 'No best-validation checkpoint in' in caplog.text
  assert 'testing the final state (step 4) on the whole test split instead' in caplog.text


def _run_saved_as(tmp_path, edit):
  """`(config, run folder)`: a workdir whose config.json is `_config()`'s after
  `edit(saved dict)`, as if the config changed after the run began."""
  config = _config()
  saved = json.loads(config.to_json_best_effort())
  edit(saved['model'])
  run = tmp_path / 'run'
  run.mkdir()
  (run / workdir_lib.CONFIG).write_text(json.dumps(saved))
  return config, run


def test_a_field_the_saved_config_lacks_is_recorded_as_absent(tmp_path):
  """A field added to the config after a run began: refused without the override, and
  recorded as '<absent>' (not as None) with it."""
  config, run = _run_saved_as(tmp_path, lambda model: model.pop('min_row_support'))
  with pytest.raises(ValueError, match=r'model.min_row_support \(<absent> -> '):
    workdir_lib.check(config, str(run))
  config.train.allow_config_change = True
  launch = workdir_lib.check(config, str(run))
  want = ['<absent>', config.model.min_row_support]
  assert launch.changed == {'model.min_row_support': want}
  workdir_lib.record_changes(str(run), launch)
  with open(run / workdir_lib.CHANGES) as f:
    assert json.loads(f.readline())['changed'] == {'model.min_row_support': want}


def test_a_field_removed_from_the_config_is_recorded_and_leaves_the_runs_config(tmp_path):
  """A field the config no longer has: allowed with the override, recorded as
  [value, '<absent>'], and from then on the run's config lacks it, so the next launch
  (and a campaign's check of the run) sees no difference."""
  config, run = _run_saved_as(tmp_path, lambda model: model.update(retired_field=3))
  with pytest.raises(ValueError, match=r'model.retired_field \(3 -> <absent>\)'):
    workdir_lib.check(config, str(run))
  config.train.allow_config_change = True
  launch = workdir_lib.check(config, str(run))
  assert launch.changed == {'model.retired_field': [3, '<absent>']}
  workdir_lib.record_changes(str(run), launch)
  assert 'model.retired_field' not in workdir_lib.run_config(str(run))
  config.train.allow_config_change = False
  assert workdir_lib.check(config, str(run)).changed == {}
