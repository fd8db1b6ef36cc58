"""`config.train.time_budget_s`: a launch stops at the first checkpoint save after its
budget, and launches on the same workdir continue to exactly what one uninterrupted run
gives (state bitwise, the same metric records)."""

import logging
import os
import subprocess
import sys
import tarfile

import pytest

from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
import helpers
import training_fixtures as fx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Checkpoints at 2, 4, 6, 7; logs at 3, 6, 7; evaluations (and best checkpoints) at 3, 6,
# 7; the test of the best checkpoint at the end. 2 devices, noise on h0.
OVERRIDES = {'model.initial_state': 'noise', 'train.num_steps': 7, 'train.log_every': 3,
             'eval.every': 3, 'checkpoint.every': 2, 'checkpoint.keep': 4,
             'train.num_devices': 2, 'eval.population_batches': 2, 'eval.test_at_end': True}
# Spent before the first step: every launch stops at its first save.
AT_ONCE = 1e-9


def _config(**extra):
  return fx.tiny_config('bn_lstm', **{**OVERRIDES, **extra})


def _final_state(config, workdir, dataset):
  trainer = loop.Trainer(config, workdir, dataset)
  ckpt = checkpoint.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    return ckpt.restore(trainer.initial_state())[0], ckpt.latest_step()
  finally:
    ckpt.close()


@pytest.mark.slow
def test_budgeted_launches_resume_to_the_uninterrupted_run(tmp_path, caplog):
  config = _config()
  dataset = fx.synthetic_dataset(config)
  straight = str(tmp_path / 'straight')
  loop.train_and_evaluate(config, straight, dataset)
  want, _ = _final_state(config, straight, dataset)

  run = str(tmp_path / 'budgeted')
  budgeted = _config(**{'train.time_budget_s': AT_ONCE})
  stops = []
  for _ in range(2):
    caplog.clear()
    with caplog.at_level(logging.INFO):
      last = loop.train_and_evaluate(budgeted, run, dataset)
    assert 'test' not in last
    stops.append(_final_state(budgeted, run, dataset)[1])
    line = next(r.getMessage() for r in caplog.records if 'time budget' in r.getMessage())
    assert f'Stopped after step {stops[-1]} of 7' in line
    assert 'run the same command with the same workdir to continue' in line
  assert stops == [2, 4]   # each launch has its own budget: one save each
  assert 'test' not in {r['split'] for r in metric_writer.read_metrics(run)}

  last = loop.train_and_evaluate(config, run, dataset)   # the rest, without a budget
  assert 'test' in last
  got, step = _final_state(config, run, dataset)
  assert step == 7
  helpers.assert_trees_equal(got, want)
  assert fx.records_without_time(run) == fx.records_without_time(straight)


def test_a_budget_spent_at_the_last_step_finishes_the_run(tmp_path):
  # num_steps 2 = the first save: the run ends there as usual (the test at the end too).
  config = _config(**{'train.time_budget_s': AT_ONCE, 'train.num_steps': 2})
  last = loop.train_and_evaluate(config, str(tmp_path), fx.synthetic_dataset(config))
  assert 'test' in last


@pytest.mark.parametrize('budget', [0, -5.0, float('inf'), float('nan')])
def test_bad_budget_is_one_clear_error(budget):
  config = _config()
  config.train.time_budget_s = budget
  with pytest.raises(ValueError, match='config.train.time_budget_s must be None'):
    config_lib.validate_config(config)


# A budgeted stop and its resume: the in-process test above.
@pytest.mark.exhaustive
def test_main_stops_cleanly_and_says_how_to_continue(tmp_path):
  """The command line: exit status 0, the checkpoint of the stop, one line saying how to
  go on; the same command then finishes the run."""
  args = [sys.executable, 'experiments/main.py', '--config',
          'experiments/configs/quickstart.py', '--workdir', str(tmp_path),
          '--config.train.num_steps=4', '--config.checkpoint.every=2',
          '--config.train.log_every=2', '--config.eval.every=4',
          '--config.model.hidden_size=8', '--config.eval.population_batches=1',
          '--config.eval.max_batches=1', '--config.train.time_budget_s=1e-9']
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env = helpers.subprocess_env(env, JAX_PLATFORMS='cpu')
  first = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'Stopped after step 2 of 4' in first.stderr
  assert 'run the same command with the same workdir to continue' in first.stderr
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2']
  second = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'Resumed from the checkpoint of step 2' in second.stderr
  assert 'Stopped after step' not in second.stderr   # 4 is the last step: it finishes
  assert '4' in os.listdir(tmp_path / 'checkpoints')


@pytest.mark.exhaustive
def test_long_run_command_stops_packs_and_continues(tmp_path):
  """experiments/seq_mnist_long_run.sh on the 8x8 digits (the same command, the data
  swapped by its pass-through arguments): a stop at the first save, a tar without the
  lock, and a second launch that goes on to the end."""
  root, pack = tmp_path / 'runs', tmp_path / 'pack'
  args = ['bash', os.path.join(REPO, 'experiments', 'seq_mnist_long_run.sh'), str(root),
          '1e-9', '--config.data.name=digits', '--config.train.num_steps=4',
          '--config.train.log_every=2', '--config.eval.every=4', '--config.eval.batch_size=250',
          '--config.model.hidden_size=8', '--config.eval.population_batches=1',
          '--config.eval.population_batch_size=100', '--config.eval.test_at_end=False']
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(JAX_PLATFORMS='cpu', PYTHON=sys.executable, MODELS='bn_lstm', EVERY='2',
             PACK=str(pack))
  first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
  assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
  assert '=== bn_lstm: latest checkpoint step 2;' in first.stdout
  assert 'Stopped after step 2 of 4' in first.stderr
  with tarfile.open(pack / 'bn_lstm.tar') as tar:
    names = tar.getnames()
  assert 'bn_lstm/checkpoints/2' in names and 'bn_lstm/metrics.jsonl' in names
  assert 'bn_lstm/lock' not in names
  second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
  assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
  assert '=== bn_lstm: latest checkpoint step 4;' in second.stdout
  assert os.listdir(root / 'bn_lstm' / 'checkpoints') == ['4']   # keep=1
