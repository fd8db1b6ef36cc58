"""How a recurrent layer runs on a backend: the execution policy, resolved in one place.

Four choices change how `RecurrentLayer` computes, never what: every combination gives the
same outputs, statistics and gradients (the tests force each one on CPU and compare).
A layer holds them as one value, `Execution` (`RecurrentLayer(execution=...)`), each a
value or 'auto'; `resolve` turns 'auto' into the backend's choice once per call, for the
layer's size and per-device batch:

  | choice | CPU | GPU | TPU |
  |---|---|---|---|
  | `hoist_input` | in the step (False) | hoisted (True) | hoisted (True) |
  | `remat` | with batch norm: 'full' up to H128, 'dots' above; else 'none' | with batch norm: 'dots'; else 'none' | 'none' |
  | `backward` | 'layer' for LSTMs with H >= 8 B; else 'scan' | 'layer' for LSTMs without batch norm; else 'scan' | 'scan' |
  | `batch_sums` | 'contraction' | 'reduce' | 'reduce' |

The CPU and GPU columns are set from `benchmarks/rnn_speed.py` runs (docs/speed.md has
the tables and the measured ratios); the TPU column is reasoned, not measured.

Why, per choice:
- `hoist_input`: W_x x for all steps as one large product before the scan (as cuDNN
  does) or inside each step. On CPU the hoisted `[T, B, G*H]` block costs memory traffic
  that the in-step product avoids; on a GPU the one large product wins. Sequence-wise
  input statistics need every step's input term before the scan, so those layers always
  hoist.
- `remat` (what the backward pass recomputes instead of storing per step): on CPU a
  small batch-normalised step is cheaper to recompute whole ('full': one more
  `[B, H] x [H, G*H]` product) than to store and reload its pointwise intermediates;
  larger ones store the matmul outputs ('dots'). On a GPU 'dots' is as fast as storing
  everything and holds less memory; TPUs keep everything ('none') until measured.
- `backward`: the autodiff of `lax.scan` ('scan') adds `h^T dz` into the `[H, G*H]`
  weight gradient at every step; the whole-layer pass of `layer_vjp` ('layer') stores
  `[B, G*H]` cotangents and forms the weight gradients in one product after the reverse
  scan, so it gains as H / B grows (CPU) and saves launches (GPU, plain LSTMs), at the
  cost of memory. It defines no forward-mode derivative (`jax.jvp`): a layer that needs
  one takes `backward='scan'`. The tanh RNN and TPUs keep 'scan'.
- `batch_sums` (the sums over the batch of the moments and of batch norm's backward
  pass): XLA's CPU reduction over the batch axis slows sharply once the kept part is
  large, where a contraction with ones does not, so CPU contracts; other backends
  reduce.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import jax

from bn_rnn_jax import normalization

AUTO = 'auto'
REMAT_MODES = ('none', 'dots', 'full')
BACKWARD_PASSES = ('scan', 'layer')
BATCH_SUMS = normalization.BATCH_SUMS
FUSED_STEPS = ('none', 'xla', 'pallas')

#: remat 'auto' on CPU: the largest hidden size whose batch-normalised layers recompute the
#: whole step in the backward pass.
FULL_REMAT_MAX_HIDDEN = 128
#: backward 'auto' on CPU: LSTM layers take the whole-layer backward pass when the hidden
#: size is at least this many times the per-device batch.
LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE = 8


@dataclasses.dataclass(frozen=True)
class ExecutionPolicy:
  """The resolved choices (no 'auto' left). See the module docstring for each."""
  hoist_input: bool
  remat: str
  backward: str
  batch_sums: str


def _choice(name: str, value, allowed: tuple) -> None:
  if value != AUTO and value not in allowed:
    raise ValueError(f'{name} must be {AUTO!r} or one of {allowed}; got {value!r}.')


@dataclasses.dataclass(frozen=True)
class Execution:
  """How a `RecurrentLayer` runs, never what it computes: the settings `resolve` turns
  into an `ExecutionPolicy`, each 'auto' (the backend's choice; the module docstring says
  why) or a value that forces it. Frozen and hashable, so that a layer holding one can
  be a static argument of `jax.jit`.

  Attributes:
    hoist_input: True: W_x x (and its normalisation) for all steps before the scan, one
      large product; False: inside each step. Sequence-wise input statistics always
      hoist (False is then an error).
    remat: what the backward pass recomputes instead of storing per step: 'none';
      'dots' (store the matmul outputs, recompute the pointwise math and
      normalisations); 'full' (store only the carry: least memory, for long
      sequences). The same for both backward passes (with 'layer', what its forward
      scan stores).
    unroll: steps per scan iteration (`lax.scan(unroll=)`), a positive int; no backend
      chooses it, so it has no 'auto'.
    backward: how the gradient of the scan is formed: 'scan' (the autodiff of
      `lax.scan`) or 'layer' (the whole-layer backward pass of `layer_vjp`: a reverse
      scan of the per-step cotangents, then one product per weight gradient). Both
      compute the same gradients; 'layer' defines no forward-mode derivative
      (`jax.jvp`, `jax.hessian`): pass 'scan' for those.
    batch_sums: how the sums over the batch run: 'reduce' or 'contraction' (with ones).
      The same values either way.
    fused_step: 'none' (the step functions under `lax.scan`), or the BN-LSTM step of
      `fused_step.py` with its whole-sequence backward pass: 'xla' (plain JAX) or
      'pallas' (one Pallas kernel per step and direction; Pallas's interpreter on CPU).
      For BN-LSTM layers with per-step statistics on one device only; the input term is
      then hoisted, and `remat` and `backward` do not apply. No backend chooses it until
      it is measured there, so it has no 'auto'.

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

  def __post_init__(self):
    if self.hoist_input != AUTO and not isinstance(self.hoist_input, bool):
      raise ValueError(f'hoist_input must be {AUTO!r}, True or False; got '
                       f'{self.hoist_input!r}.')
    _choice('remat', self.remat, REMAT_MODES)
    _choice('backward', self.backward, BACKWARD_PASSES)
    _choice('batch_sums', self.batch_sums, BATCH_SUMS)
    if self.fused_step not in FUSED_STEPS:
      raise ValueError(f'fused_step must be one of {FUSED_STEPS}; got {self.fused_step!r}.')
    if not isinstance(self.unroll, int) or self.unroll < 1:
      raise ValueError(f'unroll must be a positive int; got {self.unroll!r}.')


#: The settings of `Execution`, by name.
EXECUTION_FIELDS = tuple(field.name for field in dataclasses.fields(Execution))


def batch_sums_for(backend: str, batch_sums: str = AUTO) -> str:
  """'reduce' or 'contraction', with 'auto' resolved for `backend`."""
  _choice('batch_sums', batch_sums, BATCH_SUMS)
  if batch_sums != AUTO:
    return batch_sums
  return 'contraction' if backend == 'cpu' else 'reduce'


def resolve(*, cell: str, hidden_size: int, batch: int, batch_norm: bool,
            sequence_input: bool, execution: Execution = Execution(),
            backend: Optional[str] = None) -> ExecutionPolicy:
  """The policy of one layer call.

  Args:
    cell: 'lstm' or 'rnn'.
    hidden_size: H.
    batch: the per-device batch of this call.
    batch_norm: whether any site of the layer is batch-normalised.
    sequence_input: whether the input term has sequence-wise statistics (must hoist).
    execution: the layer's settings (`Execution`; each 'auto' is decided here).
    backend: `jax.default_backend()` when None.

  Returns:
    An `ExecutionPolicy`. Raises ValueError for `hoist_input=False` with sequence-wise
    input statistics (which need the whole input term before the scan); an unknown
    value is refused when the `Execution` is made.

  Example: a BN-LSTM layer of 1000 units at batch 64 (the character-PTB config).

    >>> import dataclasses
    >>> from bn_rnn_jax import policy
    >>> for backend in ('cpu', 'gpu', 'tpu'):
    ...   choices = policy.resolve(
    ...       cell='lstm', hidden_size=1000, batch=64, batch_norm=True, sequence_input=False,
    ...       execution=policy.Execution(), backend=backend)
    ...   print(backend, dataclasses.astuple(choices))
    cpu (False, 'dots', 'layer', 'contraction')
    gpu (True, 'dots', 'scan', 'reduce')
    tpu (True, 'none', 'scan', 'reduce')
  """
  backend = backend or jax.default_backend()
  cpu = backend == 'cpu'
  gpu = backend in ('gpu', 'cuda', 'rocm')
  # `Execution` checked every value when it was made.
  hoist, remat, backward = execution.hoist_input, execution.remat, execution.backward
  if hoist == AUTO:
    hoist = sequence_input or not cpu
  elif sequence_input and not hoist:
    raise ValueError('hoist_input=False cannot hold with sequence-wise input statistics: '
                     'they need every step\'s input term before the scan.')
  if remat == AUTO:
    if cpu and batch_norm:
      remat = 'full' if hidden_size <= FULL_REMAT_MAX_HIDDEN else 'dots'
    else:
      remat = 'dots' if gpu and batch_norm else 'none'
  if backward == AUTO:
    wide = hidden_size >= LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE * batch
    layer = (cpu and wide) or (gpu and not batch_norm)
    backward = 'layer' if cell == 'lstm' and layer else 'scan'
  return ExecutionPolicy(hoist_input=hoist, remat=remat, backward=backward,
                         batch_sums=batch_sums_for(backend, execution.batch_sums))
