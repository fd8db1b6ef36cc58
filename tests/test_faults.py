"""Fault injection: kills, damaged files, NaNs, concurrent launches, bad input.

Every probe ends in one of three outcomes, asserted: a final state bitwise identical to
an uninterrupted run's, a clear one-line error, or a fallback with a warning. Runs are
tiny (`training_fixtures`); the subprocess probes (SIGKILL, concurrent launches, the
command line) share the tests' persistent compilation cache.
"""

import gzip
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import batch_stats
from bn_rnn_jax import variants
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import workdir as workdir_lib
import helpers
import training_fixtures as fx

REPO = helpers.REPO

# test_loop.py's run (same compiled programs): h0 noise, 2 devices, 7 steps, checkpoints
# at 2, 4, 6, 7 (all kept), logs at 3, 6, 7, a best checkpoint and a test record.
OVERRIDES = {'model.initial_state': 'noise', 'train.num_steps': 7, 'train.log_every': 3,
             'eval.every': 3, 'checkpoint.every': 2, 'checkpoint.keep': 4,
             'train.num_devices': 2, 'eval.population_batches': 2, 'eval.test_at_end': True}


def _config(**extra):
  return fx.tiny_config('bn_lstm', **{**OVERRIDES, **extra})


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """An uninterrupted run: `(config, dataset, workdir, final state)`."""
  config = _config()
  dataset = fx.synthetic_dataset(config)
  workdir = str(tmp_path_factory.mktemp('straight'))
  loop.train_and_evaluate(config, workdir, dataset)
  state, _ = fx.restore(config, workdir, dataset)
  return config, dataset, workdir, state


def _copy(straight_run, tmp_path, name='copy'):
  _, _, workdir, _ = straight_run
  target = str(tmp_path / name)
  shutil.copytree(workdir, target)
  return target


# ====================================================================== kills
def _worker(workdir, overrides, *extra, wait=True):
  env = helpers.subprocess_env()
  args = [sys.executable, os.path.join(REPO, 'tests', 'fault_worker.py'), workdir,
          json.dumps(overrides), *map(str, extra)]
  proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  if not wait:
    return proc
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


@pytest.mark.slow
def test_concurrent_launches_then_sigkills_inside_a_save_and_at_random_resume_exactly(
    straight, tmp_path):
  config, dataset, workdir, state = straight
  run = str(tmp_path / 'killed')
  # 1. Two launches at once, each set to die while writing the checkpoint of step 4 (its
  #    folder half-written): one holds the workdir, the other fails at once naming it.
  procs = [_worker(run, OVERRIDES, 4, wait=False) for _ in range(2)]
  results = sorted((p.wait(timeout=300), p.communicate()[1]) for p in procs)
  (killed, _), (refused, refused_err) = results
  assert (killed, refused) == (-signal.SIGKILL, 1), [err[-2000:] for _, err in results]
  assert 'is in use by another run (pid' in helpers.last_line_without_traceback(refused_err)
  assert '4' not in os.listdir(os.path.join(run, 'checkpoints'))
  # 2. Restarted, taking over the dead run's lock (with a warning), and killed inside the
  #    save of step 6.
  code, _, err = _worker(run, OVERRIDES, 6)
  assert code == -signal.SIGKILL, err[-3000:]
  assert 'Took over the lock of a run that is no longer running' in err
  # 3. Restarted and killed at a random moment (the run may also finish first: it is
  #    short, and its programs come from the compilation cache).
  proc = _worker(run, OVERRIDES, wait=False)
  time.sleep(random.Random(0).uniform(2.0, 6.0))
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  assert proc.returncode in (0, -signal.SIGKILL)
  # 4. Restarted to the end: the same final state and the same metrics records.
  code, _, err = _worker(run, OVERRIDES)
  assert code == 0, err[-3000:]
  final, _ = fx.restore(config, run, dataset)
  helpers.assert_trees_equal(state, final)
  assert fx.records_without_time(run) == fx.records_without_time(workdir)
  assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == ['2', '4', '6', '7']


@pytest.mark.slow
def test_ctrl_c_ends_main_with_one_line_naming_the_checkpoint_it_resumes_from(tmp_path):
  """Ctrl-C (SIGINT) once a checkpoint exists: exit status 130 and one line, no traceback,
  naming the newest checkpoint (complete: the loop waits for its saves on the way out)."""
  run = tmp_path / 'run'
  args = [sys.executable, 'experiments/main.py', '--config',
          'experiments/configs/quickstart.py', f'--workdir={run}',
          '--config.train.num_steps=100000', '--config.checkpoint.every=2',
          '--config.train.log_every=2', '--config.eval.every=100000',
          '--config.model.hidden_size=8']
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  proc = subprocess.Popen(args, cwd=REPO, env=helpers.subprocess_env(env, JAX_PLATFORMS='cpu'),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          # As from a terminal, even where the tests run with SIGINT ignored.
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  deadline = time.monotonic() + 240
  while not workdir_lib.checkpoint_steps(str(run)) and time.monotonic() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-3000:]
  step = workdir_lib.checkpoint_steps(str(run))[-1]
  assert helpers.last_line_without_traceback(err) == (
      f'Stopped (Ctrl-C); the same command resumes from the checkpoint of step {step}, '
      f'{run / "checkpoints" / str(step)}.')


def test_ctrl_c_while_absl_imports_the_config_file_is_one_line(tmp_path):
  config = tmp_path / 'interrupted.py'
  config.write_text('import os, signal, time\n'
                    'os.kill(os.getpid(), signal.SIGINT)\n'
                    'time.sleep(5)\n'
                    'def get_config():\n'
                    '  return None\n')
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  done = subprocess.run(
      [sys.executable, 'experiments/main.py', f'--config={config}',
       f'--workdir={tmp_path / "run"}'], cwd=REPO,
      env=helpers.subprocess_env(env, JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=120, check=False,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert done.returncode == 130, done.stderr[-3000:]
  assert done.stderr.strip() == ('Stopped (Ctrl-C) before the run started; the same '
                                 'command starts it.')
  assert not os.path.exists(tmp_path / 'run')


# Ctrl-C landing while a garbage-collection callback runs (JAX registers one): raised
# there, the KeyboardInterrupt would be printed and dropped, and the launch train on.
# Python's own Ctrl-C handler, as a process started from a terminal has it (a shell's
# background job, as a test run may be, starts with SIGINT ignored).
_CTRL_C_IN_A_GC_CALLBACK = """
import gc, os, signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from experiments import stopping
stopping.handle_ctrl_c()
def callback(phase, info):
  if phase == 'start' and not callback.fired:
    callback.fired = True
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(1000))   # the handler runs here, inside the callback
callback.fired = False
gc.callbacks.append(callback)
try:
  gc.collect()
  end = time.monotonic() + 5
  while time.monotonic() < end:
    pass
  print('lost')
except KeyboardInterrupt:
  print('delivered')
"""


def test_ctrl_c_landing_in_a_garbage_collection_callback_still_stops_main():
  result = helpers.run_python(['-c', _CTRL_C_IN_A_GC_CALLBACK], timeout=60)
  assert result.stdout.strip() == 'delivered', result.stderr[-2000:]
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_resume_from_an_older_checkpoint_logs_what_the_straight_run_logged(straight, tmp_path):
  # A shallow-copied meta would show here: a checkpoint with a partial
  # metric window (step 4: one step since the log at 3), resumed after deleting the newer
  # ones. The window saved must be the one of step 4, not one the loop mutated later.
  config, dataset, workdir, state = straight
  run = _copy(straight, tmp_path)
  for step in ('6', '7'):
    shutil.rmtree(os.path.join(run, 'checkpoints', step))
  _, meta4 = fx.restore(config, run, dataset)
  assert meta4['window_steps'] == 1 and meta4['window']  # step 4's own metrics
  loop.train_and_evaluate(config, run, dataset)
  final, _ = fx.restore(config, run, dataset)
  helpers.assert_trees_equal(state, final)
  assert fx.records_without_time(run) == fx.records_without_time(workdir)


# ====================================================================== NaN
@pytest.mark.slow
def test_first_non_finite_step_is_named_and_the_last_good_state_is_replayed(tmp_path):
  # Metrics are fetched only every 6 steps here; NaN inputs at step 5 (batch index 4). The
  # run must name step 5 and save the state of step 4, recomputed from the last fetched
  # state (step 0): bitwise the state a plain 4-step run ends with.
  sparse = {'train.log_every': 6, 'eval.every': 100, 'checkpoint.every': 100,
            'eval.test_at_end': False}
  config = _config(**sparse)
  dataset = fx.synthetic_dataset(config)
  with pytest.raises(FloatingPointError, match=r'at step 5 .*last good state \(step 4\)'):
    loop.train_and_evaluate(config, str(tmp_path / 'nan'), fx.NaNAt(dataset, 4))
  saved, _ = fx.restore(config, str(tmp_path / 'nan'), dataset)
  loop.train_and_evaluate(_config(**sparse, **{'train.num_steps': 4}), str(tmp_path / 'four'),
                           dataset)
  four, _ = fx.restore(config, str(tmp_path / 'four'), dataset)
  assert int(saved.step) == 4
  helpers.assert_trees_equal(four, saved)


@pytest.mark.slow
def test_huge_learning_rate_never_evicts_the_good_checkpoint(straight, tmp_path):
  # keep=1: the good checkpoint of step 7 is the only one. Resumed with a learning rate
  # that overflows the state, the run stops; what is on disk is still finite.
  config, dataset, _, _ = straight
  run = _copy(straight, tmp_path)
  bad = _config(**{'checkpoint.keep': 1, 'train.num_steps': 12,
                   'optimizer.learning_rate': 1e35, 'train.allow_config_change': True})
  with pytest.raises(FloatingPointError, match='Non-finite state or training metrics at step'):
    loop.train_and_evaluate(bad, run, dataset)
  ckpt = checkpoint.Checkpointer(run, keep=1)
  template = loop.Trainer(config, run, dataset).initial_state()
  try:
    for step in ckpt.latest.all_steps():
      state, _ = ckpt.restore(template, step=step)
      assert all(np.isfinite(x).all() for x in jax.tree.leaves(state)
                 if np.issubdtype(np.asarray(x).dtype, np.floating))
    assert ckpt.latest_step() >= 7
  finally:
    ckpt.close()


# ====================================================================== concurrent launches
def test_second_launch_in_a_busy_workdir_fails_at_once_naming_the_holder(tmp_path):
  config = _config()
  workdir = str(tmp_path / 'busy')
  os.makedirs(workdir)
  with checkpoint.WorkdirLock(workdir):  # another open file: flock conflicts in-process too
    with pytest.raises(checkpoint.WorkdirInUse,
                       match=f'is in use by another run \\(pid {os.getpid()} on '):
      loop.train_and_evaluate(config, workdir, fx.synthetic_dataset(config))
  assert not os.path.exists(os.path.join(workdir, 'metrics.jsonl'))


def test_a_second_launch_is_refused_though_the_lock_file_was_removed(tmp_path):
  config = _config()
  workdir = str(tmp_path / 'busy')
  os.makedirs(workdir)
  with checkpoint.WorkdirLock(workdir):
    os.remove(os.path.join(workdir, 'lock'))
    with pytest.raises(checkpoint.WorkdirInUse) as error:
      loop.train_and_evaluate(config, workdir, fx.synthetic_dataset(config))
  assert helpers.one_line(error).startswith(f'The workdir {workdir} is in use by another run')
  assert os.listdir(workdir) == ['lock']


# ====================================================================== damaged checkpoints
def _damage_files(step_dir, how):
  """Damage every data file of a checkpoint's state (which of them hold a tiny state's
  arrays after orbax merged its per-process store is orbax's business)."""
  if how == 'empty_folder':
    shutil.rmtree(step_dir)
    os.makedirs(step_dir)
    return
  # Orbax's ocdbt store: data files in state/d/ and state/ocdbt.process_0/d/.
  targets = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, 'state'))
             for f in fs if os.path.basename(d) == 'd']
  assert targets
  for target in targets:
    if how == 'missing_file':
      os.remove(target)
      continue
    with open(target, 'rb') as f:
      data = bytearray(f.read())
    if how == 'truncated':
      data = data[:len(data) // 2]
    else:  # flipped bytes, in the middle of the file
      for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    with open(target, 'wb') as f:
      f.write(bytes(data))


def _damage(run, how):
  _damage_files(os.path.join(run, 'checkpoints', '7'), how)


# Unraisable exceptions fail the test: a damaged file printed a screen of "Event loop is
# closed" tracebacks from orbax's callbacks (not on every run: see the next test too).
@pytest.mark.filterwarnings('error::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('how, rerun', helpers.core_cases(
    [('flipped_bytes', True), ('truncated', True), ('missing_file', False),
     ('empty_folder', False)], core=[],
    also=[('flipped_bytes', True), ('missing_file', False), ('empty_folder', False)]))
def test_damaged_checkpoint_falls_back_to_the_newest_intact_one(straight, tmp_path, caplog,
                                                                capfd, how, rerun):
  config, dataset, workdir, state = straight
  run = _copy(straight, tmp_path)
  _damage(run, how)
  with caplog.at_level(logging.WARNING):
    restored, _ = fx.restore(config, run, dataset)
  assert int(restored.step) == 6
  damaged = os.path.join(run, 'checkpoints', '7')
  assert f'Checkpoint {damaged} is damaged' in caplog.text
  assert os.path.isdir(os.path.join(run, 'damaged', 'checkpoints_7'))
  if not rerun:  # the same path as above from here on; two of the four re-run it
    return
  # The run redoes step 7 from step 6: the same final state, no traceback on stderr.
  loop.train_and_evaluate(config, run, dataset)
  final, _ = fx.restore(config, run, dataset)
  helpers.assert_trees_equal(state, final)
  assert fx.records_without_time(run) == fx.records_without_time(workdir)
  assert 'Traceback' not in capfd.readouterr().err


@pytest.mark.slow
def test_every_checkpoint_damaged_is_one_clear_error(straight, tmp_path):
  config, dataset, _, _ = straight
  run = _copy(straight, tmp_path)
  for step in ('2', '4', '6', '7'):
    shutil.rmtree(os.path.join(run, 'checkpoints', step))
    os.makedirs(os.path.join(run, 'checkpoints', step))
  with pytest.raises(ValueError, match=r'No checkpoint in .* reads back \(steps \[7, 6, 4, 2\]'):
    fx.restore(config, run, dataset)
  assert not os.path.exists(os.path.join(run, 'damaged'))  # nothing moved: not provably damage


@pytest.mark.slow
def test_checkpoint_of_another_model_is_a_clear_error(straight, tmp_path):
  _, _, workdir, state = straight
  wider = state.replace(params={**state.params, 'classifier': {
      'bias': np.zeros(4, np.float32), 'kernel': np.zeros((12, 4), np.float32)}})
  ckpt = checkpoint.Checkpointer(workdir, keep=4)
  try:
    with pytest.raises(ValueError, match=r'holds params/classifier/kernel of shape \(8, 4\), '
                       r'this config needs \(12, 4\)'):
      ckpt.restore(wider)
  finally:
    ckpt.close()


@pytest.mark.slow
def test_carry_saved_on_two_devices_resumes_on_one(tmp_path, caplog):
  # A language model's carried state ([devices, batch / devices, H]) saved at step 2 on 2
  # devices is read back on 1 device as the same global rows, and the run goes on.
  dataset = fx.LanguageModelDataset()
  lm = {'model.initial_state': 'zeros', 'optimizer.name': 'adam', 'train.num_steps': 2,
        'checkpoint.every': 1, 'eval.every': 10, 'train.log_every': 1,
        'eval.population_stats': 'running', 'checkpoint.best_metric': 'valid/loss',
        'checkpoint.best_mode': 'min'}
  two = fx.tiny_config('bn_lstm', **{**lm, 'train.num_devices': 2})
  one = fx.tiny_config('bn_lstm', **{**lm, 'train.num_devices': 1, 'train.num_steps': 3})
  run = str(tmp_path / 'run')
  loop.train_and_evaluate(two, run, dataset)
  saved, _ = fx.restore(two, run, dataset)
  with caplog.at_level(logging.WARNING):
    resharded, _ = fx.restore(one, run, dataset)
  assert 'Resharded the carried state of step 2' in caplog.text
  assert saved.carry[0][1].shape == (2, 8, 8) and resharded.carry[0][1].shape == (1, 16, 8)
  for a, b in zip(jax.tree.leaves(saved.carry), jax.tree.leaves(resharded.carry)):
    np.testing.assert_array_equal(a.reshape(b.shape), b)
  loop.train_and_evaluate(one, run, dataset)
  final, _ = fx.restore(one, run, dataset)
  assert int(final.step) == 3


# ====================================================================== metrics.jsonl
@pytest.mark.slow
def test_partial_last_metrics_line_is_skipped_with_a_warning_and_the_run_resumes(
    straight, tmp_path, caplog):
  config, dataset, workdir, state = straight
  run = _copy(straight, tmp_path)
  shutil.rmtree(os.path.join(run, 'checkpoints', '7'))  # killed while writing record 7
  with open(os.path.join(run, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 7, "split": "tra')
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(config, run, dataset)
  assert 'skipped its partial last line' in caplog.text
  assert fx.records_without_time(run) == fx.records_without_time(workdir)


# ====================================================================== bad input
def test_workdir_that_is_a_file_or_not_writable_is_one_clear_error(tmp_path):
  config = _config()
  dataset = fx.synthetic_dataset(config)
  path = tmp_path / 'a_file'
  path.write_text('')
  with pytest.raises(ValueError, match=f'--workdir {path} is a file, not a directory'):
    loop.train_and_evaluate(config, str(path), dataset)
  # /sys is read-only even for root (chmod does not stop root, so a test cannot use it).
  with pytest.raises(ValueError, match=r'Cannot write in the workdir /sys \('):
    loop.train_and_evaluate(config, '/sys', dataset)


@pytest.mark.parametrize('content', [b'not gzip at all', 'truncated'])
def test_bad_mnist_archive_is_one_clear_error(tmp_path, content):
  path = str(tmp_path / 'train-images-idx3-ubyte.gz')
  if content == 'truncated':
    header = bytes([0, 0, 8, 3]) + b''.join(n.to_bytes(4, 'big') for n in (10, 28, 28))
    content = gzip.compress(header + bytes(10 * 28 * 28))[:40]
  with open(path, 'wb') as f:
    f.write(content)
  with pytest.raises(ValueError, match=f'{path} is not a complete gzip file'):
    mnist.read_idx(path)


def test_empty_validation_split_is_found_at_load_time():
  splits = fx.synthetic_splits()
  splits['valid'] = (splits['valid'][0][:0], splits['valid'][1][:0])
  with pytest.raises(ValueError, match="The 'valid' split has no examples"):
    mnist.SequenceDataset(splits, seed=0, batch_size=16, eval_batch_size=8, num_classes=4)


# ====================================================================== junk in the padding
_LENGTHS = (5, 3, 1, 4)


def _padded_batch(junk):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(len(_LENGTHS), 5, 3)).astype(np.float32)
  mask = helpers.prefix_mask(_LENGTHS, 5)
  return np.where(mask[..., None] > 0, x, np.float32(junk)), mask


# The two variants that leaked (sequence-wise input statistics, shared statistics), and one
# per other code path (per-step BN everywhere; the tanh RNN); compile time is the budget.
@pytest.mark.parametrize('variant', helpers.core_cases(
    ['bn_input_only_seq', 'bn_lstm_shared', 'bn_lstm', 'rnn_bn_recurrence'], core=[],
    also=['bn_input_only_seq']))
def test_junk_in_the_padding_reaches_nothing(variant):
  layer = variants.make_layer(variant, 4, max_length=5, initial_state='zeros')
  x, mask = _padded_batch(0.0)
  variables = layer.init(jax.random.key(0), x, mask, use_running_average=True,
                         deterministic=True)
  w = jax.random.normal(jax.random.key(1), (len(_LENGTHS), 5, 4))

  @jax.jit
  def everything(x):
    def loss(params, x):
      (carry, out), mutated = layer.apply({**variables, 'params': params}, x, mask,
                                          use_running_average=False, deterministic=False,
                                          mutable=['batch_stats'], return_carry=True)
      return jnp.sum(out * w), (carry, out, mutated)
    grads, aux = jax.grad(loss, argnums=(0, 1), has_aux=True)(variables['params'], x)
    with batch_stats.allow_untrained_statistics():  # fresh statistics, on purpose
      eval_out = layer.apply(variables, x, mask, use_running_average=True,
                             deterministic=True)
    return grads, aux, eval_out

  clean = everything(x)
  for junk in (np.nan, np.inf, 1e30):
    dirty = everything(_padded_batch(junk)[0])
    for (path, a), b in zip(jax.tree.leaves_with_path(clean), jax.tree.leaves(dirty)):
      np.testing.assert_array_equal(a, b, err_msg=f'{variant}, padding {junk}: '
                                    f'{jax.tree_util.keystr(path)}')
  (_, g_x), _, _ = clean
  assert not np.any(np.asarray(g_x)[mask == 0])  # no gradient into the padding
