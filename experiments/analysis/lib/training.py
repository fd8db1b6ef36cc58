"""Short training runs with the library's own stack, for the figures: configs of
sequential (p)MNIST and character PTB for the trainer (`loop.Trainer`, one device), a
fresh state with an initialisation-only field changed, a recording loop, evaluation
with given population statistics, and the models and variables outside `pmap`."""

from __future__ import annotations

import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import input_pipeline
from bn_rnn_jax import models
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import train


def data_dir(name: str) -> Optional[str]:
  """`<data root>/<name>` ($BN_RNN_JAX_DATA), or None without a data root."""
  root = input_pipeline.data_root()
  return os.path.join(root, name) if root else None


def _short_run(config, *, batch_size: int, eval_batch_size: int, eval_batches: int,
               population_batches: int, seed: int):
  """Single-device run settings shared by every figure."""
  config.seed = seed
  config.train.batch_size = batch_size
  config.train.num_devices = 1
  config.eval.batch_size = eval_batch_size
  config.eval.max_batches = eval_batches
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = population_batches
  return config


def mnist_config(mnist_dir: Optional[str], *, resolution: int = 14,
                 permutation_seed: Optional[int] = None, hidden_size: int = 100,
                 batch_size: int = 64, learning_rate: float = 1e-3,
                 eval_batch_size: Optional[int] = None, eval_examples: int = 512,
                 population_batches: int = 8, seed: int = 0, **model_fields):
  """Sequential (p)MNIST with Cooijmans et al.'s optimiser (RMSProp, momentum 0.9, clip 1).

  mnist_dir: folder of the IDX .gz files; when None or without them, scikit-learn's 8x8
    digits (64 steps) are read instead and `resolution` is ignored.
  resolution: 28 (784 steps) or 14 (2x2 mean-pooled, 196 steps).
  permutation_seed: pMNIST's fixed pixel order (a true permutation), or None.
  eval_examples: validation images per evaluation (the first ones, in batches of
    `eval_batch_size`, default `batch_size`).
  model_fields: `config.model` fields (variant, recurrent_init, initial_state, gamma_init...).
  """
  found = bool(mnist_dir) and all(
      os.path.exists(os.path.join(mnist_dir, f)) for f in mnist.IDX_FILES.values())
  config = config_lib.default_config()
  config.data = mnist.default_data_config('mnist' if found else 'digits')
  if found:
    config.data.mnist_dir = mnist_dir
    config.data.resolution = resolution
  config.data.permute = permutation_seed is not None
  config.data.permutation_seed = permutation_seed or 0
  config.model.hidden_size = hidden_size
  config.model.update(model_fields)
  config.optimizer.learning_rate = learning_rate
  eval_batch_size = eval_batch_size or batch_size
  return _short_run(config, batch_size=batch_size, eval_batch_size=eval_batch_size,
                    eval_batches=-(-eval_examples // eval_batch_size),
                    population_batches=population_batches, seed=seed)


def ptb_config(ptb_dir: str, *, hidden_size: int = 128, batch_size: int = 32,
               length: int = 100, learning_rate: float = 2e-3, eval_batches: int = 8,
               population_batches: int = 4, seed: int = 0, **model_fields):
  """Character-level PTB (`input_pipeline.text`): windows of `length`, one-hot inputs
  unless `embed_size` is given, Adam with clipping at 1; validation reads the first
  `eval_batches` batches of `batch_size` windows of the validation text."""
  config = config_lib.default_config()
  config.data = text.default_data_config('ptb_char')
  config.data.path = ptb_dir
  config.data.seq_length = length
  config.model.hidden_size = hidden_size
  config.model.max_length = length
  config.model.update(model_fields)
  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = learning_rate
  return _short_run(config, batch_size=batch_size, eval_batch_size=batch_size,
                    eval_batches=eval_batches, population_batches=population_batches,
                    seed=seed)


def data_description(config, dataset) -> str:
  """What was read, without the paths of this machine."""
  name = config.data.name
  if name == 'digits':
    text_ = 'scikit-learn 8x8 digits (MNIST IDX files not found)'
  elif name == 'mnist':
    r = config.data.resolution
    text_ = f'MNIST {r}x{r} ({r * r} steps; IDX files)'
  else:
    return f'character-level PTB ({dataset.vocab_size} symbols)'
  return text_ + (f', pixels permuted (seed {config.data.permutation_seed})'
                  if config.data.permute else '')


def metric_name(trainer: loop.Trainer) -> str:
  """The validation metric a figure plots: bits per character or accuracy."""
  return 'bpc' if trainer.dataset.task == 'language_model' else 'accuracy'


def initial_state(trainer: loop.Trainer, **model_fields) -> train.TrainState:
  """A fresh device state of `trainer`'s run, initialised with `config.model` fields
  changed (e.g. gamma_init). The fields must only matter at initialisation: the state is
  then trained with `trainer`'s compiled step, whatever the fields' values."""
  config = trainer.config.copy_and_resolve_references()
  config.model.update(model_fields)
  model = train.create_model(config, trainer.dataset)
  host = train.create_train_state(config, model, trainer.task, trainer.tx, trainer.dataset,
                                  trainer.num_devices)
  return trainer.to_devices(host)


def fit(trainer: loop.Trainer, state: train.TrainState, num_steps: int,
        eval_every: int = 0) -> tuple[train.TrainState, dict]:
  """`num_steps` steps of `trainer` from `state`; validation (population estimate, the
  config's `eval.max_batches`) every `eval_every` steps and at the end (none when 0).

  Returns `(state, history)`, history = `{'step', 'train_loss', 'train_accuracy',
  'eval_step', 'eval': [{'loss', 'metric'}], 'seconds'}`; the metric is accuracy or bits
  per character. Non-finite losses are recorded (as the papers' unstable runs would be).
  The step donates `state` (`config.train.donate_state`): use the state returned.
  """
  if num_steps <= 0 or eval_every < 0:
    raise ValueError(f'num_steps ({num_steps}) must be > 0 and eval_every ({eval_every}) '
                     '>= 0.')
  start = time.time()
  history = {'step': [], 'train_loss': [], 'train_accuracy': [], 'eval_step': [],
             'eval': []}
  pending = []

  def record_steps():
    for s, m in jax.device_get(pending):
      history['step'].append(s)
      history['train_loss'].append(float(m['loss'][0]))
      history['train_accuracy'].append(float(m['accuracy'][0]))
    pending.clear()

  first = int(state.step[0])
  for step in range(first + 1, first + num_steps + 1):
    state, metrics = trainer.p_train_step(state, trainer.train_batch(step - 1))
    pending.append((step, metrics))
    if eval_every and (step % eval_every == 0 or step == first + num_steps):
      record_steps()
      metrics = trainer.evaluate(state, 'valid')
      history['eval_step'].append(step)
      history['eval'].append({'loss': metrics['loss'],
                              'metric': metrics[metric_name(trainer)]})
  record_steps()
  history['seconds'] = time.time() - start
  return state, history


def evaluate_with(trainer: loop.Trainer, state: train.TrainState, batch_stats,
                  split: str = 'valid') -> dict:
  """`split`'s metrics with these host population statistics instead of the estimate.

  `Trainer.evaluate(kind='running')` evaluates with the state's own `batch_stats`, so the
  given statistics are swapped in there."""
  replicated = parallel.replicate(batch_stats, trainer.devices)
  return trainer.evaluate(state.replace(batch_stats=replicated), split, 'running')


def unmapped_model(trainer: loop.Trainer):
  """`trainer`'s model without the pmap axis name, to apply it outside `pmap`."""
  return models.with_layer_fields(trainer.model, axis_name=None)


def without_h0_noise(model):
  """`model` with `initial_state='zeros'`: the same parameters, whose estimate's pass
  draws no h0 noise (the estimate as inference alone would run it)."""
  return models.with_layer_fields(model, initial_state='zeros')


def host_variables(trainer: loop.Trainer, state: train.TrainState) -> dict:
  """`{'params', 'batch_stats'}` of a device state, as host arrays."""
  host = trainer.to_host(state)
  return {'params': host.params, 'batch_stats': host.batch_stats}


def batch_statistics_accuracy(trainer: loop.Trainer, state) -> float:
  """Validation accuracy (the config's first `eval.max_batches` batches) in training
  mode, h0 noise included: every batch normalised by its own moments."""
  model = unmapped_model(trainer)
  variables = host_variables(trainer, state)

  @jax.jit
  def correct(batch, key):
    logits, _ = model.apply(variables, batch['inputs'], use_running_average=False,
                            deterministic=False, rngs={'noise': key},
                            mutable=['batch_stats'])
    hits = (jnp.argmax(logits, -1) == batch['labels']) * batch['weights']
    return jnp.sum(hits), jnp.sum(batch['weights'])
  totals = np.zeros(2)
  batches = trainer.dataset.eval_batches('valid')
  for i in range(trainer.config.eval.max_batches):
    totals += np.asarray(correct(next(batches), jax.random.PRNGKey(i)), np.float64)
  return float(totals[0] / totals[1])
