"""How a module runs: Flax's two flags.

Flax splits the two: `nn.BatchNorm(use_running_average=...)` picks batch or population
statistics, `nn.Dropout(deterministic=...)` switches what is random. The layers, stacks
and models of this library take both, as fields or call arguments (one or the other, as
`nn.merge_param`); the cells and `MaskedBatchNorm`, which draw nothing, take
`use_running_average` only.

  use_running_average=False, deterministic=False
                                     training: batch statistics, dropout and h0 noise on
  use_running_average=True, deterministic=True
                                     evaluation: population statistics, deterministic
  use_running_average=False, deterministic=True
                                     batch statistics, no dropout or noise: a
                                     batch-statistics evaluation, and the papers'
                                     population estimate (whose pass draws the layers'
                                     h0 noise even so: `RecurrentLayer.initial_state`)

A flag given neither way follows the other one (the usual pairs above); one must be given.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Mode:
  """`use_running_average`: population statistics (True) or batch statistics (False).
  `deterministic`: no dropout and no h0 noise (True), or both (False)."""
  use_running_average: bool
  deterministic: bool

  @property
  def batch_statistics(self) -> bool:
    return not self.use_running_average

  def kwargs(self) -> dict[str, bool]:
    """The keyword arguments that pass this mode to a submodule."""
    return {'use_running_average': self.use_running_average,
            'deterministic': self.deterministic}


TRAIN = Mode(use_running_average=False, deterministic=False)
EVAL = Mode(use_running_average=True, deterministic=True)
#: Batch statistics without dropout (the estimate, batch-statistics evaluation).
BATCH_STATISTICS = Mode(use_running_average=False, deterministic=True)


def merge(name: str, field: Optional[bool], argument: Optional[bool]) -> Optional[bool]:
  """A flag given as a field or as a call argument (None: neither), not both."""
  if field is not None and argument is not None:
    raise ValueError(f'{name} was given both as a field and in the call; give it once.')
  return field if argument is None else argument


def resolve(module, use_running_average: Optional[bool] = None,
            deterministic: Optional[bool] = None) -> Mode:
  """The mode of a call of `module` (its fields merged with the call's arguments; the
  module docstring); a TypeError when neither flag is given either way."""
  use_running_average = merge('use_running_average',
                              getattr(module, 'use_running_average', None),
                              use_running_average)
  deterministic = merge('deterministic', getattr(module, 'deterministic', None), deterministic)
  if use_running_average is None and deterministic is None:
    raise TypeError(f'Say how {type(module).__name__} runs: use_running_average= and '
                    'deterministic= (Flax\'s flags), as fields or in the call.')
  if use_running_average is None:
    use_running_average = deterministic
  elif deterministic is None:
    deterministic = use_running_average
  return Mode(bool(use_running_average), bool(deterministic))


def flags(module, mode: Mode) -> dict[str, bool]:
  """`mode`'s keyword arguments that `module`'s call takes: `use_running_average`, and
  `deterministic` where it takes it (a module that draws nothing, such as a cell or
  `MaskedBatchNorm`, does not)."""
  takes = inspect.signature(type(module).__call__).parameters
  return {k: v for k, v in mode.kwargs().items() if k == 'use_running_average' or k in takes}


def batch_statistics_kwargs(module) -> dict[str, bool]:
  """The flags that ask `module` for batch statistics without noise or dropout."""
  return flags(module, BATCH_STATISTICS)
