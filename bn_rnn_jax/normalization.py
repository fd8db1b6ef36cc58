"""Batch and layer normalisation, and population-statistics arithmetic, as pure functions.

Features are the last axis; statistics reduce over `reduce_axes` (the batch axis: per
step; batch and time: per sequence). A `mask` broadcastable to `x.shape[:-1] + (1,)` is 1
on valid entries, 0 on padding, which never counts. With `axis_name`, sums and counts are
psum-ed, so the moments are the global batch's whatever each device holds. Variances are
biased (Cooijmans et al. eq. 9).

A site's population statistics are `{'mean': [R, F], 'var': [R, F], 'count': [R]}`
(`batch_stats.py`); step t reads row `min(t, last row reached)` (Cooijmans et al. sec. 3).
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bn_rnn_jax import checks
from bn_rnn_jax import sequence

Array = jax.Array
Axes = tuple[int, ...]

DEFAULT_EPSILON = 1e-5


def _psum(x, axis_name):
  return x if axis_name is None else lax.psum(x, axis_name)


BATCH_SUMS = ('reduce', 'contraction')


def batch_sum(v: Array, reduce_axes: Axes, batch_sums: str = 'reduce') -> Array:
  """`jnp.sum(v, axis=reduce_axes)` as a reduction ('reduce') or a contraction with ones
  at the highest precision ('contraction'): the same sums (`policy.batch_sums_for`)."""
  if batch_sums not in BATCH_SUMS:
    raise ValueError(f'batch_sums must be one of {BATCH_SUMS}; got {batch_sums!r}.')
  if batch_sums == 'reduce':
    return jnp.sum(v, axis=reduce_axes)
  ones = jnp.ones([v.shape[a] for a in reduce_axes], v.dtype)
  return jnp.tensordot(ones, v, axes=(tuple(range(len(reduce_axes))), tuple(reduce_axes)),
                       precision=lax.Precision.HIGHEST)


def _per_feature(count: Array) -> Array:
  """A count that broadcasts against per-feature statistics `[..., F]`."""
  return count[..., None] if jnp.ndim(count) else count


def _masked_sum(v: Array, mask: Optional[Array], reduce_axes: Axes,
                batch_sums: str) -> Array:
  # `where`, not `v * mask`: padding holding NaN or inf must not reach the sums (NaN*0).
  return batch_sum(v if mask is None else jnp.where(mask > 0, v, 0), reduce_axes, batch_sums)


def batch_moments(x: Array,
                  mask: Optional[Array] = None,
                  reduce_axes: Sequence[int] = (0,),
                  axis_name: Optional[str] = None,
                  batch_sums: str = 'reduce'):
  """Masked, cross-device mean and biased variance of `x [..., F]` over `reduce_axes`.

  Returns `(mean, var, count)`: mean and var have `x`'s shape without `reduce_axes`;
  count is the global number of valid entries per statistic (0 where only padding: mean
  and variance are then 0, the division clamps the count at 1). In at least float32.

  Example:
    >>> from bn_rnn_jax import normalization
    >>> x = jnp.array([[1.], [3.], [100.]])            # [batch 3, features 1]
    >>> mask = jnp.array([[1.], [1.], [0.]])           # the third row is padding
    >>> normalization.batch_moments(x, mask)
    (Array([2.], dtype=float32), Array([1.], dtype=float32), Array(2., dtype=float32))
  """
  sequence.check_mask_values(mask)
  reduce_axes = tuple(a % x.ndim for a in reduce_axes)
  # Statistics in at least float32, also under a bfloat16 compute dtype.
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  if mask is None:
    count = jnp.asarray(math.prod(x.shape[a] for a in reduce_axes), x.dtype)
  else:
    mask = jnp.broadcast_to(mask, x.shape[:-1] + (1,)).astype(x.dtype)
    count = batch_sum(mask[..., 0], reduce_axes, batch_sums)
  count = _psum(count, axis_name)
  safe_count = _per_feature(jnp.maximum(count, 1.0))
  mean = _psum(_masked_sum(x, mask, reduce_axes, batch_sums), axis_name) / safe_count
  centred = x - jnp.expand_dims(mean, reduce_axes)
  # Two passes: E[x^2] - E[x]^2 cancels catastrophically in float32 when |mean| >> std.
  var = _psum(_masked_sum(centred * centred, mask, reduce_axes, batch_sums),
              axis_name) / safe_count
  return mean, var, count


def normalize(x: Array, mean: Array, var: Array, scale: Optional[Array] = None,
              bias: Optional[Array] = None, epsilon: float = DEFAULT_EPSILON) -> Array:
  """`bias + scale * (x - mean) / sqrt(var + epsilon)`; statistics broadcast against x."""
  return affine((x - mean) * lax.rsqrt(var + epsilon), scale, bias)


def affine(y: Array, scale: Optional[Array], bias: Optional[Array]) -> Array:
  """`y * scale + bias`, either left out when None."""
  if scale is not None:
    y = y * scale
  if bias is not None:
    y = y + bias
  return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _batch_norm(x, scale, bias, mask, reduce_axes, axis_name, epsilon, batch_sums):
  out, _ = _batch_norm_forward(x, scale, bias, mask, reduce_axes, axis_name, epsilon,
                               batch_sums)
  return out


def _batch_norm_forward(x, scale, bias, mask, reduce_axes, axis_name, epsilon, batch_sums):
  mean, var, count = batch_moments(x, mask, reduce_axes, axis_name, batch_sums)
  inv_std = lax.rsqrt(var + epsilon)
  x_hat = (x - jnp.expand_dims(mean, reduce_axes)) * jnp.expand_dims(inv_std, reduce_axes)
  y = affine(x_hat, scale, bias)
  # The empty array carries x's dtype to the backward pass (dx is returned in it).
  residuals = (x_hat, inv_std, scale, bias, mask, jnp.maximum(count, 1.0),
               jnp.zeros((0,), x.dtype))
  return (y, mean, var, count), residuals


def _batch_norm_fwd(x, scale, bias, mask, reduce_axes, axis_name, epsilon, batch_sums):
  # symbolic_zeros=True wraps the differentiable arguments in CustomVJPPrimal.
  unwrap = lambda a: a.value if isinstance(a, jax.custom_derivatives.CustomVJPPrimal) else a
  return _batch_norm_forward(unwrap(x), unwrap(scale), unwrap(bias), unwrap(mask),
                             reduce_axes, axis_name, epsilon, batch_sums)


def _sum_to_shape(value: Array, like: Array) -> Array:
  """Sum `value` over the axes along which `like` was broadcast against it."""
  lead = value.ndim - like.ndim
  value = jnp.sum(value, axis=tuple(range(lead)))
  ones = tuple(a for a, n in enumerate(like.shape) if n == 1 and value.shape[a] != 1)
  return jnp.sum(value, axis=ones, keepdims=True).astype(like.dtype)


def _is_zero(cotangent) -> bool:
  return cotangent is None or isinstance(cotangent, jax.custom_derivatives.SymbolicZero)


def batch_norm_backward(dy: Array, x_hat: Array, inv_std: Array, scale: Optional[Array],
                        mask: Optional[Array], count: Array, *, reduce_axes: Axes = (0,),
                        axis_name: Optional[str] = None, batch_sums: str = 'reduce',
                        d_mean=None, d_var=None):
  """Backward pass of `y = scale * x_hat + bias`, `x_hat = (x - mean) * inv_std` with
  batch moments (Ioffe & Szegedy 2015, sec. 3). With g = dy * scale, N = `count` (>= 1),
  m the mask and global sums (one psum):

    dx = inv_std * (g - m * sum(g)/N - m * x_hat * sum(g * x_hat)/N)
         + m * d_mean / N + m * 2 (x - mean) * d_var / N

  Returns `(dx, sum(dy * x_hat), sum(dy))`, the sums local (d_scale's and d_bias's)."""
  sum_dy = batch_sum(dy, reduce_axes, batch_sums)
  sum_dy_x_hat = batch_sum(dy * x_hat, reduce_axes, batch_sums)
  # scale is constant along the reduced axes, so sum(g) = scale * sum(dy).
  g, terms = dy, [sum_dy, sum_dy_x_hat]
  if scale is not None:
    g, terms = dy * scale, [sum_dy * scale, sum_dy_x_hat * scale]
  with_moments = not (_is_zero(d_mean) and _is_zero(d_var))
  if with_moments:
    d_mean = jnp.zeros_like(terms[0]) if _is_zero(d_mean) else d_mean
    d_var = jnp.zeros_like(terms[0]) if _is_zero(d_var) else d_var
    terms += [d_mean, d_var * 2.0 / inv_std]  # d_var * 2 (x - mean) = d_var * 2 x_hat / inv_std
  count = _per_feature(count)
  sums = [total / count for total in _psum(terms, axis_name)]  # one psum of all the sums
  expand = lambda s: jnp.expand_dims(s, reduce_axes)
  inv = expand(inv_std)
  correction = (expand(sums[0]) + x_hat * expand(sums[1])) * inv
  if with_moments:
    correction = correction - expand(sums[2]) - x_hat * expand(sums[3])
  if mask is not None:
    correction = jnp.where(mask > 0, correction, 0)  # not `* mask`: NaN * 0 is NaN
  return g * inv - correction, sum_dy_x_hat, sum_dy


def _batch_norm_bwd(reduce_axes, axis_name, epsilon, batch_sums, residuals, cotangents):
  """`batch_norm_backward` as `_batch_norm`'s custom_vjp (parameter gradients local, as
  every parameter gradient inside pmap)."""
  del epsilon
  x_hat, inv_std, scale, bias, mask, count, x_dtype = residuals
  dy, d_mean, d_var, _ = cotangents
  if _is_zero(dy):
    dy = jnp.zeros_like(x_hat)
  dx, sum_dy_x_hat, sum_dy = batch_norm_backward(
      dy, x_hat, inv_std, scale, mask, count, reduce_axes=reduce_axes, axis_name=axis_name,
      batch_sums=batch_sums, d_mean=d_mean, d_var=d_var)
  expand = lambda s: jnp.expand_dims(s, reduce_axes)
  d_scale = None if scale is None else _sum_to_shape(expand(sum_dy_x_hat), scale)
  d_bias = None if bias is None else _sum_to_shape(expand(sum_dy), bias)
  d_mask = None if mask is None else jnp.zeros_like(mask)
  return dx.astype(x_dtype.dtype), d_scale, d_bias, d_mask


_batch_norm.defvjp(_batch_norm_fwd, _batch_norm_bwd, symbolic_zeros=True)


def batch_norm(x: Array,
               scale: Optional[Array] = None,
               bias: Optional[Array] = None,
               *,
               mask: Optional[Array] = None,
               reduce_axes: Sequence[int] = (0,),
               axis_name: Optional[str] = None,
               epsilon: float = DEFAULT_EPSILON,
               batch_sums: str = 'reduce'):
  """`bias + scale * (x - mean) / sqrt(var + epsilon)` with `batch_moments`' moments and
  the closed-form backward pass (`batch_norm_backward`); `scale`, `bias` `[F]` or None.
  Returns `(y, mean, var, count)`."""
  reduce_axes = tuple(sorted(a % x.ndim for a in reduce_axes))
  if x.shape[-1:] and (x.ndim - 1) in reduce_axes:
    raise ValueError(f'batch_norm reduces over {reduce_axes}, which includes the feature '
                     f'axis of x with shape {x.shape}.')
  for name, value in (('scale', scale), ('bias', bias)):
    # Parameters align with x's trailing axes, none of them reduced (the backward pass
    # relies on it).
    if value is not None and x.ndim - jnp.ndim(value) <= max(reduce_axes):
      raise ValueError(f'batch_norm {name} of shape {jnp.shape(value)} spans a reduced '
                       f'axis {reduce_axes} of x with shape {x.shape}.')
  sequence.check_mask_values(mask)  # the custom_vjp below sees a traced mask
  if mask is not None:
    mask = jnp.broadcast_to(mask, x.shape[:-1] + (1,)).astype(x.dtype)
  return _batch_norm(x, scale, bias, mask, reduce_axes, axis_name, epsilon, batch_sums)


def layer_norm(x: Array, scale: Optional[Array] = None, bias: Optional[Array] = None,
               epsilon: float = DEFAULT_EPSILON) -> Array:
  """Layer normalisation of `x [..., F]` over the features (Ba et al. 2016), in at least
  float32."""
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return normalize(x, mean, var, scale, bias, epsilon)


# ------------------------------------------------------------------ population statistics


def init_population_stats(num_rows: int, features: int, dtype=jnp.float32
                          ) -> dict[str, Array]:
  """Fresh statistics of one site: mean 0, var 1, count 0."""
  return {
      'mean': jnp.zeros((num_rows, features), dtype),
      'var': jnp.ones((num_rows, features), dtype),
      'count': jnp.zeros((num_rows,), dtype),
  }


def check_length(length: int, max_length: int, what: str = 'sequence') -> None:
  """Training on more steps than there are statistics rows is an error, never a clamp."""
  if length > max_length:
    raise ValueError(
        f'A training {what} has {length} time steps but the per-step batch statistics '
        f'hold only max_length={max_length} rows. Raise max_length to at least {length} '
        f'(population statistics past the training length are reused at inference only).')


def minibatch_moments_record(mean: Array, var: Array, count: Array, num_rows: int,
                             min_count: float = 1, first_row=0) -> dict[str, Array]:
  """One minibatch's moments (`mean`, `var` `[T, F]` or `[F]`; `count` `[T]` or scalar,
  the sequences behind each) as a `[num_rows]` record from row `first_row` on.

  `count` is each row's weight: 0 on rows not reached, minus the count on *thin* rows
  (fewer than `min_count` sequences), which keep the fresh (0, 1) values."""
  # Counts (the running average's weights) in the moments' dtype: float64 under x64.
  dtype = jnp.promote_types(jnp.result_type(mean), jnp.float32)
  count = jnp.atleast_1d(count).astype(dtype)
  seen = count >= jnp.maximum(min_count, 1e-6)
  thin = (count > 0) & ~seen
  # Rows that did not count get the fresh (0, 1) values, like the rows past T: the
  # record must not depend on how much padding a batch carries.
  mean = jnp.where(seen[:, None], jnp.atleast_2d(mean), 0.0)
  var = jnp.where(seen[:, None], jnp.atleast_2d(var), 1.0)
  count = jnp.where(seen, count, jnp.where(thin, -count, 0.0))
  if sequence.starts_at_zero(first_row):
    pad = num_rows - mean.shape[0]
    if pad < 0:
      check_length(mean.shape[0], num_rows)
    return {
        'mean': jnp.pad(mean, ((0, pad), (0, 0))),
        'var': jnp.pad(var, ((0, pad), (0, 0)), constant_values=1.0),
        'count': jnp.pad(count, (0, pad)),
    }
  rows = first_row + jnp.arange(mean.shape[0])
  fresh = init_population_stats(num_rows, mean.shape[-1], dtype)
  return {
      'mean': fresh['mean'].at[rows].set(mean, mode='drop'),
      'var': fresh['var'].at[rows].set(var, mode='drop'),
      'count': fresh['count'].at[rows].set(count, mode='drop'),
  }


def check_rows(first_row, length: int, num_rows: int):
  """Training steps `first_row .. first_row + length - 1` must have statistics rows (an
  error, never a clamp): while tracing for a static 0, else `checks.check` (returned)."""
  if sequence.starts_at_zero(first_row):
    check_length(length, num_rows)
    return True
  first = jnp.max(jnp.asarray(first_row))
  return checks.check(
      first + length <= num_rows,
      'Training steps {}..{} need per-step statistics rows, but max_length='
      f'{num_rows}. To train in segments (truncated backprop), start each from '
      'initial_carry=carry.state, the (c, h) that restarts the statistics rows at step 0; '
      'to train on sequences this long, raise max_length to at least {}.',
      first, first + length - 1, first + length)


def record_weights(record: dict[str, Array]) -> Array:
  """`[R]` weights of a record's rows: their valid counts, 0 on unreached and thin rows."""
  return jnp.maximum(record['count'], 0.0)


def update_running_stats(stats: dict[str, Array], record: dict[str, Array],
                         momentum: float, full_count: Optional[Array] = None
                         ) -> dict[str, Array]:
  """Running average of the rows a record reached: row r moves by `(1 - momentum) * n_r /
  n_full` towards the batch value (n its count; `n_full` = `full_count`, default the
  record's largest), and takes its first batch value outright. `count` sums the counts."""
  weights = record_weights(record)
  full = jnp.max(weights) if full_count is None else full_count
  seen = weights[:, None] > 0
  first = stats['count'][:, None] <= 0
  rate = ((1.0 - momentum) * weights / jnp.maximum(full, 1e-12))[:, None]
  def blend(old, new):
    ema = old + rate * (new - old)
    return jnp.where(seen, jnp.where(first, new, ema), old)
  return {
      'mean': blend(stats['mean'], record['mean']),
      'var': blend(stats['var'], record['var']),
      'count': stats['count'] + weights,
  }


#: The layers' `min_row_support` (`steady_tail`; docs/experiments/variable_length.md).
DEFAULT_MIN_ROW_SUPPORT = 0.05


def steady_tail(stats: dict[str, Array], min_support: float) -> dict[str, Array]:
  """`stats` whose rows after L, the last with a count of at least `min_support` times
  the largest, hold the rows L // 2 .. L pooled by the law of total variance (weights n_r):

    mean = sum_r n_r mean_r / sum_r n_r,  var = sum_r n_r (var_r + (mean_r - mean)^2) / sum_r n_r

  the steady state (Cooijmans et al. Fig. 5) in place of rows a few sequences reached."""
  count = stats['count']
  num_rows = count.shape[0]
  if num_rows == 1:
    return stats
  rows = jnp.arange(num_rows)
  last = jnp.max(jnp.where(count >= min_support * jnp.max(count), rows, 0))
  weights = jnp.where((rows >= last // 2) & (rows <= last), count, 0.0)
  total = jnp.sum(weights)
  share = (weights / jnp.maximum(total, jnp.finfo(count.dtype).tiny))[:, None]
  mean = jnp.sum(share * stats['mean'], axis=0)
  var = jnp.sum(share * (stats['var'] + (stats['mean'] - mean) ** 2), axis=0)
  tail = rows > last
  return {'mean': jnp.where(tail[:, None], mean, stats['mean']),
          'var': jnp.where(tail[:, None], var, stats['var']),
          'count': jnp.where(tail, total, count)}


def population_rows(stats: dict[str, Array], length: int, first_step=0,
                    min_support: float = 0.0) -> tuple[Array, Array]:
  """`(mean, var)` of steps `first_step .. first_step + length - 1`, each `[length, F]`
  (`[length, batch, F]` for a `[batch]` `first_step`): row `min(t, last row reached)`,
  after `steady_tail` with `min_support` > 0."""
  if min_support > 0:
    stats = steady_tail(stats, min_support)
  num_rows = stats['count'].shape[0]
  seen_rows = jnp.sum((stats['count'] > 0).astype(jnp.int32))
  last_seen = jnp.maximum(seen_rows - 1, 0)
  first_step = jnp.asarray(first_step)
  steps = jnp.arange(length).reshape((length,) + (1,) * first_step.ndim) + first_step
  rows = jnp.minimum(steps, jnp.minimum(last_seen, num_rows - 1))
  # jnp.take, not indexing: statistics held as NumPy arrays take traced rows too.
  return jnp.take(stats['mean'], rows, axis=0), jnp.take(stats['var'], rows, axis=0)
