"""Models built from the recurrent layers: sequence classifier, language model, frame
tagger (Laurent et al. sec. 5.1) and Attentive Reader (Cooijmans et al. sec. 5.4).

Modules only; losses and metrics live in `training/tasks.py`, training in
`training/train.py`. Each model takes its recurrent layer as a template (`layer=
make_layer('bn_lstm', 100, max_length=784)`), cloned for every layer and direction of its
stack (`stack.StackedRNN`), and Flax's two flags `use_running_average` / `deterministic`
(`modes.py`) as fields or in the call. The classifier, the tagger and the reader return
logits; the language model returns logits, or `(carries, logits)` with
`return_carry=True` (the state carried across truncated-BPTT segments), as the layers
return outputs or `(carry, outputs)`.
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


def with_layer_fields(model: nn.Module, **fields) -> nn.Module:
  """`model` (a model or stack of this module) with its layer template's `fields` set,
  e.g. `axis_name=None` to apply a trainer's model outside `pmap`."""
  return model.clone(layer=model.layer.clone(**fields))


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
  `SequenceClassifier(10, make_layer('bn_lstm', 100, max_length=784))`.

  With `bidirectional=True` the classifier reads the forward direction's last valid
  hidden state and the backward direction's final state (which has read the sequence
  back to its first step), concatenated `[B, 2H]`.

  Attributes:
    num_classes: C.
    layer, num_layers, dropout_rate, bidirectional: the recurrent stack's
      (`stack.StackedRNN`).
    use_running_average, deterministic: Flax's two flags (`modes.py`).

  Call: `(inputs [B, T, I], mask [B, T] | None, *, use_running_average=,
  deterministic=)` -> logits `[B, num_classes]`.
  """
  num_classes: int
  layer: nn.Module
  num_layers: int = 1
  dropout_rate: float = 0.0
  bidirectional: bool = False
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    mode = modes.resolve(self, use_running_average, deterministic).kwargs()
    carries, _ = stack.StackedRNN(
        self.layer, num_layers=self.num_layers, dropout_rate=self.dropout_rate,
        bidirectional=self.bidirectional, name='rnn')(inputs, mask, **mode, return_carry=True)
    features = final_hidden(carries[-1], self.bidirectional)
    return nn.Dense(self.num_classes, name='classifier')(features)


class LanguageModel(nn.Module):
  """Next-symbol model: embedding (or one-hot) -> stacked (BN-)LSTM -> softmax.

  Attributes:
    vocab_size: symbols.
    embed_size: embedding width; None feeds one-hot vectors (the character models of
      Cooijmans et al. sec. 5.2-5.3).
    layer, num_layers, dropout_rate: the recurrent stack's (`stack.StackedRNN`).
    use_running_average, deterministic: Flax's two flags (`modes.py`).

  No `bidirectional` option: a backward direction would read the very symbols the model
  is asked to predict.

  Call: `(tokens [B, T] int, mask [B, T] | None, *, use_running_average=,
  deterministic=, initial_carries=None, first_step=0, return_carry=False)` -> `logits
  [B, T, vocab_size]`, or with `return_carry=True` `(final_carries, logits)`, a carry per
  layer. Pass the returned carries back in to carry state across truncated-BPTT segments
  (Zaremba et al. 2014).
  `step` runs one symbol at a time (sampling; `experiments/sample.py`).
  """
  vocab_size: int
  layer: nn.Module
  embed_size: Optional[int] = None
  num_layers: int = 1
  dropout_rate: float = 0.0
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  @nn.compact
  def __call__(self, tokens: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None,
               initial_carries: Optional[Sequence[Any]] = None, first_step=0,
               return_carry: bool = False):
    mode = modes.resolve(self, use_running_average, deterministic).kwargs()
    if tokens.ndim != 2:
      raise ValueError(f'LanguageModel expects tokens [batch, time]; got {tokens.shape}.')
    if self.embed_size is None:
      x = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
    else:
      x = nn.Embed(self.vocab_size, self.embed_size, name='embed')(tokens)
    carries, h = stack.StackedRNN(
        self.layer, num_layers=self.num_layers, dropout_rate=self.dropout_rate,
        name='rnn')(x, mask, **mode, initial_carries=initial_carries, first_step=first_step,
                    return_carry=True)
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

  Laurent et al.'s speech model (sec. 5.1) is `SequenceTagger(3546,
  make_layer('bn_input_only_seq', 250), num_layers=5, bidirectional=True)` on
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
    layer, num_layers, dropout_rate, bidirectional: the recurrent stack's
      (`stack.StackedRNN`).
    use_running_average, deterministic: Flax's two flags (`modes.py`).

  Call: `(inputs, mask [B, T] | None, *, use_running_average=, deterministic=)` ->
  logits `[B, T, num_classes]`.
  Logits at padded steps are those of a zero hidden state; losses must mask them.
  """
  num_classes: int
  layer: nn.Module
  vocab_size: Optional[int] = None
  embed_size: int = 64
  input_projection: Optional[int] = None
  kernel_init: str = 'lecun_normal'
  num_layers: int = 5
  dropout_rate: float = 0.0
  bidirectional: bool = True
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None):
    mode = modes.resolve(self, use_running_average, deterministic).kwargs()
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
        self.layer, num_layers=self.num_layers, dropout_rate=self.dropout_rate,
        bidirectional=self.bidirectional, name='rnn')(x, mask, **mode)
    return nn.Dense(self.num_classes, kernel_init=kernel_init, name='softmax')(h)


# ==================================================================== attentive reader
#: Cooijmans et al. sec. 5.4 / App. C, after Hermann et al. 2015: the reader variants as
#: the recurrent layers' `VARIANTS` preset, its overrides, and the reader's fields.
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


def attentive_reader(variant: str, vocab_size: int, num_entities: int, features: int = 240,
                     *, layer_fields: Mapping[str, Any] = (), **fields) -> 'AttentiveReader':
  """The `READER_VARIANTS` reader `variant`: its layer (`variants.make_layer` of the
  variant's preset with `features` units, `layer_fields` and the variant's overrides) and
  fields, with `fields` (`embed_size`, `num_layers`, ...) set."""
  if variant not in READER_VARIANTS:
    raise ValueError(f'Unknown attentive-reader variant {variant!r}; choose one of '
                     f'{sorted(READER_VARIANTS)}.')
  spec = dict(READER_VARIANTS[variant])
  layer = variants.make_layer(spec.pop('layer'), features,
                              **{**dict(layer_fields), **spec.pop('overrides', {})})
  return AttentiveReader(vocab_size, num_entities, layer, **spec, **fields)


class AttentiveReader(nn.Module):
  """The Attentive Reader (Hermann et al. 2015) with the BN variants of Cooijmans sec. 5.4
  (`attentive_reader` builds them by name).

    y_d(t) = document encoder (uni- or bidirectional stacked (BN-)LSTM), u = the query
    encoder's final state;  m(t) = tanh(N(W_ym y_d(t)) + N(W_um u));
    s(t) = softmax_t(w^T m(t)) over the valid document steps (padding: exactly 0);
    r = sum_t s(t) y_d(t);  g = tanh(N(W_rg r) + N(W_ug u));
    logits = W_g g + b over the entity vocabulary, non-candidates set to
    `NON_CANDIDATE_LOGIT` (never predicted).

  N is the identity, or a batch norm with its own gamma, beta (`MaskedBatchNorm`, with the
  layer's statistics settings) in the BN-everywhere variants: per-step masked statistics
  for W_ym y_d ('per_step', BN-everywhere) or sequence-wise masked ones ('sequence', BN-e*,
  BN-e**); batch statistics for the `[B, F]` terms.

  Attributes:
    vocab_size, num_entities: from the dataset (`input_pipeline/reading.py`).
    layer: the encoders' layer template (`stack.StackedRNN`; App. C: 240 units).
    attention_norm: None, 'per_step' or 'sequence': the statistics of N.
    bidirectional: bidirectional encoders.
    embed_size: word embedding width (None = the layer's `features`).
    num_layers, dropout_rate: the encoders' (`stack.StackedRNN`).
    use_running_average, deterministic: Flax's two flags (`modes.py`).

  Call: `(inputs, mask=None, *, use_running_average=, deterministic=)`, inputs the dict
  of `reading.py`'s batches (`document`, `document_mask` `[B, T]`, `query`, `query_mask`
  `[B, Q]`, `candidates` `[B, E]`); `mask` is unused (both masks are in `inputs`). Returns
  logits `[B, E]`; the attention `s [B, T]` is sown as `intermediates/attention`.
  """
  vocab_size: int
  num_entities: int
  layer: nn.Module
  attention_norm: Optional[str] = None
  bidirectional: bool = False
  embed_size: Optional[int] = None
  num_layers: int = 1
  dropout_rate: float = 0.0
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  def _norm(self, name: str):
    """`N(x, mask, use_running_average)` of one attention term: identity or
    `MaskedBatchNorm`, with the layer's statistics settings."""
    if self.attention_norm is None:
      return lambda x, mask, use_running_average: x
    keep = {k: getattr(self.layer, k) for k in ('max_length', 'momentum', 'epsilon',
                                                'axis_name', 'scale_init', 'min_row_support')
            if getattr(self.layer, k, None) is not None}
    execution = getattr(self.layer, 'execution', None)
    if execution is not None:
      keep['batch_sums'] = execution.batch_sums
    norm = batch_stats.MaskedBatchNorm(statistics=self.attention_norm, name=name, **keep)
    return lambda x, mask, use_running_average: norm(
        x, mask, use_running_average=use_running_average)

  @nn.compact
  def __call__(self, inputs: Mapping[str, Array], mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None
               ) -> Array:
    del mask
    mode = modes.resolve(self, use_running_average, deterministic)
    document, query = inputs['document'], inputs['query']
    document_mask = inputs['document_mask'].astype(jnp.float32)
    query_mask = inputs['query_mask'].astype(jnp.float32)
    if document.ndim != 2 or document_mask.shape != document.shape:
      raise ValueError(f'AttentiveReader expects document and document_mask [batch, time]; '
                       f'got {document.shape} and {document_mask.shape}.')
    embed = nn.Embed(self.vocab_size, self.embed_size or self.layer.features, name='embed')
    # Padded steps read zeros whatever their ids: the padding-biased statistics of
    # 'bn_lstm' then see the paper's zero padding, and junk in the padding changes nothing.
    x_d = jnp.where(document_mask[..., None] > 0, embed(document), 0.0)
    x_q = jnp.where(query_mask[..., None] > 0, embed(query), 0.0)
    encoder = functools.partial(
        stack.StackedRNN, self.layer, num_layers=self.num_layers,
        dropout_rate=self.dropout_rate, bidirectional=self.bidirectional)
    y_d = encoder(name='document_encoder')(x_d, document_mask, **mode.kwargs())  # [B, T, D]
    query_carries, _ = encoder(name='query_encoder')(x_q, query_mask, **mode.kwargs(),
                                                     return_carry=True)
    u = final_hidden(query_carries[-1], self.bidirectional)                  # [B, D]
    width = y_d.shape[-1]

    flags = {'use_running_average': mode.use_running_average}
    dense = lambda name: nn.Dense(width, use_bias=False, name=name)
    y_m = self._norm('document_attention_norm')(
        dense('document_attention')(y_d), document_mask, **flags)           # W_ym y_d(t)
    u_m = self._norm('query_attention_norm')(dense('query_attention')(u), None,
                                             **flags)                       # W_um u
    m = jnp.tanh(y_m + u_m[:, None, :])
    scores = nn.Dense(1, use_bias=False, name='attention_score')(m)[..., 0]  # w^T m(t)
    valid = document_mask > 0
    scores = jnp.where(valid, scores, NON_CANDIDATE_LOGIT)
    attention = jnp.where(valid, jax.nn.softmax(scores, axis=-1), 0.0)      # s(t)
    self.sow('intermediates', 'attention', attention)
    r = jnp.einsum('bt,btd->bd', attention, y_d)
    r_g = self._norm('read_combination_norm')(dense('read_combination')(r), None,
                                              **flags)                      # W_rg r
    u_g = self._norm('query_combination_norm')(dense('query_combination')(u), None,
                                               **flags)                     # W_ug u
    g = jnp.tanh(r_g + u_g)
    logits = nn.Dense(self.num_entities, name='output')(g)
    return jnp.where(inputs['candidates'] > 0, logits, NON_CANDIDATE_LOGIT)
