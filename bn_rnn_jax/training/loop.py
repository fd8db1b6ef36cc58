"""The training loop: `train_and_evaluate(config, workdir)`, which drives a `Trainer`
(`trainer.py`, also importable from here) over the steps, evaluates, checkpoints and
resumes. With `config.train.time_budget_s` a launch stops at its first checkpoint save
after the budget is spent; the next launch resumes from there exactly, as after a kill."""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import Optional

import jax
from jax.experimental import multihost_utils
import numpy as np

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  import ml_collections
  from absl import logging

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.training import checkpoint as checkpoint_lib
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import environment
from bn_rnn_jax.training import metric_writer
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import train
from bn_rnn_jax.training import workdir as workdir_lib
from bn_rnn_jax.training.train import TrainState
from bn_rnn_jax.training.trainer import Trainer


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       dataset=None) -> dict:
  """Train, evaluate, checkpoint; resume from the newest intact checkpoint in `workdir`.

  `dataset` is any object with the interface of `bn_rnn_jax.input_pipeline`, recorded in
  config.json as `config.data` (`workdir.dataset_fields`); None reads the dataset
  `config.data` names. The launch is checked against the run the workdir holds
  (`workdir.check`) before anything is written.

  Returns the last metrics of every split logged, e.g. `{'valid': {...}, 'test': {...}}`
  (no 'test' when `config.train.time_budget_s` stopped the launch before the last step).
  Raises FloatingPointError on a non-finite state or metric, naming the first bad step,
  after saving the last finite state; `checkpoint.WorkdirInUse` when another run holds the
  workdir; `parallel.ProcessLost` when a peer process stops; ValueError for a bad workdir,
  config or data, for processes with different configs, and for a config the workdir's run
  was not started with.
  """
  with environment.log_lines_shown(checkpoint_lib.OrbaxInfoFilter()), \
      environment.compilation_cache():
    return _train_and_evaluate(config, workdir, dataset)


def _train_and_evaluate(config, workdir: str, dataset) -> dict:
  started = time.monotonic()
  parallel.maybe_initialize_distributed(config)  # before any call that starts a backend
  if dataset is not None:
    config = workdir_lib.with_dataset(config, dataset)
  config_lib.validate_config(config)
  parallel.check_same_config(config)
  if workdir is None:
    raise ValueError('No workdir given: pass --workdir (where checkpoints and metrics go).')
  workdir = os.path.abspath(workdir)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir {workdir} is a file, not a directory.')
  launch = workdir_lib.check(config, workdir)  # reads only
  primary = jax.process_index() == 0
  created = workdir_lib.make(workdir)
  before = None if created else set(os.listdir(workdir))
  first = launch.saved is None and launch.latest_step is None
  lock = checkpoint_lib.WorkdirLock(workdir).acquire() if primary else None
  run = None  # set once the run is set up: a failure before leaves no trace of a first launch
  try:
    trainer = Trainer(config, workdir, dataset, checked=True)
    _check_eval_splits(trainer)
    if primary:
      if launch.saved is None and launch.latest_step is not None:
        logging.warning('%s is missing, though the workdir holds checkpoints up to step %d: '
                        'written again from this launch\'s config, which could not be '
                        'checked against the run\'s.', os.path.join(workdir, workdir_lib.CONFIG),
                        launch.latest_step)
      workdir_lib.write_config(trainer.config, workdir, launch)
    writer = metric_writer.MetricWriter(workdir, enabled=primary)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=trainer.config.checkpoint.keep)
    lost = None
    try:
      run = _Run(trainer, writer, ckpt, started, workdir_lib.lineage(workdir))
      if primary:  # the checkpoint restored under the changed config: the change stands
        workdir_lib.record_changes(workdir, launch)
      return run.run()
    except jax.errors.JaxRuntimeError as e:
      lost = parallel.process_lost(e)
      if lost is None:
        raise
      raise lost from None
    finally:
      if lost is None:  # with a peer gone, orbax's closing barrier would wait for it
        ckpt.close()
      writer.close()
  finally:
    if lock is not None:
      lock.release()
    if run is None and first and primary:
      _remove_new_entries(workdir, created, before)


def _remove_new_entries(workdir: str, created: bool, before: Optional[set]) -> None:
  """Remove what a first launch that failed before its first step wrote (the workdir
  itself when it made it)."""
  if created:
    shutil.rmtree(workdir, ignore_errors=True)
    return
  for name in set(os.listdir(workdir)) - before:
    path = os.path.join(workdir, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)


def _check_eval_splits(trainer: Trainer) -> None:
  """Every split the run will evaluate has a batch, and `best_metric` names a metric the task
  logs."""
  config = trainer.config
  name = config.checkpoint.best_metric.split('/')[1]
  if trainer.task.metrics and name not in trainer.task.metrics:
    raise ValueError(f'config.checkpoint.best_metric={config.checkpoint.best_metric!r} names '
                     f'no metric of the {trainer.dataset.task!r} task; it logs '
                     f'{sorted(trainer.task.metrics)}.')
  for split in config.eval.splits:
    if next(iter(trainer.dataset.eval_batches(split)), None) is None:
      raise ValueError(f'Split {split!r} has no evaluation batches (empty data?).')
  if config.eval.test_at_end:
    try:
      if next(iter(trainer.dataset.eval_batches('test')), None) is None:
        raise ValueError("Split 'test' has no evaluation batches (empty data?).")
    except ValueError as e:
      raise ValueError(f'{e} The end-of-run test (config.eval.test_at_end) needs a test '
                       'split: give the data one, or pass --config.eval.test_at_end=False.'
                       ) from None


def _better(value: float, best: Optional[float], mode: str) -> bool:
  if best is None:
    return True
  return value > best if mode == 'max' else value < best


class _Run:
  """The loop over steps of one run; it never waits on the device between fetch points.

  Step k is dispatched, then batch k+1 is built and placed while it runs. Each step's
  metrics and its device-side `finite` flag stay on the device until a fetch (every
  `log_every` steps, before every evaluation and save); the first step whose flag is 0
  stops the run: the steps before it are replayed from `checked_state`, that state is
  saved and FloatingPointError raised.

  Attributes:
    state: the newest device state.
    checked_state, checked_step: the newest state whose steps were all fetched and found
      finite (a device copy when the step donates its state).
    pending: `(step done, device metrics)` of the steps not fetched yet.
    window, progress: the training metrics since the last log line; steps/s and ETA.
    best: the best value of `checkpoint.best_metric` so far.
    last: the last metrics of every split logged (the return value).
    started: `time.monotonic()` when this launch began.
  """

  def __init__(self, trainer: Trainer, writer: metric_writer.MetricWriter,
               ckpt: checkpoint_lib.Checkpointer, started: Optional[float] = None,
               lineage: Optional[str] = None):
    self.trainer, self.writer, self.ckpt = trainer, writer, ckpt
    self.lineage = lineage
    self.started = time.monotonic() if started is None else started
    self.config = trainer.config
    self.template = trainer.initial_state()
    host_state = self.template
    meta = {'best': None, 'window': {}, 'window_steps': 0, 'time_s': 0.0}
    if ckpt.latest_step() is not None:
      host_state, meta = ckpt.restore(self.template)
      logging.info('Resumed from the checkpoint of step %d.', int(host_state.step))
      # The run's lineage travels with its checkpoints: a config.json written again
      # (deleted, then relaunched) does not make the run's own best checkpoint another's.
      self.lineage = meta.get('lineage') or lineage
    self.start = int(host_state.step)
    self._check_best()
    # A launch that resumes at its last step tests again; an earlier launch's test of the
    # step it resumes from stays.
    writer.truncate(self.start, retest=self.start >= self.config.train.num_steps
                    and self.config.eval.test_at_end)
    self.state = trainer.to_devices(host_state)
    self._check(self.start)
    self.pending = []
    self.window = metric_writer.MetricWindow(meta['window'], meta['window_steps'])
    self.best = meta['best']
    self.progress = metric_writer.Progress(self.start, self.config.train.num_steps,
                                           meta['time_s'])
    self.last = {}

  def _meta(self) -> dict:
    """What a checkpoint saves beside the state, to resume the bookkeeping exactly."""
    return {'best': self.best, 'window': self.window.sums,
            'window_steps': self.window.steps, 'time_s': self.progress.elapsed(),
            'lineage': self.lineage}

  def _check_best(self) -> None:
    """Move aside a best checkpoint this run's history cannot hold (a step past the one it
    resumes from, or saved under another config.json)."""
    step = getattr(self.ckpt, 'best', None) and self.ckpt.best.latest_step()
    if step is None:
      return
    if step > self.start:
      reason = f'its step {step} is past step {self.start}, where this run resumes'
    else:
      saved = (self.ckpt.best_meta(step) or {}).get('lineage')
      if saved is None or self.lineage is None or saved == self.lineage:
        return
      reason = 'it was saved under another config.json'
    if jax.process_index() == 0:
      self.ckpt.move_best_aside(step, reason)
    if jax.process_count() > 1:  # the others see the move once process 0 made it
      multihost_utils.sync_global_devices('best checkpoint checked')
      self.ckpt.best.reload()

  def _save(self, state: TrainState, step: int, best: bool = False) -> None:
    host = self.trainer.to_host(state)
    save = self.ckpt.save_best if best else self.ckpt.save
    save(step, host, self._meta())  # it saves a deep copy

  def _fetch(self, done: int) -> None:
    """Metrics of the pending steps to the host, in order; stop at a non-finite one."""
    values = jax.device_get([m for _, m in self.pending])
    for (step, _), m in zip(self.pending, values):
      m = {k: float(v[0]) for k, v in m.items()}
      if m.pop(train.FINITE) != 1.0 or not all(math.isfinite(v) for v in m.values()):
        self._stop_at(step, m)
      self.window.add(m)
    self.pending.clear()
    self._check(done)

  def _check(self, done: int) -> None:
    """Mark the current state (of step `done`) as checked finite: where a replay starts."""
    self.checked_state = None  # the old copy goes before the new one is made
    self.checked_state, self.checked_step = self.trainer.copy_state(self.state), done

  def _stop_at(self, bad: int, metrics: dict) -> None:
    good = self.checked_state  # donated by the first replayed step: the run ends here
    for step in range(self.checked_step, bad - 1):  # replay up to the last good step
      good, _ = self.trainer.p_train_step(good, self.trainer.device_batch(step))
    self._save(good, bad - 1)
    self.ckpt.wait()
    self.writer.write(bad, metric_writer.STOPPED, {},
                      reason='non-finite state or training metrics')
    raise FloatingPointError(
        f'Non-finite state or training metrics at step {bad} ({metrics}); stopped. The '
        f'last good state (step {bad - 1}) is saved in {self.ckpt.latest.directory}.')

  def _log_train(self, done: int) -> None:
    means = self.trainer.task.finalize(self.window.means())  # e.g. bpc, as evaluations
    self.writer.write(done, 'train', means, time_s=round(self.progress.elapsed(), 3))
    self.last['train'] = means
    self.window.reset()
    self.progress.log(done)

  def _evaluate(self, done: int) -> None:
    """Evaluate every periodic split; save the best checkpoint when it improved."""
    for split in self.config.eval.splits:
      self.last[split] = self.trainer.evaluate(self.state, split)
      extra = {}
      for kind in self.config.eval.compare:
        other = self.trainer.evaluate(self.state, split, kind)
        extra.update({f'{k}_{kind}': v for k, v in other.items()})
      self.writer.write(done, split, {**self.last[split], **extra},
                        time_s=round(self.progress.elapsed(), 3),
                        count=self.trainer.evaluated_count)
    metric = self.config.checkpoint.best_metric  # e.g. 'valid/accuracy'
    split, name = metric.split('/')
    if split not in self.last:
      return
    if name not in self.last[split]:
      raise ValueError(f'config.checkpoint.best_metric={metric!r} names no metric of '
                       f'{split!r}; it has {sorted(self.last[split])}.')
    if _better(self.last[split][name], self.best, self.config.checkpoint.best_mode):
      self.best = self.last[split][name]
      self._save(self.state, done, best=True)

  def _log_plan(self) -> None:
    """One line saying what this launch will do, before the first (compiling) step."""
    config = self.config
    if self.start >= config.train.num_steps:
      return
    splits = ', '.join(config.eval.splits) or 'no split'
    cap = (f'at most {config.eval.max_batches} batches each' if config.eval.max_batches
           else 'whole splits')
    test = ('; then the best-validation checkpoint on the whole test split'
            if config.eval.test_at_end else '')
    logging.info('Training steps %d to %d (batch %d, %d %s); evaluating %s (%s) every %d '
                 'steps and at the end%s.', self.start + 1, config.train.num_steps,
                 config.train.batch_size, self.trainer.num_devices,
                 'device' if self.trainer.num_devices == 1 else 'devices', splits, cap,
                 config.eval.every, test)

  def run(self) -> dict:
    trainer, config = self.trainer, self.config
    num_steps = config.train.num_steps
    self._log_plan()
    batch = trainer.device_batch(self.start) if self.start < num_steps else None
    for step in range(self.start, num_steps):
      self.state, metrics = trainer.p_train_step(self.state, batch)
      done = step + 1
      self.pending.append((done, metrics))
      if done < num_steps:
        batch = trainer.device_batch(done)  # built while step `done` runs
      log = done % config.train.log_every == 0 or done == num_steps
      evaluate = done % config.eval.every == 0 or done == num_steps
      save = done % config.checkpoint.every == 0 or done == num_steps
      if not (log or evaluate or save):
        continue
      self._fetch(done)
      if log:
        self._log_train(done)
      if evaluate:
        self._evaluate(done)
      if save:
        self._save(self.state, done)
        if done < num_steps and self._budget_spent():
          self._stop_for_budget(done)
          return self.last
    if config.eval.test_at_end and 'test' not in self.last:
      self.last['test'], tested_step = self._test_best()
      self.writer.write(num_steps, 'test', self.last['test'], checkpoint_step=tested_step,
                        time_s=round(self.progress.elapsed(), 3))
    return self.last

  def _budget_spent(self) -> bool:
    budget = self.config.train.get('time_budget_s')
    if budget is None:
      return False
    spent = time.monotonic() - self.started >= budget
    if jax.process_count() > 1:  # all processes stop at the same step: process 0 decides
      spent = bool(multihost_utils.broadcast_one_to_all(np.asarray(spent)))
    return spent

  def _stop_for_budget(self, done: int) -> None:
    """End this launch after the save of step `done` (written before returning)."""
    self.ckpt.wait()
    logging.info('Stopped after step %d of %d: the time budget of this launch '
                 '(config.train.time_budget_s=%g s) is spent (%.0f s). The checkpoint of '
                 'step %d is in %s; run the same command with the same workdir to continue '
                 'from it.', done, self.config.train.num_steps,
                 self.config.train.time_budget_s, time.monotonic() - self.started, done,
                 self.ckpt.latest.directory)

  def _test_best(self):
    """Test metrics of the best-validation checkpoint (the papers' early-stopped model),
    or of the final state when there is none. Returns `(metrics, step tested)`."""
    trainer = self.trainer
    self.ckpt.wait()
    if self.ckpt.best.latest_step() is not None:
      try:
        best, _ = self.ckpt.restore(self.template, best=True)
        logging.info('Testing the best-validation checkpoint (step %d) on the whole test '
                     'split.', int(best.step))
        metrics = trainer.evaluate(trainer.to_devices(best), 'test', max_batches=0)
        return metrics, int(best.step)
      except ValueError as e:  # every best checkpoint damaged (each one warned about)
        logging.warning('%s Testing the final state (step %d) instead.', e,
                        int(self.state.step[0]))
    else:
      logging.warning('No best-validation checkpoint in %s; testing the final state (step '
                      '%d) on the whole test split instead.', self.ckpt.best.directory,
                      int(self.state.step[0]))
    return trainer.evaluate(self.state, 'test', max_batches=0), int(self.state.step[0])
