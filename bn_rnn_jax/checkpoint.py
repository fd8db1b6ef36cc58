"""Orbax checkpoints of a run: the K latest, the best by a validation metric, resume.

Layout in the workdir:
  checkpoints/<step>/   the `keep` latest saves (every `checkpoint.every` steps and at the end)
  best/<step>/          the save with the best validation metric so far
Each save holds `state` (a host pytree: step, params, batch_stats, opt_state, rng, carry)
and `meta` (JSON: the loop's bookkeeping, e.g. the best metric and the partial training-
metric window, so that a resumed run logs exactly what an uninterrupted one logs).
"""

from __future__ import annotations

import logging as std_logging
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging


def _manager(path: str, keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      path, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))


class Checkpointer:
  """Latest-K and best checkpoints of one workdir (orbax `CheckpointManager`s)."""

  def __init__(self, workdir: str, keep: int = 2):
    if keep <= 0:
      raise ValueError(f'config.checkpoint.keep must be positive; got {keep}.')
    self.latest = _manager(os.path.join(os.path.abspath(workdir), 'checkpoints'), keep)
    self.best = _manager(os.path.join(os.path.abspath(workdir), 'best'), 1)

  @staticmethod
  def _save(manager, step: int, state: Any, meta: dict) -> None:
    if step in manager.all_steps():
      return
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
    """`(state, meta)` of `step` (default: the latest) shaped like `template`."""
    manager = self.best if best else self.latest
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'No checkpoint in {manager.directory}.')
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError) as e:
      raise ValueError(
          f'The checkpoint of step {step} in {manager.directory} does not match this '
          f'config (model, optimizer or device count changed?): {e}') from e
    return restored.state, restored.meta

  def wait(self) -> None:
    self.latest.wait_until_finished()
    self.best.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self.latest.close()
    self.best.close()


class _DropOrbaxInfo(std_logging.Filter):
  """Orbax logs several INFO lines per save; keep its warnings and errors only."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno > std_logging.INFO or 'orbax' not in record.pathname


def quiet_orbax_logs() -> None:
  """Hide orbax's INFO chatter from absl logging (launchers call this once)."""
  flt = _DropOrbaxInfo()
  absl_logging.get_absl_handler().addFilter(flt)
  std_logging.getLogger('absl').addFilter(flt)
