"""Sequences with padding, and randomness per example.

Masks are `[batch, time]` with 1 on valid steps and 0 on padding, the valid steps of each
row first. Per-example randomness folds each example's *global* row (its row in the batch
of all devices) into the step's key, so that N devices draw the noise and dropout masks
of one device, and a resumed run draws what the uninterrupted one did.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import checks

Array = jax.Array


def check_mask_values(mask) -> None:
  """Raise if a concrete mask (of any shape) holds a value other than 0 and 1, naming the
  first such entry.

  The batch moments are right for 0/1 masks only. A traced mask (under jit or pmap) is
  checked inside `checks.checkify` only.
  """
  if mask is None:
    return
  if isinstance(mask, jax.core.Tracer):
    checks.check((mask == 0) | (mask == 1), 'A mask holds a value other than 0 (padding) '
                 'and 1 (a valid step).')
    return
  values = np.asarray(mask)
  bad = np.argwhere(~((values == 0) | (values == 1)))
  if bad.size:
    index = tuple(int(i) for i in bad[0])
    raise ValueError(f'mask[{", ".join(map(str, index))}] holds {values[index].item()!r}; a '
                     'mask is 0 (padding) or 1 (a valid step).')


def check_mask_prefix(mask) -> None:
  """Raise if a concrete `[batch, time]` mask holds a value other than 0 and 1
  (`check_mask_values`), or has a valid step after a padded one.

  Layers and `reverse_valid` assume each row's valid steps come first (padding at the
  end); a mask with holes would be silently mis-reversed. A traced mask (under jit or
  pmap) is checked inside `checks.checkify` only. The input pipelines build 0/1 prefix
  masks.
  """
  if mask is None:
    return
  check_mask_values(mask)
  if isinstance(mask, jax.core.Tracer):
    valid = mask > 0
    checks.check(~(valid[:, 1:] & ~valid[:, :-1]), 'A mask row has a valid step after '
                 'padding; valid steps must come first in each row (padding at the end).')
    return
  valid = np.asarray(mask) > 0
  holes = np.nonzero(valid[:, 1:] & ~valid[:, :-1])
  if holes[0].size:
    row, step = int(holes[0][0]), int(holes[1][0]) + 1
    raise ValueError(f'mask row {row} has a valid step at t={step} after padding; valid '
                     'steps must come first in each row (padding at the end).')


def check_time_index(value, what: str) -> None:
  """Raise if a time index (a scalar, or a vector of rows' steps) is not an integer (at
  trace time) or is negative (concrete; traced: inside `checks.checkify`)."""
  dtype = jnp.result_type(value)
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f'{what} must be an integer; got dtype {dtype}.')
  checks.check(jnp.asarray(value) >= 0, f'{what} must be >= 0; got {{}}.',
               jnp.min(jnp.asarray(value)))


def starts_at_zero(first_step) -> bool:
  """Whether `first_step` is the static 0 of a sequence run in one call (not a piece of
  one, not a traced or per-row step): the calls that need no step offset."""
  return isinstance(first_step, int) and first_step == 0


def trailing_zero_padding(x) -> Optional[str]:
  """What looks like zero padding in a concrete float `x [batch, time, features]` passed
  without lengths or a mask, or None: rows that end in all-zero frames, in runs of
  different lengths, with no all-zero frame before (zeros that are data, such as a
  background pixel, occur inside rows too)."""
  if (isinstance(x, jax.core.Tracer) or np.ndim(x) != 3
      or not jnp.issubdtype(jnp.result_type(x), jnp.floating)):
    return None
  zero = ~np.asarray(x).any(axis=-1)                                      # [B, T]
  run = np.cumprod(zero[:, ::-1], axis=1).sum(axis=1)                     # trailing zeros
  inside = zero & (np.arange(x.shape[1])[None, :] < (x.shape[1] - run)[:, None])
  if np.unique(run).size < 2 or inside.any():
    return None
  short, full = int(np.argmax(run)), int(np.argmin(run))
  return (f'inputs {tuple(x.shape)} with no lengths or mask, whose rows end in different '
          f'numbers of all-zero frames (row {short} in {run[short]}, row {full} in '
          f'{run[full]}), as padding does')


def common_step(first_step, mask: Optional[Array]):
  """The step of a training batch's first column, from each row's step `first_step`
  (an int, a scalar, or `[batch]`): the rows valid there (`mask [batch, time]`) pool
  their batch moments per step, so they must share it (rows at other steps take part as
  padding only). Rows at different steps are an error (`checks.check`, whose result is
  returned beside the step)."""
  if np.ndim(first_step) == 0:
    return first_step, True
  valid = (jnp.ones(np.shape(first_step), bool) if mask is None else mask[:, 0] > 0)
  steps = jnp.asarray(first_step)
  first = jnp.max(jnp.where(valid, steps, 0))
  low = jnp.min(jnp.where(valid, steps, first))
  ok = checks.check(low == first, 'Training rows start at different steps ({} and {}): '
                    'batch statistics pool the rows of one step, so a batch trains from one '
                    'step (rows at other steps are padding in this call).', low, first)
  return first, ok


def valid_counts(mask_tm: Optional[Array], batch: int, length: int,
                 axis_name: Optional[str]) -> Array:
  """`[T]` global number of valid sequences at each step; `mask_tm [T, B, 1]`."""
  if mask_tm is None:
    count = jnp.full((length,), batch, jnp.float32)
  else:
    count = jnp.sum(mask_tm[..., 0], axis=1)
  return count if axis_name is None else jax.lax.psum(count, axis_name)


def reverse_valid(x: Array, mask: Optional[Array]) -> Array:
  """Reverse each sequence's valid prefix in time, leaving its padding where it is.

  x: `[batch, time, ...]`; mask: `[batch, time]` with the valid steps first. Step t < L_b
  of sequence b goes to L_b - 1 - t; padded steps stay put. Applying it twice is the
  identity, so the same call maps a backward layer's outputs back to input order.

  Example:
    >>> from bn_rnn_jax import sequence
    >>> x = jnp.array([[1., 2., 3., 4.]])[..., None]   # [batch 1, time 4, features 1]
    >>> mask = jnp.array([[1., 1., 1., 0.]])           # 3 valid steps, then padding
    >>> sequence.reverse_valid(x, mask)[..., 0]
    Array([[3., 2., 1., 4.]], dtype=float32)
  """
  check_mask_prefix(mask)
  batch, time = x.shape[:2]
  steps = jnp.arange(time)[None, :]
  if mask is None:
    index = jnp.broadcast_to(time - 1 - steps, (batch, time))
  else:
    lengths = jnp.sum(mask > 0, axis=1, keepdims=True)
    index = jnp.where(steps < lengths, lengths - 1 - steps, steps)
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def global_rows(batch: int, axis_name: Optional[str]) -> Array:
  """`[batch]` global indices of this device's rows: `axis_index * batch + row`."""
  rows = jnp.arange(batch)
  if axis_name is None:
    return rows
  return jax.lax.axis_index(axis_name) * batch + rows


def per_example_keys(key: Array, batch: int, axis_name: Optional[str]) -> Array:
  """`[batch]` keys, `fold_in(key, global row)`: row r of the global batch draws the same
  numbers on 1 device or on N."""
  return jax.vmap(lambda row: jax.random.fold_in(key, row))(global_rows(batch, axis_name))


def example_dropout(x: Array, rate: float, key: Array, axis_name: Optional[str]) -> Array:
  """Inverted dropout on `[batch, ...]` with each row's mask drawn from its own key
  (`per_example_keys`): the same masks on any number of devices."""
  keys = per_example_keys(key, x.shape[0], axis_name)
  keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[1:]))(keys)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
