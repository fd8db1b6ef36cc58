"""The BN-LSTM recurrence with the time loop inside the kernel: one Pallas program runs all
T steps of a pass (`Execution(fused_step='persistent')`), forward and backward.

Per-step batch statistics couple every row of the batch, and the recurrence couples every
hidden unit, so one program covers both: the whole padded batch and all H units, in unit
blocks of `block_h` (`nb = H / block_h` of them). A step forms each block's four gate
pre-activations from the previous state,

    Z[:, g, i] = sum_j h_j W_h[j, g, i]          nb * nb * 4 small products per step,

then runs `fused_step`'s step math on that block (the batch moments, gates, cell, its
batch norm and the masks: the same functions as the per-step kernels). The blocks run
one after another in a loop, so one block's `[B, block_h]` tiles are live at a time; the
state goes through memory (a few KB, in the multiprocessor's cache), with a barrier
between a step's writes and the next step's reads. The backward program runs the steps
in reverse, in two phases per step: each block's step gradients, then, once every
block's `dZ_t` is written, `dh_{t-1} = dh_keep + dZ W_h^T` block by block. `dW_h = sum_t
h_{t-1}^T dZ_t` is one product after it (XLA).

In the interpreter (CPU tests) the program runs in order and the barriers are not
needed. The price of one program is one streaming multiprocessor doing all the
arithmetic: `MAX_HIDDEN` bounds H. docs/speed.md gives the arithmetic behind the choice.
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
#: The largest padded H one program computes (`4 B H^2` multiply-adds per step each way,
#: all on one streaming multiprocessor).
MAX_HIDDEN = 256
#: The smallest tile side Triton's matrix products take.
MIN_TILE = 16
#: Elements of a `[B, block_h]` tile: a block's step math holds a few dozen tiles in
#: registers, and more than this per tile spills them.
TILE_ELEMENTS = 1024


def default_block(rows: int, hidden: int) -> int:
  """`block_h` for a padded batch and H: the largest power of two with `rows * block_h
  <= TILE_ELEMENTS`, between `MIN_TILE` and `hidden`."""
  block = MIN_TILE
  while block * 2 <= hidden and rows * block * 2 <= TILE_ELEMENTS:
    block *= 2
  return block


def _dot(a, b, compute_dtype, transpose_b=False):
  """`a @ b` (or `a @ b^T`) in `compute_dtype`, accumulated in float32."""
  dtype = a.dtype if compute_dtype is None else compute_dtype
  contract = ((1,), (1,)) if transpose_b else ((1,), (0,))
  return lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())),
                         preferred_element_type=jnp.float32)


def _block(static, i):
  """Unit block `i` (an int, or traced) of a state, as a slice of its columns."""
  bh = static.layout.block_h
  return pl.ds(i * bh if isinstance(i, int) else pl.multiple_of(i * bh, bh), bh)


def _barrier(static):
  """Every thread's writes of a phase visible to every thread before the next phase
  reads them (`__syncthreads`); the interpreter runs the program in order."""
  if not static.interpret:
    pltriton.debug_barrier()


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


def _over_blocks(static, body):
  """`body(blk)` for each unit block's columns, as a loop (one block's tiles live at a
  time)."""
  def run(i, _):
    body(_block(static, i))
    return 0
  lax.fori_loop(0, static.layout.blocks, run, 0)


def _forward_kernel(static, save: bool, names, *refs):
  r = dict(zip(names, refs))
  length, tile = r['u'].shape[0], (static.layout.batch, static.layout.block_h)
  math = functools.partial(fused_step.forward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)
  # (c, h)_{t-1} in slot t of `state`: with `save` every step keeps its own (the backward
  # pass reads them), otherwise two slots alternate.
  slot = (lambda t: t) if save else (lambda t: lax.rem(t, 2))

  def start(blk):
    r['c_state'][0, :, blk], r['h_state'][0, :, blk] = r['c0'][:, blk], r['h0'][:, blk]

  _over_blocks(static, start)
  _barrier(static)

  def step(t, _):
    read, write = slot(t), slot(t + 1)
    mask = r['mask'][t, :][:, None]

    def block(blk):
      # Z[:, g, blk] = sum_j h_{t-1}[:, bj] W_h[bj, g, blk], unrolled over j so that
      # every tile's load is in flight at once.
      z = [jnp.zeros(tile, jnp.float32)] * GATES
      for j in range(static.layout.blocks):
        bj = _block(static, j)
        h_j = r['h_state'][read, :, bj]
        z = [z[g] + _dot(h_j, r['w'][bj, g, blk], static.compute_dtype) for g in range(GATES)]
      z = tuple(a.astype(r['u'].dtype) for a in z)
      o = math({**_vec(r, blk, static.population, t), 'z': z, 'mask': mask,
                'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                'c_prev': r['c_state'][read, :, blk], 'h_prev': r['h_state'][read, :, blk]})
      r['out'][t, :, blk] = o['out']
      r['c_state'][write, :, blk], r['h_state'][write, :, blk] = o['c_new'], o['h_new']
      if not static.population:
        for g in range(GATES):
          r['mean_h'][t, g, blk], r['var_h'][t, g, blk] = o['mean_h'][g], o['var_h'][g]
        r['mean_c'][t, blk], r['var_c'][t, blk] = o['mean_c'], o['var_c']
      if save:
        for g in range(GATES):
          r['z'][t, :, g, blk] = z[g]

    _over_blocks(static, block)
    _barrier(static)
    return 0

  lax.fori_loop(0, length, step, 0)


def _backward_kernel(static, names, *refs):
  r = dict(zip(names, refs))
  length = r['u'].shape[0]
  math = functools.partial(fused_step.backward_math, epsilon=static.epsilon,
                           population=static.population, axis_name=None)
  # The cotangents of step t's (c, h)_{t-1} in slot (T - t) % 2 (the final state's in 0).
  def start(blk):
    r['dc_state'][0, :, blk] = r['dc_final'][:, blk]
    r['dh_state'][0, :, blk] = r['dh_final'][:, blk]

  _over_blocks(static, start)
  _barrier(static)

  def step(k, _):
    t, read, write = length - 1 - k, lax.rem(k, 2), lax.rem(k + 1, 2)
    mask = r['mask'][t, :][:, None]

    def pointwise(blk):
      gr = math({**_vec(r, blk, static.population, t), 'mask': mask,
                 'z': tuple(r['z'][t, :, g, blk] for g in range(GATES)),
                 'u': tuple(r['u'][t, :, g, blk] for g in range(GATES)),
                 'c_prev': r['c_prev'][t, :, blk], 'dc': r['dc_state'][read, :, blk],
                 'dh': r['dh_state'][read, :, blk], 'd_out': r['d_out'][t, :, blk]})
      for g in range(GATES):
        r['dz'][t, :, g, blk], r['d_u'][t, :, g, blk] = gr['dz'][g], gr['d_pre'][g]
        r['d_gamma_h'][t, g, blk], r['d_bias'][t, g, blk] = gr['d_gamma_h'][g], gr['d_bias'][g]
      r['d_gamma_c'][t, blk], r['d_beta_c'][t, blk] = gr['d_gamma_c'], gr['d_beta_c']
      r['dc_state'][write, :, blk], r['dh_state'][write, :, blk] = gr['dc_prev'], gr['dh_keep']

    def through_w(bj):  # dh_{t-1}[:, bj] += sum_{i, g} dZ[:, g, bi] W_h[bj, g, bi]^T
      dh = r['dh_state'][write, :, bj].astype(jnp.float32)
      for i in range(static.layout.blocks):   # unrolled, as the forward products
        bi = _block(static, i)
        dh = dh + sum(_dot(r['dz'][t, :, g, bi], r['w'][bj, g, bi], static.compute_dtype,
                           transpose_b=True) for g in range(GATES))
      r['dh_state'][write, :, bj] = dh.astype(r['dh_state'].dtype)

    _over_blocks(static, pointwise)
    _barrier(static)   # every block's dZ_t written before any block multiplies it
    _over_blocks(static, through_w)
    _barrier(static)
    return 0

  lax.fori_loop(0, length, step, 0)


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
  slots, per_gate, per_unit = length + 1 if save else 2, (length, GATES, units), (length, units)
  outputs = {'out': (length, rows, units), 'c_state': (slots, rows, units),
             'h_state': (slots, rows, units)}
  if pop is None:
    outputs.update(mean_h=per_gate, var_h=per_gate, mean_c=per_unit, var_c=per_unit)
  if save:
    outputs.update(z=(length, rows, GATES, units))
  o = _call(static, functools.partial(_forward_kernel, static, save), inputs, outputs,
            'bn_lstm_persistent_forward')
  final = length if save else length % 2
  moments = {k: o[k] for k in ('mean_h', 'var_h', 'mean_c', 'var_c') if k in o}
  saved = ({'z': o['z'], 'c_prev': o['c_state'][:length], 'h_prev': o['h_state'][:length]}
           if save else None)
  return ((o['c_state'][final], o['h_state'][final]), o['out'], moments), saved


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
  outputs = {'dz': u.shape, 'd_u': u.shape, 'dc_state': (2,) + state,
             'dh_state': (2,) + state,
             'd_gamma_h': (length, GATES, units), 'd_bias': (length, GATES, units),
             'd_gamma_c': (length, units), 'd_beta_c': (length, units)}
  o = _call(static, functools.partial(_backward_kernel, static), inputs, outputs,
            'bn_lstm_persistent_backward')
  # dW_h = sum_t h_{t-1}^T dZ_t: one [Hp, T*Bp] x [T*Bp, 4Hp] product.
  d_w = steps.matmul(saved['h_prev'].reshape(-1, units), o['dz'].reshape(-1, GATES * units),
                     static.compute_dtype, ((0,), (0,)))
  d_vec = {k: jnp.sum(o[f'd_{k}'], axis=0) for k in vec}
  first = length % 2   # the slot of the initial state's cotangents
  return (d_w.astype(w.dtype), d_vec, (o['dc_state'][first], o['dh_state'][first]),
          o['d_u'].astype(u.dtype), jnp.zeros_like(mask), jax.tree.map(jnp.zeros_like, pop))


scan.defvjp(_scan_fwd, _scan_bwd)
