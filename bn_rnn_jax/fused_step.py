"""A fused BN-LSTM time step (Pallas kernels) and its scan over time, with a
whole-sequence backward pass.

One step of the BN-LSTM (Cooijmans et al. eq. 14-16), given the recurrent product
`Z = h_{t-1} W_h [B, 4H]` and the input term `U [B, 4H]` (`W_x x_t`, already batch
normalised with its gamma, as the layer's hoisted path computes it for all steps):

    gates = gamma_h * BN(Z) + U + b                      gate order (f, i, o, g)
    c     = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h     = sigmoid(o) * tanh(gamma_c * BN(c) + beta_c)

BN uses the mean and biased variance of the valid rows (mask 1) of the step, divided by
their count (at least 1), or the step's population rows in inference. A padded row keeps
its state `(c_{t-1}, h_{t-1})`, outputs 0 and counts in no statistic: the equations of
`steps.lstm_step` with a hoisted input term.

What runs where:
  * `h_{t-1} W_h` (forward) and `dZ W_h^T` (backward) are XLA matmuls between the
    kernels, once per step; `dW_h = sum_t H_{t-1}^T dZ_t` is one product over all
    `T * B` rows after the reverse scan (as `layer_vjp`).
  * one kernel call per step forward (BN of Z, gates, c, BN of c, h, the masks, the step's
    moments) and one backward (the pointwise backward pass, batch norm's included, and the
    column sums of the pointwise parameters' gradients). The backward kernel recomputes
    the step's pointwise forward from what the forward scan stores: `Z`, `c_{t-1}`,
    `h_{t-1}` per step (`U` and the mask are inputs already).

Tiling: the hidden units are split into blocks of `block_h`; one program holds the whole
(padded) batch and the four gate columns of its units, so every per-feature mean and
variance, and every column sum of the backward pass, stays inside one program. Programs
share nothing within a step; only `h_t` (through the matmul) links steps. For GPU
lowerings that need power-of-two blocks (Triton), the batch is padded to a power of two
(padded rows carry mask 0, so they change no statistic) and H to a multiple of `block_h`,
a power of two (padded units have zero weights, gammas and biases, and stay 0).

`kernel='xla'` runs the same step functions as plain JAX on whole arrays (no Pallas, no
padding) under the same scan and backward pass: the pure-JAX fused path, for backends
without a Pallas lowering. `interpret=True` runs the Pallas kernels with Pallas's
interpreter (CPU tests). `_pallas_step` is the one place that knows the Pallas lowering
(Triton compiler parameters, block specs); the step math (`_forward_math`,
`_backward_math`) works on loaded values only.

GPU lowerings: the kernels name Triton's compiler parameters, so they lower through
Pallas's Triton path (a `jax.jit(...).lower(lowering_platforms=('cuda',))` works without
a GPU). The Triton lowering refuses arrays whose sizes are not powers of two, hence the
padding. Pallas's default GPU lowering, Mosaic GPU, does not take these kernels as they
are: it stages every block in shared memory through TMA copies, which need global strides
of multiples of 16 bytes and copies of multiples of 128 bytes, and loads a 1-D block only
when it holds a multiple of 128 elements; with `block_h >= 128` and the whole batch of 64
rows in a program, the forward step's blocks alone exceed the 227 KiB of shared memory.
A Mosaic GPU step needs a block layout of its own, behind `_pallas_step`.

Not covered (the layer keeps its other paths for these): cross-device batch moments
(`axis_name`, which need a psum between the moments and their use inside a step),
`padded_statistics`, `min_step_count > 1`, layer norm, and the tanh RNN.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax import lax

from bn_rnn_jax import normalization

Array = jax.Array

GATES = 4
KERNELS = ('pallas', 'xla')
#: Elements per gate column block (batch rows times units) that the default `block_h`
#: aims at: small enough for one GPU program's registers.
_BLOCK_ELEMENTS = 2048


# ----------------------------------------------------------------------------- layout


def _next_pow2(n: int) -> int:
  return 1 << max(int(n) - 1, 0).bit_length()


def _prev_pow2(n: int) -> int:
  return 1 << (max(int(n), 1).bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Padded sizes of the kernels' arrays: `batch` rows (B or more), `hidden` units (H or
  more, a multiple of `block_h`), `block_h` units per program."""
  batch: int
  hidden: int
  block_h: int

  @property
  def grid(self) -> int:
    return self.hidden // self.block_h


def layout(batch: int, hidden: int, kernel: str = 'pallas',
           block_h: Optional[int] = None) -> Layout:
  """The padded sizes a fused scan of `[batch, hidden]` states runs at.

  'pallas': the batch padded to a power of two; `block_h` (a power of two; default the
  largest with at most 2048 elements per `[batch, block_h]` block, capped at H rounded up
  to a power of two) units per program, H padded to a multiple of it. 'xla': no padding,
  one block.
  """
  if kernel not in KERNELS:
    raise ValueError(f'kernel must be one of {KERNELS}; got {kernel!r}.')
  if kernel == 'xla':
    return Layout(batch, hidden, hidden)
  rows = _next_pow2(batch)
  if block_h is None:
    block_h = min(_next_pow2(hidden), _prev_pow2(max(1, _BLOCK_ELEMENTS // rows)))
  if block_h < 1 or block_h & (block_h - 1):
    raise ValueError(f'block_h must be a positive power of two; got {block_h}.')
  return Layout(rows, -(-hidden // block_h) * block_h, block_h)


def _pad_to(a: Array, shape, value=0.0) -> Array:
  return jnp.pad(a, [(0, n - m) for m, n in zip(a.shape, shape)], constant_values=value)


def _gate_view(a: Array, hidden: int) -> Array:
  """`[..., 4H]` -> `[..., 4, H]` (gate-blocked columns, order f, i, o, g)."""
  return a.reshape(a.shape[:-1] + (GATES, hidden))


# ----------------------------------------------------------------------------- step math
# Values, not arrays in memory: `gates`-kind inputs are 4-tuples of `[B, F]` (one per
# gate), `gate_vec`-kind ones 4-tuples of `[F]`; `state` `[B, F]`, `vec` `[F]`,
# `mask` `[B, 1]`. F is the block's units (H under `kernel='xla'`).


def _sum_rows(x: Array) -> Array:
  return jnp.sum(x, axis=0)


def _moments(x: Array, valid: Array, count: Array):
  """Mean and biased variance of the valid rows of `x [B, F]` (two passes)."""
  mean = _sum_rows(jnp.where(valid, x, 0.0)) / count
  centred = x - mean
  return mean, _sum_rows(jnp.where(valid, centred * centred, 0.0)) / count


def _forward_parts(v: dict, epsilon: float, population: bool) -> dict:
  """The step's pointwise forward pass and the intermediates its backward pass reads."""
  valid = v['mask'] > 0
  count = jnp.maximum(jnp.sum(v['mask']), 1.0)
  p = {'valid': valid, 'count': count, 'z_hat': [], 'inv_h': [], 'mean_h': [], 'var_h': []}
  pre = []
  for g in range(GATES):
    if population:
      mean, var = v['mean_h'][g], v['var_h'][g]
    else:
      mean, var = _moments(v['z'][g], valid, count)
    inv = lax.rsqrt(var + epsilon)
    z_hat = (v['z'][g] - mean) * inv
    pre.append(z_hat * v['gamma_h'][g] + v['u'][g] + v['bias'][g])
    for key, value in (('z_hat', z_hat), ('inv_h', inv), ('mean_h', mean), ('var_h', var)):
      p[key].append(value)
  p['sf'], p['si'], p['so'] = (jax.nn.sigmoid(a) for a in pre[:3])
  p['tg'] = jnp.tanh(pre[3])
  c = p['sf'] * v['c_prev'] + p['si'] * p['tg']
  if population:
    p['mean_c'], p['var_c'] = v['mean_c'], v['var_c']
  else:
    p['mean_c'], p['var_c'] = _moments(c, valid, count)
  p['inv_c'] = lax.rsqrt(p['var_c'] + epsilon)
  p['c_hat'] = (c - p['mean_c']) * p['inv_c']
  p['tanh_c'] = jnp.tanh(p['c_hat'] * v['gamma_c'] + v['beta_c'])
  p['c'] = c
  p['h'] = p['so'] * p['tanh_c']
  return p


def _forward_math(v: dict, *, epsilon: float, population: bool) -> dict:
  """One step forward: the new carry, the output (0 on padded rows) and, with batch
  statistics, the step's moments of Z (per gate) and of c."""
  p = _forward_parts(v, epsilon, population)
  valid = p['valid']
  out = {'c_new': jnp.where(valid, p['c'], v['c_prev']),
         'h_new': jnp.where(valid, p['h'], v['h_prev']),
         'out': jnp.where(valid, p['h'], 0.0)}
  if not population:
    out.update(mean_h=tuple(p['mean_h']), var_h=tuple(p['var_h']), mean_c=p['mean_c'],
               var_c=p['var_c'])
  return out


def _bn_backward(d_hat: Array, x_hat: Array, inv: Array, valid: Array, count,
                 population: bool) -> Array:
  """`dx` of `x_hat = (x - mean) * inv` given `d_hat = dL/dx_hat` (0 on padded rows):
  batch moments (their own gradients through mean and var, over the valid rows) or
  fixed population rows. The moments themselves get no cotangent."""
  if population:
    return d_hat * inv
  mean_d = _sum_rows(d_hat) / count
  mean_dx = _sum_rows(d_hat * x_hat) / count
  return inv * (d_hat - jnp.where(valid, mean_d + x_hat * mean_dx, 0.0))


def _backward_math(v: dict, *, epsilon: float, population: bool) -> dict:
  """One step backward from the cotangents of the new carry (`dc`, `dh`) and of the
  output (`d_out`): the cotangents of Z (`dz`), of the gate pre-activations (`d_pre`,
  also that of U), of `c_{t-1}` and the part of `h_{t-1}`'s that skips the matmul
  (`dh_keep`: padded rows pass `dh` through), and the step's column sums for
  `gamma_h`, `b`, `gamma_c`, `beta_c`."""
  p = _forward_parts(v, epsilon, population)
  valid, count = p['valid'], p['count']
  dh = jnp.where(valid, v['dh'] + v['d_out'], 0.0)
  sf, si, so, tg, tanh_c = p['sf'], p['si'], p['so'], p['tg'], p['tanh_c']
  d_o = dh * tanh_c * so * (1.0 - so)
  d_c_out = dh * so * (1.0 - tanh_c * tanh_c)           # d (gamma_c c_hat + beta_c)
  d_c = jnp.where(valid, v['dc'], 0.0) + _bn_backward(
      d_c_out * v['gamma_c'], p['c_hat'], p['inv_c'], valid, count, population)
  d_pre = (d_c * v['c_prev'] * sf * (1.0 - sf),          # f
           d_c * tg * si * (1.0 - si),                   # i
           d_o,                                          # o
           d_c * si * (1.0 - tg * tg))                   # g
  dz = tuple(_bn_backward(d_pre[g] * v['gamma_h'][g], p['z_hat'][g], p['inv_h'][g], valid,
                          count, population) for g in range(GATES))
  return {
      'dz': dz, 'd_pre': d_pre,
      'dc_prev': d_c * sf + jnp.where(valid, 0.0, v['dc']),
      'dh_keep': jnp.where(valid, 0.0, v['dh']),
      'd_gamma_h': tuple(_sum_rows(d_pre[g] * p['z_hat'][g]) for g in range(GATES)),
      'd_bias': tuple(_sum_rows(d) for d in d_pre),
      'd_gamma_c': _sum_rows(d_c_out * p['c_hat']),
      'd_beta_c': _sum_rows(d_c_out),
  }


# ----------------------------------------------------------------------------- kernels
# Array kinds of the step's inputs and outputs, by name.
_KINDS = {
    'z': 'gates', 'u': 'gates', 'dz': 'gates', 'd_pre': 'gates',
    'c_prev': 'state', 'h_prev': 'state', 'c_new': 'state', 'h_new': 'state',
    'out': 'state', 'dc': 'state', 'dh': 'state', 'd_out': 'state', 'dc_prev': 'state',
    'dh_keep': 'state',
    'mask': 'mask',
    'gamma_h': 'gate_vec', 'bias': 'gate_vec', 'mean_h': 'gate_vec', 'var_h': 'gate_vec',
    'd_gamma_h': 'gate_vec', 'd_bias': 'gate_vec',
    'gamma_c': 'vec', 'beta_c': 'vec', 'mean_c': 'vec', 'var_c': 'vec',
    'd_gamma_c': 'vec', 'd_beta_c': 'vec',
}
_OUTPUTS = {
    ('forward', False): ('c_new', 'h_new', 'out', 'mean_h', 'var_h', 'mean_c', 'var_c'),
    ('forward', True): ('c_new', 'h_new', 'out'),
    ('backward', False): ('dz', 'd_pre', 'dc_prev', 'dh_keep', 'd_gamma_h', 'd_bias',
                          'd_gamma_c', 'd_beta_c'),
}
_OUTPUTS[('backward', True)] = _OUTPUTS[('backward', False)]


def _shape(kind: str, lay: Layout) -> tuple[int, ...]:
  return {'gates': (lay.batch, GATES, lay.hidden), 'state': (lay.batch, lay.hidden),
          'mask': (lay.batch,), 'gate_vec': (GATES, lay.hidden),
          'vec': (lay.hidden,)}[kind]


def _split(kind: str, a):
  """An array (or a kernel's ref) as the step math's value: per-gate tuples for the
  gate-blocked kinds."""
  if kind == 'gates':
    return tuple(a[:, g, :] for g in range(GATES))
  if kind == 'gate_vec':
    return tuple(a[g, :] for g in range(GATES))
  if kind == 'mask':
    return a[...][:, None]
  return a[...]


def _join(kind: str, value) -> Array:
  if kind == 'gates':
    return jnp.stack(value, axis=1)
  if kind == 'gate_vec':
    return jnp.stack(value, axis=0)
  return value


def _xla_step(math, inputs: dict[str, Array], outputs: tuple[str, ...]) -> dict:
  """The step math on whole arrays, as plain JAX."""
  result = math({name: _split(_KINDS[name], a) for name, a in inputs.items()})
  return {name: _join(_KINDS[name], result[name]) for name in outputs}


def _pallas_step(math, inputs: dict[str, Array], outputs: tuple[str, ...], lay: Layout,
                 dtype, interpret: bool, name: str) -> dict:
  """The step math as one `pallas_call` over a grid of `lay.grid` blocks of hidden units.

  The only function that knows the Pallas lowering: block specs (every block holds the
  whole padded batch) and the GPU compiler parameters (Triton's).
  """
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top

  rows, width = lay.batch, lay.block_h
  specs = {
      'gates': pl.BlockSpec((rows, GATES, width), lambda j: (0, 0, j)),
      'state': pl.BlockSpec((rows, width), lambda j: (0, j)),
      'mask': pl.BlockSpec((rows,), lambda j: (0,)),
      'gate_vec': pl.BlockSpec((GATES, width), lambda j: (0, j)),
      'vec': pl.BlockSpec((width,), lambda j: (j,)),
  }
  names = tuple(inputs)

  def kernel(*refs):
    values = {name: _split(_KINDS[name], ref) for name, ref in zip(names, refs)}
    result = math(values)
    for name, ref in zip(outputs, refs[len(names):]):
      value = result[name]
      if _KINDS[name] == 'gates':
        for g in range(GATES):
          ref[:, g, :] = value[g]
      elif _KINDS[name] == 'gate_vec':
        for g in range(GATES):
          ref[g, :] = value[g]
      else:
        ref[...] = value

  call = pl.pallas_call(
      kernel,
      out_shape=[jax.ShapeDtypeStruct(_shape(_KINDS[name], lay), dtype) for name in outputs],
      grid=(lay.grid,),
      in_specs=[specs[_KINDS[name]] for name in names],
      out_specs=[specs[_KINDS[name]] for name in outputs],
      interpret=interpret,
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
      name=name)
  return dict(zip(outputs, call(*(inputs[name] for name in names))))


@dataclasses.dataclass(frozen=True)
class _Static:
  """The scan's static settings."""
  layout: Layout
  epsilon: float
  kernel: str
  interpret: bool
  population: bool
  compute_dtype: Any


def _step(static: _Static, direction: str, inputs: dict[str, Array]) -> dict:
  """The forward or backward kernel of one step (`_pallas_step` or `_xla_step`)."""
  math = functools.partial(_forward_math if direction == 'forward' else _backward_math,
                           epsilon=static.epsilon, population=static.population)
  outputs = _OUTPUTS[(direction, static.population)]
  if static.kernel == 'xla':
    return _xla_step(math, inputs, outputs)
  return _pallas_step(math, inputs, outputs, static.layout, inputs['c_prev'].dtype,
                      static.interpret, f'bn_lstm_step_{direction}')


# ----------------------------------------------------------------------------- matmuls


def _wide(*arrays):
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def _matmul(a: Array, b: Array, compute_dtype, contract=((1,), (0,))) -> Array:
  """`a . b` over `contract` in `compute_dtype` (None: the operands' dtype, at least
  float32), accumulated and returned in at least float32."""
  wide = _wide(a, b)
  dtype = wide if compute_dtype is None else compute_dtype
  return lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())),
                         preferred_element_type=wide).astype(wide)


# ----------------------------------------------------------------------------- scan


def _pointwise_inputs(vec: dict, pop_t) -> dict:
  inputs = dict(vec)
  if pop_t is not None:
    inputs.update(pop_t)
  return inputs


def _forward_scan(static: _Static, w, vec, carry, u, mask, pop, save: bool):
  """`lax.scan` of the forward kernel; with `save`, also what the backward pass reads."""
  rows = static.layout.batch

  def body(carry, xs):
    c_prev, h_prev = carry
    u_t, m_t, pop_t = xs
    z = _matmul(h_prev, w, static.compute_dtype).astype(c_prev.dtype)
    z = z.reshape(rows, GATES, -1)
    inputs = dict(_pointwise_inputs(vec, pop_t), z=z, u=u_t, c_prev=c_prev, h_prev=h_prev,
                  mask=m_t)
    out = _step(static, 'forward', inputs)
    moments = {k: out[k] for k in ('mean_h', 'var_h', 'mean_c', 'var_c') if k in out}
    ys = {'out': out['out'], 'moments': moments}
    if save:
      ys['saved'] = {'z': z, 'c_prev': c_prev, 'h_prev': h_prev}
    return (out['c_new'], out['h_new']), ys

  final, ys = lax.scan(body, carry, (u, mask, pop))
  return (final, ys['out'], ys['moments']), ys.get('saved')


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan(static: _Static, w, vec, carry, u, mask, pop):
  """The fused scan on padded arrays: `w [Hp, 4 Hp]`, `vec` the pointwise parameters
  (`gamma_h`, `bias` `[4, Hp]`, `gamma_c`, `beta_c` `[Hp]`), `carry (c, h) [Bp, Hp]`,
  `u [T, Bp, 4, Hp]`, `mask [T, Bp]`, `pop` None or the population rows
  (`mean_h`, `var_h` `[T, 4, Hp]`, `mean_c`, `var_c` `[T, Hp]`).

  Returns `(final carry, out [T, Bp, Hp], moments)`; moments (no gradient) are
  `{'mean_h', 'var_h': [T, 4, Hp], 'mean_c', 'var_c': [T, Hp]}` ({} with `pop`)."""
  return _forward_scan(static, w, vec, carry, u, mask, pop, save=False)[0]


def _scan_fwd(static, w, vec, carry, u, mask, pop):
  result, saved = _forward_scan(static, w, vec, carry, u, mask, pop, save=True)
  return result, (w, vec, u, mask, pop, saved)


def _scan_bwd(static, residuals, cotangents):
  w, vec, u, mask, pop, saved = residuals
  (dc_final, dh_final), d_out, _ = cotangents
  rows = static.layout.batch

  def body(state, xs):
    dc, dh, d_vec = state
    saved_t, u_t, m_t, pop_t, d_out_t = xs
    inputs = dict(_pointwise_inputs(vec, pop_t), z=saved_t['z'], u=u_t,
                  c_prev=saved_t['c_prev'], mask=m_t, dc=dc, dh=dh, d_out=d_out_t)
    grads = _step(static, 'backward', inputs)
    dz = grads['dz']
    dh_prev = grads['dh_keep'] + _matmul(dz.reshape(rows, -1), w, static.compute_dtype,
                                         ((1,), (1,))).astype(dh.dtype)
    d_vec = {'gamma_h': d_vec['gamma_h'] + grads['d_gamma_h'],
             'bias': d_vec['bias'] + grads['d_bias'],
             'gamma_c': d_vec['gamma_c'] + grads['d_gamma_c'],
             'beta_c': d_vec['beta_c'] + grads['d_beta_c']}
    return (grads['dc_prev'], dh_prev, d_vec), (dz, grads['d_pre'])

  zeros = jax.tree.map(jnp.zeros_like, vec)
  (dc0, dh0, d_vec), (dz, d_u) = lax.scan(
      body, (dc_final, dh_final, zeros), (saved, u, mask, pop, d_out), reverse=True)
  # dW_h = sum_t h_{t-1}^T dZ_t: one [Hp, T*Bp] x [T*Bp, 4Hp] product.
  steps = dz.shape[0]
  d_w = _matmul(saved['h_prev'].reshape(steps * rows, -1), dz.reshape(steps * rows, -1),
                static.compute_dtype, ((0,), (0,))).astype(w.dtype)
  return (d_w, d_vec, (dc0, dh0), d_u.astype(u.dtype), jnp.zeros_like(mask),
          jax.tree.map(jnp.zeros_like, pop))


_scan.defvjp(_scan_fwd, _scan_bwd)


def fused_bn_lstm_scan(params: dict[str, Array], carry: tuple[Array, Array],
                       input_term: Array, mask: Optional[Array] = None, *,
                       population: Optional[dict] = None,
                       epsilon: float = normalization.DEFAULT_EPSILON,
                       kernel: str = 'pallas', interpret: bool = False,
                       block_h: Optional[int] = None, compute_dtype=None):
  """The BN-LSTM recurrence over time, one fused kernel per step forward and backward.

  Differentiable (`jax.custom_vjp`) in `params`, `carry` and `input_term`; the moments
  are outputs without a gradient. Forward-mode derivatives are not defined.

  Args:
    params: the layer's parameters (`steps.py` names): `recurrent_kernel [H, 4H]`,
      `recurrent_scale [4H]`, `bias [4H]`, `cell_scale [H]`, `cell_bias [H]`; other
      entries (`input_kernel`, `input_scale`) are not read.
    carry: `(c, h)`, each `[B, H]`.
    input_term: `[T, B, 4H]`, time-major: the batch-normalised input term
      `gamma_x * BN(W_x x_t)` of every step (no bias).
    mask: `[T, B, 1]` or `[T, B]`, 1 on valid steps, 0 on padding; None: all valid.
    population: None (training: batch statistics) or, in inference, the population
      rows of each step: `{'recurrent': (mean [T, 4H], var [T, 4H]),
      'cell': (mean [T, H], var [T, H])}` (no gradient flows into them).
    epsilon: variance epsilon of both batch norms.
    kernel: 'pallas' (one `pallas_call` per step and direction) or 'xla' (the same step
      functions as plain JAX).
    interpret: run the Pallas kernels in Pallas's interpreter (CPU).
    block_h: hidden units per Pallas program (a power of two); default from `layout`.
    compute_dtype: dtype of the matmuls (e.g. bfloat16); None: the operands' (float32).

  Returns:
    `(final_carry, h, moments)`: `(c, h)` after each row's last valid step `[B, H]`;
    `h [T, B, H]` (0 at padded steps); with batch statistics `{'recurrent': (mean
    [T, 4H], var [T, 4H], count [T]), 'cell': (mean [T, H], var [T, H], count [T])}`
    (mean and biased variance over the valid rows, `count` the valid rows), else {}.
  """
  c0, h0 = carry
  batch, hidden = h0.shape
  steps = input_term.shape[0]
  lay = layout(batch, hidden, kernel, block_h)
  dtype = jnp.promote_types(jnp.result_type(c0, h0, params['recurrent_kernel']),
                            jnp.float32)
  if mask is None:
    mask = jnp.ones((steps, batch, 1), dtype)
  mask = mask.reshape(steps, batch).astype(dtype)
  rows, units = lay.batch, lay.hidden

  w = _pad_to(params['recurrent_kernel'].reshape(hidden, GATES, hidden),
              (units, GATES, units)).reshape(units, GATES * units)
  vec = {'gamma_h': _pad_to(_gate_view(params['recurrent_scale'], hidden), (GATES, units)),
         'bias': _pad_to(_gate_view(params['bias'], hidden), (GATES, units)),
         'gamma_c': _pad_to(params['cell_scale'], (units,)),
         'beta_c': _pad_to(params['cell_bias'], (units,))}
  vec = jax.tree.map(lambda a: a.astype(dtype), vec)
  state = tuple(_pad_to(a.astype(dtype), (rows, units)) for a in (c0, h0))
  u = _pad_to(_gate_view(input_term.astype(dtype), hidden), (steps, rows, GATES, units))
  padded_mask = _pad_to(mask, (steps, rows))
  pop = None
  if population is not None:
    (mean_h, var_h), (mean_c, var_c) = jax.lax.stop_gradient(
        (population['recurrent'], population['cell']))
    gate_rows = lambda a, fill: _pad_to(_gate_view(a.astype(dtype), hidden),
                                        (steps, GATES, units), fill)
    pop = {'mean_h': gate_rows(mean_h, 0.0), 'var_h': gate_rows(var_h, 1.0),
           'mean_c': _pad_to(mean_c.astype(dtype), (steps, units)),
           'var_c': _pad_to(var_c.astype(dtype), (steps, units), 1.0)}

  static = _Static(lay, float(epsilon), kernel, bool(interpret), population is not None,
                   None if compute_dtype is None else jnp.dtype(compute_dtype))
  (c, h), out, moments = _scan(static, w, vec, state, u, padded_mask, pop)
  final = (c[:batch, :hidden], h[:batch, :hidden])
  out = out[:, :batch, :hidden]
  if population is not None:
    return final, out, {}
  count = jnp.sum(mask, axis=1)
  gate_moment = lambda a: a[:, :, :hidden].reshape(steps, GATES * hidden)
  return final, out, {
      'recurrent': (gate_moment(moments['mean_h']), gate_moment(moments['var_h']), count),
      'cell': (moments['mean_c'][:, :hidden], moments['var_c'][:, :hidden], count)}


def fused_bn_lstm(params: dict[str, Array], x: Array, mask: Optional[Array] = None, *,
                  initial_carry: Optional[tuple[Array, Array]] = None,
                  population: Optional[dict] = None,
                  epsilon: float = normalization.DEFAULT_EPSILON, **scan_options):
  """A BN-LSTM layer with per-step statistics over `[batch, time, features]`: the input
  term for all steps first (one product, batch-normalised per step over the valid rows,
  as the layer's hoisted path), then `fused_bn_lstm_scan`.

  Args:
    params: `steps.py` names: `input_kernel [I, 4H]`, `input_scale [4H]` and those of
      `fused_bn_lstm_scan`.
    x: `[batch, time, features]`; padded positions are ignored (zeroed first).
    mask: `[batch, time]`, 1 on valid steps (a prefix of each row); None: all valid.
    initial_carry: `(c, h)` `[batch, hidden]`; None: zeros.
    population: None (batch statistics) or `{site: (mean [T, F], var [T, F])}` for the
      sites 'input', 'recurrent', 'cell' (inference).
    epsilon: variance epsilon.
    **scan_options: `kernel`, `interpret`, `block_h`, `compute_dtype` of
      `fused_bn_lstm_scan`.

  Returns:
    `(final_carry, outputs [batch, time, hidden], moments)`, moments as
    `fused_bn_lstm_scan`'s plus `'input'` in training.
  """
  batch, steps, _ = x.shape
  hidden = params['recurrent_kernel'].shape[0]
  compute_dtype = scan_options.get('compute_dtype')
  mask_tm = None
  if mask is not None:
    x = jnp.where(mask[..., None] > 0, x, jnp.zeros_like(x))
    mask_tm = jnp.swapaxes(mask, 0, 1)[..., None].astype(jnp.float32)
  z = _matmul(jnp.swapaxes(x, 0, 1), params['input_kernel'], compute_dtype,
              ((2,), (0,)))                                              # [T, B, 4H]
  if population is None:
    input_term, mean, var, count = normalization.batch_norm(
        z, params['input_scale'], None, mask=mask_tm, reduce_axes=(1,), epsilon=epsilon)
    input_moments = jax.lax.stop_gradient((mean, var, count))
  else:
    mean, var = jax.lax.stop_gradient(population['input'])
    input_term = normalization.normalize(z, mean[:, None], var[:, None],
                                         params['input_scale'], None, epsilon)
  if initial_carry is None:
    zeros = jnp.zeros((batch, hidden), z.dtype)
    initial_carry = (zeros, zeros)
  carry, h, moments = fused_bn_lstm_scan(
      params, initial_carry, input_term, mask_tm, population=population, epsilon=epsilon,
      **scan_options)
  if population is None:
    moments = {'input': input_moments, **moments}
  return carry, jnp.swapaxes(h, 0, 1), moments
