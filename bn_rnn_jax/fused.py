"""The fused BN-LSTM recurrences' entry (`Execution(fused_step=...)`): which layers they
run, the kernels' padded layout, and `scan`, which pads the layer's arrays and calls the
per-step kernels (`fused_step.py`: 'pallas', or plain JAX 'xla') or the persistent one
(`persistent.py`). The batch is padded to a power of two (rows with mask 0) and H to a
multiple of `block_h` (units with zero weights), as Triton's lowering needs.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from bn_rnn_jax import fused_step
from bn_rnn_jax import normalization

Array = jax.Array

KERNELS = ('pallas', 'xla', 'persistent')
GATES = fused_step.GATES
#: Elements per `[batch, block_h]` block that the default `block_h` aims at.
_BLOCK_ELEMENTS = 2048


def check_fits(cell: str, norms: tuple, statistics: str, padded_statistics: bool,
               min_step_count: int) -> None:
  """One line for a layer the fused step does not run: it runs the BN-LSTM (cell 'lstm',
  batch norm on W_h h, W_x x and c_t) with per-step statistics of the valid rows."""
  why = (f'this layer is cell={cell!r} with (recurrent, input, cell) norms {norms}'
         if (cell, norms) != ('lstm', ('batch',) * 3)
         else f'this layer keeps statistics={statistics!r}' if statistics != 'per_step'
         else 'this layer counts padding in its moments (padded_statistics=True)'
         if padded_statistics
         else f'this layer falls back on population rows (min_step_count={min_step_count})'
         if min_step_count > 1 else None)
  if why:
    raise ValueError('Execution(fused_step=...) runs the BN-LSTM only (batch norm on all '
                     "three sites, statistics='per_step', counting valid rows); " + why +
                     ": use fused_step='none'.")


def _pow2(n: int, up: bool) -> int:
  n = max(int(n), 1)
  return 1 << ((n - 1).bit_length() if up else n.bit_length() - 1)


def layout(batch: int, hidden: int, kernel: str = 'pallas',
           block_h: Optional[int] = None) -> fused_step.Layout:
  """'pallas': the batch padded to a power of two; `block_h` (a power of two; default the
  largest with at most 2048 elements per `[batch, block_h]` block, at most H rounded up)
  units per program. 'persistent': the batch padded to a power of two of at least 16,
  H to a multiple of `block_h` (default `persistent.default_block`), at most
  `persistent.MAX_HIDDEN`. 'xla': no padding, one block."""
  if kernel not in KERNELS:
    raise ValueError(f'kernel must be one of {KERNELS}; got {kernel!r}.')
  if kernel == 'xla':
    return fused_step.Layout(batch, hidden, hidden)
  rows = _pow2(batch, up=True)
  if kernel == 'persistent':
    from bn_rnn_jax import persistent  # pylint: disable=g-import-not-at-top
    rows = max(rows, persistent.MIN_TILE)
    block_h = block_h or persistent.default_block(rows, _pow2(hidden, up=True))
  elif block_h is None:
    block_h = min(_pow2(hidden, up=True), _pow2(_BLOCK_ELEMENTS // rows, up=False))
  if block_h < 1 or block_h & (block_h - 1):
    raise ValueError(f'block_h must be a positive power of two; got {block_h}.')
  lay = fused_step.Layout(rows, -(-hidden // block_h) * block_h, block_h)
  if kernel == 'persistent' and lay.hidden > persistent.MAX_HIDDEN:
    raise ValueError(f"Execution(fused_step='persistent') holds H <= {persistent.MAX_HIDDEN} "
                     f"in one program; H={hidden} pads to {lay.hidden}: use "
                     "fused_step='pallas'.")
  return lay


def _pad_to(a: Array, shape, value=0.0) -> Array:
  return jnp.pad(a, [(0, n - m) for m, n in zip(a.shape, shape)], constant_values=value)


def scan(params: dict[str, Array], carry: tuple[Array, Array], input_term: Array,
         mask: Optional[Array] = None, population: Optional[dict] = None, *,
         epsilon: float = normalization.DEFAULT_EPSILON, kernel: str = 'pallas',
         interpret: bool = False, block_h: Optional[int] = None, num_warps: int = 8,
         compute_dtype=None, axis_name: Optional[str] = None):
  """The BN-LSTM recurrence over time by `kernel` ('pallas', 'xla' or 'persistent'),
  differentiable (`jax.custom_vjp`) in `params`, `carry` and `input_term`.

  `params`: the layer's (`recurrent_kernel`, `recurrent_scale`, `bias`, `cell_scale`,
  `cell_bias` are read); `carry` `(c, h)` `[B, H]`; `input_term` `[T, B, 4H]`, the
  normalised `gamma_x * BN(W_x x_t)`; `mask` `[T, B(, 1)]`; `population` None (batch
  statistics) or `{'recurrent': (mean, var) [T, 4H], 'cell': (mean, var) [T, H]}`.
  Returns `(final carry, h [T, B, H], moments)`, moments `{'recurrent': (mean, var),
  'cell': (mean, var)}` over the valid rows (`{}` with `population`)."""
  c0, h0 = carry
  batch, hidden = h0.shape
  steps_ = input_term.shape[0]
  if population is not None:
    axis_name = None  # population rows: no moments to share
  elif kernel != 'xla' and axis_name is not None:
    if lax.axis_size(axis_name) != 1:
      raise ValueError(f'Execution(fused_step={kernel!r}) computes its moments on one device; '
                       f'axis {axis_name!r} holds {lax.axis_size(axis_name)}: use '
                       "fused_step='xla'.")
    axis_name = None
  lay = layout(batch, hidden, kernel, block_h)
  dtype = jnp.promote_types(jnp.result_type(c0, h0, params['recurrent_kernel']), jnp.float32)
  mask = (jnp.ones((steps_, batch), dtype) if mask is None
          else mask.reshape(steps_, batch).astype(dtype))
  rows, units = lay.batch, lay.hidden
  gates = lambda a, lead, fill=0.0: _pad_to(
      a.astype(dtype).reshape(lead + (GATES, hidden)), lead + (GATES, units), fill)
  w = gates(params['recurrent_kernel'], (hidden,)).reshape(hidden, GATES * units)
  vec = {'gamma_h': gates(params['recurrent_scale'], ()), 'bias': gates(params['bias'], ()),
         'gamma_c': _pad_to(params['cell_scale'].astype(dtype), (units,)),
         'beta_c': _pad_to(params['cell_bias'].astype(dtype), (units,))}
  pop = None
  if population is not None:
    (mean_h, var_h), (mean_c, var_c) = lax.stop_gradient(
        (population['recurrent'], population['cell']))
    pop = {'mean_h': gates(mean_h, (steps_,)), 'var_h': gates(var_h, (steps_,), 1.0),
           'mean_c': _pad_to(mean_c.astype(dtype), (steps_, units)),
           'var_c': _pad_to(var_c.astype(dtype), (steps_, units), 1.0)}
  static = fused_step.Static(lay, float(epsilon), kernel, bool(interpret),
                             population is not None,
                             None if compute_dtype is None else jnp.dtype(compute_dtype),
                             num_warps, axis_name)
  if kernel == 'persistent':
    from bn_rnn_jax import persistent  # pylint: disable=g-import-not-at-top
    recurrence = persistent.scan
  else:
    recurrence = fused_step.scan
  (c, h), out, moments = recurrence(
      static, _pad_to(w, (units, GATES * units)), vec,
      tuple(_pad_to(a.astype(dtype), (rows, units)) for a in (c0, h0)),
      _pad_to(gates(input_term, (steps_, batch)), (steps_, rows, GATES, units)),
      _pad_to(mask, (steps_, rows)), pop)
  final, out = (c[:batch, :hidden], h[:batch, :hidden]), out[:, :batch, :hidden]
  if population is not None:
    return final, out, {}
  per_gate = lambda a: a[:, :, :hidden].reshape(steps_, GATES * hidden)
  return final, out, {'recurrent': (per_gate(moments['mean_h']), per_gate(moments['var_h'])),
                      'cell': (moments['mean_c'][:, :hidden], moments['var_c'][:, :hidden])}
