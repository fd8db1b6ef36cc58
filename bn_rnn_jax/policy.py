"""How a recurrent layer runs: `Execution` (what the user sets) and `ExecutionPolicy` (what
`resolve` makes of it for one platform and layer).

No choice changes what the layer computes: every combination gives the same outputs,
statistics and gradients. 'auto' is the platform's choice, for the layer's size and
per-device batch (docs/speed.md, "The execution policy", says why):

  | choice | CPU | GPU | TPU |
  |---|---|---|---|
  | `hoist_input` | in the step (False) | hoisted (True) | hoisted (True) |
  | `remat` | with batch norm: 'full' up to H128, 'dots' above; else 'none' | with batch norm: 'dots'; else 'none' | as the GPU |
  | `backward` | 'layer' for LSTMs with H >= 8 B; else 'scan' | 'layer' for LSTMs without batch norm; else 'scan' | 'scan' |
  | `batch_sums` | 'contraction' | 'reduce' | 'reduce' |

The platform is the program's target: the default backend's, or those named by `targets`
while it is traced (`with policy.targets('tpu'):`). With several targets,
`jax.lax.platform_dependent` keeps the policy of the platform the program is lowered for.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator, Optional, Union

import jax

from bn_rnn_jax import normalization

AUTO = 'auto'
REMAT_MODES = ('none', 'dots', 'full')
BACKWARD_PASSES = ('scan', 'layer')
BATCH_SUMS = normalization.BATCH_SUMS
FUSED_STEPS = ('none', 'xla', 'pallas', 'persistent')
#: The fused steps that are Pallas (Triton) kernels: GPUs, interpreted on CPU.
PALLAS_STEPS = ('pallas', 'persistent')
#: `jax.lax.platform_dependent`'s platform names.
PLATFORMS = ('cpu', 'cuda', 'rocm', 'tpu')
#: CPU, with batch norm: remat 'full' up to this hidden size.
FULL_REMAT_MAX_HIDDEN = 128
#: CPU: LSTM layers take backward 'layer' when H is at least this times the batch.
LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE = 8


def _choice(name: str, value, allowed: tuple) -> None:
  if value != AUTO and value not in allowed:
    raise ValueError(f'{name} must be {AUTO!r} or one of {allowed}; got {value!r}.')


def _power_of_two(name: str, value) -> None:
  if value is not None and (not isinstance(value, int) or value < 1 or value & (value - 1)):
    raise ValueError(f'{name} must be a positive power of two; got {value!r}.')


@dataclasses.dataclass(frozen=True)
class Execution:
  """How a `RecurrentLayer` runs, never what it computes; each setting 'auto' (the
  target platform's, `resolve`) or a value. Hashable (a static argument of `jax.jit`).

  Attributes:
    hoist_input: W_x x (and its normalisation) for all steps before the scan (True) or
      inside each step (False).
    remat: what the backward pass stores per step: everything ('none'), the matmul
      outputs ('dots') or the carry ('full').
    unroll: steps per scan iteration (`lax.scan(unroll=)`).
    backward: the autodiff of `lax.scan` ('scan') or `layer_vjp`'s whole-layer backward
      pass ('layer'; no forward-mode derivative).
    batch_sums: sums over the batch as a reduction ('reduce') or a contraction with ones
      ('contraction').
    fused_step: 'none', or the fused BN-LSTM step (per-step statistics; kernels on one
      device): plain JAX ('xla'), a Pallas kernel per step ('pallas'), or one per pass
      ('persistent', H up to `persistent.MAX_HIDDEN`). It hoists the input term;
      `remat` and `backward` do not apply.
    block_h: hidden units per Pallas block (a power of two); None: `fused.layout`'s.
    num_warps: warps per Pallas program on GPUs (a power of two).

  Example:
    >>> from bn_rnn_jax import policy
    >>> policy.Execution(remat='full', backward='scan').backward
    'scan'
    >>> policy.Execution(hoist_input=None)
    Traceback (most recent call last):
    ValueError: hoist_input must be 'auto', True or False; got None.
  """
  hoist_input: Union[str, bool] = AUTO
  remat: str = AUTO
  unroll: int = 1
  backward: str = AUTO
  batch_sums: str = AUTO
  fused_step: str = 'none'
  block_h: Optional[int] = None
  num_warps: int = 8

  def __post_init__(self):
    if self.hoist_input != AUTO and not isinstance(self.hoist_input, bool):
      raise ValueError(f'hoist_input must be {AUTO!r}, True or False; got '
                       f'{self.hoist_input!r}.')
    for name, allowed in (('remat', REMAT_MODES), ('backward', BACKWARD_PASSES),
                          ('batch_sums', BATCH_SUMS)):
      _choice(name, getattr(self, name), allowed)
    if self.fused_step not in FUSED_STEPS:
      raise ValueError(f'fused_step must be one of {FUSED_STEPS}; got {self.fused_step!r}.')
    if not isinstance(self.unroll, int) or self.unroll < 1:
      raise ValueError(f'unroll must be a positive int; got {self.unroll!r}.')
    for name in ('block_h', 'num_warps'):
      _power_of_two(name, getattr(self, name))


#: The settings of `Execution`, by name.
EXECUTION_FIELDS = tuple(field.name for field in dataclasses.fields(Execution))


@dataclasses.dataclass(frozen=True)
class ExecutionPolicy:
  """An `Execution` resolved for one platform and layer call; `scan` names the
  `scans.SCANS` entry, `interpret` runs Pallas kernels interpreted (CPU)."""
  hoist_input: bool
  remat: str
  backward: str
  batch_sums: str
  fused_step: str = 'none'
  unroll: int = 1
  block_h: Optional[int] = None
  num_warps: int = 8
  interpret: bool = False

  @property
  def scan(self) -> str:
    return 'fused' if self.fused_step != 'none' else self.backward


def platform_name(platform: str) -> str:
  """`platform` as `PLATFORMS` names it ('gpu' is 'cuda')."""
  name = 'cuda' if platform == 'gpu' else platform
  if name not in PLATFORMS:
    raise ValueError(f'Unknown platform {platform!r}; one of {PLATFORMS} (or gpu).')
  return name


_TARGETS = contextvars.ContextVar('bn_rnn_jax_targets', default=())


@contextlib.contextmanager
def targets(*platforms: str) -> Iterator[None]:
  """Programs traced inside this context run the policies of `platforms` (e.g. 'tpu'),
  whatever the host's backend; with several, that of the platform it is lowered for."""
  token = _TARGETS.set(tuple(dict.fromkeys(platform_name(p) for p in platforms)))
  try:
    yield
  finally:
    _TARGETS.reset(token)


def target_platforms() -> tuple[str, ...]:
  """The platforms programs traced now are made for: `targets`', or the default backend."""
  return _TARGETS.get() or (platform_name(jax.default_backend()),)


def batch_sums_for(platform: str, batch_sums: str = AUTO) -> str:
  """'reduce' or 'contraction', with 'auto' resolved for `platform`."""
  _choice('batch_sums', batch_sums, BATCH_SUMS)
  if batch_sums != AUTO:
    return batch_sums
  return 'contraction' if platform == 'cpu' else 'reduce'


def resolve(*, cell: str, hidden_size: int, batch: int, batch_norm: bool,
            sequence_input: bool, execution: Execution = Execution(),
            platform: str = 'cpu') -> ExecutionPolicy:
  """The policy of one layer call on `platform` ('cpu', 'gpu', 'cuda', 'rocm', 'tpu'):
  `batch` per device, `batch_norm` whether a site is batch-normalised, `sequence_input`
  whether the input term has sequence-wise statistics (which must hoist).

  Example: a BN-LSTM layer of 1000 units at batch 64.

    >>> from bn_rnn_jax import policy
    >>> for platform in ('cpu', 'cuda', 'tpu'):
    ...   choices = policy.resolve(
    ...       cell='lstm', hidden_size=1000, batch=64, batch_norm=True, sequence_input=False,
    ...       platform=platform)
    ...   print(platform, choices.hoist_input, choices.remat, choices.backward,
    ...         choices.batch_sums)
    cpu False dots layer contraction
    cuda True dots scan reduce
    tpu True dots scan reduce
  """
  cpu = platform == 'cpu'
  gpu = platform in ('gpu', 'cuda', 'rocm')
  fused = execution.fused_step != 'none'
  if platform == 'tpu' and execution.fused_step in PALLAS_STEPS:
    raise ValueError(f"Execution(fused_step={execution.fused_step!r}) is Triton kernels, for "
                     "GPUs (interpreted on CPU); a TPU target has none: use fused_step='xla' "
                     "or 'none'.")
  hoist, remat, backward = execution.hoist_input, execution.remat, execution.backward
  if hoist == AUTO:
    hoist = sequence_input or fused or not cpu
  elif (sequence_input or fused) and not hoist:
    raise ValueError('hoist_input=False cannot hold with sequence-wise input statistics or '
                     'a fused step: they need every step\'s input term before the scan.')
  if remat == AUTO:
    full = cpu and hidden_size <= FULL_REMAT_MAX_HIDDEN
    remat = ('full' if full else 'dots') if batch_norm else 'none'
  if backward == AUTO:
    wide = hidden_size >= LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE * batch
    layer = (cpu and wide) or (gpu and not batch_norm)
    backward = 'layer' if cell == 'lstm' and layer else 'scan'
  return ExecutionPolicy(
      hoist_input=hoist, remat=remat, backward=backward,
      batch_sums=batch_sums_for(platform, execution.batch_sums),
      fused_step=execution.fused_step, unroll=execution.unroll, block_h=execution.block_h,
      num_warps=execution.num_warps,
      interpret=cpu and execution.fused_step in PALLAS_STEPS)
