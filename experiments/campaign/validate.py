"""What a results JSON must hold before a table reads it: its shape, and every record's
values of the right type and range. A mistake is one ValueError naming the file, the run
and the field, never a traceback from a table.

A results JSON (`collect.py`) is an object whose `runs` is an object of runs; a run is an
object with its `arm` (a string), `seed` (an integer) and either `records` (a list of
record objects) or, for an evaluation campaign, `evaluation` (an object). A record has
its `step` (an integer >= 0) and `split` (a string); its other values are numbers, except
a stopped run's `reason`; fractions (accuracy, error, frame error rate) lie in [0, 1],
and losses, counts, times and norms are >= 0. Every number anywhere in a run is finite.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional

#: Record fields that are text, not numbers.
TEXT = ('split', 'reason')
#: Metrics that are fractions (with their `_batch` / `_running` variants).
FRACTIONS = ('accuracy', 'error', 'fer')
#: Metrics and record fields that are never negative (with their variants).
NON_NEGATIVE = ('step', 'loss', 'bpc', 'perplexity', 'fce', 'grad_norm', 'count', 'time_s',
                'checkpoint_step')
#: Record fields that are whole numbers.
INTEGERS = ('step', 'count', 'checkpoint_step')
_AGAIN = '(repair the value, or run the run again)'


def check_results(result: Any, path: str) -> None:
  """Raise a one-line ValueError naming `path` when `result` is not a results JSON with
  runs, or when a run's value has the wrong type or range (`check_runs`)."""
  if not isinstance(result, dict):
    raise ValueError(f'{path} is not a results JSON (not an object); collect it again '
                     '(python -m experiments.campaign collect).')
  runs = result.get('runs')
  if not runs:
    raise ValueError(f'{path} holds no runs; collect it again once runs have finished '
                     '(python -m experiments.campaign collect).')
  if not isinstance(runs, dict):
    raise ValueError(f'{path} is not a results JSON ("runs" is {_kind(runs)}, not an '
                     'object of runs); collect it again (python -m experiments.campaign '
                     'collect).')
  spec = result.get('spec', {})
  if not isinstance(spec, dict) or not isinstance(spec.get('arms', {}), dict):
    raise ValueError(f'{path} is not a results JSON ("spec" is not an object with an '
                     'object of arms); collect it again (python -m experiments.campaign '
                     'collect).')
  check_runs(runs, path)


def check_runs(runs: Mapping[str, Any], where: str) -> None:
  """Raise a one-line ValueError naming `where`, the run and the field when a run in
  `runs` (`{name: entry}`) is not shaped as a run, or holds a value of the wrong type or
  range (a table would compare it as a number: an accuracy of 7.5 is ahead of every
  other, `true` reads as 1)."""
  for name, entry in runs.items():
    problem = _run_problem(entry)
    if problem is not None:
      field, value, rule = problem
      shown = str(value) if isinstance(value, float) else json.dumps(value)[:60]
      raise ValueError(f'{where}: run {name} holds {shown} in {field}; {rule} {_AGAIN}.')


def _run_problem(entry: Any) -> Optional[tuple[str, Any, str]]:
  """`(field, value, rule broken)` of a run's first wrong value, else None."""
  if not isinstance(entry, dict):
    return 'the run', entry, 'a run is an object'
  if not isinstance(entry.get('arm'), str):
    return 'arm', entry.get('arm'), 'a run names its arm'
  if not _integer(entry.get('seed')):
    return 'seed', entry.get('seed'), 'a seed is an integer'
  found = _non_finite(entry)
  if found is not None:
    return (*found, 'results are finite numbers')
  if 'evaluation' in entry:
    return (None if isinstance(entry['evaluation'], dict) else
            ('evaluation', entry['evaluation'], 'an evaluation is an object'))
  records = entry.get('records')
  if not isinstance(records, list):
    return 'records', records, 'a run holds a list of records'
  for index, record in enumerate(records):
    problem = _record_problem(record)
    if problem is not None:
      field, value, rule = problem
      return f'records[{index}]{field}', value, rule
  return None


def _record_problem(record: Any) -> Optional[tuple[str, Any, str]]:
  if not isinstance(record, dict):
    return '', record, 'a record is an object'
  if not isinstance(record.get('split'), str):
    return '.split', record.get('split'), 'a record names its split'
  if 'step' not in record:
    return '.step', None, 'a record has its step'
  for key, value in record.items():
    if key in TEXT:
      if not isinstance(value, str):
        return f'.{key}', value, f'{key} is text'
      continue
    if not _number(value):
      return f'.{key}', value, f'{key} is a number'
    if key in INTEGERS and not _integer(value):
      return f'.{key}', value, f'{key} is an integer'
    if _is(key, FRACTIONS) and not 0.0 <= value <= 1.0:
      return f'.{key}', value, f'{key} is a fraction from 0 to 1'
    if _is(key, NON_NEGATIVE) and value < 0:
      return f'.{key}', value, f'{key} is not negative'
  return None


def _is(key: str, names) -> bool:
  """Whether `key` is one of `names` or a variant of one (`accuracy_batch`)."""
  return any(key == name or key.startswith(name + '_') for name in names)


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
  return {list: 'a list', str: 'text', bool: 'a boolean'}.get(type(value), 'a number')


def _non_finite(value, field: str = '') -> Optional[tuple[str, float]]:
  """`(field path, value)` of the first NaN or infinity in a JSON value, else None."""
  if isinstance(value, float) and not math.isfinite(value):
    return field, value
  items = (value.items() if isinstance(value, dict) else
           enumerate(value) if isinstance(value, list) else ())
  for key, item in items:
    found = _non_finite(item, f'{field}[{key}]' if isinstance(key, int) else
                        f'{field}.{key}' if field else key)
    if found is not None:
      return found
  return None
