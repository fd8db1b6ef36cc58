"""How a module runs: which statistics its batch norms use, and whether it draws noise.

Flax splits the two: `nn.BatchNorm(use_running_average=...)` picks batch or population
statistics, `nn.Dropout(deterministic=...)` switches stochastic regularisation. Every
module of this library takes both:

  use_running_average=False, deterministic=False
                                     training: batch statistics, dropout and h0 noise on
  use_running_average=True, deterministic=True
                                     evaluation: population statistics, deterministic
  use_running_average=False, deterministic=True
                                     batch statistics, no dropout or noise: how a
                                     batch-statistics evaluation runs the network, and
                                     the papers' population estimate (whose pass draws
                                     the layers' h0 noise even so:
                                     `RecurrentLayer.initial_state`)

A flag not given follows the other one (the usual pairs above); a call must give one.
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


def resolve(use_running_average: Optional[bool] = None,
            deterministic: Optional[bool] = None) -> Mode:
  """The mode a call asks for (see the module docstring); a TypeError when it names none."""
  if use_running_average is None and deterministic is None:
    raise TypeError('Say how to run: pass use_running_average= and deterministic= '
                    '(Flax\'s flags).')
  if use_running_average is None:
    use_running_average = deterministic
  elif deterministic is None:
    deterministic = use_running_average
  return Mode(bool(use_running_average), bool(deterministic))


def batch_statistics_kwargs(module) -> dict[str, bool]:
  """The flags that ask `module` for batch statistics without noise or dropout:
  `use_running_average=False`, and `deterministic=True` where its call takes it (a
  module that draws nothing, such as a cell or `MaskedBatchNorm`, does not)."""
  takes = inspect.signature(type(module).__call__).parameters
  return {k: v for k, v in BATCH_STATISTICS.kwargs().items()
          if k == 'use_running_average' or k in takes}
