"""A run's metrics: `metrics.jsonl` (one JSON object per line), TensorBoard, absl logs."""

from __future__ import annotations

import json
import os

from absl import logging


class MetricWriter:
  """`metrics.jsonl` (one JSON object per line), TensorBoard events, absl logging."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def truncate(self, step: int) -> None:
    """Drop records past `step` (written after the checkpoint a run resumes from), and
    a partial last line that a crash mid-write left (with a warning). A run resuming
    without its file warns that the history before `step` is gone."""
    if not self.enabled:
      return
    if not os.path.lexists(self.path):
      if step > 0:
        logging.warning('%s is missing, but the run resumes from step %d: the metrics up '
                        'to that step are gone; the file restarts with the records after '
                        'it.', self.path, step)
      return
    records = _read_records(self.path)
    with open(self.path, 'w') as f:
      for record in records:
        # The end-of-run test record follows the last checkpoint: it is redone too.
        if record['step'] < step or record['step'] == step and record['split'] != 'test':
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
