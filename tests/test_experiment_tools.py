"""The tools around a run: `experiments/plot.py` (curves, one-point axes, a metric that is
not there), `experiments/report.py` (every committed result set, by name) and
`experiments/accelerator_campaign.sh` (a campaign on a machine that keeps nothing)."""

import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from experiments import plot
from experiments import rendering
from experiments import report
from experiments.campaign import collect
from experiments.campaign import show
from experiments.campaign import spec
import helpers
import real_data

REPO = spec.ROOT


def _python(*args):
  env = helpers.subprocess_env()
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


def _write_records(workdir, records):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  return str(workdir)


CHAR_RUN = [{'step': 2, 'split': 'train', 'loss': 3.0, 'bpc': 4.3, 'grad_norm': 1.0,
             'time_s': 1.0},
            {'step': 4, 'split': 'train', 'loss': 2.5, 'bpc': 3.6, 'grad_norm': 1.0,
             'time_s': 2.0},
            {'step': 4, 'split': 'valid', 'loss': 2.6, 'bpc': 3.75, 'time_s': 3.0}]


# ---------------------------------------------------------------------- plot
def test_one_point_gets_an_axis_from_zero_in_whole_steps():
  matplotlib = pytest.importorskip('matplotlib')
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots()
  series = [('valid', [20], [0.5], {})]
  ax.plot([20], [0.5])
  fit = plot._fit_single_values  # pylint: disable=protected-access
  fit(ax, series, logx=False, logy=False, ylim=None)
  assert ax.get_xlim() == (0, 21.0)
  assert ax.get_ylim() == (0.45, 0.55)
  assert all(float(t).is_integer() for t in ax.get_xticks())
  plt.close(fig)


def test_plot_draws_training_and_validation_bpc(tmp_path):
  pytest.importorskip('matplotlib')
  workdir = _write_records(tmp_path / 'run', CHAR_RUN)
  out = _python('experiments/plot.py', f'--workdirs={workdir}', '--metric=bpc',
                '--splits=valid,train', f'--output={tmp_path / "curves.png"}')
  assert out.returncode == 0, out.stderr
  assert out.stderr == '' and os.path.getsize(tmp_path / 'curves.png') > 1000


def test_unknown_metric_is_one_line_listing_the_metrics_there_are(tmp_path):
  workdir = _write_records(tmp_path / 'run', CHAR_RUN)
  out = _python('experiments/plot.py', f'--workdirs={workdir}', '--metric=acc',
                '--splits=valid,train', f'--output={tmp_path / "curves.png"}')
  assert out.returncode == 1
  assert out.stderr.strip() == (f'error: --metric=acc: no valid, train record of {workdir} has '
                                'it; they have bpc, grad_norm, loss.')


def test_a_split_without_the_metric_is_left_out_with_a_warning(tmp_path):
  pytest.importorskip('matplotlib')
  workdir = _write_records(tmp_path / 'run', CHAR_RUN)
  out = _python('experiments/plot.py', f'--workdirs={workdir}', '--metric=bpc',
                '--splits=valid,test', f'--output={tmp_path / "curves.png"}')
  assert out.returncode == 0
  assert out.stderr.strip() == (f"warning: no 'bpc' in the test records of "
                                f"{workdir}/metrics.jsonl; that curve is left out.")


def test_plot_example_reads_the_runs_the_quickstart_writes():
  """The docstring's workdirs are where `quickstart.py --workdir W` puts its runs
  (`<W>/quickstart/<variant>_s<seed>`, the campaign runner's layout)."""
  workdir = re.search(r'quickstart\.py --workdir (\S+)', plot.__doc__).group(1)
  shown = re.search(r'--workdirs=(\S+)', plot.__doc__).group(1).split(',')
  runs = spec.get('quickstart').runs()
  assert shown and all(
      path in [os.path.join(workdir, 'quickstart', r.name) for r in runs] for path in shown)
  assert 'python experiments/quickstart.py --workdir DIR' in open(
      os.path.join(REPO, 'experiments', 'quickstart.py')).read()


# ---------------------------------------------------------------------- report
def test_every_committed_result_names_a_kind_that_renders_it():
  """Every result JSON (campaigns, their speed tables, the analyses, the figures, the
  benchmarks) names its kind, and a renderer of that kind is found: a module's, or a
  benchmark script's `--report`."""
  paths = [p for d in ('experiments/results', 'benchmarks/results')
           for p in glob.glob(os.path.join(REPO, d, '**', '*.json'), recursive=True)]
  assert len(paths) > 40
  for path in paths:
    kind = rendering.load(path)['kind']
    assert kind in rendering.registry() or os.path.isfile(
        os.path.join(REPO, 'benchmarks', f'{kind}.py')), path
  assert set(report.result_sets()) >= {'figures', 'quickstart', 'rnn_speed',
                                       'variable_length_rate', 'brown_tagger_speed'}


def test_a_json_that_names_no_kind_is_one_line_naming_it(tmp_path):
  for content, problem in (('{"runs": {}}', 'names no kind ("kind"), so nothing can render it'),
                           ('{"kind": "no_such_kind"}', "no renderer of kind 'no_such_kind'")):
    path = tmp_path / 'result.json'
    path.write_text(content)
    with pytest.raises(ValueError) as error:
      rendering.render_file(str(path))
    assert helpers.one_line(error).startswith(f'{path}') and problem in helpers.one_line(error)


def test_report_prints_a_speed_table_by_its_json_name():
  out = _python('experiments/report.py', 'brown_tagger_speed', 'trainer_overhead')
  assert out.returncode == 0, out.stderr
  campaign = spec.get('brown_tagger')
  assert show.render(campaign, 'speed') in out.stdout
  assert '## trainer_overhead' in out.stdout and 'B100 T784 I1 H100 bn_lstm' in out.stdout


def test_unknown_report_is_one_line_listing_the_known():
  out = _python('experiments/report.py', 'brown_tagger', 'no_such_table')
  assert out.returncode == 1 and out.stdout == ''
  assert out.stderr.strip() == ("error: unknown result set 'no_such_table'; known: " +
                                ', '.join(report.result_sets()) + '.')


# ---------------------------------------------------------------------- accelerator_campaign.sh
ACCELERATOR_CAMPAIGN = os.path.join(REPO, 'experiments', 'accelerator_campaign.sh')


def _accelerator_campaign(tmp_path, **env):
  return subprocess.run(
      ['bash', ACCELERATOR_CAMPAIGN, 'ptb_char_1000,ptb_char_1000_lengths', str(tmp_path / 'out')],
      env=helpers.subprocess_env(PYTHON=sys.executable, RUNS_DIR=str(tmp_path / 'runs'),
                                 QUICK='1', **env),
      capture_output=True, text=True, timeout=600, check=False)


def test_accelerator_campaign_refuses_a_bad_call_and_a_deadline_too_short_to_train(tmp_path):
  usage = subprocess.run(['bash', ACCELERATOR_CAMPAIGN], capture_output=True, text=True,
                         check=False)
  assert usage.returncode == 2 and 'usage:' in usage.stderr
  short = _accelerator_campaign(tmp_path, DEADLINE_S='30', MARGIN_S='60')
  assert short.returncode == 3, short.stdout[-2000:] + short.stderr[-2000:]
  assert 'no time left to train (deadline 30 s, margin 60 s)' in short.stdout
  assert os.path.exists(tmp_path / 'out' / 'runs.tgz')


@pytest.mark.parametrize('names,env,line', [
    ('quickstart', {'DEADLINE_S': 'abc'}, 'DEADLINE_S=abc is not a whole number of seconds'),
    ('quickstart', {'MARGIN_S': '-5'}, 'MARGIN_S=-5 is not a whole number of seconds'),
    ('quickstart', {'PARALLEL': '0'}, 'PARALLEL=0 is not a positive whole number'),
])
def test_accelerator_campaign_settings_that_are_no_numbers_are_usage_errors(tmp_path, names,
                                                                            env, line):
  """Exit 2 (a usage error), not 3 ("out of time", which a caller would retry)."""
  done = subprocess.run(['bash', ACCELERATOR_CAMPAIGN, names, str(tmp_path / 'out')],
                        env=helpers.subprocess_env(**env), capture_output=True, text=True,
                        check=False)
  assert done.returncode == 2 and done.stdout == ''
  assert done.stderr.strip() == (f'usage: {ACCELERATOR_CAMPAIGN} TRAINING[,EVALUATION] '
                                 f'OUTDIR [WHEEL_DIR]: {line}')


def test_accelerator_campaign_refuses_a_misspelt_evaluation_before_training(tmp_path):
  done = subprocess.run(
      ['bash', ACCELERATOR_CAMPAIGN, 'quickstart,ptb_char_1000_lenghts', str(tmp_path / 'out')],
      env=helpers.subprocess_env(PYTHON=sys.executable, RUNS_DIR=str(tmp_path / 'runs'),
                                 QUICK='1'), capture_output=True, text=True, timeout=300,
      check=False)
  assert done.returncode == 2, done.stdout[-2000:]
  assert "error: Unknown campaign 'ptb_char_1000_lenghts'" in done.stdout
  assert os.listdir(tmp_path / 'runs') == []   # nothing trained


@pytest.mark.slow
def test_accelerator_campaign_stopped_by_timeout_packs_records_queued_runs_keep_deadline(
    tmp_path):
  """SIGTERM to the script's process group, as `timeout` sends it, while the third run
  trains: the runs stop, the records of those that finished come back in runs.tgz, exit
  3; each queued launch's time budget is what was left of the deadline at its start."""
  import tarfile  # pylint: disable=g-import-not-at-top
  proc = subprocess.Popen(
      ['bash', ACCELERATOR_CAMPAIGN, 'quickstart', str(tmp_path / 'out')],
      env=helpers.subprocess_env(PYTHON=sys.executable, RUNS_DIR=str(tmp_path / 'runs'),
                                 QUICK='1', PARALLEL='1', DEADLINE_S='400', MARGIN_S='60'),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith('started quickstart/lstm_s2'):
      os.killpg(proc.pid, signal.SIGTERM)
  assert proc.wait(timeout=120) == 3, ''.join(lines)
  assert any(l.startswith('=== stopped by SIGTERM') for l in lines), ''.join(lines)
  with tarfile.open(tmp_path / 'out' / 'runs.tgz') as packed:
    packed.extractall(tmp_path / 'back', filter='data')
  launches = []
  for run in ('lstm_s0', 'lstm_s1'):
    workdir = tmp_path / 'back' / 'quickstart' / run
    assert (workdir / 'metrics.jsonl').stat().st_size > 0
    launch, = collect.read_launches(str(workdir))
    launches.append(launch)
  assert launches[0]['time_budget_s'] <= 400 - 60
  assert launches[1]['time_budget_s'] <= launches[0]['time_budget_s'] - int(
      launches[0]['wall_s'])


@pytest.mark.exhaustive
@real_data.needs('ptb', 'ptb.train.txt')
def test_accelerator_campaign_trains_evaluates_and_packs_records_without_checkpoints(tmp_path):
  """QUICK=1 on this machine: both tiny campaigns, then a runs.tgz that `collect` reads
  (records, evaluations) and that holds no checkpoint."""
  import tarfile  # pylint: disable=g-import-not-at-top
  done = _accelerator_campaign(tmp_path, PARALLEL='2')
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
  with tarfile.open(tmp_path / 'out' / 'runs.tgz') as packed:
    names = packed.getnames()
    packed.extractall(tmp_path / 'back', filter='data')
  assert not [n for n in names if '/checkpoints' in n or '/best' in n]
  for name in ('ptb_char_1000', 'ptb_char_1000_lengths'):
    collected = helpers.run_python(
        ['-m', 'experiments.campaign', 'collect', name, f'--runs_dir={tmp_path / "back"}',
         f'--results_dir={tmp_path / "results"}', '--tiny'])
    assert collected.returncode == 0, collected.stderr[-2000:]
    with open(tmp_path / 'results' / f'{name}.json') as f:
      assert len(json.load(f)['runs']) == 2
