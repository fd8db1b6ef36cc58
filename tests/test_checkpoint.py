"""`checkpoint.py` on small trees: save and restore, the K latest and the best, content
hashes that catch flipped bytes, refusal of non-finite states, and the workdir lock. A
whole run's checkpoints (resume, best, faults) are tested in `test_loop.py` and
`test_faults.py`."""

import json
import logging
import os
import sys

import numpy as np
import pytest

from bn_rnn_jax.training import checkpoint
import helpers


def _state(step, seed=0):
  rng = np.random.default_rng(seed)
  return {'step': np.array(step, np.int32),
          'params': {'w': rng.normal(size=(3, 4)).astype(np.float32),
                     'b': np.zeros(4, np.float32)},
          'rng': np.array([0, step], np.uint32)}


def test_restore_gives_back_the_newest_state_and_its_meta(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  try:
    for step in (1, 2, 3):
      ckpt.save(step, _state(step, seed=step), {'best': float(step), 'window': [step]})
    ckpt.wait()
    assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '3']   # keep 2
    assert ckpt.latest_step() == 3
    state, meta = ckpt.restore(_state(0))
    helpers.assert_trees_equal(state, _state(3, seed=3))
    assert meta['best'] == 3.0 and meta['window'] == [3]
    assert meta['state_sha256'] == checkpoint.state_digest(_state(3, seed=3))
    older, _ = ckpt.restore(_state(0), step=2)
    helpers.assert_trees_equal(older, _state(2, seed=2))
    ckpt.save_best(2, _state(2, seed=2), {})
    best, _ = ckpt.restore(_state(0), best=True)
    helpers.assert_trees_equal(best, _state(2, seed=2))
  finally:
    ckpt.close()


def test_saving_a_step_twice_keeps_the_first(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  try:
    ckpt.save(1, _state(1, seed=1), {})
    ckpt.save(1, _state(1, seed=5), {})
    state, _ = ckpt.restore(_state(0))
    helpers.assert_trees_equal(state, _state(1, seed=1))
  finally:
    ckpt.close()


def test_no_checkpoint_and_bad_keep_are_clear_errors(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  try:
    with pytest.raises(FileNotFoundError, match='No checkpoint in .*checkpoints'):
      ckpt.restore(_state(0))
  finally:
    ckpt.close()
  with pytest.raises(ValueError, match='config.checkpoint.keep must be positive; got 0'):
    checkpoint.Checkpointer(str(tmp_path), keep=0)


def test_state_digest_depends_on_names_dtypes_and_bytes():
  digest = checkpoint.state_digest(_state(1))
  assert digest == checkpoint.state_digest(_state(1))
  renamed = {**_state(1), 'params': {'v': _state(1)['params']['w'], 'b': np.zeros(4)}}
  retyped = {**_state(1), 'step': np.array(1, np.int64)}
  flipped = _state(1)
  flipped['params']['w'].view(np.uint32)[0, 0] ^= 1       # one bit of one float
  assert len({digest, *(checkpoint.state_digest(s) for s in (renamed, retyped, flipped))}) == 4


def test_checkpointer_refuses_a_non_finite_state(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  state = {'params': {'w': np.ones(3, np.float32)}, 'batch_stats': {'var': np.array([np.inf])}}
  with pytest.raises(FloatingPointError, match='non-finite values in batch_stats/var'):
    ckpt.save(1, state, {})
  ckpt.close()
  assert not os.path.exists(os.path.join(tmp_path, 'checkpoints', '1'))


def test_flipped_bytes_that_orbax_reads_back_are_caught_by_the_content_hash(tmp_path, caplog):
  # One large array: its data file is the largest, and flipping bytes inside it still
  # reads back (the silent case): only the hash tells.
  state = {'w': np.arange(5000, dtype=np.float32), 'step': np.array(1, np.int32)}
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  ckpt.save(1, state, {})
  ckpt.save(2, {**state, 'step': np.array(2, np.int32)}, {})
  ckpt.wait()
  state_dir = os.path.join(tmp_path, 'checkpoints', '2', 'state')
  target = max((os.path.join(d, f) for d, _, fs in os.walk(state_dir) for f in fs
                if os.path.basename(d) == 'd'), key=os.path.getsize)
  with open(target, 'r+b') as f:
    f.seek(os.path.getsize(target) // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 0xFF]))
  with caplog.at_level(logging.WARNING):
    restored, _ = ckpt.restore(state)
  ckpt.close()
  assert int(restored['step']) == 1
  assert 'does not match the hash saved with it' in caplog.text


def test_closed_loop_tracebacks_are_dropped_and_nothing_else():
  """The filter around orbax's restore, deterministically: objects whose finaliser raises
  report through `sys.unraisablehook`, as orbax's stray callbacks do."""
  class RaisesWhenCollected:
    def __init__(self, error):
      self.error = error

    def __del__(self):
      raise self.error

  seen, previous = [], sys.unraisablehook
  sys.unraisablehook = lambda unraisable: seen.append(str(unraisable.exc_value))
  try:
    with checkpoint._closed_loop_errors_dropped():  # pylint: disable=protected-access
      RaisesWhenCollected(RuntimeError('Event loop is closed'))
      RaisesWhenCollected(ValueError('anything else'))
  finally:
    sys.unraisablehook = previous
  assert seen == ['anything else']


# ----------------------------------------------------------------------------- the lock
def test_second_lock_of_a_workdir_fails_at_once_naming_the_holder(tmp_path):
  with checkpoint.WorkdirLock(str(tmp_path)):
    with pytest.raises(checkpoint.WorkdirInUse,
                       match=f'is in use by another run \\(pid {os.getpid()} on ') as error:
      checkpoint.WorkdirLock(str(tmp_path)).acquire()
    helpers.one_line(error)
  # Released cleanly: the next run takes it without a warning about a previous holder.
  with checkpoint.WorkdirLock(str(tmp_path)):
    pass
  assert (tmp_path / 'lock').read_text() == ''


def test_a_removed_lock_file_does_not_let_a_second_run_in(tmp_path):
  """The folder itself is locked: a second lock fails while the first is held, though
  the first one's lock file is gone, and succeeds once it is released."""
  with checkpoint.WorkdirLock(str(tmp_path)):
    os.remove(tmp_path / 'lock')
    with pytest.raises(checkpoint.WorkdirInUse) as error:
      checkpoint.WorkdirLock(str(tmp_path)).acquire()
    assert helpers.one_line(error) == (
        f'The workdir {tmp_path} is in use by another run (unknown holder); wait for it to '
        'finish or use another --workdir.')
  with checkpoint.WorkdirLock(str(tmp_path)):
    assert json.loads((tmp_path / 'lock').read_text())['pid'] == os.getpid()


def test_stale_lock_of_a_dead_run_is_taken_over_with_a_warning(tmp_path, caplog):
  workdir = str(tmp_path / 'stale')
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'lock'), 'w') as f:  # a SIGKILLed run's file, unlocked
    f.write('{"pid": 999999, "host": "here", "start": "2026-01-01T00:00:00+00:00"}')
  with caplog.at_level(logging.WARNING):
    lock = checkpoint.WorkdirLock(workdir).acquire()
  lock.release()
  assert 'Took over the lock of a run that is no longer running (pid 999999' in caplog.text
