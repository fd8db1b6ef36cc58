"""Faults around campaigns (experiments/campaign/): unfinished runs at collect time, the
setup line from the runs' own configs, damaged or incomplete JSON files, two runners on
one campaign, and a runner stopped by Ctrl-C or SIGTERM. Fake runs (records written
here) except in the signal test, which starts real runs and stops them."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from experiments.campaign import collect
from experiments.campaign import runner
from experiments.campaign import show
from experiments.campaign import spec
import helpers

CAMPAIGN = spec.get('quickstart')
EXTRA = dict(CAMPAIGN.tiny)   # two steps per run


def _fake_runs(runs_dir, last_steps, **own):
  """Quickstart runs of seed 0 whose records end at `last_steps[arm]`; their config.json
  is the planned config with the fields `own` changes."""
  tasks = runner.plan(CAMPAIGN, str(runs_dir), seeds=[0], extra=EXTRA)
  for task in tasks:
    os.makedirs(task.workdir)
    config = task.config.copy_and_resolve_references()
    for key, value in own.items():
      section, name = key.split('.')
      config[section][name] = value
    with open(os.path.join(task.workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort())
    with open(os.path.join(task.workdir, 'metrics.jsonl'), 'w') as f:
      for step in range(1, last_steps[task.config.model.variant] + 1):
        for split in ('train', 'valid'):
          f.write(json.dumps({'step': step, 'split': split, 'loss': 1.0, 'accuracy': 0.5,
                              'time_s': float(step),
                              **({'count': 16} if split == 'valid' else {})}) + '\n')
  return tasks


def test_collect_leaves_out_an_unfinished_run_unless_asked_and_reads_the_setup_from_the_runs(
    tmp_path, capsys):
  _fake_runs(tmp_path, {'lstm': 2, 'bn_lstm': 1}, **{'eval.population_batches': 3})
  result = collect.collect(CAMPAIGN, str(tmp_path), [0], None, EXTRA)
  assert list(result['runs']) == ['lstm_s0']
  assert 'left out bn_lstm_s0 (unfinished: step 1 of 2)' in capsys.readouterr().out
  # The flags say 1 estimate batch (the tiny budget); the run was trained with 3.
  assert '(3 training batches)' in result['setup'] and '2 steps' in result['setup']
  # A run that cannot go on, collected as far as it went.
  result = collect.collect(CAMPAIGN, str(tmp_path), [0], None, EXTRA, include_unfinished=True)
  assert list(result['runs']) == ['lstm_s0', 'bn_lstm_s0']
  assert result['runs']['bn_lstm_s0']['unfinished'] is True
  assert 'unfinished' not in result['runs']['lstm_s0']
  assert max(r['step'] for r in result['runs']['bn_lstm_s0']['records']) == 1
  assert 'note: bn_lstm_s0 is unfinished (step 1 of 2)' in capsys.readouterr().out


def test_collect_counts_a_run_finished_by_the_config_it_was_trained_with(tmp_path, capsys):
  """Runs made with --tiny (two steps, 8 units), collected without it (300 steps planned):
  both count, each with a note that the flags plan another config; a later launch's
  step budget (4) is the one a run must reach."""
  tasks = _fake_runs(tmp_path, {'lstm': 2, 'bn_lstm': 2})
  result = collect.collect(CAMPAIGN, str(tmp_path), [0], None, {})
  assert list(result['runs']) == ['lstm_s0', 'bn_lstm_s0']
  assert '2 steps' in result['setup'] and '8 units' in result['setup']
  out = capsys.readouterr().out
  assert ('note: lstm_s0 was trained with another config than these flags plan '
          '(model.hidden_size 8, planned 100); collected as trained.') in out
  assert 'left out' not in out
  with open(os.path.join(tasks[0].workdir, collect.LAUNCHES), 'w') as f:
    f.write(json.dumps({'started': 'a', 'steps_before': 0, 'num_steps': 2}) + '\n' +
            json.dumps({'started': 'b', 'steps_before': 2, 'num_steps': 4}) + '\n')
  result = collect.collect(CAMPAIGN, str(tmp_path), [0], None, EXTRA)
  assert list(result['runs']) == ['bn_lstm_s0']
  assert 'left out lstm_s0 (unfinished: step 2 of 4)' in capsys.readouterr().out


def test_collect_never_writes_fewer_runs_over_a_results_json_nor_none(tmp_path):
  tasks = _fake_runs(tmp_path / 'runs', {'lstm': 2, 'bn_lstm': 2})
  path = str(tmp_path / 'quickstart.json')
  collect.write_results(collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA),
                        path)
  with open(path, 'rb') as f:
    both = f.read()
  assert len(json.loads(both)['runs']) == 2
  os.remove(os.path.join(tasks[1].workdir, 'metrics.jsonl'))
  fewer = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  with pytest.raises(ValueError) as error:
    collect.write_results(fewer, path)
  assert helpers.one_line(error) == (
      f'{path} holds 2 finished runs, this collect 1; it is left as it is (pass '
      '--allow_fewer_runs to replace it).')
  os.remove(os.path.join(tasks[0].workdir, 'metrics.jsonl'))
  none = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  for allow_fewer in (False, True):
    with pytest.raises(ValueError) as error:
      collect.write_results(none, path, allow_fewer)
    assert helpers.one_line(error) == (
        f"No finished run of 'quickstart' to collect; {path} is not written.")
  with open(path, 'rb') as f:
    assert f.read() == both
  collect.write_results(fewer, path, allow_fewer=True)
  assert list(collect.load('quickstart', str(tmp_path))['runs']) == ['lstm_s0']
  missing = str(tmp_path / 'new' / 'quickstart.json')
  with pytest.raises(ValueError, match='is not written'):
    collect.write_results(none, missing)
  assert not os.path.exists(missing)


def test_damaged_or_incomplete_results_json_is_one_line_naming_it(tmp_path):
  path = collect.path_of('quickstart', str(tmp_path))
  for content in ('{"runs": {', '', '[]'):
    with open(path, 'w') as f:
      f.write(content)
    with pytest.raises(ValueError) as error:
      show.render(CAMPAIGN, 'quickstart', str(tmp_path))
    assert helpers.one_line(error).startswith(f'{path} is not a results JSON')
  with open(path, 'w') as f:   # a run whose records lack the accuracy the table reads
    json.dump({'spec': {'arms': {'lstm': {}}}, 'setup': 'x', 'runs': {'lstm_s0': {
        'arm': 'lstm', 'seed': 0, 'records': [{'step': 2, 'split': 'valid', 'loss': 1.0,
                                                'time_s': 1.0}]}}}, f)
  with pytest.raises(ValueError) as error:
    show.render(CAMPAIGN, 'quickstart', str(tmp_path))
  assert helpers.one_line(error) == (
      f"{path} lacks what the 'quickstart' table reads (no 'accuracy'); collect it "
      'again (python -m experiments.campaign collect).')


@pytest.mark.parametrize('runs,kind', [([{'arm': 'lstm'}], 'a list'), ('lstm_s0', 'text')])
def test_a_results_json_whose_runs_are_not_an_object_is_one_line_naming_it(tmp_path, runs,
                                                                          kind):
  path = collect.path_of('quickstart', str(tmp_path))
  with open(path, 'w') as f:
    json.dump({'campaign': 'quickstart', 'spec': {'arms': {}}, 'runs': runs}, f)
  with pytest.raises(ValueError) as error:
    show.render(CAMPAIGN, 'quickstart', str(tmp_path))
  assert helpers.one_line(error) == (
      f'{path} is not a results JSON ("runs" is {kind}, not an object of runs); collect it '
      'again (python -m experiments.campaign collect).')


@pytest.mark.parametrize('field,value,shown,rule', [
    ('accuracy', 7.5, '7.5', 'accuracy is a fraction from 0 to 1'),
    ('accuracy', -0.3, '-0.3', 'accuracy is a fraction from 0 to 1'),
    ('accuracy', True, 'true', 'accuracy is a number'),
    ('accuracy', '0.5', '"0.5"', 'accuracy is a number'),
    ('loss', -1.0, '-1.0', 'loss is not negative'),
    ('step', 1.5, '1.5', 'step is an integer'),
    ('split', 3, '3', 'a record names its split'),
])
def test_a_results_value_of_the_wrong_type_or_range_is_one_line_naming_file_run_and_field(
    tmp_path, field, value, shown, rule):
  _fake_runs(tmp_path / 'runs', {'lstm': 2, 'bn_lstm': 2})
  result = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  path = collect.path_of('quickstart', str(tmp_path))
  result['runs']['bn_lstm_s0']['records'][3][field] = value
  collect.write(result, path)
  with pytest.raises(ValueError) as error:
    show.render(CAMPAIGN, 'quickstart', str(tmp_path))
  assert helpers.one_line(error) == (
      f'{path}: run bn_lstm_s0 holds {shown} in records[3].{field}; {rule} (repair the '
      'value, or run the run again).')


def test_include_unfinished_leaves_out_a_run_the_tables_cannot_read(tmp_path, capsys):
  """A run stopped before its first evaluation has no validation record for the table:
  collected with the others, `report` would refuse the results JSON."""
  _fake_runs(tmp_path / 'runs', {'lstm': 2, 'bn_lstm': 0})
  result = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA,
                           include_unfinished=True)
  assert list(result['runs']) == ['lstm_s0']
  assert ('note: bn_lstm_s0 is unfinished and left out: the result lacks what the '
          "'quickstart' table reads") in capsys.readouterr().out
  collect.write_results(result, collect.path_of('quickstart', str(tmp_path)))
  assert 'lstm' in show.render(CAMPAIGN, 'quickstart', str(tmp_path))


def test_report_of_a_results_json_without_runs_is_one_line_naming_it(tmp_path):
  path = collect.path_of('quickstart', str(tmp_path))
  expected = (f'{path} holds no runs; collect it again once runs have finished (python -m '
              'experiments.campaign collect).')
  for runs in ({}, None):
    with open(path, 'w') as f:
      json.dump({'campaign': 'quickstart', 'setup': 'x', 'runs': runs}, f)
    for report in (lambda: show.render(CAMPAIGN, 'quickstart', str(tmp_path)),
                   lambda: show.draw(CAMPAIGN, str(tmp_path), str(tmp_path / 'q.png'))):
      with pytest.raises(ValueError) as error:
        report()
      assert helpers.one_line(error) == expected
  assert not os.path.exists(tmp_path / 'q.png')


@pytest.mark.parametrize('value', ['NaN', 'Infinity', '-Infinity'])
def test_a_non_finite_metric_is_refused_by_collect_and_report_naming_the_run(tmp_path, value):
  tasks = _fake_runs(tmp_path / 'runs', {'lstm': 2, 'bn_lstm': 2})
  result = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  path = collect.path_of('quickstart', str(tmp_path))
  collect.write_results(result, path)
  result['runs']['lstm_s0']['records'][1]['accuracy'] = float(value)
  collect.write(result, path)   # json writes NaN, Infinity and -Infinity as such
  with open(path) as f:
    assert f'"accuracy": {value}' in f.read()
  with pytest.raises(ValueError) as error:
    show.render(CAMPAIGN, 'quickstart', str(tmp_path))
  shown = float(value)
  assert helpers.one_line(error) == (
      f'{path}: run lstm_s0 holds {shown} in records[1].accuracy; results are finite numbers '
      '(repair the value, or run the run again).')
  metrics = os.path.join(tasks[1].workdir, 'metrics.jsonl')
  with open(metrics) as f:
    lines = f.read().splitlines()
  lines[3] = lines[3].replace('"loss": 1.0', f'"loss": {value}')
  with open(metrics, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  with pytest.raises(ValueError) as error:
    collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  assert helpers.one_line(error) == (
      f'{metrics}: run bn_lstm_s0 holds {shown} in records[3].loss; results are finite '
      'numbers (repair the value, or run the run again).')


def test_status_survives_a_damaged_launch_record_and_a_damaged_config_json_is_one_line(
    tmp_path, capsys):
  tasks = _fake_runs(tmp_path, {'lstm': 2, 'bn_lstm': 1})
  launches = os.path.join(tasks[0].workdir, collect.LAUNCHES)
  with open(launches, 'w') as f:
    f.write('{"exit_code": 0}\n{"exit_co\n')
  text = runner.status(CAMPAIGN, str(tmp_path), [0], None, EXTRA)
  assert 'quickstart/lstm_s0' in text and '1 launch(es)' in text
  assert f'note: {launches}, line 2, is not a launch record; skipped.' in capsys.readouterr().err
  config_json = os.path.join(tasks[1].workdir, 'config.json')
  with open(config_json, 'w') as f:
    f.write('{"model": ')
  with pytest.raises(ValueError) as error:
    runner.status(CAMPAIGN, str(tmp_path), [0], None, EXTRA)
  assert helpers.one_line(error).startswith(f"Cannot read the run's config {config_json} "
                                            '(not JSON')


def test_a_second_runner_on_the_campaign_is_told_it_is_busy(tmp_path):
  with runner.CampaignLock(str(tmp_path), 'quickstart'):
    with pytest.raises(ValueError) as error:
      runner.run(CAMPAIGN, str(tmp_path), 1, [0], None, EXTRA)
  lock = os.path.join(tmp_path, 'quickstart', 'runner.lock')
  assert helpers.one_line(error) == (
      f'The campaign quickstart is busy: another runner (pid {os.getpid()}) holds {lock}; '
      'wait for it to finish or stop it.')
  assert not os.path.exists(os.path.join(tmp_path, 'quickstart', 'lstm_s0'))


def test_a_run_whose_turn_comes_too_close_to_train_until_is_not_started(tmp_path, capsys):
  failed = runner.run(CAMPAIGN, str(tmp_path), 1, [0], None, EXTRA,
                      train_until=time.time() + runner.MIN_BUDGET_S - 2)
  assert failed == [] and os.listdir(tmp_path / 'quickstart') == ['runner.lock']
  assert (f'not started, as fewer than {runner.MIN_BUDGET_S} s were left of the time to '
          'train until: quickstart/lstm_s0, quickstart/bn_lstm_s0; the same command starts '
          'them') in capsys.readouterr().err


def _training(log: str) -> bool:
  try:
    with open(log) as f:
      return re.search(r'step \d+ train: ', f.read()) is not None
  except FileNotFoundError:
    return False


def _processes_naming(text: str) -> list[int]:
  out = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        if text.encode() in f.read():
          out.append(int(pid))
    except OSError:
      pass
  return out


# SIGTERM also stops the accelerator campaign's runs in test_experiment_tools.
@pytest.mark.parametrize('signum', helpers.core_cases([signal.SIGTERM, signal.SIGINT], core=[],
                                                      also=[signal.SIGINT]))
def test_a_stopped_runner_stops_its_runs_without_a_traceback(tmp_path, signum):
  """SIGTERM to the runner, or Ctrl-C (SIGINT to its whole process group, as a terminal
  sends it): the runs stop, no traceback anywhere, no run left behind."""
  runs_dir = str(tmp_path / 'runs')
  env = helpers.subprocess_env()
  env.pop('XLA_FLAGS', None)
  proc = subprocess.Popen(
      [sys.executable, '-m', 'experiments.campaign', 'run', 'quickstart', '--tiny',
       '--seeds=0', '--parallel=2', f'--runs_dir={runs_dir}',
       # Steps no run finishes before the signal, however fast a processor runs the
       # LSTM while the BN-LSTM still compiles.
       '--set=train.num_steps=1000000'], cwd=helpers.REPO, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)
  logs = [os.path.join(runs_dir, 'quickstart', f'{arm}_s0', 'stdout.log')
          for arm in ('lstm', 'bn_lstm')]
  deadline = time.monotonic() + 300
  while not all(_training(log) for log in logs):   # both in their loops over steps
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
    time.sleep(0.2)
  if signum == signal.SIGINT:
    os.killpg(proc.pid, signum)
  else:
    proc.send_signal(signum)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  line = helpers.last_line_without_traceback(err)
  name = signal.Signals(signum).name
  assert line.startswith(f'stopped by {name}: 2 run(s) stopped; `python -m '
                         'experiments.campaign run quickstart` resumes'), line
  assert _processes_naming(os.path.join(runs_dir, 'quickstart')) == []
  for log in logs:
    with open(log) as f:
      assert 'Traceback' not in f.read(), log
    run = os.path.dirname(log)
    launch, = collect.read_launches(run)   # started, then completed
    assert launch['started'] and launch['exit_code'] is not None
    # The steps a stopped launch leaves are those of its latest checkpoint (where the
    # next launch resumes), none if the signal came before the first save.
    saved = [int(name) for name in os.listdir(os.path.join(run, 'checkpoints'))
             if name.isdigit()]
    assert launch['steps_after'] == max(saved, default=0)


def test_a_launch_killed_before_its_end_keeps_its_start_record(tmp_path):
  """The runner writes a launch's record at its start and again at its end: the last line
  of a launch counts, and a launch whose end was never written keeps its start line."""
  cpu = {'processor': 'x', 'cores': 2, 'gpus': [], 'load_average_1_5_15_min': [1, 1, 1]}
  gpu = {**cpu, 'cores': 16, 'gpus': ['G']}
  lines = [{'started': 'a', 'machine': cpu, 'steps_before': 0},           # killed
           {'started': 'b', 'machine': cpu, 'steps_before': 500},
           {'started': 'b', 'machine': {**cpu, 'load_average_1_5_15_min': [2, 2, 2]},
            'steps_before': 500, 'exit_code': 1, 'steps_after': 500},     # refused
           {'started': 'c', 'machine': gpu, 'steps_before': 400},
           {'started': 'c', 'machine': gpu, 'steps_before': 400, 'exit_code': 0,
            'steps_after': 1000}]
  with open(tmp_path / collect.LAUNCHES, 'w') as f:
    f.write(''.join(json.dumps(line) + '\n' for line in lines))
  launches = collect.read_launches(str(tmp_path))
  assert launches == [lines[0], lines[2], lines[4]]
  assert collect.machines_used(launches) == [cpu, gpu]
  assert collect.machines_used(launches[1:]) == [gpu]


def test_collect_keeps_the_runs_a_results_json_holds_and_the_runs_folder_lacks(tmp_path):
  """An arm retrained elsewhere: `keep_held_runs` adds the JSON's other runs in the
  campaign's order and recounts the machines from every run's launches."""
  tasks = _fake_runs(tmp_path / 'runs', {'lstm': 2, 'bn_lstm': 2})
  for task, processor in zip(tasks, ('A', 'B')):
    with open(os.path.join(task.workdir, collect.LAUNCHES), 'w') as f:
      f.write(json.dumps({'started': 'a', 'steps_before': 0, 'steps_after': 2,
                          'num_steps': 2, 'machine': {'processor': processor}}) + '\n')
  path = str(tmp_path / 'quickstart.json')
  collect.write_results(collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA),
                        path)
  os.remove(os.path.join(tasks[0].workdir, 'metrics.jsonl'))   # lstm_s0 is elsewhere now
  result = collect.collect(CAMPAIGN, str(tmp_path / 'runs'), [0], None, EXTRA)
  assert list(result['runs']) == ['bn_lstm_s0'] and 'machines' not in result
  assert collect.keep_held_runs(result, path, CAMPAIGN) == ['lstm_s0']
  assert list(result['runs']) == ['lstm_s0', 'bn_lstm_s0']
  assert [m['processor'] for m in result['machines']] == ['A', 'B']
  assert result['machine'] == {'processor': 'A'}
  assert collect.keep_held_runs(result, path, CAMPAIGN) == []
  assert collect.keep_held_runs(result, str(tmp_path / 'absent.json'), CAMPAIGN) == []
