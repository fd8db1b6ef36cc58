"""Stacks of recurrent layers: `StackedRNN` (optionally bidirectional) and `Bidirectional`.

A unidirectional stack also runs one step at a time (`StackedRNN.step`, with each layer's
population rows of that step); a bidirectional one refuses, since its backward direction
starts from the end of the sequence.

Both return the outputs, or `(carry, outputs)` with `return_carry=True`, as
`flax.linen.RNN` (`RecurrentLayer`).
`StackedRNN` builds its layers from a variant name or from a *layer factory*: any
callable `factory(hidden_size, name=..., **layer_options) -> module`, e.g.
`functools.partial(RecurrentLayer, cell='rnn', max_length=100)` or a module class of
your own. The module is called as a `RecurrentLayer` is: `layer(inputs [B, T, I], mask
[B, T] | None, *, use_running_average=, deterministic=, return_carry=True)` ->
`(carry, outputs [B, T, H])`, and also with `initial_carry=` and `first_step=` where the
stack carries state or steps (`StackedRNN.step`). A Flax cell runs in a stack through
such a module around `nn.RNN` (the layer guide has one).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

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

  Call: `(inputs [B, T, I], mask [B, T] | None, use_running_average=...,
  deterministic=... (`modes.py`), return_carry=False)` -> `outputs [B, T, 2H]`, or with
  `return_carry=True` `((forward_carry, backward_carry), outputs)`. Each direction is
  called with `return_carry=True` (a `RecurrentLayer`, or a module that answers as one).
  """
  forward_layer: nn.Module
  backward_layer: nn.Module

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None, return_carry: bool = False):
    mode = modes.resolve(use_running_average, deterministic).kwargs()
    mode['return_carry'] = True
    forward_carry, forward_out = self.forward_layer(inputs, mask, **mode)
    backward_carry, backward_out = self.backward_layer(
        sequence.reverse_valid(inputs, mask), mask, **mode)
    outputs = jnp.concatenate([forward_out, sequence.reverse_valid(backward_out, mask)],
                              axis=-1)
    return ((forward_carry, backward_carry), outputs) if return_carry else outputs

  def step(self, *args, **kwargs):
    del args, kwargs
    raise ValueError(_NO_BIDIRECTIONAL_STEP)


_NO_BIDIRECTIONAL_STEP = ('A bidirectional layer cannot run one step at a time: its backward '
                          'direction reads each sequence from its last step.')


class StackedRNN(nn.Module):
  """`num_layers` recurrent layers with Zaremba-style dropout on the non-recurrent
  connections (each layer's input and the stack's output).

  Attributes:
    variant: a name in `variants.VARIANTS`, or a layer factory (the module docstring):
      `factory(hidden_size, name=..., **layer_options)` builds each layer (each
      direction).
    hidden_size: units per layer (per direction).
    num_layers: depth.
    dropout_rate: dropout between layers, before the first and after the last.
    bidirectional: wrap each layer in `Bidirectional`.
    layer_options: `RecurrentLayer` field overrides (`variants.LayerOptions`; a dict is
      converted), e.g. `{'max_length': 784, 'axis_name': 'batch'}`; passed to a factory
      as keyword arguments.

  Call: `(inputs [B, T, I], mask [B, T] | None, use_running_average=...,
  deterministic=... (`modes.py`), initial_carries=None, first_step=0,
  return_carry=False)` -> `outputs [B, T, H or 2H]`, or with `return_carry=True`
  `(final_carries, outputs)`, a carry per layer; `initial_carries` (one per layer) and
  `first_step` as `RecurrentLayer`'s `initial_carry` and `first_step` (unidirectional).
  """
  variant: Union[str, Callable[..., nn.Module]]
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
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None,
               initial_carries: Optional[Sequence[Any]] = None, first_step=0,
               return_carry: bool = False):
    mode = modes.resolve(use_running_average, deterministic)
    if self.num_layers <= 0:
      raise ValueError(f'num_layers must be positive; got {self.num_layers}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'dropout_rate must be in [0, 1); got {self.dropout_rate}.')
    if initial_carries is not None and self.bidirectional:
      raise ValueError('initial_carries are for unidirectional stacks (carried state).')
    if self.bidirectional and not sequence.starts_at_zero(first_step):
      raise ValueError(_NO_BIDIRECTIONAL_STEP)
    axis_name = self.layer_options.get('axis_name')
    carries = []
    x = inputs
    for index in range(self.num_layers):
      x = self._dropout(x, mode.deterministic, axis_name)
      if self.bidirectional:
        layer = Bidirectional(self._layer(None), self._layer(None), name=f'layer_{index}')
        carry, x = layer(x, mask, **mode.kwargs(), return_carry=True)
      else:
        # Carried state and steps only where asked, so that a factory's layer need not
        # take them otherwise.
        extra = {'return_carry': True}
        if initial_carries is not None:
          extra['initial_carry'] = initial_carries[index]
        if not sequence.starts_at_zero(first_step):
          extra['first_step'] = first_step
        carry, x = self._layer(f'layer_{index}')(x, mask, **mode.kwargs(), **extra)
      carries.append(carry)
    x = self._dropout(x, mode.deterministic, axis_name)
    return (carries, x) if return_carry else x

  def _layer(self, name: Optional[str]) -> nn.Module:
    """One layer (one direction): of the variant named `variant`, or the factory's."""
    if isinstance(self.variant, nn.Module) or not (isinstance(self.variant, str)
                                                   or callable(self.variant)):
      got = (f'a {type(self.variant).__name__} instance' if isinstance(self.variant, nn.Module)
             else repr(self.variant))
      raise ValueError('StackedRNN.variant must be a name in VARIANTS or a layer factory, '
                       'factory(hidden_size, name=...) -> module (a module class, or a '
                       f'functools.partial of one); got {got}.')
    if isinstance(self.variant, str):
      return variants.make_layer(self.variant, self.hidden_size, name=name,
                                 **self.layer_options)
    return self.variant(self.hidden_size, name=name, **self.layer_options)

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

  def _dropout(self, x: Array, deterministic: bool, axis_name: Optional[str]) -> Array:
    """Dropout with per-example masks (`sequence.example_dropout`), unless deterministic."""
    if deterministic or self.dropout_rate == 0.0:
      return x
    return sequence.example_dropout(x, self.dropout_rate, self.make_rng('dropout'), axis_name)
