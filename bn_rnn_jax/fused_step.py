"""The BN-LSTM step fused into one kernel per step and direction: its math, shared with
the persistent kernel (`persistent.py`), and its scan over time (`fused.py` pads and
calls it).

One step (Cooijmans et al. eq. 14-16) given `Z = h_{t-1} W_h [B, 4H]` and the hoisted,
normalised input term `U [B, 4H]`:

    gates = gamma_h * BN(Z) + U + b                      gate order (f, i, o, g)
    c     = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h     = sigmoid(o) * tanh(gamma_c * BN(c) + beta_c)

with `normalization`'s masked moments and batch-norm backward pass (or the step's
population rows). The matmuls run between the kernels: `h_{t-1} W_h` forward, `dZ W_h^T`
backward, and `dW_h = sum_t H_{t-1}^T dZ_t` as one product after the reverse scan. The
backward kernel recomputes the step's pointwise forward from the stored `Z`, `c_{t-1}`.
A Pallas program holds the whole padded batch and the four gate columns of `block_h`
hidden units, so every per-feature moment and column sum stays inside it; `kernel='xla'`
runs the same math on whole arrays as plain JAX, with cross-device moments.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax import lax

from bn_rnn_jax import normalization
from bn_rnn_jax import steps

Array = jax.Array

GATES = 4


@dataclasses.dataclass(frozen=True)
class Layout:
  """Padded sizes: `batch` rows, `hidden` units (a multiple of `block_h`)."""
  batch: int
  hidden: int
  block_h: int

  @property
  def blocks(self) -> int:
    """Unit blocks of `block_h` in `hidden`."""
    return self.hidden // self.block_h


# ----------------------------------------------------------------------------- step math
# On values: 'gates' are 4-tuples of `[B, F]`, 'gate_vec' 4-tuples of `[F]`, 'state'
# `[B, F]`, 'vec' `[F]`, 'mask' `[B, 1]`; F is a block's units (H for 'xla').


def _normalized(x, mask, population, epsilon, axis_name):
  """`(x_hat, inv_std, mean, var)` of `x [B, F]`: batch moments of the valid rows, or the
  `(mean, var)` given."""
  if population is None:
    mean, var, _ = normalization.batch_moments(x, mask, axis_name=axis_name)
  else:
    mean, var = population
  inv = lax.rsqrt(var + epsilon)
  return (x - mean) * inv, inv, mean, var


def _forward_parts(v: dict, epsilon: float, population: bool, axis_name) -> dict:
  """The step's pointwise forward pass and the intermediates its backward pass reads."""
  def pop(name, g=None):  # the population rows of Z's gate g or of c, or None
    if not population:
      return None
    mean, var = v[f'mean_{name}'], v[f'var_{name}']
    return (mean, var) if g is None else (mean[g], var[g])

  p = {'z_hat': [], 'inv_h': [], 'mean_h': [], 'var_h': []}
  pre = []
  for g in range(GATES):
    parts = _normalized(v['z'][g], v['mask'], pop('h', g), epsilon, axis_name)
    for key, value in zip(('z_hat', 'inv_h', 'mean_h', 'var_h'), parts):
      p[key].append(value)
    pre.append(p['z_hat'][g] * v['gamma_h'][g] + v['u'][g] + v['bias'][g])
  p['sf'], p['si'], p['so'] = (jax.nn.sigmoid(a) for a in pre[:3])
  p['tg'] = jnp.tanh(pre[3])
  p['c'] = p['sf'] * v['c_prev'] + p['si'] * p['tg']
  p['c_hat'], p['inv_c'], p['mean_c'], p['var_c'] = _normalized(
      p['c'], v['mask'], pop('c'), epsilon, axis_name)
  p['tanh_c'] = jnp.tanh(p['c_hat'] * v['gamma_c'] + v['beta_c'])
  p['h'] = p['so'] * p['tanh_c']
  return p


def forward_math(v: dict, *, epsilon: float, population: bool, axis_name) -> dict:
  """One step forward: the new carry, the output (0 on padded rows) and, with batch
  statistics, the step's moments of Z (per gate) and of c."""
  p = _forward_parts(v, epsilon, population, axis_name)
  valid = v['mask'] > 0
  out = {'c_new': jnp.where(valid, p['c'], v['c_prev']),
         'h_new': jnp.where(valid, p['h'], v['h_prev']), 'out': jnp.where(valid, p['h'], 0.0)}
  if not population:
    out.update(mean_h=tuple(p['mean_h']), var_h=tuple(p['var_h']), mean_c=p['mean_c'],
               var_c=p['var_c'])
  return out


def backward_math(v: dict, *, epsilon: float, population: bool, axis_name) -> dict:
  """One step backward from the cotangents of the new carry (`dc`, `dh`) and the output
  (`d_out`): those of Z (`dz`), of the gate pre-activations and U (`d_pre`), of
  `c_{t-1}` and of the part of `h_{t-1}`'s that skips the matmul (`dh_keep`), and the
  step's sums for `gamma_h`, `b`, `gamma_c`, `beta_c` (local to the device)."""
  p = _forward_parts(v, epsilon, population, axis_name)
  valid, mask = v['mask'] > 0, v['mask']
  count = jnp.maximum(lax.psum(jnp.sum(mask), axis_name) if axis_name else jnp.sum(mask), 1.0)

  def bn_grad(dy, scale, x_hat, inv):  # (dx, sum(dy x_hat), sum(dy))
    if population:
      return dy * scale * inv, jnp.sum(dy * x_hat, 0), jnp.sum(dy, 0)
    return normalization.batch_norm_backward(dy, x_hat, inv, scale, mask, count,
                                             axis_name=axis_name)

  dh = jnp.where(valid, v['dh'] + v['d_out'], 0.0)
  sf, si, so, tg, tanh_c = p['sf'], p['si'], p['so'], p['tg'], p['tanh_c']
  d_c_out = dh * so * (1.0 - tanh_c * tanh_c)           # d (gamma_c c_hat + beta_c)
  dx_c, d_gamma_c, d_beta_c = bn_grad(d_c_out, v['gamma_c'], p['c_hat'], p['inv_c'])
  d_c = jnp.where(valid, v['dc'], 0.0) + dx_c
  d_pre = (d_c * v['c_prev'] * sf * (1.0 - sf),          # f
           d_c * tg * si * (1.0 - si),                   # i
           dh * tanh_c * so * (1.0 - so),                # o
           d_c * si * (1.0 - tg * tg))                   # g
  grads = [bn_grad(d_pre[g], v['gamma_h'][g], p['z_hat'][g], p['inv_h'][g])
           for g in range(GATES)]
  return {'dz': tuple(g[0] for g in grads), 'd_pre': d_pre,
          'dc_prev': d_c * sf + jnp.where(valid, 0.0, v['dc']),
          'dh_keep': jnp.where(valid, 0.0, v['dh']),
          'd_gamma_h': tuple(g[1] for g in grads), 'd_bias': tuple(g[2] for g in grads),
          'd_gamma_c': d_gamma_c, 'd_beta_c': d_beta_c}


# ----------------------------------------------------------------------------- kernels
_KINDS = {
    **dict.fromkeys(('z', 'u', 'dz', 'd_pre'), 'gates'),
    **dict.fromkeys(('c_prev', 'h_prev', 'c_new', 'h_new', 'out', 'dc', 'dh', 'd_out',
                     'dc_prev', 'dh_keep'), 'state'),
    'mask': 'mask',
    **dict.fromkeys(('gamma_h', 'bias', 'mean_h', 'var_h', 'd_gamma_h', 'd_bias'),
                    'gate_vec'),
    **dict.fromkeys(('gamma_c', 'beta_c', 'mean_c', 'var_c', 'd_gamma_c', 'd_beta_c'), 'vec'),
}
_OUTPUTS = {
    ('forward', False): ('c_new', 'h_new', 'out', 'mean_h', 'var_h', 'mean_c', 'var_c'),
    ('forward', True): ('c_new', 'h_new', 'out'),
    'backward': ('dz', 'd_pre', 'dc_prev', 'dh_keep', 'd_gamma_h', 'd_bias', 'd_gamma_c',
                 'd_beta_c'),
}


def _split(kind: str, a):
  """An array (or a kernel's ref) as the step math's value."""
  if kind == 'gates':
    return tuple(a[:, g, :] for g in range(GATES))
  if kind == 'gate_vec':
    return tuple(a[g, :] for g in range(GATES))
  return a[...][:, None] if kind == 'mask' else a[...]


def _join(kind: str, value) -> Array:
  return jnp.stack(value, axis={'gates': 1, 'gate_vec': 0}[kind]) if isinstance(
      value, tuple) else value


@dataclasses.dataclass(frozen=True)
class Static:
  """A fused scan's static settings (`fused.scan` makes them)."""
  layout: Layout
  epsilon: float
  kernel: str
  interpret: bool
  population: bool
  compute_dtype: Any
  num_warps: int
  axis_name: Optional[str]


def _step(static: Static, direction: str, inputs: dict[str, Array]) -> dict:
  """The forward or backward step: plain JAX ('xla') or one `pallas_call` over a grid of
  `block_h`-unit blocks, each holding the whole padded batch."""
  math = functools.partial(forward_math if direction == 'forward' else backward_math,
                           epsilon=static.epsilon, population=static.population,
                           axis_name=static.axis_name)
  outputs = _OUTPUTS[direction if direction == 'backward' else (direction, static.population)]
  if static.kernel == 'xla':
    result = math({name: _split(_KINDS[name], a) for name, a in inputs.items()})
    return {name: _join(_KINDS[name], result[name]) for name in outputs}
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
  lay, names = static.layout, tuple(inputs)
  rows, width = lay.batch, lay.block_h
  specs = {'gates': pl.BlockSpec((rows, GATES, width), lambda j: (0, 0, j)),
           'state': pl.BlockSpec((rows, width), lambda j: (0, j)),
           'mask': pl.BlockSpec((rows,), lambda j: (0,)),
           'gate_vec': pl.BlockSpec((GATES, width), lambda j: (0, j)),
           'vec': pl.BlockSpec((width,), lambda j: (j,))}
  shapes = {'gates': (rows, GATES, lay.hidden), 'state': (rows, lay.hidden), 'mask': (rows,),
            'gate_vec': (GATES, lay.hidden), 'vec': (lay.hidden,)}

  def kernel(*refs):
    result = math({name: _split(_KINDS[name], ref) for name, ref in zip(names, refs)})
    for name, ref in zip(outputs, refs[len(names):]):
      value = result[name]
      if isinstance(value, tuple):  # per gate: no stacking inside a kernel
        for g in range(GATES):
          ref[(slice(None), g) if _KINDS[name] == 'gates' else g] = value[g]
      else:
        ref[...] = value

  call = pl.pallas_call(
      kernel, grid=(lay.blocks,),
      out_shape=[jax.ShapeDtypeStruct(shapes[_KINDS[n]], inputs['c_prev'].dtype)
                 for n in outputs],
      in_specs=[specs[_KINDS[n]] for n in names], out_specs=[specs[_KINDS[n]] for n in outputs],
      interpret=static.interpret, name=f'bn_lstm_step_{direction}',
      compiler_params=pltriton.CompilerParams(num_warps=static.num_warps, num_stages=1))
  return dict(zip(outputs, call(*(inputs[name] for name in names))))


# ----------------------------------------------------------------------------- scan


def _forward_scan(static: Static, w, vec, carry, u, mask, pop, save: bool):
  """`lax.scan` of the forward step; with `save`, also what the backward pass reads."""
  def body(carry, xs):
    c_prev, h_prev = carry
    u_t, m_t, pop_t = xs
    z = steps.matmul(h_prev, w, static.compute_dtype).astype(c_prev.dtype)
    z = z.reshape(static.layout.batch, GATES, -1)
    out = _step(static, 'forward', {**vec, **(pop_t or {}), 'z': z, 'u': u_t,
                                    'c_prev': c_prev, 'h_prev': h_prev, 'mask': m_t})
    ys = {'out': out['out'],
          'moments': {k: out[k] for k in ('mean_h', 'var_h', 'mean_c', 'var_c') if k in out}}
    if save:
      ys['saved'] = {'z': z, 'c_prev': c_prev, 'h_prev': h_prev}
    return (out['c_new'], out['h_new']), ys

  final, ys = lax.scan(body, carry, (u, mask, pop))
  return (final, ys['out'], ys['moments']), ys.get('saved')


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def scan(static: Static, w, vec, carry, u, mask, pop):
  """The scan on padded arrays: `w [Hp, 4 Hp]`, `vec` (`gamma_h`, `bias` `[4, Hp]`,
  `gamma_c`, `beta_c` `[Hp]`), `carry (c, h) [Bp, Hp]`, `u [T, Bp, 4, Hp]`, `mask
  [T, Bp]`, `pop` None or the rows (`mean_h`, `var_h` `[T, 4, Hp]`, `mean_c`, `var_c`
  `[T, Hp]`) -> `(final carry, out [T, Bp, Hp], moments)`."""
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
    grads = _step(static, 'backward', {**vec, **(pop_t or {}), 'z': saved_t['z'], 'u': u_t,
                                       'c_prev': saved_t['c_prev'], 'mask': m_t, 'dc': dc,
                                       'dh': dh, 'd_out': d_out_t})
    dz = grads['dz']
    dh_prev = grads['dh_keep'] + steps.matmul(dz.reshape(rows, -1), w, static.compute_dtype,
                                              ((1,), (1,))).astype(dh.dtype)
    d_vec = {k: d_vec[k] + grads[f'd_{k}'] for k in d_vec}
    return (grads['dc_prev'], dh_prev, d_vec), (dz, grads['d_pre'])

  (dc0, dh0, d_vec), (dz, d_u) = lax.scan(
      body, (dc_final, dh_final, jax.tree.map(jnp.zeros_like, vec)),
      (saved, u, mask, pop, d_out), reverse=True)
  # dW_h = sum_t h_{t-1}^T dZ_t: one [Hp, T*Bp] x [T*Bp, 4Hp] product.
  units = static.layout.hidden
  d_w = steps.matmul(saved['h_prev'].reshape(-1, units), dz.reshape(-1, GATES * units),
                     static.compute_dtype, ((0,), (0,)))
  return (d_w.astype(w.dtype), d_vec, (dc0, dh0), d_u.astype(u.dtype), jnp.zeros_like(mask),
          jax.tree.map(jnp.zeros_like, pop))


scan.defvjp(_scan_fwd, _scan_bwd)
