"""Tasks: what the task-generic steps of `train.py` need to know about a problem.

`register(name, task, unit=None)` makes a `Task` the one of datasets whose `task` is
`name` (and whose `unit` is `unit`), and `get` finds it: a new task needs no change to
the loop. Registered: 'classification' (`SequenceClassifier`), 'language_model'
(`LanguageModel`: `bpc` per character; `nats` and `perplexity` per word or other token),
'tagging' (`SequenceTagger`: frame cross-entropy `fce`, frame error rate `fer`) and
'reading_comprehension' (`AttentiveReader`: `error`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import jax.numpy as jnp

from bn_rnn_jax import extras
from bn_rnn_jax import models
from bn_rnn_jax import modes
from bn_rnn_jax import variants

with extras.needed_by(__name__):
  import optax


@dataclasses.dataclass(frozen=True)
class Task:
  """What the task-generic steps need to know about a problem.

  Attributes:
    build_model: `(config, model_kwargs, layer_fields) -> module`; `model_kwargs` from the
      dataset, `layer_fields` the `RecurrentLayer` fields of `config.model`.
    apply: `(model, variables, batch, *, use_running_average, deterministic, carry,
      **apply_kwargs) -> ((final_carries | None, outputs), mutated collections)`.
    loss_sums: `(outputs, batch) -> ({'loss': ..., <metric>: ...}, count)`: sums over the
      valid entries (`weights`, and `mask` for tokens) and their number; the steps divide
      by the global count.
    finalize: `means -> metrics` with derived values (bpc, perplexity), for evaluations
      and training windows alike.
    metrics: the names `finalize` returns; a `checkpoint.best_metric` naming another is
      refused at start (() = not checked).
    counted: what `count` counts, for progress lines ('examples', 'characters', ...).
  """
  build_model: Callable[..., Any]
  apply: Callable[..., Any]
  loss_sums: Callable[..., Any]
  finalize: Callable[[dict], dict] = dict
  metrics: tuple[str, ...] = ()
  counted: str = 'examples'


TASKS: dict[str, Task] = {}
# `{(name, unit): Task}`: a task's form for datasets whose `unit` (what one position of a
# sequence is) calls for other metrics; `get` prefers it to `TASKS[name]`.
UNIT_TASKS: dict[tuple[str, str], Task] = {}


def register(name: str, task: Task, unit: Optional[str] = None) -> Task:
  """Make `task` available to datasets whose `task` attribute is `name` (and whose `unit`
  is `unit`, when given)."""
  registry, key = (TASKS, name) if unit is None else (UNIT_TASKS, (name, unit))
  if key in registry and registry[key] is not task:
    raise ValueError(f'A task {key!r} is already registered.')
  registry[key] = task
  return task


def get(name: str, unit: Optional[str] = None) -> Task:
  """The task of datasets whose `task` is `name` and whose `unit` is `unit` (None: the
  dataset declares none)."""
  if name not in TASKS:
    raise ValueError(f'Unknown task {name!r}; have {sorted(TASKS)}.')
  return UNIT_TASKS.get((name, unit), TASKS[name])


# ---------------------------------------------------------------------- shared pieces
def model_fields(config) -> dict:
  """The recurrent stack's fields every model takes from `config.model`."""
  return dict(num_layers=config.model.num_layers, dropout_rate=config.model.dropout_rate)


def layer(config, layer_fields):
  """The model's layer template: `config.model.variant` with `hidden_size` units and
  `layer_fields` (`train.layer_fields`)."""
  return variants.make_layer(config.model.variant, config.model.hidden_size, **layer_fields)


def apply_model(model, variables, args, mode: modes.Mode, apply_kwargs, **call_kwargs):
  """`model.apply(variables, *args, **mode.kwargs())` as `(outputs, mutated
  collections)`."""
  out = model.apply(variables, *args, **mode.kwargs(), **call_kwargs, **apply_kwargs)
  return out if 'mutable' in apply_kwargs else (out, {})


def weighted_sums(values: dict, weights) -> tuple[dict, Any]:
  """`({name: sum(value * weights)}, sum(weights))` over the entries of positive weight,
  by `where`, so a non-finite value at a padded entry does not leak in (NaN * 0 is NaN)."""
  valid = weights > 0
  sums = {name: jnp.sum(jnp.where(valid, value.astype(jnp.float32) * weights, 0.0))
          for name, value in values.items()}
  return sums, jnp.sum(weights)


def example_sums(per_example_loss, correct, weights):
  """Sums of a per-example loss and accuracy over weighted (non-padding) examples."""
  return weighted_sums({'loss': per_example_loss, 'accuracy': correct}, weights)


def token_weights(batch):
  """`[B, T]` weights of the valid tokens of valid examples."""
  return batch['mask'].astype(jnp.float32) * batch['weights'][:, None]


# ---------------------------------------------------------------------- classification
def _build_classifier(config, model_kwargs, layer_fields):
  return models.SequenceClassifier(**model_kwargs, layer=layer(config, layer_fields),
                                   **model_fields(config))


def _apply_classifier(model, variables, batch, *, carry, use_running_average=None,
                      deterministic=None, **kwargs):
  del carry  # a classifier starts every sequence afresh
  mode = modes.resolve(model, use_running_average, deterministic)
  logits, mutated = apply_model(model, variables, (batch['inputs'], batch.get('mask')),
                                mode, kwargs)
  return (None, logits), mutated


def _classification_sums(logits, batch):
  """Sums of cross-entropy and of correct predictions over weighted examples."""
  labels = batch['labels']
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return example_sums(ce, jnp.argmax(logits, -1) == labels, batch['weights'])


# ---------------------------------------------------------------------- language model
def _build_language_model(config, model_kwargs, layer_fields):
  return models.LanguageModel(**model_kwargs, layer=layer(config, layer_fields),
                              embed_size=config.model.embed_size, **model_fields(config))


def _apply_language_model(model, variables, batch, *, carry, use_running_average=None,
                          deterministic=None, **kwargs):
  mode = modes.resolve(model, use_running_average, deterministic)
  return apply_model(model, variables, (batch['inputs'], batch.get('mask')), mode, kwargs,
                     initial_carries=carry, return_carry=True)


def _language_model_sums(logits, batch):
  """Sums of per-token cross-entropy (nats) and accuracy over valid tokens."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  correct = jnp.argmax(logits, -1) == batch['targets']
  return weighted_sums({'loss': ce, 'accuracy': correct}, token_weights(batch))


def _per_word_finalize(means):
  """Nats per word (the loss) and perplexity = exp(nats)."""
  loss = means['loss']
  return {**means, 'nats': loss, 'perplexity': math.exp(min(loss, 700.0))}


def _per_character_finalize(means):
  """Bits per character = nats / ln 2."""
  return {**means, 'bpc': means['loss'] / math.log(2.0)}


register('classification', Task(_build_classifier, _apply_classifier,
                                _classification_sums, metrics=('loss', 'accuracy')))
_language_model = functools.partial(Task, _build_language_model, _apply_language_model,
                                    _language_model_sums)
# Words (`unit='word'`) and any other tokens: nats and perplexity; characters: bpc.
register('language_model', _language_model(
    _per_word_finalize, metrics=('loss', 'accuracy', 'nats', 'perplexity'), counted='tokens'))
register('language_model', _language_model(
    _per_character_finalize, metrics=('loss', 'accuracy', 'bpc'), counted='characters'),
         unit='character')


# ---------------------------------------------------------------------- tagging
# 'tagging'  `SequenceTagger`, logits `[B, T, C]`, labels / mask `[B, T]` (Laurent et al.
# sec. 5.1 frame classification; Brown POS tagging). Metrics over valid steps only:
# `loss` = frame cross-entropy (FCE, nats per frame), `fer` = frame error rate.
def _build_tagger(config, model_kwargs, layer_fields):
  m = config.model
  optional = {name: m[name] for name in ('embed_size', 'input_projection', 'kernel_init')
              if m[name] is not None}
  return models.SequenceTagger(**model_kwargs, layer=layer(config, layer_fields), **optional,
                               **model_fields(config), bidirectional=m.bidirectional)


def _tagging_sums(logits, batch):
  """Sums of frame cross-entropy, correct and wrong frames over valid, weighted steps."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['labels'])
  correct = (jnp.argmax(logits, -1) == batch['labels']).astype(jnp.float32)
  return weighted_sums({'loss': ce, 'accuracy': correct, 'fer': 1.0 - correct},
                       token_weights(batch))


def _tagging_finalize(means):
  return {**means, 'fce': means['loss']}


register('tagging', Task(_build_tagger, _apply_classifier, _tagging_sums, _tagging_finalize,
                         metrics=('loss', 'accuracy', 'fer', 'fce'), counted='frames'))


# ---------------------------------------------------------------------- reading comprehension
def _build_reader(config, model_kwargs, layer_fields):
  return models.attentive_reader(config.model.variant, features=config.model.hidden_size,
                                 layer_fields=layer_fields, **model_kwargs,
                                 embed_size=config.model.embed_size, **model_fields(config))


def _apply_reader(model, variables, batch, *, carry, use_running_average=None,
                  deterministic=None, **kwargs):
  del carry  # every question starts afresh
  mode = modes.resolve(model, use_running_average, deterministic)
  logits, mutated = apply_model(model, variables, (batch['inputs'], None), mode, kwargs)
  return (None, logits), mutated


def _reader_sums(logits, batch):
  """Sums of cross-entropy and accuracy over weighted questions. A question whose answer is
  not a candidate (`data.top_k_sentences` stripped it) is wrong and adds 0 to the loss."""
  labels = batch['labels']
  answerable = jnp.take_along_axis(batch['inputs']['candidates'], labels[:, None], 1)[:, 0]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  ce = jnp.where(answerable > 0, ce, 0.0)
  sums, count = example_sums(ce, jnp.argmax(logits, -1) == labels, batch['weights'])
  return sums, count


def _reader_finalize(means):
  return {**means, 'error': 1.0 - means['accuracy']}


register('reading_comprehension', Task(_build_reader, _apply_reader, _reader_sums,
                                       _reader_finalize, metrics=('loss', 'accuracy', 'error'),
                                       counted='questions'))
