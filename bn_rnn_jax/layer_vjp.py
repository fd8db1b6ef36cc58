"""The whole-layer backward pass of the scanned layer (`Execution(backward='layer')`).

The autodiff of `lax.scan` adds each step's `h^T dz` into the weight gradients inside the
reverse loop. This pass, as fused RNN libraries do, runs a reverse scan that carries only
the per-step cotangents, and forms the weight gradients after it from the whole sequence:

    dW_h = H_prev^T dZ_h   dW_x = X^T dZ_x   dX = dZ_x W_x^T     (one product each)

The reverse scan takes the vjp of the step's pointwise part (`steps.lstm_cell` /
`rnn_cell`, with batch norm's closed-form backward pass and its psum) and one product per
step for `dh_{t-1} += dZ_h W_h^T`; it sums the pointwise parameters' gradients in its
carry. The forward scan stores, as `remat` says, the pointwise vjp's residuals ('none'),
the carry and matmul outputs ('dots'), or the carry ('full'). Batch moments get no
cotangent. No forward-mode derivative (a `custom_vjp`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from bn_rnn_jax import steps

KERNELS = ('input_kernel', 'recurrent_kernel')
MODES = ('none', 'dots', 'full')


def _h(carry):
  """h of an LSTM `(c, h)` carry or of an RNN `h` carry."""
  return carry[1] if isinstance(carry, tuple) else carry


def _with_h(carry, h):
  return (carry[0], h) if isinstance(carry, tuple) else h


def _sequence_matmul(a: jax.Array, b: jax.Array, compute_dtype) -> jax.Array:
  """`sum_{t, b} a[t, b, :]^T b[t, b, :]`: `[T, B, M] x [T, B, N] -> [M, N]`, one product."""
  return steps.matmul(a, b, compute_dtype, ((0, 1), (0, 1)))


def _times_transpose(d: jax.Array, kernel: jax.Array, compute_dtype) -> jax.Array:
  """`d @ kernel^T` for `d [..., G*H]`, `kernel [F, G*H]` -> `[..., F]`."""
  return steps.matmul(d, kernel, compute_dtype, ((d.ndim - 1,), (1,)))


def scan_layer(cell: Callable, terms_fn: Callable, params: dict[str, jax.Array], carry: Any,
               xs: dict[str, Any], *, compute_dtype, mode: str, unroll: int = 1,
               tied_terms: bool = False):
  """`lax.scan` of one layer's step with the whole-layer backward pass: `(final_carry,
  outputs)` as `lax.scan` of the step gives.

  `cell(pointwise_params, carry, terms, inputs) -> (carry, outputs)` is the step after
  its matmuls (`outputs['h']` the differentiable output), `terms_fn(params, carry,
  inputs)` its matmuls (`steps.step_terms`); `xs` the time-major step inputs; `mode` what
  the forward scan stores. `tied_terms`: the input and recurrent terms meet as a plain sum
  (equal cotangents: one stored, one product for both kernels).
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}; got {mode!r}.')
  tied = tied_terms and 'x' in xs

  def split(params):
    kernels = {k: v for k, v in params.items() if k in KERNELS}
    return kernels, {k: v for k, v in params.items() if k not in KERNELS}

  def step(params, carry, inputs):
    return cell(split(params)[1], carry, terms_fn(params, carry, inputs), inputs)

  def pointwise(inputs):
    """The cell as a function of what is differentiated: `(carry, h_out), outputs`."""
    def fn(carry, terms, pointwise_params):
      new_carry, outputs = cell(pointwise_params, carry, terms, inputs)
      return (new_carry, outputs['h']), outputs
    return fn

  @jax.custom_vjp
  def run(params, carry, xs):
    return lax.scan(lambda c, inp: step(params, c, inp), carry, xs, unroll=unroll)

  def run_fwd(params, carry, xs):
    pointwise_params = split(params)[1]

    def forward_step(carry, inputs):
      terms = terms_fn(params, carry, inputs)
      if mode == 'none':
        (new_carry, _), vjp_fn, outputs = jax.vjp(
            pointwise(inputs), carry, terms, pointwise_params, has_aux=True)
        saved = {'h': _h(carry), 'vjp': vjp_fn}
      else:
        new_carry, outputs = cell(pointwise_params, carry, terms, inputs)
        saved = {'carry': carry}
        if mode == 'dots':
          saved['terms'] = {k: v for k, v in terms.items() if k != 'input_term'}
      return new_carry, (outputs, saved)

    final_carry, (outputs, saved) = lax.scan(forward_step, carry, xs, unroll=unroll)
    return (final_carry, outputs), (params, carry, xs, saved)

  def run_bwd(residuals, cotangents):
    params, carry0, xs, saved = residuals
    d_final_carry, d_outputs = cotangents
    kernels, pointwise_params = split(params)
    w_h = kernels['recurrent_kernel']
    # The reverse scan reads only what its mode recomputes from.
    loop_xs = {'none': {}, 'dots': {k: v for k, v in xs.items() if k != 'x'}, 'full': xs}[mode]

    def backward_step(state, inputs):
      d_carry, d_pointwise = state
      saved_t, d_h, xs_t = inputs
      if mode == 'none':
        vjp_fn = saved_t['vjp']
      else:
        carry = saved_t['carry']
        if mode == 'dots':
          terms = dict(saved_t['terms'])
          if 'input_term' in xs_t:
            terms['input_term'] = xs_t['input_term']
        else:
          terms = terms_fn(params, carry, xs_t)
        _, vjp_fn, _ = jax.vjp(pointwise(xs_t), carry, terms, pointwise_params,
                               has_aux=True)
      d_carry_prev, d_terms, d_pointwise_t = vjp_fn((d_carry, d_h))
      h_prev_cotangent = _h(d_carry_prev) + _times_transpose(
          d_terms['recurrent'], w_h, compute_dtype).astype(_h(d_carry_prev).dtype)
      d_carry_prev = _with_h(d_carry_prev, h_prev_cotangent)
      d_pointwise = jax.tree.map(jnp.add, d_pointwise, d_pointwise_t)
      if tied and 'input' in d_terms:
        d_terms = {'recurrent': d_terms['recurrent']}
      return (d_carry_prev, d_pointwise), d_terms

    zeros = jax.tree.map(jnp.zeros_like, pointwise_params)
    (d_carry0, d_pointwise), d_terms = lax.scan(
        backward_step, (d_final_carry, zeros), (saved, d_outputs['h'], loop_xs),
        reverse=True, unroll=unroll)

    # The weight gradients, each one product over the whole sequence.
    h_prev = saved['h'] if mode == 'none' else _h(saved['carry'])         # [T, B, H]
    d_params = dict(d_pointwise)
    d_xs = jax.tree.map(jnp.zeros_like, xs)
    if tied:
      # One product for both kernels: [x_t, h_{t-1}]^T dZ.
      w_x = kernels['input_kernel']
      both = _sequence_matmul(jnp.concatenate([xs['x'].astype(h_prev.dtype), h_prev], -1),
                              d_terms['recurrent'], compute_dtype).astype(w_h.dtype)
      d_params['input_kernel'] = both[:w_x.shape[0]].astype(w_x.dtype)
      d_params['recurrent_kernel'] = both[w_x.shape[0]:]
      d_xs['x'] = _times_transpose(d_terms['recurrent'], w_x, compute_dtype).astype(
          xs['x'].dtype)
      return d_params, d_carry0, d_xs
    d_params['recurrent_kernel'] = _sequence_matmul(h_prev, d_terms['recurrent'],
                                                    compute_dtype).astype(w_h.dtype)
    if 'input' in d_terms:
      w_x = kernels['input_kernel']
      d_params['input_kernel'] = _sequence_matmul(xs['x'], d_terms['input'],
                                                  compute_dtype).astype(w_x.dtype)
      d_xs['x'] = _times_transpose(d_terms['input'], w_x, compute_dtype).astype(
          xs['x'].dtype)
    else:
      # Hoisted input term: W_x gets its gradient from the autodiff of the projection
      # outside this function (one large matmul already).
      d_params['input_kernel'] = jnp.zeros_like(kernels['input_kernel'])
      d_xs['input_term'] = d_terms['input_term']
    return d_params, d_carry0, d_xs

  run.defvjp(run_fwd, run_bwd)
  return run(params, carry, xs)
