"""`experiments/main.py` as a multi-process run: two processes on 127.0.0.1 (one CPU device
each, gloo collectives), a lost process, a relaunch, and processes started with different
configs. The run is the quickstart's tiny preset (8x8 digits, no data root)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
import helpers
import training_fixtures as fx

MAIN = os.path.join(helpers.REPO, 'experiments', 'main.py')
# 12 steps, a checkpoint every 2: a kill at the first checkpoint leaves most of the run.
FLAGS = ('--config=experiments/configs/quickstart.py:tiny', '--config.train.num_steps=12',
         '--config.checkpoint.every=2', '--config.checkpoint.keep=2',
         '--config.train.log_every=2', '--config.eval.every=12')


def _env(devices: int) -> dict:
  env = helpers.subprocess_env(JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}'
  return env


def _launch(workdir, port, process_id, *extra):
  flags = [*FLAGS, f'--workdir={workdir}', '--config.distributed.enabled=True',
           f'--config.distributed.coordinator_address=127.0.0.1:{port}',
           '--config.distributed.num_processes=2', '--config.distributed.heartbeat_timeout_s=20',
           f'--config.distributed.process_id={process_id}', *extra]
  return subprocess.Popen([sys.executable, MAIN, *flags], cwd=helpers.REPO, env=_env(1),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(path, procs, timeout=600):
  deadline = time.monotonic() + timeout
  while not os.path.isdir(path):
    for p in procs:
      assert p.poll() is None, p.communicate()[1][-3000:]
    assert time.monotonic() < deadline, f'no {path} after {timeout} s'
    time.sleep(0.05)


def _final_params(workdir):
  config = fx.load_config('quickstart', 'tiny')
  config.train.num_steps, config.train.num_devices = 12, 1
  trainer = loop.Trainer(config, workdir)
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    state, _ = ckpt.restore(trainer.initial_state())
  finally:
    ckpt.close()
  assert int(state.step) == 12
  return state


@pytest.mark.slow
def test_two_processes_lose_one_then_resume_to_the_two_device_run(tmp_path):
  """Process 1 is SIGKILLed after the first checkpoint: process 0 stops within seconds
  with one line saying a process was lost and that relaunching resumes; both relaunched
  end where one process with two devices ends."""
  workdir = str(tmp_path / 'two')
  port = helpers.free_port()
  procs = [_launch(workdir, port, i) for i in range(2)]
  _wait_for(os.path.join(workdir, 'checkpoints', '2'), procs)
  procs[1].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  stderr = procs[0].communicate(timeout=300)[1]
  procs[1].wait()
  assert time.monotonic() - killed < 60
  # Process 0 is stopped by whichever notices first: its next collective (the one line
  # below) or JAX's coordination service (its own fatal message), e.g. in a save's barrier.
  line = stderr.strip().splitlines()[-1]
  if procs[0].returncode == 1:
    assert line.startswith('error: A process of this 2-process run was lost'), stderr[-3000:]
    assert 'Relaunch every process with the same command' in line
  else:
    assert procs[0].returncode == -signal.SIGABRT, stderr[-3000:]
    assert 'JAX distributed service detected fatal errors' in stderr, stderr[-3000:]
  assert not os.path.exists(os.path.join(workdir, 'checkpoints', '12'))

  port = helpers.free_port()
  procs = [_launch(workdir, port, i) for i in range(2)]
  outputs = [p.communicate(timeout=900)[1] for p in procs]
  for p, err in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  assert 'Resumed from the checkpoint of step' in outputs[0]

  # The same run in this process on two of its devices (FLAGS as fields).
  single = str(tmp_path / 'one')
  config = fx.load_config('quickstart', 'tiny')
  config.train.num_steps, config.checkpoint.every, config.checkpoint.keep = 12, 2, 2
  config.train.log_every, config.eval.every, config.train.num_devices = 2, 12, 2
  loop.train_and_evaluate(config, single)
  two, one = _final_params(workdir), _final_params(single)
  helpers.assert_trees_close(two.params, one.params, rtol=1e-4, atol=1e-6)
  helpers.assert_trees_close(two.batch_stats, one.batch_stats, rtol=1e-4, atol=1e-6)
  records = {(r['step'], r['split']): r for r in metric_writer.read_metrics(workdir)}
  expected = {(r['step'], r['split']): r for r in metric_writer.read_metrics(single)}
  assert records.keys() == expected.keys()
  for key, record in expected.items():
    np.testing.assert_allclose(records[key]['loss'], record['loss'], rtol=1e-4,
                               err_msg=str(key))


@pytest.mark.slow
def test_processes_with_different_configs_stop_naming_the_fields(tmp_path):
  workdir = str(tmp_path / 'run')
  port = helpers.free_port()
  procs = [_launch(workdir, port, 0), _launch(workdir, port, 1, '--config.seed=3')]
  for p in procs:
    err = p.communicate(timeout=600)[1]
    assert p.returncode == 1, err[-3000:]
    line = helpers.last_line_without_traceback(err)
    assert line.startswith('error: The processes of this run hold different configs: '
                           'process 1 differs from process 0 in seed (0 vs 3)'), line
  assert not os.path.exists(workdir)


@pytest.mark.slow
def test_a_process_whose_peer_never_starts_ends_with_one_line(tmp_path):
  """Process 0 of two, alone: after config.distributed.init_timeout_s it ends with one
  line and status 1, before JAX's client would abort it with a C++ stack dump."""
  workdir = str(tmp_path / 'run')
  started = time.monotonic()
  proc = _launch(workdir, helpers.free_port(), 0, '--config.distributed.init_timeout_s=3')
  err = proc.communicate(timeout=120)[1]
  assert proc.returncode == 1, err[-3000:]
  assert time.monotonic() - started < 60
  port = err.split('waited 3 s at 127.0.0.1:')[1].split(' ')[0]
  assert helpers.last_line_without_traceback(err) == (
      f'error: process 0 of a 2-process run waited 3 s at 127.0.0.1:{port} and the other '
      'processes did not all start (config.distributed.init_timeout_s); start every process '
      'with the same command, each with its own distributed.process_id.')
  assert 'Check failure' not in err and 'fatal errors' not in err, err[-3000:]
  assert not os.path.exists(workdir)
