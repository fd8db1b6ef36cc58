"""The BN-LSTM recurrence with the time loop inside the kernel: one Pallas program runs all
T steps of a pass (`Execution(fused_step='persistent')`), forward and backward.

Per-step batch statistics couple every row of the batch, and the recurrence couples every
hidden unit, so one program holds both: the whole padded batch and all H units, as
`[B, block_h]` tiles (`nb = H / block_h` of them per state). A step forms each unit
block's four gate pre-activations from the previous state's tiles,

    Z[:, g, i] = sum_j h_j W_h[j, g, i]          nb * nb * 4 small products per step,

then runs `fused_step`'s step math on that block (the batch moments, gates, cell, its
batch norm and the masks: the same functions as the per-step kernels). The state stays
in the loop's carry (registers); W_h is read from memory (L2) at every step. The
backward pass is a second program running the steps in reverse, carrying the state's
cotangents and the pointwise parameters' gradient sums, with `dh_{t-1} = dh_keep + dZ
W_h^T` inside; `dW_h = sum_t h_{t-1}^T dZ_t` is one product after it (XLA).

No program talks to another, so no barrier is needed, and the program is the same on the
interpreter (CPU tests) and a GPU. The price is one streaming multiprocessor doing all
the arithmetic: `MAX_HIDDEN` bounds H. docs/speed.md gives the arithmetic behind the
choice.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bn_rnn_jax import fused_step
from bn_rnn_jax import steps

GATES = fused_step.GATES
#: The largest padded H the one program holds (its tiles, and nb^2 products per step).
MAX_HIDDEN = 256
#: The smallest tile side Triton's matrix products take.
MIN_TILE = 16


def default_block(hidden: int) -> int:
  """`block_h` for a padded H: a quarter of it, at least `MIN_TILE`."""
  return max(MIN_TILE, hidden // 4)


def _dot(a, b, compute_dtype, transpose_b=False):
  """`a @ b` (or `a @ b^T`) in `compute_dtype`, accumulated in float32."""
  dtype = a.dtype if compute_dtype is None else compute_dtype
  contract = ((1,), (1,)) if transpose_b else ((1,), (0,))
  return lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())),
                         preferred_element_type=jnp.float32).astype(a.dtype)


def _blocks(static):
  """The unit blocks of a state, as slices of its columns."""
  bh = static.layout.block_h
  return [pl.ds(i * bh, bh) for i in range(static.layout.hidden // bh)]


def _vec(r, blk, population, t=None):
  """The pointwise parameters (and population rows of step t) of one unit block."""
  v = {'gamma_h': tuple(r['gamma_h'][g, blk] for g in range(GATES)),
       'bias': tuple(r['bias'][g, blk] for g in range(GATES)),
       'gamma_c': r['gamma_c'][blk], 'beta_c': r['beta_c'][blk]}
  if population:
    v.update(mean_h=tuple(r['mean_h'][t, g, blk] for g in range(GATES)),
             var_h=tuple(r['var_h'][t, g, blk] for g in range(GATES)),
             mean_c=r['mean_c'][t, blk], var_c=r['var_c'][t, blk])
  return v


def _assemble(tiles: list) -> jax.Array:
  """`[B, block_h]` tiles side by side as one `[B, H]` state (a `where` over a `[B, nb,
  block_h]` view: Triton's lowering concatenates nothing wider)."""
  rows, width = tiles[0].shape
  which = lax.broadcasted_iota(jnp.int32, (rows, len(tiles), width), 1)
  full = jnp.zeros((rows, len(tiles), width), tiles[0].dtype)
  for i, tile in enumerate(tiles):
    full = jnp.where(which == i, jnp.broadcast_to(tile[:, None, :], full.shape), full)
  return full.reshape(rows, len(tiles) * width)


def _tile(full: jax.Array, i: int, nb: int) -> jax.Array:
  """Tile i of a `[B, H]` state (a masked sum over a `[B, nb, block_h]` view)."""
  rows, units = full.shape
  view = full.reshape(rows, nb, units // nb)
  which = lax.broadcasted_iota(jnp.int32, view.shape, 1)
  return jnp.sum(jnp.where(which == i, view, 0.0), axis=1)


def _forward_kernel(static, save: bool, names, *refs):
  r = dict(zip(names, refs))
  blocks, length = _blocks(static), r['u'].shape[0]
  math = functools.partial(fused_step.forward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)

  def step(t, carry):
    cs, h = carry                     # c as tiles (each read by its block), h [B, H] whole
    mask = r['mask'][t, :][:, None]
    if save:
      r['h_prev'][t] = h
    new_c, outs = [], []
    for i, blk in enumerate(blocks):
      z = tuple(_dot(h, r['w'][:, g, blk], static.compute_dtype) for g in range(GATES))
      o = math({**_vec(r, blk, static.population, t), 'z': z, 'mask': mask,
                'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                'c_prev': cs[i], 'h_prev': jnp.zeros_like(cs[i])})
      r['out'][t, :, blk] = o['out']
      if not static.population:
        for g in range(GATES):
          r['mean_h'][t, g, blk] = o['mean_h'][g]
          r['var_h'][t, g, blk] = o['var_h'][g]
        r['mean_c'][t, blk], r['var_c'][t, blk] = o['mean_c'], o['var_c']
      if save:
        for g in range(GATES):
          r['z'][t, :, g, blk] = z[g]
        r['c_prev'][t, :, blk] = cs[i]
      new_c.append(o['c_new'])
      outs.append(o['out'])
    return tuple(new_c), jnp.where(mask > 0, _assemble(outs), h)   # padded rows keep h

  start = (tuple(r['c0'][:, blk] for blk in blocks), r['h0'][...])
  cs, h = lax.fori_loop(0, length, step, start)
  for i, blk in enumerate(blocks):
    r['c_final'][:, blk] = cs[i]
  r['h_final'][...] = h


def _backward_kernel(static, names, *refs):
  r = dict(zip(names, refs))
  blocks, length = _blocks(static), r['u'].shape[0]
  math = functools.partial(fused_step.backward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)

  def step(k, carry):
    dcs, dh = carry                   # dc as tiles, dh [B, H] whole
    t = length - 1 - k
    mask = r['mask'][t, :][:, None]
    new_dc, new_dh = [], jnp.where(mask > 0, 0.0, dh)   # padded rows pass dh through
    for i, blk in enumerate(blocks):
      gr = math({**_vec(r, blk, static.population, t), 'mask': mask,
                 'z': tuple(r['z'][t, :, g, blk] for g in range(GATES)),
                 'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                 'c_prev': r['c_prev'][t, :, blk], 'dc': dcs[i],
                 'dh': _tile(dh, i, len(blocks)), 'd_out': r['d_out'][t, :, blk]})
      for g in range(GATES):
        r['dz'][t, :, g, blk], r['d_u'][t, :, g, blk] = gr['dz'][g], gr['d_pre'][g]
        r['d_gamma_h'][t, g, blk], r['d_bias'][t, g, blk] = gr['d_gamma_h'][g], gr['d_bias'][g]
        # dh_{t-1} += dZ W_h^T, gate by gate: no dZ outlives its own products.
        new_dh = new_dh + _dot(gr['dz'][g], r['w'][:, g, blk], static.compute_dtype,
                               transpose_b=True)
      r['d_gamma_c'][t, blk], r['d_beta_c'][t, blk] = gr['d_gamma_c'], gr['d_beta_c']
      new_dc.append(gr['dc_prev'])
    return tuple(new_dc), new_dh

  start = (tuple(r['dc_final'][:, blk] for blk in blocks), r['dh_final'][...])
  dcs, dh = lax.fori_loop(0, length, step, start)
  for i, blk in enumerate(blocks):
    r['dc0'][:, blk] = dcs[i]
  r['dh0'][...] = dh


def _call(static, kernel, inputs: dict, outputs: dict, name: str):
  """One `pallas_call` of `kernel` over named inputs, with named outputs `{name: shape}`."""
  names = tuple(inputs) + tuple(outputs)
  dtype = inputs['mask'].dtype
  results = pl.pallas_call(
      functools.partial(kernel, names), grid=(1,),
      out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape in outputs.values()],
      interpret=static.interpret, name=name,
      compiler_params=pltriton.CompilerParams(num_warps=static.num_warps, num_stages=1),
  )(*inputs.values())
  return dict(zip(outputs, results))


def _forward(static, w, vec, carry, u, mask, pop, save: bool):
  length, rows, _, units = u.shape
  inputs = {'u': u, 'mask': mask, 'w': w.reshape(units, GATES, units), **vec,
            'c0': carry[0], 'h0': carry[1], **(pop or {})}
  state, gates, per_gate, per_unit = ((rows, units), (length, rows, GATES, units),
                                      (length, GATES, units), (length, units))
  outputs = {'out': (length, rows, units), 'c_final': state, 'h_final': state}
  if pop is None:
    outputs.update(mean_h=per_gate, var_h=per_gate, mean_c=per_unit, var_c=per_unit)
  if save:
    outputs.update(z=gates, c_prev=(length,) + state, h_prev=(length,) + state)
  o = _call(static, functools.partial(_forward_kernel, static, save), inputs, outputs,
            'bn_lstm_persistent_forward')
  moments = {k: o[k] for k in ('mean_h', 'var_h', 'mean_c', 'var_c') if k in o}
  saved = {k: o[k] for k in ('z', 'c_prev', 'h_prev')} if save else None
  return ((o['c_final'], o['h_final']), o['out'], moments), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def scan(static, w, vec, carry, u, mask, pop):
  """`fused_step.scan`'s contract (padded arrays in, `(final carry, out, moments)` out),
  with the time loop inside one forward and one backward kernel."""
  return _forward(static, w, vec, carry, u, mask, pop, save=False)[0]


def _scan_fwd(static, w, vec, carry, u, mask, pop):
  result, saved = _forward(static, w, vec, carry, u, mask, pop, save=True)
  return result, (w, vec, u, mask, pop, saved)


def _scan_bwd(static, residuals, cotangents):
  w, vec, u, mask, pop, saved = residuals
  (dc_final, dh_final), d_out, _ = cotangents
  _, rows, _, units = u.shape
  inputs = {'u': u, 'mask': mask, 'w': w.reshape(units, GATES, units), **vec,
            **(pop or {}), 'z': saved['z'], 'c_prev': saved['c_prev'], 'd_out': d_out,
            'dc_final': dc_final, 'dh_final': dh_final}
  length, state = u.shape[0], (rows, units)
  # The pointwise parameters' gradients per step, summed after the kernel (no carry).
  outputs = {'dz': u.shape, 'd_u': u.shape, 'dc0': state, 'dh0': state,
             'd_gamma_h': (length, GATES, units), 'd_bias': (length, GATES, units),
             'd_gamma_c': (length, units), 'd_beta_c': (length, units)}
  o = _call(static, functools.partial(_backward_kernel, static), inputs, outputs,
            'bn_lstm_persistent_backward')
  # dW_h = sum_t h_{t-1}^T dZ_t: one [Hp, T*Bp] x [T*Bp, 4Hp] product.
  d_w = steps.matmul(saved['h_prev'].reshape(-1, units), o['dz'].reshape(-1, GATES * units),
                     static.compute_dtype, ((0,), (0,)))
  d_vec = {k: jnp.sum(o[f'd_{k}'], axis=0) for k in vec}
  return (d_w.astype(w.dtype), d_vec, (o['dc0'], o['dh0']), o['d_u'].astype(u.dtype),
          jnp.zeros_like(mask), jax.tree.map(jnp.zeros_like, pop))


scan.defvjp(_scan_fwd, _scan_bwd)
