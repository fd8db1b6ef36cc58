"""Spellings of the previous release, accepted for this one with a DeprecationWarning.

  previous release                            now
  a layer, stack or language model called     `return_carry=True` for `(carry, outputs)`,
  without `return_carry`: `(carry, outputs)`  `return_carry=False` for the outputs (the
                                              next release's default, as `nn.RNN`'s)
  `RecurrentLayer(hoist_input=, remat=,       `RecurrentLayer(execution=
  unroll=, backward=, batch_sums=)`           policy.Execution(...))`; `hoist_input=None`
                                              is 'auto'
  `remat=True` / `remat=False`                `remat='full'` / `remat='none'`
  `stats_per_step=`, `input_statistics=`      `statistics=` ('per_step', 'sequence',
                                              'shared')
  a cell without `max_length` (1000 rows)     `max_length=` (T_max) given

Each warning names the caller's line (the first frame outside this library, Flax and
JAX), so that Python's default filters show it to a script, and is shown once per
process: a layer's `init` and `apply` trace its code several times (and JAX resets
Python's record of the warnings shown), but one cause is one warning. Filters that ask for
every occurrence ('always', 'error', as `pytest.warns` and the test suite's filters do)
get every one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
import warnings
from typing import Any, Iterator, Mapping, Optional

from bn_rnn_jax import policy

#: What a cell without `max_length` got in the previous release.
OLD_CELL_MAX_LENGTH = 1000
#: `RecurrentLayer`'s execution fields and their defaults (a field left at its default is
#: not set).
OLD_EXECUTION_DEFAULTS = {'hoist_input': None, 'remat': policy.AUTO, 'unroll': 1,
                          'backward': policy.AUTO, 'batch_sums': policy.AUTO}
# Spellings of earlier releases: (stats_per_step, input_statistics) -> statistics.
_OLD_STATISTICS = {(True, 'frame'): 'per_step', (True, 'sequence'): 'sequence',
                   (False, 'sequence'): 'shared'}
_INTERNAL = ('bn_rnn_jax', 'flax', 'jax', 'jaxlib', 'contextlib', 'functools')
_OUTPUTS_DISCARDED = contextvars.ContextVar('outputs_discarded', default=False)
# The messages shown so far in this process (`warn`).
_SHOWN: set[str] = set()


def _action(message: str, module: str, lineno: int) -> str:
  """What Python's warning filters do with a DeprecationWarning `message` raised from
  `module` at `lineno` (the first matching filter's action, as `warnings.warn` finds it)."""
  def matches(pattern, value: str) -> bool:   # None, a compiled pattern or a plain string
    return (pattern is None or (pattern == value if isinstance(pattern, str) else
                                bool(pattern.match(value))))
  for action, text, category, where, line in warnings.filters:
    if (matches(text, message) and issubclass(DeprecationWarning, category)
        and matches(where, module) and line in (0, lineno)):
      return action
  return warnings.defaultaction


def warn(message: str) -> None:
  """A DeprecationWarning attributed to the first caller outside this library, Flax and
  JAX (a layer's call runs several frames deep in Flax's wrappers), shown once per
  process unless the filters ask for every occurrence ('always', 'error')."""
  frame, level = sys._getframe(1), 2  # pylint: disable=protected-access
  internal = lambda f: f.f_globals.get('__name__', '').split('.')[0] in _INTERNAL
  while frame is not None and internal(frame):
    frame, level = frame.f_back, level + 1
  module = '<unknown>' if frame is None else frame.f_globals.get('__name__', '<string>')
  action = _action(message, module, 0 if frame is None else frame.f_lineno)
  if action in ('default', 'module', 'once'):
    if message in _SHOWN:
      return
    _SHOWN.add(message)
  warnings.warn(message, DeprecationWarning, stacklevel=level)


@contextlib.contextmanager
def outputs_discarded() -> Iterator[None]:
  """Calls inside discard their outputs (the population estimate keeps only the
  statistics), so a missing `return_carry` changes nothing there and is not warned."""
  token = _OUTPUTS_DISCARDED.set(True)
  try:
    yield
  finally:
    _OUTPUTS_DISCARDED.reset(token)


def returned(carry: Any, outputs: Any, return_carry: Optional[bool], who: str,
             initializing: bool = False) -> Any:
  """What a call returns: `outputs`, or `(carry, outputs)` with `return_carry=True`.

  `return_carry=None` is the previous release's `(carry, outputs)`, with a
  DeprecationWarning (none during `init`, whose outputs Flax drops, nor inside
  `outputs_discarded`)."""
  if return_carry is None:
    if not initializing and not _OUTPUTS_DISCARDED.get():
      warn(f'{who} called without return_carry returns (carry, outputs) in this release '
           'only; pass return_carry=True to keep that, or return_carry=False for the '
           'outputs alone (the default of the next release, as flax.linen.RNN).')
    return carry, outputs
  return (carry, outputs) if return_carry else outputs


def _is_default(value: Any, default: Any) -> bool:
  return value is default or (type(value) is type(default) and value == default)


def _execution_value(name: str, value: Any) -> Any:
  """An old execution field's value in `policy.Execution`'s spelling."""
  if name == 'hoist_input' and value is None:
    return policy.AUTO
  if name == 'remat' and isinstance(value, bool):
    return 'full' if value else 'none'
  return value


def merge_execution(execution: policy.Execution, fields: Mapping[str, Any], who: str,
                    *, deprecated: bool = True) -> policy.Execution:
  """`execution` with the old execution `fields` that are set (not at their old
  default) merged in, each overriding; a DeprecationWarning names them (unless not
  `deprecated`: the config keys `model.remat` etc. stay the config's spelling)."""
  old = {name: value for name, value in fields.items()
         if not _is_default(value, OLD_EXECUTION_DEFAULTS[name])}
  if not old:
    return execution
  new = {name: _execution_value(name, value) for name, value in old.items()}
  if deprecated:
    spelled = ', '.join(f'{name}={value!r}' for name, value in new.items())
    warn(f'{who}: the fields {", ".join(old)} are deprecated; pass '
         f'execution=policy.Execution({spelled}) (bn_rnn_jax.policy).')
  return dataclasses.replace(execution, **new)


def upgrade_layer_fields(fields: Mapping[str, Any], who: str) -> dict[str, Any]:
  """`RecurrentLayer` fields with the old spellings translated, each with a
  DeprecationWarning (or a one-line error): `stats_per_step` / `input_statistics` to
  `statistics`, the execution fields into `execution`."""
  fields = dict(fields)
  if 'stats_per_step' in fields or 'input_statistics' in fields:
    key = (fields.pop('stats_per_step', True), fields.pop('input_statistics', 'frame'))
    if key not in _OLD_STATISTICS:
      raise ValueError(f'stats_per_step={key[0]} with input_statistics={key[1]!r} has no '
                       f"'statistics' value; use statistics='per_step', 'sequence' or "
                       "'shared'.")
    warn(f'stats_per_step / input_statistics are replaced by statistics='
         f'{_OLD_STATISTICS[key]!r}.')
    fields['statistics'] = _OLD_STATISTICS[key]
  old = {name: fields.pop(name) for name in OLD_EXECUTION_DEFAULTS if name in fields}
  execution = fields.get('execution', policy.Execution())
  merged = merge_execution(execution, old, who)
  if merged != execution:
    fields['execution'] = merged
  return fields


def cell_max_length(max_length: Optional[int], who: str) -> int:
  """A cell's T_max: `max_length`, or the previous release's default with a
  DeprecationWarning (a cell sees no sequence length when its statistics are made)."""
  if max_length is None:
    warn(f'{who} without max_length is deprecated (it gets {OLD_CELL_MAX_LENGTH} rows of '
         'statistics per site); pass max_length=T_max, the longest training sequence.')
    return OLD_CELL_MAX_LENGTH
  return max_length
