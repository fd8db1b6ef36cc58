"""Metric names that fit the task: a character model logs bits per character, a word model
nats and perplexity (no bpc); training records carry the same derived metrics as
evaluations. Values against NumPy float64."""

import math
import os

import numpy as np
import pytest

from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from bn_rnn_jax.training import tasks

WORDS = ('the', 'cat', 'dog', 'sat', 'on', 'a', 'mat', 'ran')


def _write_ptb(folder, lines=(80, 12, 12)):
  rng = np.random.default_rng(0)
  for split, count in zip(('train', 'valid', 'test'), lines):
    with open(os.path.join(folder, f'ptb.{split}.txt'), 'w') as f:
      f.writelines(' ' + ' '.join(rng.choice(WORDS, size=rng.integers(3, 8))) + ' \n'
                   for _ in range(count))
  return str(folder)


def _config(name, path):
  config = config_lib.default_config()
  config.data = text.default_data_config(name)
  config.data.path = path
  config.data.seq_length = 6
  config.model.hidden_size = 8
  config.model.max_length = 6
  config.train.batch_size = config.eval.batch_size = 4
  config.train.num_devices = 1
  config.train.num_steps = 4
  config.train.log_every = config.eval.every = config.checkpoint.every = 2
  config.eval.population_batches = 1
  config.eval.test_at_end = False
  return config


@pytest.mark.parametrize('unit,derived', [('character', {'bpc'}),
                                          ('word', {'nats', 'perplexity'}),
                                          (None, {'nats', 'perplexity'})])
def test_language_model_metrics_follow_the_unit(unit, derived):
  task = tasks.get('language_model', unit)
  assert set(task.metrics) == {'loss', 'accuracy'} | derived
  loss = 1.2345678
  metrics = task.finalize({'loss': loss, 'accuracy': 0.5, 'grad_norm': 2.0})
  assert set(metrics) == set(task.metrics) | {'grad_norm'}
  expected = {'bpc': np.float64(loss) / np.log(np.float64(2.0)), 'nats': np.float64(loss),
              'perplexity': np.exp(np.float64(loss))}
  for name in derived:
    np.testing.assert_allclose(metrics[name], expected[name], rtol=1e-12)


def test_language_model_datasets_declare_their_unit(tmp_path):
  path = _write_ptb(tmp_path)
  assert text.get_dataset(_config('ptb_word', path)).unit == 'word'
  assert text.get_dataset(_config('ptb_char', path)).unit == 'character'


@pytest.mark.slow
def test_word_model_logs_perplexity_in_training_and_validation_records(tmp_path):
  config = _config('ptb_word', _write_ptb(tmp_path))
  config.checkpoint.best_metric = 'valid/perplexity'
  config.checkpoint.best_mode = 'min'
  loop.train_and_evaluate(config, str(tmp_path / 'run'))
  records = metric_writer.read_metrics(str(tmp_path / 'run'))
  for record in records:
    assert 'bpc' not in record
    assert math.isclose(record['perplexity'], math.exp(record['loss']), rel_tol=1e-9)
    assert record['nats'] == record['loss']
  assert [r['split'] for r in records] == ['train', 'valid', 'train', 'valid']


def test_bpc_of_a_word_model_is_refused_at_start(tmp_path):
  config = _config('ptb_word', _write_ptb(tmp_path))
  config.checkpoint.best_metric = 'valid/bpc'
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert str(error.value) == (
      "config.checkpoint.best_metric='valid/bpc' names no metric of the 'language_model' "
      "task; it logs ['accuracy', 'loss', 'nats', 'perplexity'].")
