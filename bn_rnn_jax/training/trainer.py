"""`Trainer`: one run's model, optimizer and device-mapped steps, the state's placement on
the devices, and evaluation, deterministic and normalised as `config.eval.population_stats`
says: 'estimate' (the papers' estimate, the default), 'running' or 'batch'."""

from __future__ import annotations

import functools
import json
import time
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np

from bn_rnn_jax import extras
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import population
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import optim
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import tasks
from bn_rnn_jax.training import train
from bn_rnn_jax.training.train import TrainState

with extras.needed_by(__name__):
  import ml_collections
  import optax
  from absl import logging

_EVAL_LOG_EVERY_S = 10.0  # an evaluation logs its progress at most this often


class _DeviceSteps(NamedTuple):
  tx: optax.GradientTransformation
  train: Callable
  eval: Callable
  batch_eval: Callable
  minibatch_moments: Callable
  average_minibatch_moments: Callable


# Trainers of one model, task, optimizer and devices share their device-mapped steps, so
# each program is traced and compiled once per process (tests, analyses and campaign
# evaluations build many Trainers of one run).
@functools.lru_cache(maxsize=8)
def _device_steps(model, task, optimizer_json: str, steps_per_epoch: int,
                  carries_state: bool, devices: tuple, backend: str,
                  donates_state: bool) -> _DeviceSteps:
  """The steps for these arguments; `optimizer_json` is `config.optimizer.to_json()`."""
  optimizer = ml_collections.ConfigDict({'optimizer': json.loads(optimizer_json)})
  tx = optim.create_optimizer(optimizer, steps_per_epoch)
  common = dict(model=model, task=task)
  device_map = functools.partial(parallel.device_map, devices=devices, backend=backend)
  return _DeviceSteps(
      tx=tx,
      train=device_map(functools.partial(train.train_step, tx=tx,
                                         carries_state=carries_state, **common),
                       donate_argnums=(0,) if donates_state else ()),
      eval=device_map(functools.partial(train.eval_step, **common)),
      batch_eval=device_map(functools.partial(train.eval_step, batch_statistics=True,
                                              **common)),
      minibatch_moments=device_map(functools.partial(train.minibatch_moments_step, **common)),
      average_minibatch_moments=device_map(population.average_minibatch_moments))


class Trainer:
  """The device-mapped steps of one run, and the state's placement on devices.

  `config` is validated and the distributed runtime started, unless `checked` says the
  caller did both; `dataset` defaults to `input_pipeline.get_dataset(config)` and must be
  given for a run whose config.json records a dataset object (`config.data.given`).
  """

  def __init__(self, config, workdir: Optional[str] = None, dataset=None, *,
               checked: bool = False):
    if not checked:
      config_lib.validate_config(config)
      parallel.maybe_initialize_distributed(config)
    self.config = config
    self.devices = parallel.local_devices(config.train.num_devices)
    self.num_devices = len(self.devices)
    global_devices = self.num_devices * jax.process_count()
    parallel.check_divisible(config.train.batch_size, global_devices,
                             'config.train.batch_size')
    parallel.check_divisible(config.eval.batch_size, global_devices,
                             'config.eval.batch_size')
    if dataset is None and config.data.get('given'):
      raise ValueError(f'The run was trained on a dataset object (config.data.name='
                       f'{config.data.name!r}, given to train_and_evaluate), which '
                       'config.json cannot hold: pass the same dataset again (dataset=...).')
    self.dataset = dataset or input_pipeline.get_dataset(
        config, workdir=workdir, process_index=jax.process_index(),
        process_count=jax.process_count())
    self.task = tasks.get(self.dataset.task, getattr(self.dataset, 'unit', None))
    self.model = train.create_model(config, self.dataset)
    self.backend = config.parallel.backend
    # With config.train.donate_state the step donates its state (argument 0): the state
    # passed in is deleted by the call; `copy_state` keeps one that outlives it.
    self.donates_state = bool(config.train.get('donate_state', True))
    steps = train.call_cached(
        _device_steps, self.model, self.task, config.optimizer.to_json(),
        self.dataset.steps_per_epoch, self.dataset.carries_state, tuple(self.devices),
        self.backend, self.donates_state)
    self.tx = steps.tx
    self.p_train_step = steps.train
    self.p_eval_step = steps.eval
    self.p_batch_eval_step = steps.batch_eval
    self.p_minibatch_moments_step = steps.minibatch_moments
    self.p_average_minibatch_moments = steps.average_minibatch_moments
    self._thin_rows_reported = False

  # ---------------------------------------------------------------- placement
  def initial_state(self) -> TrainState:
    """A fresh host state (see `train.create_train_state`)."""
    return train.create_train_state(self.config, self.model, self.task, self.tx,
                                    self.dataset, self.num_devices)

  def to_devices(self, host_state: TrainState) -> TrainState:
    """Replicate a host state; its carry is already split per device."""
    state = parallel.replicate(host_state.replace(carry=None), self.devices, self.backend)
    carry = host_state.carry
    if carry is not None:
      carry = parallel.put_sharded(carry, self.devices, self.backend)
    return state.replace(carry=carry)

  def copy_state(self, state: TrainState) -> TrainState:
    """A device state that stays readable after `state` is passed to `p_train_step`: a
    copy on the devices when the step donates its state, else `state` itself."""
    if not self.donates_state:
      return state
    return parallel.copy_on_devices(state, self.devices, self.backend)

  def to_host(self, state: TrainState) -> TrainState:
    """Device 0's copy of a device state as host arrays (the carry still split per device);
    safe to keep after `state` is donated to a step."""
    carry = None if state.carry is None else jax.tree.map(np.asarray, state.carry)
    return parallel.unreplicate(state.replace(carry=None)).replace(carry=carry)

  def shard(self, batch, place: bool = False):
    """A host batch `[B, ...]` split over the devices, `[D, B / D, ...]`; placed on them when
    `place` or when the backend is shard_map."""
    batch = parallel.shard(batch, self.num_devices)
    if self.backend == 'pmap' and not place:
      return batch  # pmap splits host arrays itself
    return parallel.put_sharded(batch, self.devices, self.backend)

  def train_batch(self, step: int):
    return self.shard(self.dataset.train_batch(step))

  def device_batch(self, step: int):
    """`train_batch(step)` already placed on the devices (the loop's prefetch)."""
    return self.shard(self.dataset.train_batch(step), place=True)

  # ---------------------------------------------------------------- evaluation
  def population_stats(self, state: TrainState, kind: Optional[str] = None):
    """Replicated statistics for evaluation: the running average, or the estimate over
    `population_batches` batches of `population_batch_size // train.batch_size` (default 1)
    consecutive training batches each, read from the current step on, with the current parameters."""
    kind = kind or self.config.eval.population_stats
    if kind in ('running', 'batch') or not jax.tree.leaves(state.batch_stats):
      return state.batch_stats
    step = int(state.step[0])
    joined = (self.config.eval.population_batch_size or self.config.train.batch_size) \
        // self.config.train.batch_size
    records = []
    for i in range(self.config.eval.population_batches):
      first = step + i * joined
      parts = [self.dataset.train_batch(first + j) for j in range(joined)]
      batch = jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)
      noise_key = parallel.replicate(train.estimate_noise_key(self.config.seed, step, i),
                                     self.devices, self.backend)
      records.append(self.p_minibatch_moments_step(state.params, state.batch_stats,
                                                   self.shard(batch), noise_key))
    if not self._thin_rows_reported:  # once a run: the same rows stay thin
      self._thin_rows_reported = True
      for line in population.thin_rows([jax.tree.map(lambda x: np.asarray(x[0]), r)
                                        for r in records]):
        logging.warning('population estimate: %s.', line)
    return self.p_average_minibatch_moments(tuple(records))

  def evaluate(self, state: TrainState, split: str, kind: Optional[str] = None,
               max_batches: Optional[int] = None) -> dict:
    """Metrics of `split`, normalised as `kind` says (default `config.eval.population_stats`).
    `max_batches` (default `config.eval.max_batches`; None or 0 = all) caps the batches read,
    and `evaluated_count` is then the entries scored."""
    start = last_log = time.time()
    kind = kind or self.config.eval.population_stats
    stats = self.population_stats(state, kind)
    step = self.p_batch_eval_step if kind == 'batch' else self.p_eval_step
    totals, count, carry, batches = None, 0.0, None, 0
    if max_batches is None:
      max_batches = self.config.eval.max_batches
    for batch in self.dataset.eval_batches(split):
      if max_batches and batches >= max_batches:
        break
      sums, n, new_carry = step(state.params, stats, self.shard(batch), carry)
      carry = new_carry if self.dataset.carries_state else None
      sums = {k: float(v[0]) for k, v in sums.items()}
      totals = sums if totals is None else {k: totals[k] + v for k, v in sums.items()}
      count += float(n[0])
      batches += 1
      if time.time() - last_log > _EVAL_LOG_EVERY_S:
        last_log = time.time()
        logging.info('evaluating %s: %d batches, %d %s so far, %.0f s', split, batches,
                     count, self.task.counted, last_log - start)
    if totals is None:
      raise ValueError(f'Split {split!r} has no evaluation batches.')
    cap = f' (the first {max_batches}: config.eval.max_batches)' if (
        max_batches and batches == max_batches) else ''
    logging.info('evaluated %s: %d batches%s, %d %s, %.1f s, %s', split, batches, cap,
                 count, self.task.counted, time.time() - start,
                 self._statistics_text(state, kind))
    self.evaluated_count = int(count)
    return self.task.finalize({k: v / max(count, 1.0) for k, v in totals.items()})

  def _statistics_text(self, state: TrainState, kind: str) -> str:
    """What the evaluation normalised with, for its log line."""
    if not jax.tree.leaves(state.batch_stats):
      return 'no batch statistics'
    if kind == 'running':
      return 'population statistics: the running average'
    if kind == 'batch':
      return "each evaluation batch's own statistics"
    size = self.config.eval.population_batch_size or self.config.train.batch_size
    return (f'population statistics: the estimate from {self.config.eval.population_batches}'
            f' training batches of {size}')
