"""A run's metrics: `metrics.jsonl` (one JSON object per line), TensorBoard, absl logs;
the window of training metrics between log lines, and progress (steps/s, ETA)."""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  from absl import logging
  from tensorboardX import SummaryWriter


#: The split of the record a run writes when a non-finite step stops it: `{'step': the
#: bad step, 'split': STOPPED, 'reason': ...}`, the last line of its metrics.jsonl. A run
#: that resumes from its last good checkpoint drops it with the other later records.
STOPPED = 'stopped'


class MetricWriter:
  """`metrics.jsonl` (one JSON object per line), TensorBoard events, absl logging."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self._tb_dir = os.path.join(workdir, 'tensorboard')
    self._tb = None  # opened at the first record: a launch that fails before writes none

  def truncate(self, step: int, retest: bool = True) -> None:
    """Drop the records past `step` (written after the checkpoint a run resumes from), the
    test record of `step` when `retest`, and a partial last line (with a warning); warn when
    a resumed run's file is gone, or a run from step 0 drops earlier records."""
    if not self.enabled:
      return
    if not os.path.lexists(self.path):
      if step > 0:
        logging.warning('%s is missing, but the run resumes from step %d: the metrics up '
                        'to that step are gone; the file restarts with the records after '
                        'it.', self.path, step)
      return
    records = _read_records(self.path)
    if step == 0 and records:
      steps = [r['step'] for r in records]
      logging.warning('%s holds %d records (steps %d to %d) but the run starts from step 0 '
                      '(no checkpoint to resume from): they are dropped.', self.path,
                      len(records), min(steps), max(steps))
    with open(self.path, 'w') as f:
      for record in records:
        # The end-of-run test record follows the last checkpoint.
        if record['step'] < step or record['step'] == step and (
            record['split'] != 'test' or not retest):
          f.write(json.dumps(record) + '\n')

  def write(self, step: int, split: str, metrics: dict, **extra) -> None:
    record = {'step': int(step), 'split': split,
              **{k: float(v) for k, v in metrics.items()}, **extra}
    logging.info('step %d %s: %s', step, split,
                 ', '.join(f'{k}={v:.4f}' for k, v in metrics.items()))
    if not self.enabled:
      return
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')
      f.flush()
    if self._tb is None:
      self._tb = SummaryWriter(self._tb_dir)
    for name, value in metrics.items():
      self._tb.add_scalar(f'{split}/{name}', float(value), step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  """The records of a run's `metrics.jsonl` (a partial last line is skipped with a
  warning; any other bad line is a one-line ValueError naming the file and line)."""
  return _read_records(os.path.join(workdir, 'metrics.jsonl'))


def _read_records(path: str) -> list[dict]:
  if os.path.isdir(path):
    raise ValueError(f'{path} is a directory, not the metrics file; move it away.')
  with open(path, errors='replace') as f:
    lines = f.read().split('\n')
  # A complete file ends with a newline, so its last piece is empty; anything else there
  # is a record a crash cut short.
  last = len(lines) - 1
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      if number - 1 == last:
        logging.warning('%s: skipped its partial last line %d (a run stopped while '
                        'writing it).', path, number)
        continue
      raise ValueError(f'{path} line {number} is not a JSON record: {line[:60]!r}.') from None
    if not isinstance(record, dict) or not isinstance(record.get('step'), int) or (
        not isinstance(record.get('split'), str)):
      raise ValueError(f'{path} line {number} is not a metrics record (needs an integer '
                       f'"step" and a "split"): {line[:60]!r}.')
    records.append(record)
  return records


class MetricWindow:
  """Training metrics of the steps since the last log line, summed on the host in step
  order (float64; the sums are checkpointed, so a resumed run logs what an uninterrupted
  one logs)."""

  def __init__(self, sums: dict, steps: int):
    self.sums, self.steps = dict(sums), steps

  def add(self, metrics: dict) -> None:
    for k, v in metrics.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.steps += 1

  def means(self) -> dict:
    return {k: v / self.steps for k, v in self.sums.items()}

  def reset(self) -> None:
    self.sums, self.steps = {}, 0


class Progress:
  """Steps/s and ETA lines (absl logging); wall time accumulated across restarts.

  The rate is measured from the launch's first log line on: the steps before it also
  paid for start-up and compilation, so that line gives no ETA.
  """

  def __init__(self, start: int, num_steps: int, previous_s: float):
    self.start, self.num_steps = start, num_steps
    self.t0 = time.time()
    self.previous_s = previous_s
    self.first = None   # (time, step) of the first log line

  def elapsed(self) -> float:
    return self.previous_s + time.time() - self.t0

  def rate(self, step: int, now: float) -> tuple[float, Optional[float]]:
    """`(steps/s, seconds left)` at `step`: since the first log line, or (on that line)
    since the launch started, with no time left given."""
    if self.first is None:
      self.first = (now, step)
      return (step - self.start) / max(now - self.t0, 1e-9), None
    since, counted = self.first
    rate = (step - counted) / max(now - since, 1e-9)
    return rate, (self.num_steps - step) / max(rate, 1e-9)

  def log(self, step: int) -> None:
    rate, left = self.rate(step, time.time())
    if left is None:
      logging.info('step %d/%d: %.2f steps/s with start-up and compilation', step,
                   self.num_steps, rate)
    else:
      logging.info('step %d/%d: %.2f steps/s, ETA %s', step, self.num_steps, rate,
                   time.strftime('%H:%M:%S', time.gmtime(left)))
