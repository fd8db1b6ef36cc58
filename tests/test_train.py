"""Trainer pieces against float64 NumPy references: losses, schedules, population
statistics, evaluation with population statistics, config errors, the launchers."""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import tasks
from bn_rnn_jax import train
from bn_rnn_jax import config as config_lib
from bn_rnn_jax import loop
from bn_rnn_jax import optim
import training_fixtures as fx
from training_fixtures import compilation_cache  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log_softmax64(logits):
  z = logits - logits.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


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


def test_step_decay_schedule_is_zaremba():
  config = fx.tiny_config(**{'optimizer.name': 'sgd', 'optimizer.learning_rate': 1.0,
                             'optimizer.momentum': 0.0, 'optimizer.schedule': 'step_decay',
                             'optimizer.decay_rate': 0.5,
                             'optimizer.decay_after_epochs': 4})
  schedule = optim.learning_rate_schedule(config, steps_per_epoch=10)
  # lr 1 for epochs 0-3, then halved at the start of every further epoch.
  expected = {0: 1.0, 39: 1.0, 40: 0.5, 49: 0.5, 50: 0.25, 65: 0.125}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, err_msg=f'step {step}')


def test_optimizer_clips_global_norm_then_rmsprop():
  config = fx.tiny_config(**{'optimizer.clip_norm': 1.0, 'optimizer.momentum': 0.0,
                             'optimizer.decay': 0.9, 'optimizer.eps': 0.0})
  tx = optim.create_optimizer(config, steps_per_epoch=1)
  params = {'w': jnp.zeros(2)}
  grads = {'w': jnp.array([30.0, 40.0])}  # norm 50 -> clipped to [0.6, 0.8]
  updates, _ = tx.update(grads, tx.init(params), params)
  clipped = np.array([0.6, 0.8])
  # RMSProp's first step: -lr * g / sqrt((1 - decay) g^2) = -lr * sign(g) / sqrt(0.1).
  np.testing.assert_allclose(updates['w'], -1e-3 * clipped / np.sqrt(0.1 * clipped**2),
                             rtol=1e-5)


@pytest.mark.parametrize('bad_leaf', ['small_f32', 'small_bf16', 'large_f32', None])
@pytest.mark.parametrize('bad_value', [np.nan, np.inf, -np.inf])
def test_all_finite_checks_every_floating_leaf(bad_leaf, bad_value):
  """Small leaves are checked jointly (per dtype) and large ones alone; a single bad
  entry anywhere gives 0.0, integer leaves are ignored (NumPy decides)."""
  size = train._FINITE_CHECK_JOINED_SIZE  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  tree = {'small_f32': [rng.normal(size=(3, 5)).astype(np.float32), np.float32(2.0)],
          'small_bf16': rng.normal(size=7).astype(jnp.bfloat16),
          'large_f32': rng.normal(size=size + 1).astype(np.float32),
          'ints': np.arange(4)}
  if bad_leaf is not None:
    leaf = tree[bad_leaf][0] if bad_leaf == 'small_f32' else tree[bad_leaf]
    leaf.flat[rng.integers(leaf.size)] = bad_value
  expected = all(np.all(np.isfinite(np.asarray(x, np.float64)))
                 for x in jax.tree.leaves(tree) if np.asarray(x).dtype.kind != 'i')
  assert expected == (bad_leaf is None)
  got = float(jax.jit(train.all_finite)(tree))
  assert got == float(expected)


def test_config_errors_are_one_clear_line():
  bad = {'model.hidden_size': -3, 'train.batch_size': 0,
         'eval.population_stats': 'batch', 'checkpoint.best_mode': 'maximum'}
  for key, value in bad.items():
    config = fx.tiny_config(**{key: value})
    with pytest.raises(ValueError) as info:
      loop.Trainer(config, None, fx.synthetic_dataset(fx.tiny_config()))
    message = str(info.value)
    assert key.split('.')[-1] in message and '\n' not in message
  config = fx.tiny_config(**{'model.max_length': 4})  # sequences have 6 steps
  with pytest.raises(ValueError, match=r'T=6 steps but config.model.max_length=4'):
    loop.Trainer(config, None, fx.synthetic_dataset(config))


@pytest.fixture(scope='module')
def trained():
  """A tiny BN-LSTM trained a few steps on 2 devices, and its Trainer."""
  config = fx.tiny_config('bn_lstm', **{'train.num_devices': 2,
                                        'model.initial_state': 'noise',
                                        'eval.population_batches': 2})
  trainer = loop.Trainer(config, None, fx.synthetic_dataset(config))
  state = trainer.to_devices(trainer.initial_state())
  for step in range(3):
    state, _ = trainer.p_train_step(state, trainer.train_batch(step))
  return config, trainer, state


def test_population_estimate_averages_batch_moments_of_current_params(trained):
  """The input site's statistics at step t are moments of W_x x_t: recompute them in
  float64 from the parameters for the batches the pass uses, and average them."""
  config, trainer, state = trained
  estimate = trainer.population_stats(state, 'estimate')
  host = trainer.to_host(state)
  kernel = np.asarray(host.params['rnn']['layer_0']['input_kernel'], np.float64)
  means, variances = [], []
  step = int(host.step)
  for i in range(config.eval.population_batches):
    x = trainer.dataset.train_batch(step + i)['inputs'].astype(np.float64)  # [B, T, I]
    z = x @ kernel                                                         # [B, T, 4H]
    means.append(z.mean(0))
    variances.append(z.var(0))
  site = jax.tree.map(lambda a: np.asarray(a[0]), estimate)['rnn']['layer_0']['input']
  length = x.shape[1]
  np.testing.assert_allclose(site['mean'][:length], np.mean(means, 0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(site['var'][:length], np.mean(variances, 0), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_array_equal(site['count'][:length], config.eval.population_batches)
  assert not site['count'][length:].any()
  # It is not the running average that training kept.
  running = host.batch_stats['rnn']['layer_0']['input']
  assert np.abs(running['mean'][:length] - site['mean'][:length]).max() > 1e-4
  assert trainer.population_stats(state, 'running') is state.batch_stats


def test_population_estimate_of_joined_batches_uses_pooled_moments(trained):
  """With `population_batch_size` = 2 training batches, each record holds the moments of
  the two consecutive batches joined (pooled, in float64 here), not their average."""
  config, _, state = trained
  config = fx.tiny_config('bn_lstm', **{'train.num_devices': 2,
                                        'model.initial_state': 'noise',
                                        'eval.population_batches': 2,
                                        'eval.population_batch_size': 32})
  trainer = loop.Trainer(config, None, fx.synthetic_dataset(config))
  site = jax.tree.map(lambda a: np.asarray(a[0]), trainer.population_stats(
      state, 'estimate'))['rnn']['layer_0']['input']
  host = trainer.to_host(state)
  kernel = np.asarray(host.params['rnn']['layer_0']['input_kernel'], np.float64)
  step, means, variances = int(host.step), [], []
  for record in range(2):
    x = np.concatenate([trainer.dataset.train_batch(step + 2 * record + j)['inputs']
                        for j in range(2)]).astype(np.float64)           # [2B, T, I]
    z = x @ kernel
    means.append(z.mean(0))
    variances.append(z.var(0))
  length = x.shape[1]
  np.testing.assert_allclose(site['mean'][:length], np.mean(means, 0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(site['var'][:length], np.mean(variances, 0), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_array_equal(site['count'][:length], 2)


@pytest.mark.parametrize('size', [-16, 24])
def test_population_batch_size_must_be_a_multiple_of_the_batch(size):
  config = fx.tiny_config(**{'eval.population_batch_size': size})
  with pytest.raises(ValueError, match='population_batch_size must be None'):
    config_lib.validate_config(config)


def test_evaluation_uses_population_statistics(trained):
  """With batch statistics an example's logits would depend on its batch mates; with
  population statistics (train=False) they do not, and metrics do not depend on how a
  split is cut into (padded) batches."""
  config, trainer, state = trained
  stats = trainer.population_stats(state)
  variables = {'params': jax.tree.map(lambda x: x[0], state.params),
               'batch_stats': jax.tree.map(lambda x: x[0], stats)}
  inputs = next(trainer.dataset.eval_batches('valid'))['inputs']
  full = trainer.model.apply(variables, jnp.asarray(inputs), train=False)
  half = trainer.model.apply(variables, jnp.asarray(inputs[:4]), train=False)
  np.testing.assert_allclose(np.asarray(full[:4]), np.asarray(half), rtol=1e-5, atol=1e-6)
  whole = trainer.evaluate(state, 'valid')  # 12 examples: batches of 8, padded
  config4 = config.copy_and_resolve_references()
  config4.eval.batch_size = 4                # 12 examples: 3 batches, no padding
  other = loop.Trainer(config4, None, fx.synthetic_dataset(config4))
  result = other.evaluate(state, 'valid')
  np.testing.assert_allclose(result['loss'], whole['loss'], rtol=1e-5)
  assert result['accuracy'] == whole['accuracy']


def _run(args, timeout=300):
  # A fresh process as a user would start it: one CPU device, not the tests' 8.
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['JAX_PLATFORMS'] = 'cpu'
  return subprocess.run([sys.executable] + args, cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_main_reports_bad_config_in_one_line(tmp_path):
  result = _run(['experiments/main.py', '--config', 'experiments/configs/seq_mnist.py',
                 '--workdir', str(tmp_path), '--config.model.hidden_size=-5'])
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last == 'error: config.model.hidden_size must be a positive integer; got -5.'


def test_main_reports_missing_mnist_path(tmp_path):
  missing = str(tmp_path / 'no_mnist_here')
  result = _run(['experiments/main.py', '--config', 'experiments/configs/seq_mnist.py',
                 '--workdir', str(tmp_path / 'run'), f'--config.data.mnist_dir={missing}'])
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert missing in last and 'yann.lecun.com' in last


def test_quickstart_runs_end_to_end(tmp_path):
  result = _run(['experiments/quickstart.py', '--workdir', str(tmp_path), '--seeds=0',
                 '--config.train.num_steps=4', '--config.eval.every=2',
                 '--config.train.log_every=2', '--config.model.hidden_size=8',
                 '--config.eval.population_batches=1', '--config.eval.max_batches=1',
                 "--config.variants=('bn_lstm',)"])  # one variant: the test budget
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'bn_lstm' in result.stdout and 'acc@end' in result.stdout
  assert os.path.getsize(tmp_path / 'learning_curves.png') > 1000
  assert os.path.exists(tmp_path / 'quickstart' / 'bn_lstm_s0' / 'metrics.jsonl')
