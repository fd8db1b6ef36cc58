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
    """Drop records past `step` (written after the checkpoint a run resumes from)."""
    if not (self.enabled and os.path.exists(self.path)):
      return
    with open(self.path) as f:
      records = [json.loads(line) for line in f if line.strip()]
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
    for name, value in metrics.items():
      self._tb.add_scalar(f'{split}/{name}', float(value), step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  """The records of a run's `metrics.jsonl`."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f if line.strip()]
