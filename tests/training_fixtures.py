"""Tiny configs and synthetic datasets shared by the trainer tests (not a test module)."""

import jax
import numpy as np
import pytest

from bn_rnn_jax import config as config_lib
from bn_rnn_jax import loop
from bn_rnn_jax.input_pipeline import mnist


def tiny_config(variant='bn_lstm', **overrides):
  """A config whose model and data compile and run in about a second."""
  config = config_lib.default_config()
  config.data = mnist.default_data_config('synthetic')
  config.model.variant = variant
  config.model.hidden_size = 8
  config.model.gamma_init = 0.1
  config.train.batch_size = 16
  config.train.num_steps = 6
  config.train.log_every = 3
  config.eval.every = 3
  config.eval.batch_size = 8
  config.eval.population_batches = 2
  config.eval.test_at_end = False
  config.checkpoint.every = 2
  config.checkpoint.keep = 2
  for key, value in overrides.items():
    node = config
    *path, name = key.split('.')
    for part in path:
      node = node[part]
    node[name] = value
  return config


class Killed(Exception):
  """Raised by `KillAt`: a run "killed" before a training step."""


class KillAt:
  """Wraps a dataset; asking for the batch of step `kill_step` "kills" the run."""

  def __init__(self, dataset, kill_step):
    self._dataset, self._kill_step = dataset, kill_step

  def __getattr__(self, name):
    return getattr(self._dataset, name)

  def train_batch(self, step):
    if step == self._kill_step:
      raise Killed(step)
    return self._dataset.train_batch(step)


def one_step(config, dataset, num_devices):
  """One train step and a validation pass on `num_devices` devices:
  `(initial host state, host state after the step, metrics, valid metrics)`."""
  config = config.copy_and_resolve_references()
  config.train.num_devices = num_devices
  trainer = loop.Trainer(config, None, dataset)
  init = trainer.initial_state()
  state, metrics = trainer.p_train_step(trainer.to_devices(init), trainer.train_batch(0))
  valid = trainer.evaluate(state, 'valid')
  return init, trainer.to_host(state), {k: float(v[0]) for k, v in metrics.items()}, valid


def synthetic_splits(num_train=64, num_eval=12, length=6, features=2, seed=0):
  """Random sequences whose class depends on the sign of their mean (learnable)."""
  rng = np.random.default_rng(seed)
  def split(n):
    x = rng.normal(size=(n, length, features)).astype(np.float32)
    y = (x.mean(axis=(1, 2)) > 0).astype(np.int32) + 2 * (x[:, 0, 0] > 0)
    return x, y
  return {'train': split(num_train), 'valid': split(num_eval), 'test': split(num_eval)}


def synthetic_dataset(config, **kwargs):
  return mnist.SequenceDataset(synthetic_splits(**kwargs), seed=config.seed,
                               batch_size=config.train.batch_size,
                               eval_batch_size=config.eval.batch_size, num_classes=4)


class LanguageModelDataset:
  """A random token stream cut into contiguous [B, T] segments (carried state)."""
  task = 'language_model'
  carries_state = True

  def __init__(self, batch_size=16, length=5, vocab=7, steps=10, seed=0):
    rng = np.random.default_rng(seed)
    self.stream = rng.integers(0, vocab, size=(batch_size, steps * length + 1))
    self.batch_size, self.train_length, self.steps_per_epoch = batch_size, length, steps
    self.model_kwargs = {'vocab_size': vocab}

  def train_batch(self, step):
    index = step % self.steps_per_epoch
    s = slice(index * self.train_length, (index + 1) * self.train_length)
    s1 = slice(s.start + 1, s.stop + 1)
    return {'inputs': self.stream[:, s].astype(np.int32),
            'targets': self.stream[:, s1].astype(np.int32),
            'mask': np.ones((self.batch_size, self.train_length), np.float32),
            'reset': np.full((self.batch_size,), float(index == 0), np.float32),
            'weights': np.ones((self.batch_size,), np.float32)}

  def eval_batches(self, split):
    del split
    for step in range(2):
      yield self.train_batch(step)


_CACHE_OPTIONS = {'jax_persistent_cache_min_compile_time_secs': 0.0,
                  'jax_persistent_cache_min_entry_size_bytes': 0}


@pytest.fixture(scope='module', autouse=True)
def compilation_cache(tmp_path_factory):
  """A persistent XLA cache for the trainer tests: every run builds a new Trainer (new
  pmapped closures), and without it each would compile the same programs again.
  Restored afterwards so other test modules are unaffected."""
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  options = {'jax_compilation_cache_dir': str(tmp_path_factory.getbasetemp() / 'jax_cache'),
             **_CACHE_OPTIONS}
  old = {name: getattr(jax.config, name) for name in options}
  cc.reset_cache()
  for name, value in options.items():
    jax.config.update(name, value)
  yield
  for name, value in old.items():
    jax.config.update(name, value)
  cc.reset_cache()
