"""Columns of the campaigns' tables, computed from a results JSON's records.

A run's `records` are its metrics.jsonl lines: `{'step', 'split', <metrics>, 'time_s'}`
with split 'train' (means over the steps since the last record), an evaluation split
('valid', 'train_eval', ...; population statistics) or 'test' (the best-validation
checkpoint's, with 'checkpoint_step'). Everything here is pure and reads only those.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from experiments.plot import curve  # pylint: disable=unused-import  (one curve reader)

DASH = '–'


# ---------------------------------------------------------------------- text
def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
  """A GitHub table: `| a | b |`, `|---|---|`, one line per row (an empty cell `| |`)."""
  line = lambda cells: '|' + '|'.join(f' {c} ' if str(c) else ' ' for c in cells) + '|'
  return '\n'.join([line(header), '|' + '---|' * len(header)] + [line(r) for r in rows])


def fmt(value: Optional[float], digits: int = 3) -> str:
  return DASH if value is None else f'{value:.{digits}f}'


def spread(values: Sequence[float], digits: int = 3) -> str:
  """`mean (min – max)` of several seeds' values."""
  return (f'{statistics.fmean(values):.{digits}f} ({min(values):.{digits}f} – '
          f'{max(values):.{digits}f})')


# ---------------------------------------------------------------------- runs
def runs_by_arm(result: dict) -> dict[str, list[dict]]:
  """`{arm: [run entries, by seed]}` in the spec's arm order (arms without runs left out)."""
  out = {arm: [] for arm in result['spec']['arms']}
  for run in result['runs'].values():
    out.setdefault(run['arm'], []).append(run)
  return {arm: sorted(runs, key=lambda r: r['seed']) for arm, runs in out.items() if runs}


def label(result: dict, arm: str) -> str:
  return result['spec']['arms'].get(arm, {}).get('label') or arm


def split(records: Sequence[dict], name: str) -> list[dict]:
  return [r for r in records if r['split'] == name]


def at_step(records: Sequence[dict], name: str, key: str, step: int) -> Optional[float]:
  for r in records:
    if r['split'] == name and r['step'] == step:
      return r.get(key)
  return None


def best(records: Sequence[dict], name: str, key: str, mode: str = 'min') -> Optional[dict]:
  """The first record of split `name` with the lowest (`mode='min'`) or highest `key`."""
  candidates = [r for r in records if r['split'] == name and key in r]
  if not candidates:
    return None
  pick = min if mode == 'min' else max
  return pick(candidates, key=lambda r: r[key])


def last(records: Sequence[dict], name: str) -> Optional[dict]:
  found = split(records, name)
  return found[-1] if found else None


def first_past(steps: Sequence[int], values: Sequence[float], threshold: float,
               above: bool = True) -> Optional[int]:
  """The first step whose value is past `threshold` (above it, or below it)."""
  for step, value in zip(steps, values):
    if (value > threshold) if above else (value < threshold):
      return step
  return None


def smooth(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing moving average over `window` values (fewer at the start)."""
  values = np.asarray(values, np.float64)
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  index = np.arange(1, values.size + 1)
  lo = np.maximum(index - window, 0)
  return (cumsum[index] - cumsum[lo]) / (index - lo)


def train_steps_per_second(records: Sequence[dict]) -> Optional[float]:
  """Median training steps/s between consecutive training records with no evaluation
  between them (from the logged wall times: evaluation time left out)."""
  rates = []
  for previous, record in zip(records, records[1:]):
    if previous['split'] == 'train' and record['split'] == 'train':
      seconds = record['time_s'] - previous['time_s']
      if seconds > 0:
        rates.append((record['step'] - previous['step']) / seconds)
  return float(np.median(rates)) if rates else None


def wall_time(records: Sequence[dict]) -> Optional[float]:
  """The run's training wall time (the trainer's clock, kept across restarts)."""
  times = [r['time_s'] for r in records if 'time_s' in r]
  return max(times) if times else None


def cpu_time(run: dict) -> Optional[float]:
  """Process CPU seconds of all the run's launches (None if it was not launched by the
  runner)."""
  launches = run.get('launches') or []
  seconds = [l.get('cpu_s') for l in launches]
  return sum(seconds) if seconds and None not in seconds else None


def trained_launches(run: dict) -> list[dict]:
  """The launches of a run that moved its steps, oldest first, each with `steps_after`:
  its own record's, or for a launch killed with the runner (no end record) the step the
  next launch resumed from (None for the last)."""
  launches = run.get('launches') or []
  out = []
  for i, launch in enumerate(launches):
    after = launch.get('steps_after')
    if after is None and i + 1 < len(launches):
      after = launches[i + 1]['steps_before']
    if after is None or after > launch['steps_before']:
      out.append({**launch, 'steps_after': after})
  return out


def launches_table(result: dict) -> str:
  """Every launch of every run that trained: its steps; its seconds per training step
  (the median between consecutive training records, evaluations left out) and its
  wall-clock hours (start-up, evaluations and steps after its last checkpoint included;
  "?" for a launch killed with the runner, whose end was not recorded); the cores it kept
  to and its machine (its accelerators where it had any, else its processor)."""
  rows = []
  for name, run in result['runs'].items():
    for i, launch in enumerate(trained_launches(run), 1):
      before, after, wall = launch['steps_before'], launch['steps_after'], launch.get('wall_s')
      last = math.inf if after is None else after
      rate = train_steps_per_second([r for r in run['records'] if before < r['step'] <= last])
      per_step = f'{1 / rate:#.3g}' if rate else '?'
      machine = launch['machine']
      cores = (f"{launch['cores_used']} of {machine['cores']}" if 'cores_used' in launch
               else f"{machine['cores']} (shared)")
      steps = f'{before:,} → {after:,}' if after is not None else f'{before:,} →'
      rows.append([name, i, steps, f'{wall / 3600:.2f}' if wall else '?', per_step, cores,
                   ', '.join(machine.get('gpus') or []) or machine.get('processor') or '?',
                   f"{machine['load_average_1_5_15_min'][0]:.2f}"])
  return markdown(['run', 'launch', 'steps', 'wall (h)', 's / step', 'cores',
                   'accelerator or processor', 'load at start'], rows)


def median(values: Sequence[float]) -> float:
  return float(np.median(values))
