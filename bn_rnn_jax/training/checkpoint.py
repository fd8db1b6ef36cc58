"""Orbax checkpoints of a run: the K latest, the best by a validation metric, resume.

Layout in the workdir:
  checkpoints/<step>/   the `keep` latest saves (every `checkpoint.every` steps and at the end)
  best/<step>/          the save with the best validation metric so far
  damaged/              checkpoints found damaged on restore, moved aside
  other_runs/           best checkpoints of another run found in the workdir, moved aside
  lock                  the live run's pid, host and start time (`WorkdirLock`)
Each save holds `state` (a host pytree: step, params, batch_stats, opt_state, rng, carry)
and `meta` (JSON: the loop's bookkeeping, and `state_sha256`, the state's content hash).
A save is a snapshot, refuses a non-finite state, and is renamed into place when
complete; a restore takes the newest checkpoint that reads back and matches its hash.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import errno
import fcntl
import gc
import hashlib
import json
import logging as std_logging
import os
import shutil
import socket
import sys
import time
from typing import Any, Optional

import jax
import numpy as np

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  import orbax.checkpoint as ocp
  from absl import logging as absl_logging


def _manager(path: str, keep: int, read_only: bool = False) -> ocp.CheckpointManager:
  # Handlers named up front, so that `item_metadata` reads saved shapes before a restore.
  return ocp.CheckpointManager(
      path, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                                 read_only=read_only),
      item_handlers={'state': ocp.StandardCheckpointHandler(),
                     'meta': ocp.JsonCheckpointHandler()})


def _path_names(path) -> tuple:
  """A pytree path as plain names, the same for a dataclass field and a dict key."""
  names = []
  for entry in path:
    for attr in ('name', 'key', 'idx'):
      if hasattr(entry, attr):
        names.append(str(getattr(entry, attr)))
        break
  return tuple(names)


def _leaves_by_name(tree) -> dict:
  return {_path_names(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def state_digest(state: Any) -> str:
  """SHA-256 of a host state's leaves: names, dtypes, shapes and bytes."""
  digest = hashlib.sha256()
  for name, leaf in sorted(_leaves_by_name(state).items()):
    leaf = np.ascontiguousarray(np.asarray(leaf))
    digest.update(repr((name, leaf.dtype.str, leaf.shape)).encode())
    digest.update(leaf.tobytes())
  return digest.hexdigest()


def check_finite(state: Any, what: str = 'state') -> None:
  """FloatingPointError naming the first floating leaf of `state` with a NaN or inf."""
  for name, leaf in _leaves_by_name(state).items():
    leaf = np.asarray(leaf)
    if np.issubdtype(leaf.dtype, np.inexact) and not np.isfinite(leaf).all():
      raise FloatingPointError(f'The {what} holds non-finite values in '
                               f'{"/".join(name)}; it is not saved.')


class WorkdirInUse(RuntimeError):
  """Another live run holds the workdir's lock."""


class DamagedCheckpoint(Exception):
  """A checkpoint that does not read back, or reads back other bytes than were saved."""


class Checkpointer:
  """Latest-K and best checkpoints of one workdir (two orbax `CheckpointManager` objects).
  `read_only` (tools that read a run they do not hold) creates, saves, deletes and moves
  nothing; a damaged checkpoint is then skipped with a warning and left where it is."""

  def __init__(self, workdir: str, keep: int = 2, read_only: bool = False):
    if keep <= 0:
      raise ValueError(f'config.checkpoint.keep must be positive; got {keep}.')
    self.workdir = os.path.abspath(workdir)
    self.read_only = read_only
    self.latest = _manager(os.path.join(self.workdir, 'checkpoints'), keep, read_only)
    self.best = _manager(os.path.join(self.workdir, 'best'), 1, read_only)

  def _save(self, manager, step: int, state: Any, meta: dict) -> None:
    if jax.process_count() > 1:
      # One save in flight at a time across both managers: each save's barriers then run
      # in the same order in every process (two managers' saves overlapping could leave
      # the processes waiting at different barriers).
      self.wait()
    if step in manager.all_steps():
      return
    check_finite(state, f'state of step {step}')
    # Orbax serialises on a background thread after `save` returns: hand it a snapshot.
    state = jax.tree.map(lambda x: np.array(x, copy=True), state)
    meta = {**copy.deepcopy(meta), 'state_sha256': state_digest(state)}
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               meta=ocp.args.JsonSave(meta)))

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Save `state` (host arrays) as the latest checkpoint of `step`."""
    self._save(self.latest, step, state, meta)

  def save_best(self, step: int, state: Any, meta: dict) -> None:
    self._save(self.best, step, state, meta)

  def latest_step(self) -> Optional[int]:
    return self.latest.latest_step()

  def restore(self, template: Any, step: Optional[int] = None,
              best: bool = False) -> tuple[Any, dict]:
    """`(state, meta)` of the newest intact checkpoint (or of `step`) like `template`.

    A checkpoint that does not read back is skipped for the next older one, and once one
    does, moved to `<workdir>/damaged/` with a warning (left in place when `read_only`). A
    carry saved on another device count with the same global batch is resharded. Raises
    FileNotFoundError when there is none, ValueError when none reads back (nothing is moved
    then) or when the config does not match the saved shapes (naming the leaf).
    """
    manager = self.best if best else self.latest
    self.wait()
    steps = sorted(manager.all_steps(), reverse=True) if step is None else [step]
    if not steps:
      raise FileNotFoundError(f'No checkpoint in {manager.directory}.')
    damaged = []  # (step, reason), newest first
    for candidate in steps:
      try:
        restored = self._restore_step(manager, candidate, template)
      except DamagedCheckpoint as e:
        damaged.append((candidate, str(e)))
        continue
      # Only once an older one reads back is a failure the newer checkpoint's own fault
      # (not, say, a bug or a full disk): then it is moved aside, never before.
      for bad, reason in damaged:
        if self.read_only:
          absl_logging.warning('Checkpoint %s does not read back (%s); skipped (left where '
                               'it is).', os.path.join(str(manager.directory), str(bad)),
                               reason)
        else:
          self._move_aside(manager, bad, reason)
      return restored
    bad, reason = damaged[0]
    advice = '' if self.read_only else ' Delete or move the folder to start again.'
    raise ValueError(f'No checkpoint in {manager.directory} reads back (steps '
                     f'{[s for s, _ in damaged]}; step {bad}: {reason}); nothing was moved.'
                     f'{advice}')

  def _restore_step(self, manager, step: int, template: Any) -> tuple[Any, dict]:
    try:
      with _closed_loop_errors_dropped():
        saved = manager.item_metadata(step)['state']
      saved_shapes = {name: tuple(m.shape) for name, m in _leaves_by_name(saved).items()}
    except Exception as e:  # orbax raises many types for unreadable metadata
      raise DamagedCheckpoint(f'unreadable metadata: {_one_line(e)}') from e
    if not saved_shapes:
      raise DamagedCheckpoint('its metadata lists no arrays')
    abstract, reshaped = _abstract_state(template, saved_shapes, step, manager.directory)
    try:
      with _closed_loop_errors_dropped():
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
      state, meta = restored.state, restored.meta
    except Exception as e:  # truncated / missing data files: orbax and tensorstore errors
      raise DamagedCheckpoint(_one_line(e)) from e
    expected = (meta or {}).get('state_sha256')
    if expected is None:  # saved before hashes were written: readable, not verifiable
      absl_logging.warning('The checkpoint of step %d in %s has no content hash; restored '
                           'without checking it.', step, manager.directory)
    elif state_digest(state) != expected:
      raise DamagedCheckpoint('its content does not match the hash saved with it')
    if reshaped:
      state = _reshape_leaves(state, reshaped)
      absl_logging.warning('Resharded the carried state of step %d to this run\'s %d '
                           'devices.', step, len(jax.tree.leaves(template.carry)[0]))
    return state, meta

  def _move_aside(self, manager, step: int, reason: str) -> str:
    source = os.path.join(str(manager.directory), str(step))
    target = os.path.join(self.workdir, 'damaged',
                          f'{os.path.basename(str(manager.directory))}_{step}')
    if os.path.exists(target):
      shutil.rmtree(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(source):
      shutil.move(source, target)
    manager.reload()
    absl_logging.warning('Checkpoint %s is damaged (%s); moved it to %s and fell back to '
                         'an older one.', source, reason, target)
    return target

  def best_meta(self, step: int) -> Optional[dict]:
    """The `meta` saved with the best checkpoint of `step` (None when unreadable)."""
    try:
      with _closed_loop_errors_dropped():
        return self.best.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta
    except Exception:  # pylint: disable=broad-except  # damaged: the restore says so later
      return None

  def move_best_aside(self, step: int, reason: str) -> str:
    """Move the best checkpoint of `step`, which belongs to another run, to
    `<workdir>/other_runs/best_<step>` with a warning."""
    source = os.path.join(str(self.best.directory), str(step))
    target = os.path.join(self.workdir, 'other_runs', f'best_{step}')
    suffix = 1
    while os.path.exists(target):
      target = os.path.join(self.workdir, 'other_runs', f'best_{step}.{suffix}')
      suffix += 1
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(source, target)
    self.best.reload()
    absl_logging.warning('The best checkpoint %s is not this run\'s (%s); moved it to %s. '
                         'This run picks its own best checkpoint.', source, reason, target)
    return target

  def wait(self) -> None:
    self.latest.wait_until_finished()
    self.best.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self.latest.close()
    self.best.close()


@contextlib.contextmanager
def _closed_loop_errors_dropped():
  """Drop only the "Event loop is closed" tracebacks that orbax's stray tensorstore callbacks
  print after a restore fails on a damaged file (the failure is one warning line)."""
  previous = sys.unraisablehook
  def hook(unraisable):
    exc = unraisable.exc_value
    if not (isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'):
      previous(unraisable)
  sys.unraisablehook = hook
  try:
    yield
  finally:
    gc.collect()  # let the stray callbacks fire while the filter is in place
    sys.unraisablehook = previous


def _one_line(error: Exception) -> str:
  text = f'{type(error).__name__}: {error}'.splitlines()
  return text[0][:200] if text else type(error).__name__


def _abstract_state(template, saved_shapes: dict, step: int, directory) -> tuple[Any, dict]:
  """The restore target: the template's shapes, or the saved ones for a carry saved on
  another device count (`[D', B/D', ...]` with the same global batch), to reshape after.
  Returns `(abstract tree, {name: template shape} of the leaves to reshape)`."""
  reshaped = {}
  def target(path, leaf):
    name = _path_names(path)
    want = tuple(np.shape(leaf))
    have = saved_shapes.get(name)
    if have is None:
      raise ValueError(f'The checkpoint of step {step} in {directory} has no '
                       f'{"/".join(name)}; the config changed (model, optimizer?) since it '
                       'was saved. Use a new workdir.')
    if have != want:
      same_batch = (name[:1] == ('carry',) and len(have) == len(want) >= 2
                    and have[0] * have[1] == want[0] * want[1] and have[2:] == want[2:])
      if not same_batch:
        raise ValueError(f'The checkpoint of step {step} in {directory} holds '
                         f'{"/".join(name)} of shape {have}, this config needs {want}; the '
                         'config (model, batch size or device count) changed. Use a new '
                         'workdir.')
      reshaped[name] = want
      return jax.ShapeDtypeStruct(have, np.asarray(leaf).dtype)
    return ocp.utils.to_shape_dtype_struct(leaf)
  abstract = jax.tree_util.tree_map_with_path(target, template)
  extra = set(saved_shapes) - set(_leaves_by_name(template))
  if extra:
    raise ValueError(f'The checkpoint of step {step} in {directory} holds '
                     f'{"/".join(sorted(extra)[0])}, which this config has no place for; the '
                     'config changed since it was saved. Use a new workdir.')
  return abstract, reshaped


def _reshape_leaves(state, shapes: dict):
  def reshape(path, leaf):
    shape = shapes.get(_path_names(path))
    return leaf if shape is None else np.asarray(leaf).reshape(shape)
  return jax.tree_util.tree_map_with_path(reshape, state)


# ====================================================================== workdir lock
class WorkdirLock:
  """One run per workdir: an exclusive `flock` on the workdir folder and on `<workdir>/lock`
  (the holder's pid, host and start time). A second launch fails at once naming the
  holder, also when the lock file was removed; a dead run's lock (the kernel drops it) is
  taken over with a warning. A workdir that is a file or cannot be written is one line."""

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, 'lock')
    self._file = None
    self._folder = None  # the folder's descriptor while its lock is held

  def acquire(self) -> 'WorkdirLock':
    try:
      handle = open(self.path, 'a+')
    except OSError as e:
      raise ValueError(f'Cannot write in the workdir {self.workdir} ({e.strerror}); choose '
                       'a writable --workdir.') from e
    folder = _HELD
    try:
      folder = _lock_folder(self.workdir)
      taken = folder != _HELD and _try_flock(handle)
    except OSError:
      _close_folder(folder)
      handle.close()
      raise
    if not taken:
      _close_folder(folder)
      # The holder writes its pid just after taking the lock: give it up to a second.
      deadline = time.monotonic() + 1.0
      holder = _read_holder(handle)
      while holder == 'unknown holder' and time.monotonic() < deadline:
        time.sleep(0.05)
        holder = _read_holder(handle)
      handle.close()
      raise WorkdirInUse(f'The workdir {self.workdir} is in use by another run ({holder}); '
                         'wait for it to finish or use another --workdir.')
    previous = _read_holder(handle)
    if previous != 'unknown holder':
      absl_logging.warning('Took over the lock of a run that is no longer running (%s).',
                           previous)
    handle.seek(0)
    handle.truncate()
    json.dump({'pid': os.getpid(), 'host': socket.gethostname(),
               'start': datetime.datetime.now(datetime.timezone.utc).isoformat(
                   timespec='seconds')}, handle)
    handle.flush()
    self._file, self._folder = handle, folder
    return self

  def release(self) -> None:
    if self._file is None:
      return
    self._file.seek(0)
    self._file.truncate()  # an empty file: released cleanly, nothing to take over
    self._file.flush()
    fcntl.flock(self._file, fcntl.LOCK_UN)
    self._file.close()
    self._file = None
    _close_folder(self._folder)
    self._folder = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


_HELD = -1  # `_lock_folder`: another open file holds the folder's lock


def _try_flock(handle) -> bool:
  """Take an exclusive `flock` on `handle` (a file or descriptor) without waiting: False
  when another open file holds it."""
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      return False
    raise
  return True


def _close_folder(fd) -> None:
  """Close a descriptor `_lock_folder` returned (which drops its lock)."""
  if fd not in (None, _HELD):
    os.close(fd)


def _lock_folder(folder: str):
  """An exclusive `flock` on the folder: its open descriptor, `_HELD` when another open
  file holds it, or None where the filesystem cannot lock a folder."""
  fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
  try:
    if _try_flock(fd):
      return fd
    os.close(fd)
    return _HELD
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
      return None
    raise


def _read_holder(handle) -> str:
  handle.seek(0)
  try:
    info = json.loads(handle.read() or 'null')
    return f'pid {info["pid"]} on {info["host"]}, started {info["start"]}'
  except (ValueError, KeyError, TypeError):
    return 'unknown holder'


class OrbaxInfoFilter(std_logging.Filter):
  """Keeps orbax's warnings and errors, not its INFO lines nor the traceback of a wait for a
  save cut by Ctrl-C (the launcher reports the stop in one line)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if 'orbax' not in record.pathname:
      return True
    if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
      return False
    return record.levelno > std_logging.INFO


def quiet_orbax_logs() -> None:
  """Apply `OrbaxInfoFilter` to absl logging (launchers call this once)."""
  flt = OrbaxInfoFilter()
  absl_logging.get_absl_handler().addFilter(flt)
  std_logging.getLogger('absl').addFilter(flt)
