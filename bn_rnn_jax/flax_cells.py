"""The papers' LSTM cells in Linen, and `RNN`, the `nn.RNN` that passes them the lengths.

A cell is one step, `cell(carry, x_t, mask_t) -> (carry, h_t)` with `x_t [*batch,
features]`, as `flax.linen.RNNCellBase` asks:

  BNLSTMCell          BN on W_h h, W_x x and c_t, per-step statistics (Cooijmans et al.;
                      `make_layer('bn_lstm')`)
  BNInputLSTMCell     BN on W_x x only, frame-wise (per-step) statistics (Laurent et al.
                      eq. 18; `make_layer('bn_input_only')`)
  LNLSTMCell          layer norm on the same three sites as BNLSTMCell (`'ln_lstm'`)

A cell is a thin adapter over `RecurrentLayer`, whose parameters and `batch_stats` it
holds under the same names and shapes (`{site: {'mean': [T_max, F], 'var': [T_max, F],
'count': [T_max]}}`): a step, or a whole sequence, is the layer's scan of the same step
function (`steps.lstm_step`), and its statistics are recorded as the layer records them.

Lengths reach a cell as arguments, never by looking around:

  RNN(cell)(x, seq_lengths=lengths)        # x [*batch, time, features], one line
  nn.Bidirectional(RNN(fwd), RNN(bwd))(x, seq_lengths=lengths)
  carry, h = cell(carry, x_t, mask_t)      # a scan or loop of one's own; mask_t [*batch]

`RNN` has `nn.RNN`'s signature (`seq_lengths`, `initial_carry`, `return_carry`,
`time_major`, `reverse`, `keep_order`) and runs the whole sequence in one call of the
cell, so the moments of every step are folded into `batch_stats` once, after the scan.
Lengths are relative to the call, as Flax defines them; a carry returned by one call
continues the sequence in the next (`LSTMCarry.step` holds each row's step, which picks
its statistics row). Training a cell with batch statistics needs the mask: plain
`nn.RNN` cannot pass one, so a cell under it trains only through `RNN` (it evaluates
under either).

The carry is `LSTMCarry(c, h, step)`; it unpacks as Flax's LSTM carry, `c, h = carry`,
and `RNN` takes `initial_carry=(c0, h0)` as the start of a sequence.

Sequence-wise statistics (Laurent eq. 20-21, `'bn_input_only_seq'`) and statistics
shared over time reduce over the whole sequence before the first step; no cell sees
that, so they exist only as layers (`RecurrentLayer`, `make_layer`).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct
from flax.linen.recurrent import flip_sequences

from bn_rnn_jax import batch_stats
from bn_rnn_jax import checks
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from bn_rnn_jax import policy
from bn_rnn_jax import recurrent

Array = jax.Array


@struct.dataclass
class LSTMCarry:
  """An LSTM cell's carry: the state `c`, `h` `[*batch, H]` and `step` `[*batch]` (int32),
  each row's next time step (its statistics row). Unpacks as `c, h = carry`."""
  c: Array
  h: Array
  step: Array

  def __iter__(self):
    return iter((self.c, self.h))


def as_carry(carry, batch_shape: tuple[int, ...]) -> LSTMCarry:
  """`carry` as an `LSTMCarry`: one as it is, or Flax's `(c, h)` at step 0 (the start of a
  sequence); anything else is a one-line error saying what to pass."""
  if isinstance(carry, LSTMCarry):
    return carry
  if isinstance(carry, (tuple, list)) and len(carry) == 2:
    c, h = carry
    return LSTMCarry(jnp.asarray(c), jnp.asarray(h), jnp.zeros(batch_shape, jnp.int32))
  raise TypeError(f'An LSTM carry is LSTMCarry(c, h, step) or (c, h) [*batch, H]; got '
                  f'{type(carry).__name__}: pass cell.initialize_carry(rng, x_t.shape) or '
                  '(c0, h0).')


def check_seq_lengths(seq_lengths, batch_shape: tuple[int, ...], length: int) -> None:
  """One line for `seq_lengths` that are not `[*batch]` integers in `0..length`; traced
  ones are checked for shape and dtype only."""
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
  """An LSTM cell with each of its three sites normalised or not; the subclasses below are
  the papers' presets. One step (or one run) of `RecurrentLayer` (cell 'lstm',
  statistics 'per_step') with the same fields.

  Attributes:
    features: H, the hidden size.
    recurrent_norm, input_norm, cell_norm: None | 'batch' | 'layer' on W_h h, W_x x, c_t.
    max_length: T_max, the rows of the per-step statistics (`[T_max, F]` per site);
      inference past the last trained row reuses it. Required with batch statistics,
      unused without.
    use_running_average: population statistics (True) or batch statistics, folded into
      the running average (False), as in `nn.BatchNorm`; a field, or a call argument.
    momentum, epsilon, scale_init, forget_bias, recurrent_kernel_init, kernel_init,
      dtype, axis_name, min_row_support, execution: as
      `RecurrentLayer` (which checks them).
  """
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

  @nn.nowrap
  def layer_fields(self) -> dict[str, Any]:
    """The fields of the `RecurrentLayer` this cell steps: the layer `make_layer` builds
    for the matching variant has the same variables."""
    return dict(hidden_size=self.features, cell='lstm', recurrent_norm=self.recurrent_norm,
                input_norm=self.input_norm, cell_norm=self.cell_norm,
                statistics='per_step', max_length=self.max_length, momentum=self.momentum,
                epsilon=self.epsilon, scale_init=self.scale_init,
                forget_bias=self.forget_bias,
                recurrent_kernel_init=self.recurrent_kernel_init,
                kernel_init=self.kernel_init, execution=self.execution, dtype=self.dtype,
                axis_name=self.axis_name, min_row_support=self.min_row_support)

  @nn.nowrap
  def _batch_norm(self) -> bool:
    return 'batch' in (self.recurrent_norm, self.input_norm, self.cell_norm)

  @nn.nowrap
  def initialize_carry(self, rng, input_shape: tuple[int, ...]) -> LSTMCarry:
    """Zeros for `x_t` of shape `input_shape = [*batch, features]`, at step 0."""
    del rng
    batch_shape = tuple(input_shape[:-1])
    zeros = jnp.zeros(batch_shape + (self.features,), jnp.float32)
    return LSTMCarry(zeros, zeros, jnp.zeros(batch_shape, jnp.int32))

  @nn.compact
  def __call__(self, carry: Optional[LSTMCarry], inputs: Array,
               mask: Optional[Array] = None, *, use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None, sequence: bool = False):
    """One step, or with `sequence=True` a whole sequence from `carry`.

    Args:
      carry: `LSTMCarry` (or `(c, h)`: a sequence's start); with `sequence=True` also
        None, the zero state at step 0.
      inputs: `x_t [*batch, features]`, or `[*batch, time, features]` with `sequence`.
      mask: `[*batch]` (`[*batch, time]` with `sequence`), 1 on valid steps, 0 on
        padding (valid steps first). Padding keeps the state, outputs 0 and never counts
        in a statistic. Training with batch statistics needs it for a step (ones when
        nothing is padded): without it a step cannot tell padding from data.
      use_running_average: as the field (`nn.merge_param`).
      deterministic: unused (a cell draws no noise: its carry is given); accepted as
        every module of the library accepts it.

    Returns:
      `(carry, h_t [*batch, H])`, or `(carry, outputs [*batch, time, H])`; the carry's
      `step` advanced by each row's valid steps.
    """
    del deterministic
    name = type(self).__name__
    batch_norm = self._batch_norm()
    if batch_norm and self.max_length is None:
      raise ValueError(f'{name} keeps per-step batch statistics, made before it sees a '
                       'sequence: pass max_length=T_max, the longest training sequence.')
    train = batch_norm and not nn.merge_param(
        'use_running_average', self.use_running_average, use_running_average)
    if train and mask is None and not sequence and not self.is_initializing():
      raise ValueError(
          f'{name}: a training step needs mask= ([*batch], 1 valid, 0 padding; ones when '
          'nothing is padded) to keep padding out of its statistics; under nn.RNN use '
          'bn_rnn_jax.RNN(cell), which passes seq_lengths.')
    xs = inputs if sequence else inputs[..., None, :]
    if xs.ndim < 3:
      raise ValueError(f'{name} takes x [*batch, {"time, " if sequence else ""}features]; '
                       f'got shape {inputs.shape}.')
    batch_shape, (length, features) = xs.shape[:-2], xs.shape[-2:]
    if mask is not None:
      mask = jnp.asarray(mask)
      mask = mask if sequence else mask[..., None]
      if mask.shape != batch_shape + (length,):
        raise ValueError(f'{name}: mask must be {batch_shape + (length,)} for inputs '
                         f'{inputs.shape}; got {mask.shape}.')
    rows = int(np.prod(batch_shape))
    if carry is None:
      if not sequence:
        raise ValueError(f'{name}: a step needs a carry (cell.initialize_carry).')
      c = h = jnp.zeros((rows, self.features), jnp.float32)
      first_step = 0
    else:
      carry = as_carry(carry, batch_shape)
      c, h = (a.reshape(rows, self.features) for a in (carry.c, carry.h))
      first_step = carry.step.reshape(rows)
    layer = recurrent.RecurrentLayer(**self.layer_fields(), parent=self)
    nn.share_scope(self, layer)
    flat_mask = None if mask is None else mask.reshape(rows, length).astype(jnp.float32)
    (c, h), ys = layer(xs.reshape(rows, length, features), flat_mask,
                       use_running_average=not train, deterministic=True,
                       initial_carry=(c, h), first_step=first_step,
                       return_carry=True)
    steps = (jnp.full((rows,), length, jnp.int32) if flat_mask is None
             else jnp.sum(flat_mask > 0, axis=1).astype(jnp.int32))
    carry = LSTMCarry(c.reshape(batch_shape + (self.features,)),
                      h.reshape(batch_shape + (self.features,)),
                      (first_step + steps).reshape(batch_shape))
    ys = ys.reshape(batch_shape + (length, self.features))
    return carry, (ys if sequence else ys[..., 0, :])


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


class RNN(nn.Module):
  """`nn.RNN` for the cells of this module: the same fields and call, with `seq_lengths`
  handed to the cell as a mask and the whole sequence run in one cell call (one scan,
  statistics recorded once). See the module docstring.

  Attributes:
    cell: a `NormalizedLSTMCell`.
    return_carry, time_major, reverse, keep_order: as `nn.RNN`.

  Call: `(inputs [*batch, time, features], *, initial_carry=None, init_key=None,
  seq_lengths=None [*batch] int, return_carry=None, time_major=None, reverse=None,
  keep_order=None, use_running_average=None, deterministic=None)` -> outputs
  `[*batch, time, H]` (0 on padding), or `(carry, outputs)`; the carry is each row's
  state after its last valid step. The two flags, where given, override the cell's.
  """
  cell: NormalizedLSTMCell
  return_carry: bool = False
  time_major: bool = False
  reverse: bool = False
  keep_order: bool = False

  def __call__(self, inputs: Array, *, initial_carry=None, init_key=None,
               seq_lengths: Optional[Array] = None, return_carry: Optional[bool] = None,
               time_major: Optional[bool] = None, reverse: Optional[bool] = None,
               keep_order: Optional[bool] = None,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    del init_key  # the cells start from zeros
    flags = {'use_running_average': use_running_average, 'deterministic': deterministic}
    kwargs = {name: value for name, value in flags.items() if value is not None}
    pick = lambda value, default: default if value is None else value
    return run_sequence(
        lambda carry, xs, mask: self.cell(carry, xs, mask, sequence=True, **kwargs),
        inputs, initial_carry=initial_carry, seq_lengths=seq_lengths,
        return_carry=pick(return_carry, self.return_carry),
        time_major=pick(time_major, self.time_major), reverse=pick(reverse, self.reverse),
        keep_order=pick(keep_order, self.keep_order))


def run_sequence(run_cell, inputs: Array, *, initial_carry, seq_lengths, return_carry: bool,
                 time_major: bool, reverse: bool, keep_order: bool):
  """`nn.RNN`'s call around `run_cell(carry | None, xs [*batch, time, F], mask | None) ->
  (carry, outputs [*batch, time, H])`, a cell's run over a whole sequence (the Linen and
  NNX `RNN`): checks `seq_lengths` and makes them the mask, and handles `time_major`,
  `reverse` (padding stays at the end) and `keep_order`."""
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
