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


def _forward_kernel(static, save: bool, names, *refs):
  r = dict(zip(names, refs))
  blocks, length = _blocks(static), r['u'].shape[0]
  math = functools.partial(fused_step.forward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)

  def step(t, carry):
    cs, hs = carry
    mask = r['mask'][t, :][:, None]
    new_c, new_h = [], []
    for i, blk in enumerate(blocks):
      z = tuple(sum(_dot(hs[j], r['w'][bj, g, blk], static.compute_dtype)
                    for j, bj in enumerate(blocks)) for g in range(GATES))
      o = math({**_vec(r, blk, static.population, t), 'z': z, 'mask': mask,
                'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                'c_prev': cs[i], 'h_prev': hs[i]})
      r['out'][t, :, blk] = o['out']
      if not static.population:
        for g in range(GATES):
          r['mean_h'][t, g, blk] = o['mean_h'][g]
          r['var_h'][t, g, blk] = o['var_h'][g]
        r['mean_c'][t, blk], r['var_c'][t, blk] = o['mean_c'], o['var_c']
      if save:
        for g in range(GATES):
          r['z'][t, :, g, blk] = z[g]
        r['c_prev'][t, :, blk], r['h_prev'][t, :, blk] = cs[i], hs[i]
      new_c.append(o['c_new'])
      new_h.append(o['h_new'])
    return tuple(new_c), tuple(new_h)

  start = tuple(tuple(r[k][:, blk] for blk in blocks) for k in ('c0', 'h0'))
  cs, hs = lax.fori_loop(0, length, step, start)
  for i, blk in enumerate(blocks):
    r['c_final'][:, blk], r['h_final'][:, blk] = cs[i], hs[i]


def _backward_kernel(static, names, *refs):
  r = dict(zip(names, refs))
  blocks, length = _blocks(static), r['u'].shape[0]
  math = functools.partial(fused_step.backward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)

  def step(k, carry):
    dcs, dhs = carry
    t = length - 1 - k
    mask = r['mask'][t, :][:, None]
    new_dc, new_dh = [], [jnp.zeros_like(dh) for dh in dhs]
    for i, blk in enumerate(blocks):
      gr = math({**_vec(r, blk, static.population, t), 'mask': mask,
                 'z': tuple(r['z'][t, :, g, blk] for g in range(GATES)),
                 'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                 'c_prev': r['c_prev'][t, :, blk], 'dc': dcs[i], 'dh': dhs[i],
                 'd_out': r['d_out'][t, :, blk]})
      for g in range(GATES):
        r['dz'][t, :, g, blk], r['d_u'][t, :, g, blk] = gr['dz'][g], gr['d_pre'][g]
        r['d_gamma_h'][t, g, blk], r['d_bias'][t, g, blk] = gr['d_gamma_h'][g], gr['d_bias'][g]
        # dh_{t-1} += dZ W_h^T, block by block, so that no block's dZ outlives it.
        for j, bj in enumerate(blocks):
          new_dh[j] = new_dh[j] + _dot(gr['dz'][g], r['w'][bj, g, blk], static.compute_dtype,
                                       transpose_b=True)
      r['d_gamma_c'][t, blk], r['d_beta_c'][t, blk] = gr['d_gamma_c'], gr['d_beta_c']
      new_dc.append(gr['dc_prev'])
      new_dh[i] = new_dh[i] + gr['dh_keep']
    return tuple(new_dc), tuple(new_dh)

  start = tuple(tuple(r[k][:, blk] for blk in blocks) for k in ('dc_final', 'dh_final'))
  dcs, dhs = lax.fori_loop(0, length, step, start)
  for i, blk in enumerate(blocks):
    r['dc0'][:, blk], r['dh0'][:, blk] = dcs[i], dhs[i]


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
