"""The papers' LSTM cells in Linen, and `RNN`, the `nn.RNN` that passes them the lengths.

A cell is one step, `cell(carry, x_t, mask_t) -> (carry, h_t)` (`nn.RNNCellBase`):
`BNLSTMCell` (`make_layer('bn_lstm')`), `BNInputLSTMCell` (`'bn_input_only'`) and
`LNLSTMCell` (`'ln_lstm'`). A cell holds the `RecurrentLayer` with its fields in its own
scope, so its variables are the layer's; a step is one call of that layer, and
`RNN(cell)` runs a whole sequence as one call of it (one scan, statistics recorded once).

  RNN(cell)(x, seq_lengths=lengths)        # x [*batch, time, features]
  nn.Bidirectional(RNN(fwd), RNN(bwd))(x, seq_lengths=lengths)
  carry, h = cell(carry, x_t, mask_t)      # a scan or loop of one's own; mask_t [*batch]

The carry, `LSTMCarry(c, h, step)`, is Flax's `(c, h)` with each row's next step (its
statistics row): a returned carry continues the sequence in the next call; its `state`
starts a new segment (truncated backprop). A training step needs the mask; Flax's
`nn.RNN` passes none and scans without `batch_stats`, so a cell under it is refused in
one line naming `RNN`. Statistics per sequence or shared over time exist only as layers.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import linen as nn
from flax import struct
from flax.core import FrozenDict
from flax.linen.recurrent import flip_sequences

from bn_rnn_jax import checks
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from bn_rnn_jax import policy
from bn_rnn_jax import recurrent

Array = jax.Array


@struct.dataclass
class LSTMCarry:
  """An LSTM cell's carry: the state `c`, `h` `[*batch, H]` and `step` `[*batch]` (int32),
  each row's next time step (its statistics row). Indexes and unpacks as Flax's `(c, h)`."""
  c: Array
  h: Array
  step: Array

  def __iter__(self):
    return iter((self.c, self.h))

  def __getitem__(self, index):
    return (self.c, self.h)[index]

  def __len__(self) -> int:
    return 2

  @property
  def state(self) -> tuple[Array, Array]:
    """`(c, h)`: the state without its steps, the start of a new segment (statistics row
    0 again), as truncated backprop trains."""
    return self.c, self.h


def as_carry(carry, batch_shape: tuple[int, ...]) -> LSTMCarry:
  """`carry` as an `LSTMCarry`: Flax's `(c, h)` starts at step 0; else one line."""
  if isinstance(carry, LSTMCarry):
    return carry
  if isinstance(carry, (tuple, list)) and len(carry) == 2:
    c, h = carry
    return LSTMCarry(jnp.asarray(c), jnp.asarray(h), jnp.zeros(batch_shape, jnp.int32))
  raise TypeError(f'An LSTM carry is LSTMCarry(c, h, step) or (c, h) [*batch, H]; got '
                  f'{type(carry).__name__}: pass cell.initialize_carry(rng, x_t.shape) or '
                  '(c0, h0).')


def check_seq_lengths(seq_lengths, batch_shape: tuple[int, ...], length: int) -> None:
  """One line for `seq_lengths` that are not `[*batch]` integers in `0..length` (traced
  values: inside `checks.checkify`)."""
  shape = tuple(np.shape(seq_lengths))
  if shape != tuple(batch_shape):
    raise ValueError(f'seq_lengths must have the batch shape {tuple(batch_shape)}; got {shape}.')
  dtype = getattr(seq_lengths, 'dtype', None) or np.asarray(seq_lengths).dtype
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f'seq_lengths must be integers (the valid steps of each row); got '
                     f'dtype {dtype}.')
  if isinstance(seq_lengths, jax.core.Tracer):
    checks.check((seq_lengths >= 0) & (seq_lengths <= length), 'seq_lengths holds {} or {}, '
                 f'outside 0..{length} (the time steps of the inputs).',
                 jnp.min(seq_lengths), jnp.max(seq_lengths))
    return
  values = np.asarray(seq_lengths)
  bad = np.argwhere((values < 0) | (values > length))
  if bad.size:
    index = tuple(int(i) for i in bad[0])
    raise ValueError(f'seq_lengths{list(index)} = {int(values[index])} is outside 0..{length} '
                     '(the time steps of the inputs).')


class NormalizedLSTMCell(nn.RNNCellBase):
  """An LSTM cell with each of its sites normalised or not (the subclasses: the papers'
  presets): one step of the `RecurrentLayer` (cell 'lstm', statistics 'per_step') with
  the same fields, which it checks. `max_length` is required with batch statistics;
  `use_running_average` is a field or a call argument, as in `nn.BatchNorm`."""
  features: int
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  max_length: Optional[int] = None
  use_running_average: Optional[bool] = None
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  scale_init: initializers.Initializer = initializers.Constant(0.1)
  forget_bias: float = 0.0
  recurrent_kernel_init: initializers.Initializer = initializers.ORTHOGONAL_BLOCKS
  kernel_init: initializers.Initializer = initializers.ORTHOGONAL
  dtype: Optional[Any] = None
  axis_name: Optional[str] = None
  min_row_support: float = normalization.DEFAULT_MIN_ROW_SUPPORT
  execution: policy.Execution = policy.Execution()

  @property
  def num_feature_axes(self) -> int:
    return 1

  def setup(self):
    # The layer's variables are the cell's (one scope), whoever calls it: a step, or
    # `RNN` running a whole sequence.
    self.recurrence = self.layer()
    nn.share_scope(self, self.recurrence)

  @nn.nowrap
  def layer(self, **fields) -> recurrent.RecurrentLayer:
    """The `RecurrentLayer` this cell steps (`fields` override its own): the layer
    `make_layer` builds for the matching variant has the same variables."""
    own = dict(
        features=self.features, cell='lstm', recurrent_norm=self.recurrent_norm,
        input_norm=self.input_norm, cell_norm=self.cell_norm, statistics='per_step',
        max_length=self.max_length, momentum=self.momentum, epsilon=self.epsilon,
        scale_init=self.scale_init, forget_bias=self.forget_bias,
        recurrent_kernel_init=self.recurrent_kernel_init, kernel_init=self.kernel_init,
        execution=self.execution, dtype=self.dtype, axis_name=self.axis_name,
        min_row_support=self.min_row_support)
    return recurrent.RecurrentLayer(**{**own, **fields})

  @nn.nowrap
  def training(self, use_running_average: Optional[bool]) -> bool:
    """Whether a call with this flag normalises with batch statistics (checked)."""
    batch_norm = 'batch' in (self.recurrent_norm, self.input_norm, self.cell_norm)
    if batch_norm and self.max_length is None:
      raise ValueError(f'{type(self).__name__} keeps per-step batch statistics, made before '
                       'it sees a sequence: pass max_length=T_max, the longest training '
                       'sequence.')
    return batch_norm and not nn.merge_param('use_running_average', self.use_running_average,
                                             use_running_average)

  @nn.nowrap
  def initialize_carry(self, rng, input_shape: tuple[int, ...]) -> LSTMCarry:
    """Zeros for `x_t` of shape `input_shape = [*batch, features]`, at step 0."""
    del rng
    batch_shape = tuple(input_shape[:-1])
    zeros = jnp.zeros(batch_shape + (self.features,), jnp.float32)
    return LSTMCarry(zeros, zeros, jnp.zeros(batch_shape, jnp.int32))

  def __call__(self, carry, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None):
    """One step: `(carry, x_t [*batch, features], mask_t [*batch])` -> `(carry, h_t)`,
    the carry's `step` advanced where `mask_t` is 1 (a padded row keeps its state and
    outputs 0). A training step needs `mask_t` (ones when nothing is padded)."""
    train = self.training(use_running_average)
    if train and mask is None and not self.is_initializing():
      raise ValueError(
          f'{type(self).__name__}: a training step needs mask= ([*batch], 1 valid, 0 '
          'padding; ones when nothing is padded) to keep padding out of its statistics; '
          'for a whole sequence use bn_rnn_jax.RNN(cell), which passes seq_lengths.')
    if inputs.ndim < 2:
      raise ValueError(f'{type(self).__name__} takes x_t [*batch, features]; got shape '
                       f'{inputs.shape}.')
    if carry is None:
      raise ValueError(f'{type(self).__name__}: a step needs a carry '
                       '(cell.initialize_carry).')
    carry, ys = run_layer(self.recurrence, carry, inputs[..., None, :],
                          None if mask is None else jnp.asarray(mask)[..., None], train,
                          type(self).__name__)
    return carry, ys[..., 0, :]


def run_layer(layer: recurrent.RecurrentLayer, carry, xs: Array, mask: Optional[Array],
              train: bool, cell: str):
  """`layer` (the cell's, in its scope; `cell` its class's name) over `xs [*batch, time,
  features]` from `carry` (an `LSTMCarry`, `(c, h)`, or None: zeros at step 0) with
  `mask [*batch, time]` | None: `(LSTMCarry, outputs [*batch, time, H])`."""
  batch_shape, (length, features) = xs.shape[:-2], xs.shape[-2:]
  if mask is not None and mask.shape != batch_shape + (length,):
    raise ValueError(f'mask must be {batch_shape + (length,)} for inputs {xs.shape}; got '
                     f'{mask.shape}.')
  rows, width = int(np.prod(batch_shape)), layer.features
  if carry is None:
    state, first_step = None, 0
  else:
    carry = as_carry(carry, batch_shape)
    shapes = [tuple(jnp.shape(a)) for a in (carry.c, carry.h, carry.step)]
    if shapes != [batch_shape + (width,)] * 2 + [batch_shape]:
      raise ValueError(f'{cell}: the carry must be [*batch, H] = {batch_shape + (width,)} '
                       f'(step [*batch]) for inputs {xs.shape}; got c, h, step {shapes}.')
    state = tuple(a.reshape(rows, width) for a in (carry.c, carry.h))
    first_step = carry.step.reshape(rows)
  flat_mask = None if mask is None else mask.reshape(rows, length).astype(jnp.float32)
  try:
    (c, h), ys = layer(xs.reshape(rows, length, features), flat_mask,
                       use_running_average=not train, deterministic=True,
                       initial_carry=state, first_step=first_step, return_carry=True)
  except flax_errors.ScopeCollectionNotFound:
    raise ValueError(f'{cell} keeps batch_stats, which nn.RNN does not pass into its scan: '
                     'run the cell with bn_rnn_jax.RNN(cell) (to evaluate with nn.RNN, pass '
                     "variable_broadcast=['params', 'batch_stats']).") from None
  steps = (jnp.full((rows,), length, jnp.int32) if flat_mask is None
           else jnp.sum(flat_mask > 0, axis=1).astype(jnp.int32))
  start = 0 if carry is None else first_step
  carry = LSTMCarry(c.reshape(batch_shape + (width,)), h.reshape(batch_shape + (width,)),
                    (start + steps).reshape(batch_shape))
  return carry, ys.reshape(batch_shape + (length, width))


class BNLSTMCell(NormalizedLSTMCell):
  """The BN-LSTM cell of Cooijmans et al. (eq. 14-16): batch norm on W_h h, W_x x and c_t
  with per-step statistics, gamma 0.1 (`make_layer('bn_lstm')`, one step)."""
  recurrent_norm: Optional[str] = 'batch'
  input_norm: Optional[str] = 'batch'
  cell_norm: Optional[str] = 'batch'


class BNInputLSTMCell(NormalizedLSTMCell):
  """Laurent et al.'s LSTM with batch norm on the input term only, frame-wise (per-step)
  statistics (eq. 18; `make_layer('bn_input_only')`, one step)."""
  input_norm: Optional[str] = 'batch'


class LNLSTMCell(NormalizedLSTMCell):
  """Layer norm on W_h h, W_x x and c_t (Ba et al. 2016; `make_layer('ln_lstm')`, one
  step); no statistics, so `use_running_average` is not needed."""
  recurrent_norm: Optional[str] = 'layer'
  input_norm: Optional[str] = 'layer'
  cell_norm: Optional[str] = 'layer'
  scale_init: initializers.Initializer = initializers.Constant(1.0)


#: `nn.RNN`'s `nn.scan` options and their defaults (`RNN` takes these only).
_SCAN_DEFAULTS = {'variable_axes': FrozenDict(), 'variable_broadcast': 'params',
                  'variable_carry': False, 'split_rngs': FrozenDict({'params': False})}


class RNN(nn.Module):
  """`nn.RNN` for the cells of this module: its fields and call (plus
  `use_running_average`, the cell's flag), `seq_lengths` handed to the cell's layer as a
  mask, the whole sequence one call of it. `unroll` is the cell's `Execution(unroll=)`
  (None takes it), and `nn.scan`'s options (`variable_*`, `split_rngs`) stay at their
  defaults: the layer scans itself (another value is one line)."""
  cell: NormalizedLSTMCell
  return_carry: bool = False
  time_major: bool = False
  reverse: bool = False
  keep_order: bool = False
  unroll: Optional[int] = None
  variable_axes: Mapping[Any, Any] = _SCAN_DEFAULTS['variable_axes']
  variable_broadcast: Any = _SCAN_DEFAULTS['variable_broadcast']
  variable_carry: Any = _SCAN_DEFAULTS['variable_carry']
  split_rngs: Mapping[Any, bool] = _SCAN_DEFAULTS['split_rngs']

  @nn.compact
  def __call__(self, inputs: Array, *, initial_carry=None, init_key=None,
               seq_lengths: Optional[Array] = None, return_carry: Optional[bool] = None,
               time_major: Optional[bool] = None, reverse: Optional[bool] = None,
               keep_order: Optional[bool] = None,
               use_running_average: Optional[bool] = None):
    del init_key  # the cells start from zeros
    for name, default in _SCAN_DEFAULTS.items():
      if getattr(self, name) != default:
        raise ValueError(f'RNN runs the cell\'s layer, which scans itself: {name}='
                         f'{getattr(self, name)!r} has no meaning here (nn.scan\'s option; '
                         f'leave it at {default!r}).')
    if self.unroll not in (None, self.cell.execution.unroll):
      raise ValueError(f'RNN(unroll={self.unroll}) runs the cell\'s layer, which unrolls as '
                       'the cell\'s execution says: give the cell execution=Execution('
                       f'unroll={self.unroll}) instead.')
    train = self.cell.training(use_running_average)

    def run_cell(carry, xs, mask):
      return run_layer(self.cell.recurrence, carry, xs, mask, train, type(self.cell).__name__)

    pick = lambda value, default: default if value is None else value
    return run_sequence(
        run_cell, inputs, initial_carry=initial_carry, seq_lengths=seq_lengths,
        return_carry=pick(return_carry, self.return_carry),
        time_major=pick(time_major, self.time_major), reverse=pick(reverse, self.reverse),
        keep_order=pick(keep_order, self.keep_order))


def run_sequence(run_cell, inputs: Array, *, initial_carry, seq_lengths, return_carry: bool,
                 time_major: bool, reverse: bool, keep_order: bool):
  """`nn.RNN`'s call around `run_cell(carry | None, xs [*batch, time, F], mask | None) ->
  (carry, outputs)`: `seq_lengths` checked and made the mask, `time_major`, `reverse`
  (padding stays at the end) and `keep_order`."""
  xs = jnp.moveaxis(inputs, 0, -2) if time_major else inputs
  if xs.ndim < 3:
    raise ValueError(f'RNN takes inputs [*batch, time, features]; got {inputs.shape}.')
  batch_shape, length = xs.shape[:-2], xs.shape[-2]
  mask = None
  if seq_lengths is not None:
    check_seq_lengths(seq_lengths, batch_shape, length)
    mask = jnp.arange(length) < jnp.asarray(seq_lengths)[..., None]
  flip = lambda a: flip_sequences(a, seq_lengths, num_batch_dims=len(batch_shape),
                                  time_major=False)
  if reverse:
    xs = flip(xs)
  carry = None if initial_carry is None else as_carry(initial_carry, batch_shape)
  carry, outputs = run_cell(carry, xs, mask)
  if reverse and keep_order:
    outputs = flip(outputs)
  if time_major:
    outputs = jnp.moveaxis(outputs, -2, 0)
  return (carry, outputs) if return_carry else outputs
