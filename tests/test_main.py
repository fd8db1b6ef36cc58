"""`experiments/main.py` on the command line: `--show_config`, and every kind of mistake in
the arguments as one line `error: ...` naming what is wrong (no traceback).

The runs are fresh processes as a user starts them; none of these gets as far as training.
"""

import json
import os
import subprocess
import sys

import pytest

from experiments import config_files
import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join('experiments', 'configs')


def _main(*args, python_flags=()):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env = helpers.subprocess_env(env, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, *python_flags, 'experiments/main.py', *args],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                        check=False)


def _config(name):
  return f'--config={os.path.join(CONFIGS, name)}'


MISTAKES = [
    # (arguments, the error line)
    ([_config('ptb_char.py:bnlstm'), '--workdir=/tmp/unused'],
     "error: ptb_char.py:bnlstm: 'bnlstm' is no variant and no preset; variant must be one "
     "of ('lstm', 'bn_lstm', 'bn_input_only'), presets are ('tiny',)."),
    ([_config('quickstart.py:bn_lstm'), '--workdir=/tmp/unused'],
     "error: quickstart.py:bn_lstm: 'bn_lstm' is no preset; it takes only the presets "
     "('tiny',); set other fields with --config.<field>=<value>."),
    ([_config('ptb_word.py:small,large'), '--workdir=/tmp/unused'],
     "error: ptb_word.py:small,large: it names two sizes; size must be one of ('small', "
     "'medium', 'large'), presets are ('tiny',)."),
    ([_config('quickstart.py')],
     'error: --workdir is required: the folder of the run (config.json, checkpoints, '
     'metrics.jsonl); or --show_config to print the config.'),
    (['--workdir=/tmp/unused'],
     'error: --config is required: an experiment config file, e.g. '
     '--config=experiments/configs/quickstart.py (one per paper experiment in '
     'experiments/configs/).'),
    ([_config('no_such_config.py'), '--workdir=/tmp/unused'],
     f'error: --config=experiments/configs/no_such_config.py: no config file at '
     f'{REPO}/experiments/configs/no_such_config.py.'),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', '--config.model.hiden_size=3'],
     "error: --config.model.hiden_size=3: config.model has no field 'hiden_size'; did you "
     "mean 'hidden_size'?"),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', '--config.modle.hidden_size=3'],
     "error: --config.modle.hidden_size=3: config has no field 'modle'; did you mean "
     "'model'?"),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', '--config.model.hidden_size=abc'],
     "error: --config.model.hidden_size=abc: config.model.hidden_size takes an int; got "
     "'abc'."),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', '--config.eval.test_at_end=maybe'],
     "error: --config.eval.test_at_end=maybe: config.eval.test_at_end takes a bool; got "
     "'maybe'."),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', '--confg.seed=3'],
     'error: unknown flag --confg.seed; the flags are --config=<file>[:<argument>], '
     '--workdir=<folder>, --show_config, --config.<field>=<value>.'),
    ([_config('quickstart.py'), '--workdir=/tmp/unused', 'extra'],
     "error: unexpected arguments ['extra']; the flags are --config=<file>[:<argument>], "
     '--workdir=<folder>, --show_config, --config.<field>=<value>.'),
]


@pytest.mark.parametrize('args,line', MISTAKES, ids=[line.split(':')[1].strip()
                                                     for _, line in MISTAKES])
def test_argument_mistakes_are_one_line(args, line):
  result = _main(*args)
  assert result.returncode == 1, result.stderr
  assert result.stderr.strip() == line


def test_a_bad_value_the_config_checks_is_one_line(tmp_path):
  result = _main(_config('seq_mnist.py'), f'--workdir={tmp_path}',
                 '--config.train.batch_size=-4')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'error: config.train.batch_size must be a positive integer; got -4.')


def test_main_reports_bad_config_in_one_line(tmp_path):
  result = _main(_config('seq_mnist.py'), f'--workdir={tmp_path}',
                 '--config.model.hidden_size=-5')
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last == 'error: config.model.hidden_size must be a positive integer; got -5.'


def test_main_reports_missing_mnist_path(tmp_path):
  missing = str(tmp_path / 'no_mnist_here')
  result = _main(_config('seq_mnist.py'), f'--workdir={tmp_path / "run"}',
                 f'--config.data.mnist_dir={missing}')
  assert result.returncode == 1
  last = helpers.last_line_without_traceback(result.stderr)
  assert last.startswith('error: ') and missing in last and 'yann.lecun.com' in last
  assert result.stderr.count(missing) == 1, result.stderr   # printed once, not logged too


def test_unknown_config_field_is_one_line_with_did_you_mean(tmp_path):
  result = _main(_config('seq_mnist.py'), f'--workdir={tmp_path}',
                 '--config.model.hiden_size=5')
  assert result.returncode == 1
  line = helpers.last_line_without_traceback(result.stderr)
  assert line == ("error: --config.model.hiden_size=5: config.model has no field "
                  "'hiden_size'; did you mean 'hidden_size'?")


def test_show_config_prints_the_config_without_loading_jax():
  result = _main(_config('ptb_char.py:lstm,tiny'), '--show_config',
                 '--config.model.hidden_size=16', '--config.eval.max_batches=3',
                 python_flags=('-X', 'importtime'))
  assert result.returncode == 0, result.stderr[-2000:]
  shown = json.loads(result.stdout)
  expected = config_files.load_config('experiments/configs/ptb_char.py', 'lstm,tiny')
  expected.model.hidden_size = 16
  expected.eval.max_batches = 3
  assert shown == json.loads(expected.to_json_best_effort())
  imported = {line.split('|')[-1].strip() for line in result.stderr.splitlines()
              if line.startswith('import time:')}
  assert 'ml_collections' in imported and 'jax' not in imported and 'flax' not in imported


def test_show_config_checks_what_it_prints():
  result = _main(_config('quickstart.py'), '--show_config', '--config.eval.every=0')
  assert result.returncode == 1
  assert json.loads(result.stdout)['eval']['every'] == 0
  assert result.stderr.strip() == 'error: config.eval.every must be a positive integer; got 0.'
