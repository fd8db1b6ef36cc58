"""Models built from the recurrent layers: sequence classifier and language model.

Modules only; losses and training live in `train.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import recurrent

Array = jax.Array


def last_hidden(carry: Any) -> Array:
  """The hidden state `h [B, H]` of a layer's carry (`(c, h)` LSTM, `h` RNN)."""
  return carry[1] if isinstance(carry, tuple) else carry


class SequenceClassifier(nn.Module):
  """Stacked (BN-)RNN whose last valid hidden state feeds a softmax classifier.

  The sequential-MNIST model of Cooijmans et al. sec. 5.1 is
  `SequenceClassifier(num_classes=10, variant='bn_lstm', hidden_size=100)`.

  Call: `(inputs [B, T, I], mask [B, T] | None, train=...)` -> logits `[B, num_classes]`.
  """
  num_classes: int
  variant: str = 'bn_lstm'
  hidden_size: int = 100
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool):
    carries, _ = recurrent.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, layer_options=self.layer_options,
        name='rnn')(inputs, mask, train=train)
    return nn.Dense(self.num_classes, name='classifier')(last_hidden(carries[-1]))


class LanguageModel(nn.Module):
  """Next-symbol model: embedding (or one-hot) -> stacked (BN-)LSTM -> softmax.

  Attributes:
    vocab_size: symbols.
    embed_size: embedding width; None feeds one-hot vectors (the character models of
      Cooijmans et al. sec. 5.2-5.3).
    variant, hidden_size, num_layers, dropout_rate, layer_options: as `StackedRNN`.

  Call: `(tokens [B, T] int, mask [B, T] | None, train=..., initial_carries=None)` ->
  `(final_carries, logits [B, T, vocab_size])`. Pass the returned carries back in to
  carry state across truncated-BPTT segments (Zaremba et al. 2014).
  """
  vocab_size: int
  embed_size: Optional[int] = None
  variant: str = 'bn_lstm'
  hidden_size: int = 1000
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @nn.compact
  def __call__(self, tokens: Array, mask: Optional[Array] = None, *, train: bool,
               initial_carries: Optional[Sequence[Any]] = None):
    if tokens.ndim != 2:
      raise ValueError(f'LanguageModel expects tokens [batch, time]; got {tokens.shape}.')
    if self.embed_size is None:
      x = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
    else:
      x = nn.Embed(self.vocab_size, self.embed_size, name='embed')(tokens)
    carries, h = recurrent.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, layer_options=self.layer_options,
        name='rnn')(x, mask, train=train, initial_carries=initial_carries)
    return carries, nn.Dense(self.vocab_size, name='softmax')(h)
