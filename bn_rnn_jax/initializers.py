"""Initialisers Flax lacks: per-gate-block orthogonal and identity recurrent kernels, and
the named presets of the papers' configs.

A gated cell's recurrent kernel `[H, G * H]` is G square blocks side by side, one per
gate, in the order (f, i, o, g). The presets are module-level values, and `Constant` is
hashable, so two layers built from one config compare equal (and share their programs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

Initializer = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class Constant:
  """`value` everywhere, as `nn.initializers.constant(value)`, but hashable and equal by
  value (`scale_init=Constant(0.1)`)."""
  value: float

  def __call__(self, key, shape, dtype=jnp.float32) -> jax.Array:
    del key
    return jnp.full(shape, self.value, dtype)


def _check_blocks(shape):
  if len(shape) != 2 or shape[1] % shape[0]:
    raise ValueError(f'A per-gate recurrent kernel must be [H, G*H]; got shape {shape}.')
  return shape[1] // shape[0]


def identity_blocks(scale: float = 1.0):
  """`[H, G*H]` kernel made of G identity blocks (times `scale`).

  Example:
    >>> from bn_rnn_jax import initializers
    >>> initializers.identity_blocks()(jax.random.key(0), (2, 4))   # H = 2, two gates
    Array([[1., 0., 1., 0.],
           [0., 1., 0., 1.]], dtype=float32)
  """
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


def identity_candidate_blocks(scale: float = 1.0):
  """`[H, G*H]` kernel: the last gate block (the candidate g of the (f, i, o, g) order)
  is `scale` times the identity, the G - 1 others independent orthogonal blocks."""
  orthogonal = orthogonal_blocks(scale)
  def init(key, shape, dtype=jnp.float32):
    num_blocks = _check_blocks(shape)
    eye = scale * jnp.eye(shape[0], dtype=dtype)
    if num_blocks == 1:
      return eye
    gates = orthogonal(key, (shape[0], (num_blocks - 1) * shape[0]), dtype)
    return jnp.concatenate([gates, eye], axis=1)
  return init


ORTHOGONAL = nn.initializers.orthogonal()
GLOROT_UNIFORM = nn.initializers.glorot_uniform()
ORTHOGONAL_BLOCKS = orthogonal_blocks()
IDENTITY_BLOCKS = identity_blocks()
IDENTITY_CANDIDATE_BLOCKS = identity_candidate_blocks()
#: W_h's initialisers by name (`config.model.recurrent_init`; the layer guide describes each).
RECURRENT_INITS = {'orthogonal': ORTHOGONAL_BLOCKS, 'identity': IDENTITY_BLOCKS,
                   'identity_candidate': IDENTITY_CANDIDATE_BLOCKS,
                   'glorot_uniform': GLOROT_UNIFORM}
#: W_x's initialisers by name (`config.model.input_init`).
INPUT_INITS = {'orthogonal': ORTHOGONAL, 'glorot_uniform': GLOROT_UNIFORM}


def recurrent_initializer(name: str) -> Initializer:
  """The recurrent (W_h) initialiser of that name (`RECURRENT_INITS`)."""
  if name not in RECURRENT_INITS:
    raise ValueError(f'recurrent_init must be one of {sorted(RECURRENT_INITS)}; got '
                     f'{name!r}.')
  return RECURRENT_INITS[name]


def input_initializer(name: str) -> Initializer:
  """The input (W_x) initialiser of that name (`INPUT_INITS`)."""
  if name not in INPUT_INITS:
    raise ValueError(f'input_init must be one of {sorted(INPUT_INITS)}; got {name!r}.')
  return INPUT_INITS[name]


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


def layer_parameters(input_size: int, hidden_size: int, *, cell: str = 'lstm',
                     recurrent_norm: Optional[str] = None, input_norm: Optional[str] = None,
                     cell_norm: Optional[str] = None,
                     scale_init: Initializer = Constant(0.1), forget_bias: float = 0.0,
                     recurrent_kernel_init: Initializer = ORTHOGONAL_BLOCKS,
                     kernel_init: Initializer = ORTHOGONAL) -> dict[str, tuple[Any, tuple]]:
  """`{name: (initializer, shape)}` of a recurrent layer's (or cell's) parameters in creation
  order: W_x `[I, G*H]`, W_h `[H, G*H]`, the bias `[G*H]`, then the scales (and the cell's
  shift) of its normalised terms; one layout for `RecurrentLayer` and the cells."""
  gates = 4 if cell == 'lstm' else 1
  width = gates * hidden_size
  params = {
      'input_kernel': (kernel_init, (input_size, width)),
      'recurrent_kernel': (recurrent_kernel_init, (hidden_size, width)),
      'bias': (gate_bias(gates, hidden_size, 0 if cell == 'lstm' else None, forget_bias),
               (width,)),
  }
  if input_norm is not None:
    params['input_scale'] = (scale_init, (width,))
  if recurrent_norm is not None:
    params['recurrent_scale' if cell == 'lstm' else 'scale'] = (scale_init, (width,))
  if cell_norm is not None:
    params['cell_scale'] = (scale_init, (hidden_size,))
    params['cell_bias'] = (nn.initializers.zeros, (hidden_size,))
  return params
