"""Whole-layer backward pass of the scanned recurrent layer (`RecurrentLayer(backward=)`).

The autodiff of `lax.scan` accumulates the weight gradients step by step: T small
`[H, B] x [B, G*H]` products inside the reverse loop, each followed by an add into the
accumulator. Fused RNN libraries (cuDNN's RNN, for one) instead run a reverse scan that
only carries the per-step cotangents, and form the weight gradients after it from the
whole sequence:

    dW_h = H_prev^T dZ_h     one [H, B*T] x [B*T, G*H] product
    dW_x = X^T dZ_x          one [I, B*T] x [B*T, G*H] product (input term in the step)
    dX   = dZ_x W_x^T        one [B*T, G*H] x [G*H, I] product

where `Z_h = H_prev W_h` and `Z_x = X W_x` are the matmul outputs of each step
(`steps.step_terms`). What remains in the reverse scan is the vjp of the pointwise part
of the step (`steps.lstm_cell` / `steps.rnn_cell`: gates, c, h, the normalisations, the
mask), taken with `jax.vjp`, so the batch norms use the closed-form backward pass of
`normalization.batch_norm` (with its psum over `axis_name`), and one `[B, G*H] x [G*H, H]`
product per step for the recurrent cotangent `dh_{t-1} += dZ_h W_h^T`. The pointwise
parameters' gradients (biases, gammas) are summed in the reverse scan's carry.

What the forward scan stores for the reverse one is the layer's `remat` option:
  'none'  the residuals of the pointwise vjp (no recomputation), plus h_{t-1};
  'dots'  the step's carry and matmul outputs; the pointwise part is recomputed;
  'full'  the step's carry only; the matmuls and the pointwise part are recomputed.

Which one is faster depends on H / B (docs/speed.md). The autodiff path reads and
writes the `[H, G*H]` gradient accumulators at every step; this one stores and rereads
`[B, G*H]` cotangents per step instead. With a small H / B the accumulators stay in
cache and the autodiff path wins; with a large one this one does. `policy.resolve` says
where 'auto' takes it.

Batch moments are outputs without a gradient (the cells stop it), so they take no part
in the backward pass; forward-mode differentiation (`jax.jvp`) of this path is not
defined (a `custom_vjp`), use `backward='scan'` for it.
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
  """`lax.scan` of one recurrent layer, with the whole-layer backward pass.

  Args:
    cell: `(pointwise_params, carry, terms, inputs) -> (carry, outputs)`, the step after
      its matmuls; `outputs['h'] [B, H]` is the differentiable output, the rest of
      `outputs` (the packed batch moments) gets no cotangent.
    terms_fn: `(params, carry, inputs) -> terms`, the step's matmuls
      (`steps.step_terms`): `'recurrent'` = h_{t-1} W_h, and `'input'` = x_t W_x or the
      hoisted `'input_term'` taken from the inputs.
    params: the layer's parameters: `input_kernel [I, G*H]`, `recurrent_kernel [H, G*H]`
      and the pointwise ones.
    carry: the initial state, `(c, h)` or `h`, each `[B, H]`.
    xs: time-major step inputs: `'x' [T, B, I]` or `'input_term' [T, B, G*H]`,
      optionally `'mask' [T, B, 1]` and `'stats'` (population statistics, no gradient).
    compute_dtype: dtype of the backward pass's matmuls (as the forward's).
    mode: 'none' | 'dots' | 'full': what the forward pass stores (module docstring).
    unroll: steps per iteration of both scans.
    tied_terms: the cell adds the in-step input term and the recurrent term before any
      normalisation (plain LSTM, tanh RNN without input norm), so their cotangents are
      equal: the reverse scan then stores one `[T, B, G*H]` cotangent instead of two,
      and W_x and W_h get theirs from one product of `[x_t, h_{t-1}]`.

  Returns:
    `(final_carry, outputs)` as `lax.scan` of the whole step would, outputs stacked over
    time.
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
    if mode == 'none':
      loop_xs = {}
    elif mode == 'dots':
      loop_xs = {k: v for k, v in xs.items() if k != 'x'}
    else:
      loop_xs = xs

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
    if tied and 'x' in xs:
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
