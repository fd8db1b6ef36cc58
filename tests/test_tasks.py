"""`tasks.py`: each task's loss sums and metrics against NumPy float64 (padding and
unanswerable questions excluded), the models they build from a config, and the registry."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import variants
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import tasks
import reference as ref


def _log_softmax64(logits):
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _picked(log_probs, labels):
  return np.take_along_axis(log_probs, np.asarray(labels)[..., None], -1)[..., 0]


# ----------------------------------------------------------------------------- sums
def test_classification_sums_match_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 4)).astype(np.float32)
  labels = np.array([0, 1, 2, 3, 0, 1], np.int32)
  weights = np.array([1, 1, 1, 1, 0, 0], np.float32)  # two padding examples
  sums, count = tasks.TASKS['classification'].loss_sums(
      jnp.asarray(logits), {'labels': labels, 'weights': weights})
  ce = -_log_softmax64(logits.astype(np.float64))[np.arange(6), labels]
  np.testing.assert_allclose(float(sums['loss']), (ce * weights).sum(), rtol=1e-6)
  correct = (logits.argmax(-1) == labels) * weights
  assert float(sums['accuracy']) == correct.sum()
  assert float(count) == 4


def test_language_model_sums_and_bpc_match_numpy():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(3, 5)).astype(np.int32)
  mask = np.ones((3, 5), np.float32)
  mask[1, 3:] = 0
  weights = np.array([1, 1, 0], np.float32)
  task = tasks.TASKS['language_model']
  sums, count = task.loss_sums(jnp.asarray(logits), {'targets': targets, 'mask': mask,
                                                     'weights': weights})
  logp = _log_softmax64(logits.astype(np.float64))
  ce = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  w = mask * weights[:, None]
  np.testing.assert_allclose(float(sums['loss']), (ce * w).sum(), rtol=1e-6)
  assert float(count) == w.sum() == 8
  characters = tasks.get('language_model', 'character').finalize({'loss': 1.5, 'accuracy': 0.25})
  np.testing.assert_allclose(characters['bpc'], 1.5 / math.log(2))
  words = tasks.get('language_model', 'word').finalize({'loss': 1.5, 'accuracy': 0.25})
  np.testing.assert_allclose(words['perplexity'], math.exp(1.5))


def test_loss_sums_give_bits_per_character_and_perplexity():
  batch_size, length, vocab = 3, 6, 7
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(batch_size, length, vocab))
  targets = rng.integers(0, vocab, size=(batch_size, length))
  mask = np.ones((batch_size, length))
  mask[1, 3:] = 0
  weights = np.array([1.0, 1.0, 0.0])     # an all-padding row of an evaluation batch
  batch = {'targets': jnp.asarray(targets), 'mask': jnp.asarray(mask, jnp.float32),
           'weights': jnp.asarray(weights, jnp.float32)}
  sums, count = tasks.TASKS['language_model'].loss_sums(jnp.asarray(logits, jnp.float32),
                                                         batch)
  nll = -np.take_along_axis(_log_softmax64(logits), targets[..., None], -1)[..., 0]
  valid = mask * weights[:, None]
  assert float(count) == valid.sum() == 9
  mean = (nll * valid).sum() / valid.sum()
  means = {k: float(v) / float(count) for k, v in sums.items()}
  characters = tasks.get('language_model', 'character').finalize(means)
  words = tasks.get('language_model', 'word').finalize(means)
  np.testing.assert_allclose(characters['loss'], mean, rtol=1e-5)
  np.testing.assert_allclose(characters['bpc'], mean / math.log(2), rtol=1e-5)
  np.testing.assert_allclose(words['perplexity'], math.exp(mean), rtol=1e-5)


def test_tagging_sums_are_frame_cross_entropy_and_error_rate():
  """Over the valid frames only; NaN logits at padded frames do not leak in."""
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 6, 5)).astype(np.float32)
  labels = rng.integers(0, 5, size=(4, 6)).astype(np.int32)
  mask = (np.arange(6)[None] < np.array([6, 4, 1, 3])[:, None]).astype(np.float32)
  logits[mask == 0] = np.nan
  task = tasks.get('tagging')
  sums, count = task.loss_sums(jnp.asarray(logits), {'labels': labels, 'mask': mask,
                                                     'weights': np.ones(4, np.float32)})
  fce, fer = ref.frame_metrics(np.nan_to_num(logits), labels, mask)
  assert float(count) == mask.sum() == 14
  means = {k: float(v) / float(count) for k, v in sums.items()}
  np.testing.assert_allclose(means['loss'], fce, rtol=1e-5)
  np.testing.assert_allclose(means['fer'], fer, rtol=1e-6)
  np.testing.assert_allclose(means['accuracy'], 1.0 - fer, rtol=1e-6)
  assert task.finalize(means)['fce'] == means['loss']


def test_reader_sums_count_an_unanswerable_question_wrong_with_no_loss():
  """Question 2's answer is not among its candidates (a stripped document): it adds 0 to
  the loss and counts as an error; question 3 is padding."""
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(4, 5)).astype(np.float32)
  candidates = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 1, 0, 0],
                         [1, 1, 1, 1, 1]], np.float32)
  labels = np.array([3, 1, 1, 0], np.int32)
  weights = np.array([1, 1, 1, 0], np.float32)
  masked = np.where(candidates > 0, logits, models.NON_CANDIDATE_LOGIT).astype(np.float32)
  task = tasks.get('reading_comprehension')
  sums, count = task.loss_sums(jnp.asarray(masked), {
      'labels': labels, 'weights': weights, 'inputs': {'candidates': candidates}})
  ce = -_picked(_log_softmax64(masked[:2]), labels[:2])     # the answerable ones
  np.testing.assert_allclose(float(sums['loss']), ce.sum(), rtol=1e-5)
  correct = (masked.argmax(-1) == labels)[:3]
  assert not correct[2]
  assert float(sums['accuracy']) == correct.sum() and float(count) == 3
  metrics = task.finalize({'loss': 0.5, 'accuracy': 0.75})
  assert metrics['error'] == pytest.approx(0.25)


def test_weighted_sums_use_where_not_a_product():
  values = {'loss': jnp.array([1.0, jnp.nan, 2.0]), 'accuracy': jnp.array([1, 0, 1])}
  sums, count = tasks.weighted_sums(values, jnp.array([0.5, 0.0, 2.0]))
  assert float(sums['loss']) == 4.5 and float(sums['accuracy']) == 2.5
  assert float(count) == 2.5


# ----------------------------------------------------------------------------- models
def _config(**model):
  config = config_lib.default_config()
  config.model.update({'variant': 'bn_lstm', 'hidden_size': 6, 'num_layers': 2, **model})
  return config


@pytest.mark.parametrize('name,kwargs,cls', [
    ('classification', {'num_classes': 3}, models.SequenceClassifier),
    ('language_model', {'vocab_size': 11}, models.LanguageModel),
    ('tagging', {'num_classes': 4, 'vocab_size': 9}, models.SequenceTagger),
    ('reading_comprehension', {'vocab_size': 9, 'num_entities': 4}, models.AttentiveReader),
])
def test_each_task_builds_its_model_from_the_config(name, kwargs, cls):
  variant = 'bn_e_star' if name == 'reading_comprehension' else 'bn_lstm'
  model = tasks.get(name).build_model(_config(variant=variant), kwargs, {'max_length': 12})
  assert type(model) is cls  # pylint: disable=unidiomatic-typecheck
  assert (model.layer.features, model.layer.max_length, model.num_layers) == (6, 12, 2)
  assert model.layer.recurrent_norm == model.layer.input_norm == 'batch'
  for key, value in kwargs.items():
    assert getattr(model, key) == value


@pytest.mark.slow
def test_apply_returns_the_mutated_collections_only_when_asked():
  task = tasks.get('classification')
  model = task.build_model(_config(num_layers=1), {'num_classes': 3}, {'max_length': 4})
  batch = {'inputs': np.ones((2, 4, 3), np.float32), 'mask': np.ones((2, 4), np.float32)}
  variables = model.init(jax.random.key(0), batch['inputs'], batch['mask'],
                         use_running_average=True, deterministic=True)
  (carry, logits), mutated = task.apply(model, variables, batch, use_running_average=False,
                                        deterministic=False, carry=None,
                                        mutable=['batch_stats'])
  assert carry is None and logits.shape == (2, 3)
  assert set(mutated) == {'batch_stats'}
  (_, eval_logits), nothing = task.apply(model, {**variables, **mutated}, batch,
                                         use_running_average=True, deterministic=True,
                                         carry=None)
  assert nothing == {} and eval_logits.shape == (2, 3)


# ----------------------------------------------------------------------------- registry
def test_declared_metrics_are_those_each_task_logs():
  rng = np.random.default_rng(0)
  b, t, c = 2, 3, 4
  logits = {'classification': rng.normal(size=(b, c)), 'reading_comprehension':
            rng.normal(size=(b, c)), 'language_model': rng.normal(size=(b, t, c)),
            'tagging': rng.normal(size=(b, t, c))}
  batches = {
      'classification': {'labels': np.array([0, 1]), 'weights': np.ones(b)},
      'reading_comprehension': {'labels': np.array([0, 1]), 'weights': np.ones(b),
                                'inputs': {'candidates': np.ones((b, c))}},
      'language_model': {'targets': np.zeros((b, t), int), 'mask': np.ones((b, t)),
                         'weights': np.ones(b)},
      'tagging': {'labels': np.zeros((b, t), int), 'mask': np.ones((b, t)),
                  'weights': np.ones(b)}}
  for name, batch in batches.items():
    task = tasks.get(name)
    sums, _ = task.loss_sums(logits[name], batch)
    assert set(task.finalize({k: float(v) for k, v in sums.items()})) == set(task.metrics)


def test_registry_refuses_a_second_task_under_a_name_and_names_unknown_ones():
  task = tasks.get('classification')
  assert tasks.register('classification', task) is task   # the same task again: fine
  with pytest.raises(ValueError, match="A task 'classification' is already registered"):
    tasks.register('classification', tasks.Task(*(lambda: None,) * 3))
  with pytest.raises(ValueError, match="Unknown task 'translation'; have \\["):
    tasks.get('translation')
