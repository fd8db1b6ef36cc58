"""Stacks of recurrent layers: `StackedRNN` (optionally bidirectional) and `Bidirectional`.

A unidirectional stack also runs one step at a time (`StackedRNN.step`, with each layer's
population rows of that step); a bidirectional one refuses, since its backward direction
starts from the end of the sequence.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import modes
from bn_rnn_jax import sequence
from bn_rnn_jax import variants

Array = jax.Array


class Bidirectional(nn.Module):
  """Runs `forward_layer` in time order and `backward_layer` on each sequence's reversed
  valid part (padding stays at the end, as masked sequence-wise statistics need);
  concatenates their outputs.

  Call: `(inputs [B, T, I], mask [B, T] | None, train=... | use_running_average=...,
  deterministic=...)` (`modes.py`) -> `((forward_carry, backward_carry), outputs
  [B, T, 2H])`.
  """
  forward_layer: nn.Module
  backward_layer: nn.Module

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               train: Optional[bool] = None, use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    mode = modes.resolve(train, use_running_average, deterministic).kwargs()
    forward_carry, forward_out = self.forward_layer(inputs, mask, **mode)
    backward_carry, backward_out = self.backward_layer(
        sequence.reverse_valid(inputs, mask), mask, **mode)
    outputs = jnp.concatenate([forward_out, sequence.reverse_valid(backward_out, mask)],
                              axis=-1)
    return (forward_carry, backward_carry), outputs

  def step(self, *args, **kwargs):
    del args, kwargs
    raise ValueError(_NO_BIDIRECTIONAL_STEP)


_NO_BIDIRECTIONAL_STEP = ('A bidirectional layer cannot run one step at a time: its backward '
                          'direction reads each sequence from its last step.')


class StackedRNN(nn.Module):
  """`num_layers` recurrent layers with Zaremba-style dropout on the non-recurrent
  connections (each layer's input and the stack's output).

  Attributes:
    variant: a name in `variants.VARIANTS`.
    hidden_size: units per layer (per direction).
    num_layers: depth.
    dropout_rate: dropout between layers, before the first and after the last.
    bidirectional: wrap each layer in `Bidirectional`.
    layer_options: `RecurrentLayer` field overrides (`variants.LayerOptions`; a dict is
      converted), e.g. `{'max_length': 784, 'axis_name': 'batch'}`.

  Call: `(inputs [B, T, I], mask [B, T] | None, train=... | use_running_average=...,
  deterministic=... (`modes.py`), initial_carries=None, first_step=0)` -> `(final_carries: list per layer, outputs [B, T, H or 2H])`;
  `first_step` as `RecurrentLayer` (inference, unidirectional).
  """
  variant: str
  hidden_size: int
  num_layers: int = 1
  dropout_rate: float = 0.0
  bidirectional: bool = False
  layer_options: Mapping[str, Any] = variants.LayerOptions()

  def __post_init__(self):
    # A hashable model can be a static jit argument (`population.estimate_population_stats`).
    object.__setattr__(self, 'layer_options', variants.as_layer_options(self.layer_options))
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               train: Optional[bool] = None, use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None,
               initial_carries: Optional[Sequence[Any]] = None, first_step=0):
    mode = modes.resolve(train, use_running_average, deterministic)
    if self.num_layers <= 0:
      raise ValueError(f'num_layers must be positive; got {self.num_layers}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'dropout_rate must be in [0, 1); got {self.dropout_rate}.')
    if initial_carries is not None and self.bidirectional:
      raise ValueError('initial_carries are for unidirectional stacks (carried state).')
    if self.bidirectional and not (isinstance(first_step, int) and first_step == 0):
      raise ValueError(_NO_BIDIRECTIONAL_STEP)
    options = dict(self.layer_options)
    axis_name = options.get('axis_name')
    carries = []
    x = inputs
    for index in range(self.num_layers):
      x = self._dropout(x, mode.deterministic, axis_name)
      if self.bidirectional:
        layer = Bidirectional(variants.make_layer(self.variant, self.hidden_size, **options),
                              variants.make_layer(self.variant, self.hidden_size, **options),
                              name=f'layer_{index}')
        carry, x = layer(x, mask, **mode.kwargs())
      else:
        layer = variants.make_layer(self.variant, self.hidden_size, **options,
                                    name=f'layer_{index}')
        start = None if initial_carries is None else initial_carries[index]
        carry, x = layer(x, mask, **mode.kwargs(), initial_carry=start,
                         first_step=first_step)
      carries.append(carry)
    x = self._dropout(x, mode.deterministic, axis_name)
    return carries, x

  def step(self, carries: Optional[Sequence[Any]], x: Array, t, mask: Optional[Array] = None):
    """One inference step of every layer: `(carries, x_t [B, I], t)` -> `(carries, h_t
    [B, H])` (`RecurrentLayer.step`; carries None: the initial states)."""
    if self.bidirectional:
      raise ValueError(_NO_BIDIRECTIONAL_STEP)
    if x.ndim != 2:
      raise ValueError(f'StackedRNN.step expects x [batch, features]; got {x.shape}.')
    carries, outputs = self(x[:, None], None if mask is None else mask[:, None], train=False,
                            initial_carries=carries, first_step=t)
    return carries, outputs[:, 0]

  def _dropout(self, x: Array, deterministic: bool, axis_name: Optional[str]) -> Array:
    """Dropout with per-example masks (`sequence.example_dropout`), unless deterministic."""
    if deterministic or self.dropout_rate == 0.0:
      return x
    return sequence.example_dropout(x, self.dropout_rate, self.make_rng('dropout'), axis_name)
