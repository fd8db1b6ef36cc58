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

  With `bidirectional=True` the classifier reads the forward direction's last valid
  hidden state and the backward direction's final state (which has read the sequence
  back to its first step), concatenated `[B, 2H]`.

  Call: `(inputs [B, T, I], mask [B, T] | None, train=...)` -> logits `[B, num_classes]`.
  """
  num_classes: int
  variant: str = 'bn_lstm'
  hidden_size: int = 100
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  bidirectional: bool = False

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool):
    carries, _ = recurrent.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, bidirectional=self.bidirectional,
        layer_options=self.layer_options, name='rnn')(inputs, mask, train=train)
    if self.bidirectional:
      forward, backward = carries[-1]
      features = jnp.concatenate([last_hidden(forward), last_hidden(backward)], axis=-1)
    else:
      features = last_hidden(carries[-1])
    return nn.Dense(self.num_classes, name='classifier')(features)


class LanguageModel(nn.Module):
  """Next-symbol model: embedding (or one-hot) -> stacked (BN-)LSTM -> softmax.

  Attributes:
    vocab_size: symbols.
    embed_size: embedding width; None feeds one-hot vectors (the character models of
      Cooijmans et al. sec. 5.2-5.3).
    variant, hidden_size, num_layers, dropout_rate, layer_options: as `StackedRNN`.

  No `bidirectional` option: a backward direction would read the very symbols the model
  is asked to predict.

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


# ------------------------------------------------------------------ frame / token tagger
_KERNEL_INITS = {'lecun_normal': nn.initializers.lecun_normal(),
                 'glorot_uniform': nn.initializers.glorot_uniform()}


class SequenceTagger(nn.Module):
  """A label at every step: (embedding | projection) -> stacked (bi)RNN -> softmax.

  Laurent et al.'s speech model (sec. 5.1) is `SequenceTagger(num_classes=3546,
  variant='bn_input_only_seq', hidden_size=250, num_layers=5, bidirectional=True)` on
  real-valued frames; with `vocab_size` set it tags token ids (Brown POS tagging).

  Attributes:
    num_classes: C, labels per step.
    vocab_size: token-id inputs `[B, T]` go through an `nn.Embed(vocab_size, embed_size)`;
      None = real-valued frames `[B, T, I]`.
    embed_size: embedding width (token ids only).
    input_projection: frames only: width of a linear projection before the stack; None
      feeds the frames to the first recurrent layer directly (as Laurent et al.).
    kernel_init: 'lecun_normal' (Flax's default) or 'glorot_uniform' (Laurent et al.) for
      the projection and softmax kernels; their biases start at zero.
    variant, hidden_size, num_layers, dropout_rate, bidirectional, layer_options: as
      `recurrent.StackedRNN`.

  Call: `(inputs, mask [B, T] | None, train=...)` -> logits `[B, T, num_classes]`.
  Logits at padded steps are those of a zero hidden state; losses must mask them.
  """
  num_classes: int
  vocab_size: Optional[int] = None
  embed_size: int = 64
  input_projection: Optional[int] = None
  kernel_init: str = 'lecun_normal'
  variant: str = 'bn_input_only_seq'
  hidden_size: int = 250
  num_layers: int = 5
  dropout_rate: float = 0.0
  bidirectional: bool = True
  layer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool):
    if self.kernel_init not in _KERNEL_INITS:
      raise ValueError(f'kernel_init must be one of {sorted(_KERNEL_INITS)}; got '
                       f'{self.kernel_init!r}.')
    kernel_init = _KERNEL_INITS[self.kernel_init]
    if self.vocab_size is not None:
      if inputs.ndim != 2:
        raise ValueError(f'SequenceTagger with vocab_size expects token ids [batch, time]; '
                         f'got shape {inputs.shape}.')
      x = nn.Embed(self.vocab_size, self.embed_size, name='embed')(inputs)
    else:
      if inputs.ndim != 3:
        raise ValueError('SequenceTagger expects frames [batch, time, features] (or set '
                         f'vocab_size for token ids); got shape {inputs.shape}.')
      x = inputs
      if self.input_projection is not None:
        x = nn.Dense(self.input_projection, kernel_init=kernel_init, name='projection')(x)
    _, h = recurrent.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, bidirectional=self.bidirectional,
        layer_options=self.layer_options, name='rnn')(x, mask, train=train)
    return nn.Dense(self.num_classes, kernel_init=kernel_init, name='softmax')(h)
