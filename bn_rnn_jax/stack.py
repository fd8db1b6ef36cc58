"""Stacks of recurrent layers: `StackedRNN` (optionally bidirectional) and `Bidirectional`.

A stack takes one layer as its template (`StackedRNN(make_layer('bn_lstm', 100,
max_length=784), num_layers=2)`) and clones it for every layer and direction, as
`nn.RNN` takes its cell. A template is a `RecurrentLayer` or any module called as one is:
`layer(inputs [B, T, I], mask [B, T] | None, *, use_running_average=, deterministic=,
return_carry=True)` -> `(carry, outputs [B, T, H])`, and also with `initial_carry=` and
`first_step=` where the stack carries state or steps (`StackedRNN.step`).

A unidirectional stack also runs one step at a time (`StackedRNN.step`, with each layer's
population rows of that step); a bidirectional one refuses, since its backward direction
starts from the end of the sequence. Both return the outputs, or `(carry, outputs)` with
`return_carry=True`, as `flax.linen.RNN`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import modes
from bn_rnn_jax import sequence

Array = jax.Array

_NO_BIDIRECTIONAL_STEP = ('A bidirectional layer cannot run one step at a time: its backward '
                          'direction reads each sequence from its last step.')


class Bidirectional(nn.Module):
  """Runs `forward_layer` in time order and `backward_layer` on each sequence's reversed
  valid part (padding stays at the end, as masked sequence-wise statistics need);
  concatenates their outputs.

  Call: `(inputs [B, T, I], mask [B, T] | None, *, use_running_average=,
  deterministic=, return_carry=False)` -> `outputs [B, T, 2H]`, or with
  `return_carry=True` `((forward_carry, backward_carry), outputs)`.
  """
  forward_layer: nn.Module
  backward_layer: nn.Module
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None, return_carry: bool = False):
    mode = modes.resolve(self, use_running_average, deterministic).kwargs()
    forward_carry, forward_out = self.forward_layer(inputs, mask, **mode, return_carry=True)
    backward_carry, backward_out = self.backward_layer(
        sequence.reverse_valid(inputs, mask), mask, **mode, return_carry=True)
    outputs = jnp.concatenate([forward_out, sequence.reverse_valid(backward_out, mask)],
                              axis=-1)
    return ((forward_carry, backward_carry), outputs) if return_carry else outputs

  def step(self, *args, **kwargs):
    del args, kwargs
    raise ValueError(_NO_BIDIRECTIONAL_STEP)


class StackedRNN(nn.Module):
  """`num_layers` clones of `layer` with Zaremba-style dropout on the non-recurrent
  connections (each layer's input and the stack's output).

  Attributes:
    layer: the template (the module docstring), cloned as `layer_{i}` (bidirectional:
      `layer_{i}` holds `forward_layer` and `backward_layer`).
    num_layers: depth.
    dropout_rate: dropout between layers, before the first and after the last.
    bidirectional: wrap each layer in `Bidirectional`.
    use_running_average, deterministic: Flax's two flags (`modes.py`), here or in the
      call.

  Call: `(inputs [B, T, I], mask [B, T] | None, *, use_running_average=,
  deterministic=, initial_carries=None, first_step=0, return_carry=False)` -> `outputs
  [B, T, H or 2H]`, or with `return_carry=True` `(final_carries, outputs)`, a carry per
  layer; `initial_carries` (one per layer) and `first_step` as `RecurrentLayer`'s
  `initial_carry` and `first_step` (unidirectional).
  """
  layer: nn.Module
  num_layers: int = 1
  dropout_rate: float = 0.0
  bidirectional: bool = False
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None,
               initial_carries: Optional[Sequence[Any]] = None, first_step=0,
               return_carry: bool = False):
    mode = modes.resolve(self, use_running_average, deterministic)
    if not isinstance(self.layer, nn.Module):
      raise ValueError('StackedRNN.layer is a template layer (a module, e.g. '
                       f"make_layer('bn_lstm', 100)); got {self.layer!r}.")
    if self.num_layers <= 0:
      raise ValueError(f'num_layers must be positive; got {self.num_layers}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'dropout_rate must be in [0, 1); got {self.dropout_rate}.')
    if initial_carries is not None and self.bidirectional:
      raise ValueError('initial_carries are for unidirectional stacks (carried state).')
    if self.bidirectional and not sequence.starts_at_zero(first_step):
      raise ValueError(_NO_BIDIRECTIONAL_STEP)
    carries, x = [], inputs
    for index in range(self.num_layers):
      x = self._dropout(x, mode.deterministic)
      name = f'layer_{index}'
      if self.bidirectional:
        layer = Bidirectional(self.layer.clone(parent=None), self.layer.clone(parent=None),
                              name=name)
        carry, x = layer(x, mask, **mode.kwargs(), return_carry=True)
      else:
        # Carried state and steps only where asked, so that a template need not take them.
        extra = {'return_carry': True}
        if initial_carries is not None:
          extra['initial_carry'] = initial_carries[index]
        if not sequence.starts_at_zero(first_step):
          extra['first_step'] = first_step
        carry, x = self.layer.clone(parent=self, name=name)(x, mask, **mode.kwargs(), **extra)
      carries.append(carry)
    x = self._dropout(x, mode.deterministic)
    return (carries, x) if return_carry else x

  def step(self, carries: Optional[Sequence[Any]], x: Array, t, mask: Optional[Array] = None):
    """One inference step of every layer: `(carries, x_t [B, I], t)` -> `(carries, h_t
    [B, H])` (`RecurrentLayer.step`; carries None: the initial states)."""
    if self.bidirectional:
      raise ValueError(_NO_BIDIRECTIONAL_STEP)
    if x.ndim != 2:
      raise ValueError(f'StackedRNN.step expects x [batch, features]; got {x.shape}.')
    carries, outputs = self(x[:, None], None if mask is None else mask[:, None],
                            **modes.EVAL.kwargs(), initial_carries=carries, first_step=t,
                            return_carry=True)
    return carries, outputs[:, 0]

  def _dropout(self, x: Array, deterministic: bool) -> Array:
    """Dropout with per-example masks (`sequence.example_dropout`), unless deterministic."""
    if deterministic or self.dropout_rate == 0.0:
      return x
    return sequence.example_dropout(x, self.dropout_rate, self.make_rng('dropout'),
                                    getattr(self.layer, 'axis_name', None))
