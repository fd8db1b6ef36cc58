"""Models built from the recurrent layers: sequence classifier, language model, frame
tagger (Laurent et al. sec. 5.1) and Attentive Reader (Cooijmans et al. sec. 5.4).

Modules only; losses and metrics live in `training/tasks.py`, training in
`training/train.py`. Each model takes `layer_options` (`variants.LayerOptions`, or a
dict), the `RecurrentLayer` fields of its recurrent stack. Each model's call takes Flax's
pair `use_running_average=` / `deterministic=` (`modes.py`), as its layers do. The
classifier, the tagger and the reader return logits; the language model returns logits,
or `(carries, logits)` with `return_carry=True` (the state carried across truncated-BPTT
segments), as the layers return outputs or `(carry, outputs)`.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import modes
from bn_rnn_jax import stack
from bn_rnn_jax import variants

Array = jax.Array


def last_hidden(carry: Any) -> Array:
  """The hidden state `h [B, H]` of a layer's carry (`(c, h)` LSTM, `h` RNN)."""
  return carry[1] if isinstance(carry, tuple) else carry


def final_hidden(carry: Any, bidirectional: bool) -> Array:
  """The last valid hidden state of a layer, `[B, H]`; of a `Bidirectional` layer (carry
  `(forward, backward)`), both directions' `[B, 2H]` (the backward one has read each
  sequence back to its first step)."""
  if bidirectional:
    forward, backward = carry
    return jnp.concatenate([last_hidden(forward), last_hidden(backward)], axis=-1)
  return last_hidden(carry)


class SequenceClassifier(nn.Module):
  """Stacked (BN-)RNN whose last valid hidden state feeds a softmax classifier.

  The sequential-MNIST model of Cooijmans et al. sec. 5.1 is
  `SequenceClassifier(num_classes=10, variant='bn_lstm', hidden_size=100)`.

  With `bidirectional=True` the classifier reads the forward direction's last valid
  hidden state and the backward direction's final state (which has read the sequence
  back to its first step), concatenated `[B, 2H]`.

  Call: `(inputs [B, T, I], mask [B, T] | None, use_running_average=...,
  deterministic=...)` -> logits `[B, num_classes]`.
  """
  num_classes: int
  variant: str = 'bn_lstm'
  hidden_size: int = 100
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = variants.LayerOptions()
  bidirectional: bool = False

  def __post_init__(self):
    object.__setattr__(self, 'layer_options', variants.as_layer_options(self.layer_options))
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    mode = modes.resolve(use_running_average, deterministic).kwargs()
    carries, _ = stack.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, bidirectional=self.bidirectional,
        layer_options=self.layer_options, name='rnn')(inputs, mask, **mode,
                                                      return_carry=True)
    features = final_hidden(carries[-1], self.bidirectional)
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

  Call: `(tokens [B, T] int, mask [B, T] | None, use_running_average=...,
  deterministic=..., initial_carries=None, first_step=0, return_carry=False)` -> `logits
  [B, T, vocab_size]`, or with `return_carry=True` `(final_carries, logits)`, a carry per
  layer. Pass the returned carries back in to carry state across truncated-BPTT segments
  (Zaremba et al. 2014).
  `step` runs one symbol at a time (sampling; `experiments/sample.py`).
  """
  vocab_size: int
  embed_size: Optional[int] = None
  variant: str = 'bn_lstm'
  hidden_size: int = 1000
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = variants.LayerOptions()

  def __post_init__(self):
    object.__setattr__(self, 'layer_options', variants.as_layer_options(self.layer_options))
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None,
               initial_carries: Optional[Sequence[Any]] = None, first_step=0,
               return_carry: bool = False):
    mode = modes.resolve(use_running_average, deterministic).kwargs()
    if tokens.ndim != 2:
      raise ValueError(f'LanguageModel expects tokens [batch, time]; got {tokens.shape}.')
    if self.embed_size is None:
      x = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
    else:
      x = nn.Embed(self.vocab_size, self.embed_size, name='embed')(tokens)
    carries, h = stack.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, layer_options=self.layer_options,
        name='rnn')(x, mask, **mode, initial_carries=initial_carries,
                    first_step=first_step, return_carry=True)
    logits = nn.Dense(self.vocab_size, name='softmax')(h)
    return (carries, logits) if return_carry else logits

  def step(self, carries: Optional[Sequence[Any]], tokens: Array, t,
           mask: Optional[Array] = None):
    """One inference step: `(carries, tokens_t [B] int, t)` -> `(carries, logits [B,
    vocab_size])`, each layer normalised with its population row `min(t, last trained
    row)`; carries None: the initial states. `model.apply(variables, carries, tokens, t,
    method='step')`; stepping t = 0, 1, ... equals `__call__` on the whole sequence."""
    if tokens.ndim != 1:
      raise ValueError(f'LanguageModel.step expects tokens [batch]; got {tokens.shape}.')
    carries, logits = self(tokens[:, None], None if mask is None else mask[:, None],
                           **modes.EVAL.kwargs(), initial_carries=carries, first_step=t,
                           return_carry=True)
    return carries, logits[:, 0]


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
      `stack.StackedRNN`.

  Call: `(inputs, mask [B, T] | None, use_running_average=..., deterministic=...)` ->
  logits `[B, T, num_classes]`.
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
  layer_options: Mapping[str, Any] = variants.LayerOptions()

  def __post_init__(self):
    object.__setattr__(self, 'layer_options', variants.as_layer_options(self.layer_options))
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    mode = modes.resolve(use_running_average, deterministic).kwargs()
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
    h = stack.StackedRNN(
        variant=self.variant, hidden_size=self.hidden_size, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, bidirectional=self.bidirectional,
        layer_options=self.layer_options, name='rnn')(x, mask, **mode)
    return nn.Dense(self.num_classes, kernel_init=kernel_init, name='softmax')(h)


# ==================================================================== attentive reader
#: Cooijmans et al. sec. 5.4 / App. C, after Hermann et al. 2015. The reader variants:
#: the recurrent layers' `VARIANTS` preset, their overrides, bidirectional encoders, and the
#: statistics of the batch norms in the attention (None = no batch norm there).
READER_VARIANTS: dict[str, dict[str, Any]] = {
    'lstm': dict(layer='lstm'),
    # BN-LSTM and BN-everywhere as the paper ran them: moments biased by zero padding.
    'bn_lstm': dict(layer='bn_lstm', overrides=dict(padded_statistics=True)),
    'bn_everywhere': dict(layer='bn_lstm', overrides=dict(padded_statistics=True),
                          attention_norm='per_step'),
    # BN-e*: sequence-wise masked statistics for the input terms (Laurent eq. 20-21), per-step
    # masked ones for the recurrent terms and the cell.
    'bn_e_star': dict(layer='bn_lstm', overrides=dict(statistics='sequence'),
                      attention_norm='sequence'),
    # BN-e**: BN-e*, bidirectional; the backward layers reverse each sequence's valid part.
    'bn_e_star_star': dict(layer='bn_lstm', overrides=dict(statistics='sequence'),
                           attention_norm='sequence', bidirectional=True),
    'lstm_bidirectional': dict(layer='lstm', bidirectional=True),
}

#: Logit of an entity that is not a candidate: finite, so that log-softmax and its gradient
#: stay NaN-free, and exp(NON_CANDIDATE_LOGIT - max) is exactly 0 in float32.
NON_CANDIDATE_LOGIT = -1e30


class AttentiveReader(nn.Module):
  """The Attentive Reader (Hermann et al. 2015) with the BN variants of Cooijmans sec. 5.4.

    y_d(t) = document encoder (uni- or bidirectional stacked (BN-)LSTM), u = the query
    encoder's final state;  m(t) = tanh(N(W_ym y_d(t)) + N(W_um u));
    s(t) = softmax_t(w^T m(t)) over the valid document steps (padding: exactly 0);
    r = sum_t s(t) y_d(t);  g = tanh(N(W_rg r) + N(W_ug u));
    logits = W_g g + b over the entity vocabulary, non-candidates set to
    `NON_CANDIDATE_LOGIT` (never predicted).

  N is the identity, or a batch norm with its own gamma, beta (`MaskedBatchNorm`) in the
  BN-everywhere variants: per-step masked statistics for W_ym y_d ('per_step',
  BN-everywhere)
  or sequence-wise masked ones ('sequence', BN-e*, BN-e**); batch statistics for the
  `[B, F]` terms.

  Attributes:
    vocab_size, num_entities: from the dataset (`input_pipeline/reading.py`).
    variant: a name in `READER_VARIANTS`.
    hidden_size: units per encoder direction (App. C: 240).
    embed_size: word embedding width (None = hidden_size).
    num_layers, dropout_rate, layer_options: as `StackedRNN` (max_length, axis_name, ...).

  Call: `(inputs, mask=None, use_running_average=..., deterministic=...)`, inputs the
  dict of `reading.py`'s batches (`document`, `document_mask` `[B, T]`, `query`,
  `query_mask` `[B, Q]`, `candidates` `[B, E]`); `mask` is unused (both masks are in
  `inputs`). Returns logits `[B, E]`; the attention `s [B, T]` is sown as
  `intermediates/attention`.
  """
  vocab_size: int
  num_entities: int
  variant: str = 'lstm'
  hidden_size: int = 240
  embed_size: Optional[int] = None
  num_layers: int = 1
  dropout_rate: float = 0.0
  layer_options: Mapping[str, Any] = variants.LayerOptions()

  def __post_init__(self):
    object.__setattr__(self, 'layer_options', variants.as_layer_options(self.layer_options))
    super().__post_init__()

  def _spec(self) -> dict[str, Any]:
    if self.variant not in READER_VARIANTS:
      raise ValueError(f'Unknown attentive-reader variant {self.variant!r}; choose one of '
                       f'{sorted(READER_VARIANTS)}.')
    return READER_VARIANTS[self.variant]

  def _norm(self, statistics: Optional[str], name: str):
    """`N(x, mask, **mode)` of one attention term: identity or `MaskedBatchNorm`."""
    if statistics is None:
      return lambda x, mask, **mode: x
    o = self.layer_options
    keep = {k: o[k] for k in ('max_length', 'momentum', 'epsilon', 'axis_name',
                              'scale_init', 'min_row_support') if o.get(k) is not None}
    if 'execution' in o:
      keep['batch_sums'] = o['execution'].batch_sums
    norm = batch_stats.MaskedBatchNorm(statistics=statistics, name=name, **keep)
    return lambda x, mask, use_running_average, deterministic: norm(
        x, mask, use_running_average=use_running_average)

  @nn.compact
  def __call__(self, inputs: Mapping[str, Array], mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None
               ) -> Array:
    del mask
    mode = modes.resolve(use_running_average, deterministic).kwargs()
    spec = self._spec()
    document, query = inputs['document'], inputs['query']
    document_mask = inputs['document_mask'].astype(jnp.float32)
    query_mask = inputs['query_mask'].astype(jnp.float32)
    if document.ndim != 2 or document_mask.shape != document.shape:
      raise ValueError(f'AttentiveReader expects document and document_mask [batch, time]; '
                       f'got {document.shape} and {document_mask.shape}.')
    embed = nn.Embed(self.vocab_size, self.embed_size or self.hidden_size, name='embed')
    # Padded steps read zeros whatever their ids: the padding-biased statistics of
    # 'bn_lstm' then see the paper's zero padding, and junk in the padding changes nothing.
    x_d = jnp.where(document_mask[..., None] > 0, embed(document), 0.0)
    x_q = jnp.where(query_mask[..., None] > 0, embed(query), 0.0)
    options = self.layer_options.replace(**spec.get('overrides', {}))
    encoder = functools.partial(
        stack.StackedRNN, variant=spec['layer'], hidden_size=self.hidden_size,
        num_layers=self.num_layers, dropout_rate=self.dropout_rate,
        bidirectional=spec.get('bidirectional', False), layer_options=options)
    y_d = encoder(name='document_encoder')(x_d, document_mask, **mode)     # [B, T, D]
    query_carries, _ = encoder(name='query_encoder')(x_q, query_mask, **mode,
                                                     return_carry=True)
    u = final_hidden(query_carries[-1], spec.get('bidirectional', False))     # [B, D]
    width = y_d.shape[-1]

    term_norm = spec.get('attention_norm')
    flat_norm = term_norm  # on [B, F] terms: one row of batch statistics either way
    dense = lambda name: nn.Dense(width, use_bias=False, name=name)
    y_m = self._norm(term_norm, 'document_attention_norm')(
        dense('document_attention')(y_d), document_mask, **mode)             # W_ym y_d(t)
    u_m = self._norm(flat_norm, 'query_attention_norm')(
        dense('query_attention')(u), None, **mode)                           # W_um u
    m = jnp.tanh(y_m + u_m[:, None, :])
    scores = nn.Dense(1, use_bias=False, name='attention_score')(m)[..., 0]  # w^T m(t)
    valid = document_mask > 0
    scores = jnp.where(valid, scores, NON_CANDIDATE_LOGIT)
    attention = jnp.where(valid, jax.nn.softmax(scores, axis=-1), 0.0)      # s(t)
    self.sow('intermediates', 'attention', attention)
    r = jnp.einsum('bt,btd->bd', attention, y_d)
    r_g = self._norm(flat_norm, 'read_combination_norm')(
        dense('read_combination')(r), None, **mode)                         # W_rg r
    u_g = self._norm(flat_norm, 'query_combination_norm')(
        dense('query_combination')(u), None, **mode)                        # W_ug u
    g = jnp.tanh(r_g + u_g)
    logits = nn.Dense(self.num_entities, name='output')(g)
    return jnp.where(inputs['candidates'] > 0, logits, NON_CANDIDATE_LOGIT)
