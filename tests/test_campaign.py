"""The campaign mechanism (experiments/campaign/, experiments/campaign_specs/).

* The docs quote a table of every committed campaign (tests/test_docs.py checks that
  every quoted block regenerates byte for byte); every committed JSON renders, from
  itself alone.
* A campaign runs end to end at a tiny budget (two steps per run, the spec's tiny model,
  fixture data written here): runner, collector, tables, figure, speed. The default run
  takes the quickstart campaign (run, collect, tables, figure, run again, resume), the
  exhaustive tier every campaign and every arm, and a killed campaign resumed.
* The runner skips finished runs (nothing is evaluated twice) and resumes the others; the
  collector records the machine and no paths; each run's command line builds exactly the
  config the spec means.
"""

import datetime
import glob
import importlib
import importlib.util
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from absl import flags
from absl.testing import flagsaver
from ml_collections import config_flags
import pytest

from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import metric_writer
from experiments import config_files
from experiments.campaign import collect
from experiments.campaign import runner
from experiments.campaign import show
from experiments.campaign import spec
from experiments import quickstart as quickstart_script
from experiments.campaign_specs import ptb_word_small
from experiments.campaign_specs import quickstart
import helpers
import training_fixtures as fx

REPO = spec.ROOT


def _committed() -> list[str]:
  """The campaigns with results (a campaign still training has none yet)."""
  return [name for name in spec.names() if os.path.exists(collect.path_of(name))]


def test_docs_quote_tables_of_every_committed_training_campaign():
  docs = _load_docs_tables()
  quoted = {name for path in docs.documents()
            for name, _, _ in docs.json_blocks(open(path).read())}
  for name in _committed():
    if spec.get(name).title.startswith('Attentive Reader') and name != (
        'attentive_reader_long'):
      continue   # the earlier reader runs are described in prose, not quoted
    assert name in quoted, f'no quoted table of {name}'


def _load_docs_tables():
  module_spec = importlib.util.spec_from_file_location(
      'docs_tables', os.path.join(REPO, 'docs', 'tables.py'))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def _moved_floats(value):
  """`value` (a JSON tree) with every float moved to `0.5 x + 0.25` (accuracies stay in
  [0, 1]); integers (steps, counts) and strings are kept."""
  if isinstance(value, float):
    return 0.5 * value + 0.25
  if isinstance(value, dict):
    return {k: _moved_floats(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_moved_floats(v) for v in value]
  return value


@pytest.mark.parametrize('name', _committed())
def test_every_committed_json_renders_and_names_no_local_path(name, tmp_path):
  """Every table renders from its committed JSON, and from its JSON alone: the same JSONs
  with other numbers give another text."""
  campaign = spec.get(name)
  for result_name in [name] + ([campaign.speed.name] if campaign.speed else []):
    if os.path.exists(collect.path_of(result_name)):
      with open(collect.path_of(result_name)) as f:
        collect.write(_moved_floats(json.load(f)),
                      collect.path_of(result_name, str(tmp_path)))
  for table in show.available(campaign):
    rendered = show.render(campaign, table)
    assert rendered.strip() and 'nan' not in rendered
    assert show.render(campaign, table, str(tmp_path)) != rendered, (name, table)
  result = collect.load(name)
  assert result['campaign'] == name and result['runs']
  assert result['command'].startswith('python -m experiments.campaign run ' + name)


def test_results_carry_no_paths_of_this_machine():
  paths = [p for d in ('experiments/results', 'benchmarks/results')
           for p in glob.glob(os.path.join(REPO, d, '**', '*.json'), recursive=True)]
  assert paths
  for path in paths:
    with open(path) as f:
      content = f.read()
    for prefix in ('/tmp/', '/work/', '/root/', '/home/'):
      assert prefix not in content, f'{path} names {prefix}...'


def test_list_shows_every_campaign_with_command_and_expected_time():
  text = show.listing()
  for name in spec.names():
    campaign = spec.get(name)
    assert f'{name}: {campaign.title}' in text and campaign.command in text
    assert f'expected: {campaign.expected}' in text
    # big_vision's manner: the spec's header carries its commands
    doc = importlib.import_module(f'experiments.campaign_specs.{name}').__doc__
    assert f'python -m experiments.campaign run {name}' in doc
    if campaign.speed:
      assert f'python -m experiments.campaign speed {name}' in text


def test_experiment_modules_import_together_without_flag_clashes():
  """The command line, the plotting and report modules, every spec, every analysis
  script and library in one process: no absl DuplicateFlagError."""
  modules = ['experiments.campaign.__main__', 'experiments.plot', 'experiments.report'] + [
      f'experiments.campaign_specs.{n}' for n in spec.names()] + [
          'experiments.' + os.path.relpath(p, os.path.join(REPO, 'experiments'))[:-3].replace(
              os.sep, '.') for p in glob.glob(os.path.join(REPO, 'experiments', 'analysis',
                                                           '**', '*.py'), recursive=True)]
  for module in modules:
    importlib.import_module(module)


# ---------------------------------------------------------------------- spec
@pytest.mark.parametrize('name', spec.names())
def test_every_run_command_builds_the_spec_config(name, tmp_path):
  """`experiments/main.py`'s flags of every run (tiny mode too) parse, through
  config_flags as main.py parses them, to the config the spec means; it validates."""
  campaign = spec.get(name)
  trainer = spec.get(campaign.source) if campaign.source else campaign
  for extra in ({}, dict(trainer.tiny)):
    for run in campaign.runs():
      args = trainer.main_args(run, str(tmp_path), extra)
      argv = ['main.py'] + args[1:]
      values = flags.FlagValues()
      config_flags.DEFINE_config_file('config', None, '', flag_values=values, sys_argv=argv)
      flags.DEFINE_string('workdir', None, '', flag_values=values)
      values(argv)
      wanted = trainer.config_of(run, extra)
      config_lib.validate_config(wanted)
      assert values.config.to_dict() == wanted.to_dict(), (name, run.name, extra)


def test_set_values_are_read_as_the_fields_types():
  config = config_files.load_config('experiments/configs/quickstart.py')
  assert config_files.parse_assignment('train.num_steps=4', config) == ('train.num_steps', 4)
  assert config_files.parse_assignment('optimizer.learning_rate=1', config) == (
      'optimizer.learning_rate', 1.0)
  assert config_files.parse_assignment('eval.test_at_end=true', config) == (
      'eval.test_at_end', True)
  assert config_files.parse_assignment('data.name=mnist', config) == ('data.name', 'mnist')
  assert config_files.parse_assignment("eval.splits=('valid',)", config) == (
      'eval.splits', ('valid',))
  with pytest.raises(ValueError) as error:
    config_files.parse_assignment('train.num_stepz=4', config)
  assert helpers.one_line(error) == (
      "--set=train.num_stepz=4: config.train has no field 'num_stepz'; did you mean "
      "'num_steps'?")
  for wrong in ('four', '4.5'):
    with pytest.raises(ValueError) as error:
      config_files.parse_assignment(f'train.num_steps={wrong}', config)
    assert helpers.one_line(error) == (
        f"--set=train.num_steps={wrong}: config.train.num_steps takes an int; got {wrong!r}.")


def test_unknown_campaign_and_arm_are_one_line_errors():
  with pytest.raises(ValueError, match="Unknown campaign 'nope'"):
    spec.get('nope')
  with pytest.raises(ValueError, match=r"no arm\(s\) \['gru'\]"):
    spec.get('quickstart').runs(arms=['gru'])


# ---------------------------------------------------------------------- tables
def _record(step, split, **values):
  return {'step': step, 'split': split, **values}


def _quickstart_result(lstm, bn):
  """A quickstart JSON whose valid accuracy at steps 1, 2 and 4 is given per seed."""
  runs = {}
  for arm, per_seed in (('lstm', lstm), ('bn_lstm', bn)):
    for seed, accuracies in enumerate(per_seed):
      records = [_record(s, 'valid', accuracy=a, time_s=float(s), count=100)
                 for s, a in zip((1, 2, 4), accuracies)]
      runs[f'{arm}_s{seed}'] = {'arm': arm, 'seed': seed, 'records': records}
  return {'spec': {'arms': {'lstm': {}, 'bn_lstm': {}}}, 'setup': 'tiny', 'runs': runs}


def test_quickstart_table_says_what_holds_in_every_seed():
  result = _quickstart_result(lstm=[(0.1, 0.2, 0.5), (0.1, 0.5, 0.6), (0.2, 0.3, 0.4)],
                              bn=[(0.3, 0.4, 0.6), (0.4, 0.4, 0.7), (0.5, 0.6, 0.3)])
  text = quickstart.table(result)
  lines = {l.split(':')[0].strip(): l for l in text.split('\n') if l.startswith('  ')}
  # a quarter of 4 steps is step 1; half is step 2
  assert lines['at step 1'].endswith(
      'ahead in every seed (mean +0.267 ± 0.058 over seeds, min +0.200)')
  assert '+0.200 -0.100 +0.300' in lines['at step 2']
  assert lines['at step 2'].endswith(
      'ahead in 2 of 3 seeds (mean +0.133 ± 0.208 over seeds, min -0.100)')
  assert lines['at step 4'].endswith(
      'ahead in 2 of 3 seeds (mean +0.033 ± 0.115 over seeds, min -0.100)')
  assert '   1  bn_lstm     0.400    0.400    0.700  0.700        4.0s      –' in text
  # The image count comes from the records; the binomial error of one gap from it: the
  # largest, sqrt((0.4 * 0.6 + 0.5 * 0.5) / 100) = 0.070 (seed 0 at step 4, among others).
  assert 'tiny, on the 100 validation images' in text
  assert 'binomial standard error of 0.' in text and 'to 0.070;' in text
  assert 'standard deviation of the 3 gaps' in text


def test_quickstart_table_of_one_seed_reads_as_one_seed():
  result = _quickstart_result(lstm=[(0.1, 0.5, 0.5)], bn=[(0.3, 0.4, 0.5)])
  text = quickstart.table(result)
  lines = {l.split(':')[0].strip(): l for l in text.split('\n') if l.startswith('  ')}
  assert 'BN-LSTM minus LSTM (seed 0):' in text
  assert lines['at step 1'].endswith('+0.200  ahead')
  assert lines['at step 2'].endswith('-0.100  behind')
  assert lines['at step 4'].endswith('+0.000  level')
  assert text.endswith('to 0.071.') and 'gaps' not in text and 'every seed' not in text


def test_quickstart_default_workdir_is_the_users_own(monkeypatch, tmp_path):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.delenv('XDG_CACHE_HOME', raising=False)
  assert quickstart.default_workdir() == str(tmp_path / 'home' / '.cache' / 'bn_rnn_jax' /
                                             'quickstart')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  assert quickstart.default_workdir() == str(tmp_path / 'cache' / 'bn_rnn_jax' / 'quickstart')


def test_quickstart_says_which_runs_of_its_table_finished_before_it_and_how_to_train_afresh():
  launch = lambda started, wall: {'started': started, 'wall_s': wall}
  result = {'runs': {
      'lstm_s0': {'launches': [launch('2026-01-02T10:00:00+00:00', 50.0)]},
      'bn_lstm_s0': {'launches': [launch('2026-01-02T10:00:00+00:00', 20.0),
                                  launch('2026-01-02T11:00:00+00:00', 90.0)]},
      'lstm_s1': {'launches': [launch('2026-01-03T09:00:00+00:00', 30.0)]}}}
  since = datetime.datetime(2026, 1, 3, tzinfo=datetime.timezone.utc).timestamp()
  assert quickstart_script.earlier_runs_note(result, '/w/quickstart', since) == (
      '2 of the 3 runs in this table finished before this command, between 2026-01-02 '
      '10:00 UTC and 2026-01-02 11:01 UTC, in /w/quickstart: they were not trained again.\n'
      'To train afresh: python experiments/quickstart.py --workdir NEW_FOLDER (or remove '
      '/w/quickstart).')
  assert quickstart_script.earlier_runs_note(result, '/w/quickstart', 0.0) is None


def test_quickstart_table_refuses_runs_of_other_image_counts():
  result = _quickstart_result(lstm=[(0.1, 0.2, 0.5)], bn=[(0.3, 0.4, 0.6)])
  result['runs']['lstm_s0']['records'][0]['count'] = 250
  with pytest.raises(ValueError, match=r'scored \[100, 250\] validation images'):
    quickstart.table(result)


def test_word_ptb_table_reads_best_epochs_and_test_score():
  """Best validation epoch, training perplexity at that epoch and at its lowest, the
  final test score, Laurent's numbers beside them."""
  runs = {}
  for arm, valid in (('lstm', [130.0, 120.0, 125.0]), ('bn_input_only', [128.0, 126.0,
                                                                          121.0])):
    records = []
    for epoch, ppl in enumerate(valid, start=1):
      records.append(_record(10 * epoch, 'train', loss=math.log(100.0 / epoch)))
      records.append(_record(10 * epoch, 'valid', perplexity=ppl))
    records.append(_record(30, 'test', perplexity=111.0, checkpoint_step=20))
    runs[f'{arm}_s0'] = {'arm': arm, 'seed': 0, 'records': records}
  result = {'spec': {'arms': {'lstm': {'label': 'LSTM'}, 'bn_input_only': {'label': 'BN'}},
                     'paper': {'table2_small': ptb_word_small.PAPER}}, 'runs': runs}
  rows = ptb_word_small.table2(result).split('\n')[2:]
  assert rows[0] == '| lstm | 120.0, epoch 2 (119.2) | 50.0 | 33.3 (78.5) | 111.0 |'
  assert rows[1] == '| bn_input_only | 121.0, epoch 3 (120.9) | 33.3 | 33.3 (62.5) | 111.0 |'
  assert ptb_word_small.valid_per_epoch(result).split('\n') == [
      '* LSTM 130, **120**, 125', '* BN   128, 126, **121**']


def test_markdown_and_first_past():
  from experiments.campaign import columns  # pylint: disable=g-import-not-at-top
  assert columns.markdown(['a', 'b'], [[1, ''], ['x', 2]]) == (
      '| a | b |\n|---|---|\n| 1 | |\n| x | 2 |')
  assert columns.first_past([1, 2, 3], [0.1, 0.5, 0.9], 0.4) == 2
  assert columns.first_past([1, 2, 3], [0.9, 0.5, 0.1], 0.4, above=False) == 3
  assert columns.first_past([1, 2], [0.1, 0.2], 0.4) is None


def test_launches_table_gives_each_launch_that_trained_its_steps_rate_and_cores():
  """Launches: one with its end recorded (steps 0-4, a training record every 2 steps 2 s
  apart, an evaluation between), one killed with the runner (resumed from step 6 by the
  next), one refused at start (no step), one pinned to a core, on a GPU machine, and still
  running."""
  from experiments.campaign import columns  # pylint: disable=g-import-not-at-top
  machine = {'processor': 'CPU X', 'cores': 2, 'load_average_1_5_15_min': [0.5, 0, 0]}
  launches = [
      {'steps_before': 0, 'steps_after': 4, 'wall_s': 3600.0, 'machine': machine},
      {'steps_before': 4, 'machine': machine},
      {'steps_before': 6, 'steps_after': 6, 'wall_s': 1.0, 'machine': machine},
      {'steps_before': 6, 'cores_used': 1, 'machine': {**machine, 'gpus': ['GPU Y']}}]
  train = lambda step, time_s: {'step': step, 'split': 'train', 'time_s': time_s}
  records = [train(2, 10.0), {'step': 2, 'split': 'valid', 'time_s': 50.0},
             train(4, 52.0), train(6, 70.0), train(8, 80.0), train(10, 90.0)]
  assert [(l['steps_before'], l['steps_after'])
          for l in columns.trained_launches({'launches': launches})] == [(0, 4), (4, 6), (6, None)]
  assert columns.launches_table({'runs': {'r': {'launches': launches, 'records': records}}}) == (
      '| run | launch | steps | wall (h) | s / step | cores | accelerator or processor '
      '| load at start |\n'
      '|---|---|---|---|---|---|---|---|\n'
      '| r | 1 | 0 → 4 | 1.00 | ? | 2 (shared) | CPU X | 0.50 |\n'
      '| r | 2 | 4 → 6 | ? | ? | 2 (shared) | CPU X | 0.50 |\n'
      '| r | 3 | 6 → | ? | 5.00 | 1 of 2 | GPU Y | 0.50 |')


# ---------------------------------------------------------------------- runner
def _finished_config(test_at_end):
  config = config_files.load_config('experiments/configs/quickstart.py')
  config.train.num_steps = 4
  config.eval.test_at_end = test_at_end
  return config


def test_finished_needs_the_last_records_the_config_asks_for():
  config = _finished_config(test_at_end=False)
  partial = [_record(2, 'train'), _record(2, 'valid')]
  assert not collect.finished(partial, config)
  assert not collect.finished(partial + [_record(4, 'train')], config)
  assert collect.finished(partial + [_record(4, 'train'), _record(4, 'valid')], config)
  config = _finished_config(test_at_end=True)
  done = partial + [_record(4, 'train'), _record(4, 'valid')]
  assert not collect.finished(done, config)
  assert collect.finished(done + [_record(4, 'test')], config)
  # A run a non-finite step stopped has ended: its records end with the stop record.
  stopped = {'step': 3, 'split': metric_writer.STOPPED, 'reason': 'non-finite'}
  assert collect.finished(partial + [stopped], config)
  assert not collect.finished([stopped] + partial, config)


def test_a_workdir_of_another_config_is_an_error(tmp_path):
  campaign = spec.get('quickstart')
  task = runner.plan(campaign, str(tmp_path), seeds=[0], arms=['lstm'])[0]
  os.makedirs(task.workdir)
  other = task.config.copy_and_resolve_references()
  other.model.hidden_size = 7
  with open(os.path.join(task.workdir, 'config.json'), 'w') as f:
    f.write(other.to_json_best_effort())
  with open(os.path.join(task.workdir, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps(_record(2, 'train')) + '\n')
  with pytest.raises(ValueError, match=f'{task.workdir} holds a run of another config '
                     r"\(model.hidden_size: 7 there, 100 wanted\)"):
    runner.progress(task)
  other.model.hidden_size = 100
  other.train.num_steps = 5     # another budget is not another config: it resumes
  with open(os.path.join(task.workdir, 'config.json'), 'w') as f:
    f.write(other.to_json_best_effort())
  os.makedirs(os.path.join(task.workdir, 'checkpoints', '2'))
  assert runner.progress(task) == ('partial', 2)


def test_a_partial_run_counts_the_steps_its_latest_checkpoint_keeps(tmp_path):
  campaign = spec.get('quickstart')
  task = runner.plan(campaign, str(tmp_path), seeds=[0], arms=['lstm'])[0]
  os.makedirs(task.workdir)
  with open(os.path.join(task.workdir, 'config.json'), 'w') as f:
    f.write(task.config.to_json_best_effort())
  with open(os.path.join(task.workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(_record(step, 'train')) + '\n' for step in (2, 4, 6))
  # Killed before its first save: the next launch starts again from step 0.
  assert runner.progress(task) == ('partial', 0)
  # Killed after the save of step 4 and a logged step 6: it resumes from step 4.
  for name in ('2', '4', '6.orbax-checkpoint-tmp'):
    os.makedirs(os.path.join(task.workdir, 'checkpoints', name))
  assert runner.progress(task) == ('partial', 4)


def test_an_evaluation_takes_its_source_runs_at_their_own_budget(tmp_path):
  """A source run last launched with a budget of its own is finished at that budget for
  the evaluation campaign, not trained on to the training campaign's."""
  campaign = spec.get('ptb_char_256_lengths')
  planned = runner.plan(campaign, str(tmp_path), seeds=[0], arms=['lstm'])[0]
  assert planned.config.train.num_steps == spec.get('ptb_char_256').config_of(
      spec.get('ptb_char_256').runs([0], ['lstm'])[0], {}).train.num_steps
  os.makedirs(planned.workdir)
  with open(os.path.join(planned.workdir, collect.LAUNCHES), 'w') as f:
    f.write(json.dumps({'started': 't0', 'steps_before': 0, 'num_steps': 9}) + '\n')
  source, evaluation = runner.plan(campaign, str(tmp_path), seeds=[0], arms=['lstm'])
  assert (source.config.train.num_steps, source.total) == (9, 9)
  assert evaluation.after == source.key
  longer = runner.plan(campaign, str(tmp_path), [0], ['lstm'], {'train.num_steps': 12})[0]
  assert longer.config.train.num_steps == 12


def test_runs_side_by_side_each_keep_to_their_own_cores(tmp_path):
  assert runner.core_slots(2, [0, 1]) == [{0}, {1}]
  assert runner.core_slots(2, range(5)) == [{0, 1, 2}, {3, 4}]
  assert runner.core_slots(3, [0, 1]) == [None] * 3     # fewer cores than runs: shared
  assert runner.core_slots(1, [0, 1]) == [None]
  cores = sorted(os.sched_getaffinity(0))
  task = runner.Task('probe/run', str(tmp_path), [
      '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], {}, 1)
  child = runner._Child(task, 0, frozenset(cores[-1:]))  # pylint: disable=protected-access
  assert child.process.wait() == 0
  child._finish(None)                                   # pylint: disable=protected-access
  with open(child.log_path) as f:
    assert f.read().strip() == str(cores[-1:])
  assert collect.read_launches(str(tmp_path))[-1]['cores_used'] == 1


def test_eta_comes_from_measured_steps_and_start_ups():
  """Four runs of 300 steps, two at a time; each starts up for 10 s, then runs 25 steps/s
  (its first 25 steps logged 11 s after its launch). Start-up and compilation are not
  taken for training speed, and the runs not started yet pay theirs."""
  eta = runner.Eta(parallel=2)
  assert eta.left(0.0, {'a': 300, 'b': 300}, [300, 300]) == '?'
  for key in 'ab':
    eta.launched(key, 0.0, 0)
    eta.progressed(key, 5.0, 0)
  assert eta.left(5.0, {'a': 300, 'b': 300}, [300, 300]) == '?'   # no rate yet
  for key in 'ab':
    eta.progressed(key, 11.0, 25)
  assert eta.left(11.0, {'a': 275, 'b': 275}, [300, 300]) == '?'  # one point: no span
  for key in 'ab':
    eta.progressed(key, 13.0, 75)
  assert eta.rate() == pytest.approx(25.0) and eta.start_up(25.0) == pytest.approx(10.0)
  # Left: 2 x 225 steps running, 2 runs of 10 s + 300 steps pending; over 2 slots:
  # (2 x 9 + 2 x (10 + 12)) / 2 = 31 s (the whole campaign: 13 + 31 = 44 = 2 x 22 s).
  assert eta.left(13.0, {'a': 225, 'b': 225}, [300, 300]) == '0:00:31'
  # A launch that has not logged yet still owes the rest of its start-up.
  eta.launched('c', 13.0, 0)
  assert eta.left(17.0, {'c': 300}, []) == '0:00:18'     # 6 s of start-up + 12 s


def test_report_draws_its_figure_only_when_asked(monkeypatch, tmp_path, capsys):
  """`report NAME` reads the committed results and writes nothing; `--figure=PATH`
  writes PATH; `--results_dir=DIR` (results collected there) writes DIR/NAME.png."""
  main = importlib.import_module('experiments.campaign.__main__')
  drawn = []
  monkeypatch.setattr(show, 'draw', lambda campaign, results_dir, output: drawn.append(
      (results_dir, output)) or output)
  campaign = spec.get('quickstart')
  results = tmp_path / 'results'
  results.mkdir()
  shutil.copy(collect.path_of('quickstart'), results)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  for figure, results_dir in ((None, None), (str(tmp_path / 'f.png'), None),
                              (None, str(results)), ('none', str(results))):
    with flagsaver.flagsaver(figure=figure, results_dir=results_dir):
      main._report(campaign)  # pylint: disable=protected-access
  assert drawn == [(None, str(tmp_path / 'f.png')),
                   (str(results), os.path.join(str(results), 'quickstart.png'))]
  assert capsys.readouterr().out.count('acc@end') == 4


def test_command_line_names_no_paths():
  assert collect.command_line(['run', 'x', '--runs_dir', '/tmp/a', '--seeds=0',
                               '--results_dir=/b', '--set=data.path=/tmp/ptb',
                               '--set', 'model.variant=lstm', '--set', 'data.path=/tmp/b',
                               '--set=train.num_steps=2']) == (
      'python -m experiments.campaign run x --seeds=0 --set=data.path=<path> '
      '--set=model.variant=lstm --set=data.path=<path> --set=train.num_steps=2')
  assert collect.scrub({'a': ['/tmp/x', 'rel/y'], 'b': 3}) == {'a': ['<path>', 'rel/y'],
                                                              'b': 3}


# ---------------------------------------------------------------------- end to end
@pytest.fixture(scope='module')
def data(tmp_path_factory):
  """Fixture data of every campaign's dataset (digits need none)."""
  root = tmp_path_factory.mktemp('campaign_data')
  (root / 'ptb').mkdir()
  return {
      'ptb': fx.write_ptb_fixture(root / 'ptb', lines=(60, 12, 12)),
      'brown': fx.write_brown(root / 'brown'),
      'cloze': fx.write_questions(str(root / 'cloze')),
  }


DATA = {'ptb_char_256': 'ptb', 'ptb_char_256_lengths': 'ptb', 'ptb_char_1000': 'ptb',
        'ptb_char_1000_lengths': 'ptb', 'ptb_word_small': 'ptb', 'brown_tagger': 'brown', 'attentive_reader_long': 'cloze',
        'attentive_reader_1200': 'cloze', 'attentive_reader_200': 'cloze'}


@pytest.fixture(scope='module')
def tiny_runs(tmp_path_factory):
  """One runs folder and XLA cache for every campaign's tiny runs (the lengths campaign
  evaluates the tiny ptb_char_256 runs)."""
  return tmp_path_factory.mktemp('campaign_runs')


def _tiny(name, data, runs_dir, results_dir, arms=None, seeds=None):
  """Run, collect, report (every table, the figure) and time a campaign at the tiny
  budget (its first seed, `arms` or all); returns its results JSON."""
  campaign = spec.get(name)
  trainer = spec.get(campaign.source) if campaign.source else campaign
  extra = dict(trainer.tiny)
  if name in DATA:
    extra['data.path'] = data[DATA[name]]
  seeds = seeds or campaign.seeds[:1]
  failed = runner.run(campaign, str(runs_dir), 2, seeds, arms, extra, compile_cache=True,
                      tiny=True)
  assert not failed, [open(os.path.join(runs_dir, k, 'stdout.log')).read()[-3000:]
                      for k in failed]
  result = collect.collect(campaign, str(runs_dir), seeds, arms, extra, 'tiny')
  collect.write(result, collect.path_of(name, str(results_dir)))
  if campaign.speed:   # the command line, as a user runs it
    speed_arms = [a for a in campaign.speed.arms if arms is None or a in arms]
    options = [f'--set={k}={config_files.flag_value(v)}' for k, v in extra.items()
               if k not in campaign.tiny]
    done = subprocess.run(
        [sys.executable, '-m', 'experiments.campaign', 'speed', name, '--tiny',
         f'--arms={",".join(speed_arms)}', f'--runs_dir={runs_dir}',
         f'--results_dir={results_dir}', '--compile_cache', *options],
        cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    timed = collect.load(campaign.speed.name, str(results_dir))
    assert list(timed['arms']) == speed_arms
    assert 'intra_op_parallelism_threads=1' in timed['machine']['xla_flags']
  for table in show.table_names(campaign):
    text = show.render(campaign, table, str(results_dir))
    assert text.strip() and 'nan' not in text
  if campaign.figure:
    png = show.draw(campaign, str(results_dir))
    assert os.path.getsize(png) > 1000
  content = json.dumps(result)
  assert str(runs_dir) not in content and str(data['ptb']) not in content
  assert len(result['runs']) == len(campaign.runs(seeds, arms))
  for run in result['runs'].values():
    if 'records' in run:
      assert run['records'][-1]['step'] == 2
      launch = run['launches'][-1]
      assert launch['exit_code'] == 0 and launch['num_steps'] == 2
      machine = launch['machine']
      # The launch's own process CPU time: some, and no more than its cores gave it.
      assert 0 < launch['cpu_s'] <= launch['wall_s'] * machine['cores'] + 0.1, launch
      assert machine['cores'] >= 1 and machine['processor'] and machine['versions']['jax']
      assert 'intra_op_parallelism_threads=1' in machine['xla_flags']
      assert len(machine['load_average_1_5_15_min']) == 3
    else:
      assert run['evaluation']['rows'][-1]['length'] == 'whole'
  return result


# Arms of the quick end-to-end runs, where a campaign's other arms differ from these only
# in config values: every arm's config is built, parsed and validated above, and the slow
# test below trains them all. The reader's reference arm (lstm) is kept: its speed table
# needs it; the earlier reader campaigns reuse its compiled programs.
QUICK_ARMS = {'init_options': ['lstm_ours', 'bn_lstm_authors'],
              'mnist_fig2': ['seq_bn_lstm'],
              'pmnist_fig2': ['pmnist_lstm'],
              'attentive_reader_long': ['lstm', 'bn_e_star_star'],
              'attentive_reader_1200': ['lstm'],
              'attentive_reader_200': ['lstm']}


# Every campaign (their configs are built and validated in process above); the default run
# takes the quickstart campaign end to end in the run-again test below.
@pytest.mark.exhaustive
@pytest.mark.parametrize('name', spec.names())
def test_campaign_end_to_end_at_a_tiny_budget(name, data, tiny_runs, tmp_path):
  result = _tiny(name, data, tiny_runs, tmp_path, QUICK_ARMS.get(name))
  if name.startswith('attentive_reader'):
    assert set(result['baselines']) == {'train', 'valid', 'test'}


# The reader campaigns of 200 and 1,200 steps train arms of attentive_reader_long with
# other budgets and cadences (their configs are built and validated above), so their
# other arms are not trained again here.
EVERY_ARM = sorted(set(QUICK_ARMS) - {'attentive_reader_200', 'attentive_reader_1200'})


@pytest.mark.exhaustive
@pytest.mark.parametrize('name', EVERY_ARM)
def test_every_arm_end_to_end_at_a_tiny_budget(name, data, tiny_runs, tmp_path):
  """The arms the quick test leaves out (the runs it made are skipped, not redone)."""
  _tiny(name, data, tiny_runs, tmp_path)


@pytest.mark.slow
def test_run_again_skips_finished_runs_and_resumes_the_others(data, tiny_runs, tmp_path):
  """After the tiny quickstart, the same `run` launches nothing; a longer budget resumes
  the run from its checkpoint (one more launch); no step is evaluated twice."""
  campaign = spec.get('quickstart')
  extra = dict(campaign.tiny)
  _tiny('quickstart', data, tiny_runs, tmp_path, ['lstm'])
  workdir = os.path.join(tiny_runs, 'quickstart', 'lstm_s0')
  before = collect.read_launches(workdir)
  assert runner.run(campaign, str(tiny_runs), 2, [0], ['lstm'], extra) == []
  assert collect.read_launches(workdir) == before
  longer = {**extra, 'train.num_steps': 4}
  assert runner.run(campaign, str(tiny_runs / 'longer'), 2, [0], ['lstm'], extra) == []
  assert runner.run(campaign, str(tiny_runs / 'longer'), 2, [0], ['lstm'], longer) == []
  resumed = os.path.join(tiny_runs, 'longer', 'quickstart', 'lstm_s0')
  launches = collect.read_launches(resumed)
  assert [(l['steps_before'], l['steps_after']) for l in launches] == [(0, 2), (2, 4)]
  assert runner.run(campaign, str(tiny_runs / 'longer'), 2, [0], ['lstm'], longer) == []
  records = metric_writer.read_metrics(resumed)
  assert [r['step'] for r in records if r['split'] == 'train'] == [2, 4]
  assert [r['step'] for r in records if r['split'] == 'valid'] == [2, 4]
  assert len(collect.read_launches(resumed)) == 2


# The quickstart campaign itself: the run-again test above.
@pytest.mark.exhaustive
def test_quickstart_runs_end_to_end(tmp_path):
  """`experiments/quickstart.py` (the README's first command) at a tiny budget: it runs
  the quickstart campaign, prints its table and draws the curves; run again, it trains
  nothing and says that its table's runs finished before, and how to train afresh."""
  args = ['--workdir', str(tmp_path), '--seeds=0', '--config.train.num_steps=4',
          '--config.eval.every=2', '--config.train.log_every=2',
          '--config.model.hidden_size=8', '--config.eval.population_batches=1',
          '--config.eval.max_batches=1',
          "--config.variants=('bn_lstm',)"]  # one variant: the budget
  result = helpers.run_python(['experiments/quickstart.py', *args], one_device=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'bn_lstm' in result.stdout and 'acc@end' in result.stdout
  assert 'finished before this command' not in result.stdout
  assert os.path.getsize(tmp_path / 'learning_curves.png') > 1000
  assert os.path.exists(tmp_path / 'quickstart' / 'bn_lstm_s0' / 'metrics.jsonl')
  again = helpers.run_python(['experiments/quickstart.py', *args], one_device=True)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.rstrip().endswith(
      f'To train afresh: python experiments/quickstart.py --workdir NEW_FOLDER (or remove '
      f'{tmp_path / "quickstart"}).')
  assert '1 of the 1 runs in this table finished before this command, on ' in again.stdout


# A stopped runner: tests/test_campaign_faults.py; a killed run resumes exactly:
# tests/test_faults.py, tests/test_loop.py.
@pytest.mark.exhaustive
def test_a_killed_campaign_resumes_exactly(tiny_runs):
  """Kill the runner and its run (SIGKILL to the process group) after the first
  checkpoint; `run` again resumes the run from it and ends with the records of an
  uninterrupted one.

  The killed launch asks for more steps than it can reach, so however far it got before
  the kill (the test's polling may lag the run), it is unfinished; the resumed and the
  uninterrupted runs then share a budget past that point (the learning rate does not
  depend on `train.num_steps`, and a changed budget resumes rather than restarts)."""
  campaign = spec.get('quickstart')
  budget = {**campaign.tiny, 'train.num_steps': 1_000_000, 'train.log_every': 5,
            'eval.every': 50, 'checkpoint.every': 10}
  argv = [sys.executable, '-m', 'experiments.campaign', 'run', 'quickstart', '--tiny',
          '--arms=lstm', '--seeds=0', f'--runs_dir={tiny_runs / "killed"}',
          '--compile_cache'] + [f'--set={k}={v}' for k, v in budget.items()
                                if k not in campaign.tiny or v != campaign.tiny[k]]
  killed = os.path.join(tiny_runs, 'killed', 'quickstart', 'lstm_s0')
  process = subprocess.Popen(argv, cwd=REPO, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 300   # a checkpoint is written and a step past it logged
    while time.time() < deadline and not _past_a_checkpoint(killed):
      time.sleep(0.05)
  finally:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
  task = runner.plan(campaign, str(tiny_runs / 'killed'), [0], ['lstm'], budget)[0]
  deadline = time.time() + 30   # the killed run's process ends (its lock goes with it)
  while runner.progress(task)[0] == 'running' and time.time() < deadline:
    time.sleep(0.1)
  reached = max(r['step'] for r in _records_so_far(killed))
  assert reached >= 15
  budget['train.num_steps'] = (reached // 50 + 2) * 50   # two evaluations past the kill
  assert not collect.finished(_records_so_far(killed), campaign.config_of(
      campaign.runs([0], ['lstm'])[0], budget))
  assert runner.run(campaign, str(tiny_runs / 'killed'), 1, [0], ['lstm'], budget,
                    compile_cache=True) == []
  assert runner.run(campaign, str(tiny_runs / 'whole'), 1, [0], ['lstm'], budget,
                    compile_cache=True) == []
  with open(os.path.join(killed, 'stdout.log')) as f:
    assert re.search(r'Resumed from the checkpoint of step [1-9][0-9]*0\.', f.read())
  whole = os.path.join(tiny_runs, 'whole', 'quickstart', 'lstm_s0')
  strip = lambda records: [{k: v for k, v in r.items() if k != 'time_s'} for r in records]
  assert strip(metric_writer.read_metrics(killed)) == strip(metric_writer.read_metrics(whole))
  assert [r['step'] for r in metric_writer.read_metrics(killed) if r['split'] == 'valid'] == list(
      range(50, budget['train.num_steps'] + 1, 50))


def _past_a_checkpoint(workdir):
  """Whether a train record is written past the step of a saved checkpoint (with
  `checkpoint.keep=1` each save removes the one before, so any step counts)."""
  try:
    saved = [int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit()]
  except FileNotFoundError:
    return False
  return bool(saved) and any(r['split'] == 'train' and r['step'] > min(saved)
                             for r in _records_so_far(workdir))


def _records_so_far(workdir):
  if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    return []
  return metric_writer.read_metrics(workdir)
