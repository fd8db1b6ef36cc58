"""The cells of `flax_cells.py` as Flax NNX modules, and `RNN`, the `nnx.RNN` that passes
them the lengths:

  cell = BNLSTMCell(in_features, hidden_features, max_length=T, rngs=nnx.Rngs(0))
  outputs = RNN(cell)(x, seq_lengths=lengths)            # x [*batch, time, in_features]
  carry, h = cell(carry, x_t, mask_t)                    # a loop of one's own

A cell is the Linen cell wrapped by `nnx_bridge.FromLinen` (its variables the layer's, as
`nnx.Param` and `nnx.BatchStat`); `RNN` applies the Linen `flax_cells.RNN` to them.
`model.train()` / `model.eval()` and `nnx_bridge.estimate_population_stats` work as for
any wrapped module. Training needs the mask, so a cell trains under `RNN` or in a loop of
one's own with `mask_t`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from bn_rnn_jax import flax_cells
from bn_rnn_jax import nnx_bridge

Array = jax.Array
LSTMCarry = flax_cells.LSTMCarry


class NormalizedLSTMCell(nnx_bridge.FromLinen):
  """`flax_cells.NormalizedLSTMCell` as an NNX module (the subclasses: the papers'
  presets): `in_features` I, `hidden_features` H, `rngs` (its `params` stream
  initialises it), `use_running_average` (`model.eval()`) and the Linen cell's other
  fields (`max_length`, `momentum`, `execution`, ...)."""
  linen_cell = flax_cells.NormalizedLSTMCell

  def __init__(self, in_features: int, hidden_features: int, *, rngs: nnx.Rngs,
               use_running_average: bool = False, **fields: Any):
    module = type(self).linen_cell(hidden_features, **fields)
    x = jnp.zeros((1, in_features), jnp.float32)
    super().__init__(module, module.initialize_carry(None, x.shape), x, rngs=rngs)
    self.in_features, self.hidden_features = in_features, hidden_features
    self.use_running_average = use_running_average

  @property
  def num_feature_axes(self) -> int:
    return 1

  def initialize_carry(self, input_shape: tuple[int, ...], rngs=None,
                       carry_init=None) -> LSTMCarry:
    """The carry at step 0 for `x_t` of shape `[*batch, features]`: zeros, or
    `carry_init(key, shape, dtype)` for c and h (keys from `rngs`' `carry` stream)."""
    carry = self.to_nnx__module.initialize_carry(None, input_shape)
    if carry_init is None:
      return carry
    stream = rngs.carry if isinstance(rngs, nnx.Rngs) else rngs
    if stream is None:
      raise ValueError('initialize_carry(carry_init=...) needs rngs= to draw from.')
    return LSTMCarry(carry_init(stream(), carry.c.shape, carry.c.dtype),
                     carry_init(stream(), carry.h.shape, carry.h.dtype), carry.step)

  def __call__(self, carry, inputs: Array, mask: Optional[Array] = None):
    """The Linen cell's step: `(carry, x_t [*batch, I], mask_t [*batch])` -> `(carry,
    h_t)`."""
    return super().__call__(carry, inputs, mask)


class BNLSTMCell(NormalizedLSTMCell):
  """Cooijmans et al.'s BN-LSTM cell (`flax_cells.BNLSTMCell` in NNX): batch norm on
  W_h h, W_x x and c_t, per-step statistics, gamma 0.1."""
  linen_cell = flax_cells.BNLSTMCell


class BNInputLSTMCell(NormalizedLSTMCell):
  """Laurent et al.'s input-only BN-LSTM cell, frame-wise statistics
  (`flax_cells.BNInputLSTMCell` in NNX)."""
  linen_cell = flax_cells.BNInputLSTMCell


class LNLSTMCell(NormalizedLSTMCell):
  """Layer norm on W_h h, W_x x and c_t (`flax_cells.LNLSTMCell` in NNX), gamma 1."""
  linen_cell = flax_cells.LNLSTMCell


class RNN(nnx.Module):
  """`nnx.RNN` for the cells of this module (a `NormalizedLSTMCell`): the same arguments
  and call, with `seq_lengths` handed to the cell as a mask and the whole sequence run in
  one cell call (`flax_cells.run_sequence`)."""

  def __init__(self, cell: NormalizedLSTMCell, *, return_carry: bool = False,
               time_major: bool = False, reverse: bool = False, keep_order: bool = False):
    self.cell = cell
    self.return_carry, self.time_major = return_carry, time_major
    self.reverse, self.keep_order = reverse, keep_order

  def __call__(self, inputs: Array, *, initial_carry=None, seq_lengths=None,
               return_carry: Optional[bool] = None, time_major: Optional[bool] = None,
               reverse: Optional[bool] = None, keep_order: Optional[bool] = None,
               rngs=None):
    del rngs  # the cells start from zeros
    rnn = flax_cells.RNN(self.cell.to_nnx__module, return_carry=self.return_carry,
                         time_major=self.time_major, reverse=self.reverse,
                         keep_order=self.keep_order)
    return self.cell.apply_linen(rnn, inputs, scope='cell', initial_carry=initial_carry,
                                 seq_lengths=seq_lengths, return_carry=return_carry,
                                 time_major=time_major, reverse=reverse, keep_order=keep_order)
