"""Initialisers Flax lacks: per-gate-block orthogonal and identity recurrent matrices.

A recurrent kernel of a gated cell has shape `[H, G * H]`: G square blocks side by side,
one per gate. Cooijmans et al. (sec. 5.1) initialise W_h to the identity for sequential
MNIST and orthogonally elsewhere; for a gated cell that means each `[H, H]` gate block is an
identity (or an independent orthogonal) matrix, not one `[H, 4H]` orthogonal slab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn


def _check_blocks(shape):
  if len(shape) != 2 or shape[1] % shape[0]:
    raise ValueError(f'A per-gate recurrent kernel must be [H, G*H]; got shape {shape}.')
  return shape[1] // shape[0]


def identity_blocks(scale: float = 1.0):
  """`[H, G*H]` kernel made of G identity blocks (times `scale`)."""
  def init(key, shape, dtype=jnp.float32):
    del key
    num_blocks = _check_blocks(shape)
    eye = scale * jnp.eye(shape[0], dtype=dtype)
    return jnp.tile(eye, (1, num_blocks))
  return init


def orthogonal_blocks(scale: float = 1.0):
  """`[H, G*H]` kernel made of G independent orthogonal blocks."""
  orthogonal = nn.initializers.orthogonal(scale)
  def init(key, shape, dtype=jnp.float32):
    num_blocks = _check_blocks(shape)
    keys = jax.random.split(key, num_blocks)
    return jnp.concatenate([orthogonal(k, (shape[0], shape[0]), dtype) for k in keys], axis=1)
  return init


def recurrent_initializer(name: str):
  """'orthogonal' | 'identity': the per-gate-block recurrent initialiser of that name;
  'glorot_uniform': Glorot & Bengio's U(+-sqrt(6 / (H + G*H))) over the whole kernel
  (Laurent et al. sec. 5.1)."""
  table = {'orthogonal': orthogonal_blocks(), 'identity': identity_blocks(),
           'glorot_uniform': nn.initializers.glorot_uniform()}
  if name not in table:
    raise ValueError(f'recurrent_init must be one of {sorted(table)}; got {name!r}.')
  return table[name]


def gate_bias(num_gates: int, hidden_size: int, forget_gate: int | None = None,
              forget_bias: float = 0.0):
  """Zero bias `[G*H]`, except `forget_bias` on gate block `forget_gate` (if any)."""
  def init(key, shape, dtype=jnp.float32):
    del key
    if shape != (num_gates * hidden_size,):
      raise ValueError(f'bias shape {shape} != ({num_gates} * {hidden_size},)')
    bias = jnp.zeros(shape, dtype)
    if forget_gate is not None:
      start = forget_gate * hidden_size
      bias = bias.at[start:start + hidden_size].set(forget_bias)
    return bias
  return init
