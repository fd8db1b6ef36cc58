"""Task-generic training loop: TrainState, train/eval steps, population statistics.

Interface for tasks (read this before adding one)
-------------------------------------------------
The loop knows nothing about MNIST or text. It gets everything task-specific from:

1. The dataset, `input_pipeline.get_dataset(config, workdir, process_index,
   process_count)` (interface in `input_pipeline/__init__.py`): `task`, `model_kwargs`,
   `train_length`, `steps_per_epoch`, `carries_state`, `train_batch(step)` (a pure
   function of (seed, step)), `eval_batches(split)`.
2. `tasks.get(dataset.task)`, a `Task` (see `tasks.py`): how to build the model, apply
   it, sum its loss and metrics over valid entries, and finalise the means. New tasks
   register themselves there; nothing here changes.
3. Carried state (Zaremba et al. 2014): when `dataset.carries_state`, `TrainState.carry`
   holds the model's final recurrent state of the previous step, per device
   (`[devices, batch / devices, H]` leaves). `train_step` passes it as `initial_carries`
   (zeroing the rows where `batch['reset']` is 1) and stores the new one (no gradient
   flows across segments). It is checkpointed, so a resumed run stays exact.

Steps are written for one device's batch; `parallel.device_map` maps them over devices
with axis 'batch' (pmap, or jit of shard_map: `config.parallel.backend`). The loss of a
device is its sum divided by the *global* count and gradients are psum-ed, so N devices
compute exactly the single-device gradient of the global batch, and the layers' batch
moments are global (psums of sums and counts).

Evaluation always uses population statistics (train=False): either the running average
kept in `batch_stats` ('running') or the papers' estimate ('estimate', the default):
minibatch moments averaged over `config.eval.population_batches` training batches with
the current parameters (`normalization.average_moment_records`), optionally of batches
larger than the training batch (`config.eval.population_batch_size`; see the README's
note on 784-step MNIST).
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax import lax

from bn_rnn_jax import checkpoint as checkpoint_lib
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import metric_writer
from bn_rnn_jax import normalization
from bn_rnn_jax import parallel
from bn_rnn_jax import tasks
from bn_rnn_jax.tasks import Task

AXIS = parallel.AXIS


# ====================================================================== state
@flax.struct.dataclass
class TrainState:
  """Everything a step reads and writes; checkpointed whole.

  step: int32 scalar; params, batch_stats (running population statistics), opt_state;
  rng: the run's base PRNG key (per-step keys are `fold_in(rng, step)`, so resuming does
  not depend on history); carry: the carried recurrent state or None.
  """
  step: Any
  params: Any
  batch_stats: Any
  opt_state: Any
  rng: Any
  carry: Any = None


# ====================================================================== construction
def layer_options(config, train_length: int) -> dict:
  """`RecurrentLayer` fields from `config.model`, with the pmap axis name."""
  m = config.model
  max_length = m.get('max_length', 0) or train_length
  if train_length > max_length:
    raise ValueError(f'Training sequences have T={train_length} steps but '
                     f'config.model.max_length={max_length} (T_max) is smaller.')
  options = dict(max_length=max_length, axis_name=AXIS)
  for name in ('recurrent_init', 'initial_state', 'initial_state_noise', 'gamma_init',
               'momentum', 'forget_bias', 'unroll', 'remat', 'backward', 'epsilon',
               'hoist_input', 'min_step_count'):
    if m.get(name) is not None:
      options[name] = m[name]
  options.update(dict(m.get('layer_options', {})))
  return options


def create_model(config, dataset):
  options = layer_options(config, dataset.train_length)
  return tasks.get(dataset.task).build_model(config, dict(dataset.model_kwargs), options)


def learning_rate_schedule(config, steps_per_epoch: int):
  """Constant, or Zaremba's step decay: the initial rate for `decay_after_epochs` epochs,
  then multiplied by `decay_rate` at the start of every further epoch."""
  o = config.optimizer
  if o.get('schedule', 'constant') == 'constant':
    return o.learning_rate
  if o.schedule == 'step_decay':
    start = o.decay_after_epochs
    rate = o.decay_rate
    lr = o.learning_rate
    def schedule(count):
      epoch = count // steps_per_epoch
      return lr * rate ** jnp.maximum(0, epoch - start + 1).astype(jnp.float32)
    return schedule
  raise ValueError(f"config.optimizer.schedule must be 'constant' or 'step_decay'; got "
                   f'{o.schedule!r}.')


def create_optimizer(config, steps_per_epoch: int) -> optax.GradientTransformation:
  """RMSProp+momentum (seq-MNIST), Adam (char LM), SGD (word PTB), after global-norm
  gradient clipping (`clip_norm` <= 0 turns it off)."""
  o = config.optimizer
  lr = learning_rate_schedule(config, steps_per_epoch)
  if o.name == 'rmsprop':
    opt = optax.rmsprop(lr, decay=o.get('decay', 0.9), eps=o.get('eps', 1e-8),
                        momentum=o.get('momentum') or None,
                        centered=o.get('centered', False))
  elif o.name == 'adam':
    opt = optax.adam(lr, b1=o.get('b1', 0.9), b2=o.get('b2', 0.999), eps=o.get('eps', 1e-8))
  elif o.name == 'sgd':
    opt = optax.sgd(lr, momentum=o.get('momentum') or None)
  else:
    raise ValueError(f"config.optimizer.name must be 'rmsprop', 'adam' or 'sgd'; got "
                     f'{o.name!r}.')
  clip = o.get('clip_norm', 0.0)
  return optax.chain(optax.clip_by_global_norm(clip), opt) if clip > 0 else opt


def initial_variables(model, task: Task, batch, seed: int):
  """Model variables from one (per-device) example batch."""
  rng = jax.random.PRNGKey(seed)
  params_rng, noise_rng, dropout_rng = jax.random.split(rng, 3)
  rngs = {'params': params_rng, 'noise': noise_rng, 'dropout': dropout_rng}
  init = lambda: model.init(rngs, batch['inputs'], batch.get('mask'), train=False)
  return jax.jit(init)()


def zero_carry(model, task: Task, variables, batch) -> Any:
  """Zeros shaped like the model's final carries for `batch` (one device's share)."""
  shapes = jax.eval_shape(
      lambda v, b: task.apply(model, v, b, False, None)[0][0], variables, batch)
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


# Normalisation scales and shifts of the recurrent layers: `uniform_init` leaves them at
# their initial values (gamma = 0.1 or 1, beta = 0 are part of the method).
_NORM_PARAMS = ('input_scale', 'recurrent_scale', 'scale', 'cell_scale', 'cell_bias')


def uniform_init(params, key, scale: float):
  """Zaremba et al.'s initialisation: every parameter (embedding, kernels, biases,
  softmax) drawn from U(-scale, scale), except the normalisation scales and shifts."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  keys = iter(jax.random.split(key, len(flat)))
  def draw(path, value):
    k = next(keys)
    if getattr(path[-1], 'key', None) in _NORM_PARAMS:
      return value
    return np.asarray(jax.random.uniform(k, value.shape, value.dtype, -scale, scale))
  return jax.tree_util.tree_map_with_path(draw, params)


def create_train_state(config, model, task: Task, tx, dataset, num_devices: int):
  """A host (unreplicated) TrainState; `carry` has a leading device axis."""
  batch = parallel.shard(dataset.train_batch(0), num_devices)
  device_batch = jax.tree.map(lambda x: x[0], batch)
  variables = initial_variables(model, task, device_batch, config.seed)
  params = variables['params']
  if config.model.get('uniform_init_scale'):
    params = uniform_init(params, jax.random.PRNGKey(config.seed + 2),
                          config.model.uniform_init_scale)
  carry = None
  if dataset.carries_state:
    zeros = zero_carry(model, task, variables, device_batch)
    carry = jax.tree.map(lambda z: np.broadcast_to(z, (num_devices,) + z.shape).copy(),
                         zeros)
  state = TrainState(step=np.int32(0), params=params,
                     batch_stats=variables.get('batch_stats', {}),
                     opt_state=tx.init(params),
                     rng=jax.random.PRNGKey(config.seed + 1), carry=carry)
  return jax.tree.map(np.asarray, state)


# ====================================================================== steps
def _step_rngs(rng, step):
  """Per-step keys for h0 noise and dropout: a function of (seed, step) only, the same on
  every device. The layers fold each example's global row into them
  (`recurrent.per_example_keys`, DESIGN.md decision 8), so N devices draw the noise and
  dropout masks of 1 device, and a resumed run draws what the uninterrupted one did."""
  noise, dropout = jax.random.split(jax.random.fold_in(rng, step))
  return {'noise': noise, 'dropout': dropout}


def _reset_carry(carry, reset):
  """Zero the carried state of the rows where `reset` [B] is 1."""
  keep = 1.0 - reset.astype(jnp.float32)
  return jax.tree.map(lambda c: c * keep.reshape((-1,) + (1,) * (c.ndim - 1)), carry)


def _global_means(sums, count):
  """Psum sums and counts over devices: the global batch's means."""
  sums, count = lax.psum((sums, count), AXIS)
  return jax.tree.map(lambda s: s / jnp.maximum(count, 1.0), sums), count


def train_step(state: TrainState, batch, *, model, task: Task, tx, carries_state: bool):
  """One optimisation step on one device's share of the global batch (inside pmap)."""
  rngs = _step_rngs(state.rng, state.step)
  carry = state.carry if carries_state else None
  if carries_state and 'reset' in batch:
    carry = _reset_carry(carry, batch['reset'])
  def loss_fn(params):
    variables = {'params': params, 'batch_stats': state.batch_stats}
    (new_carry, logits), mutated = task.apply(
        model, variables, batch, True, carry, rngs=rngs, mutable=['batch_stats'])
    sums, count = task.loss_sums(logits, batch)
    return sums['loss'], (sums, count, mutated, new_carry)

  # The gradient of the local loss *sum*; psum-ed and divided by the global count below,
  # it is the gradient of the global batch's mean loss, however the batch is split.
  grads, (sums, count, mutated, new_carry) = jax.grad(loss_fn, has_aux=True)(state.params)
  metrics, total = _global_means(sums, count)
  grads = jax.tree.map(lambda g: g / jnp.maximum(total, 1.0), lax.psum(grads, AXIS))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics['grad_norm'] = optax.tree.norm(grads)
  new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state,
      batch_stats=mutated.get('batch_stats', state.batch_stats),
      carry=lax.stop_gradient(new_carry) if carries_state else state.carry)
  # 1.0 when the new state and the metrics are finite: checked on the host when the loop
  # fetches metrics, which it does before every save (see `_run`).
  metrics[FINITE] = all_finite((new_state.params, new_state.batch_stats,
                                new_state.opt_state, new_state.carry, metrics))
  return new_state, metrics


FINITE = 'finite'  # the metrics entry of `train_step` that is not a metric


_FINITE_CHECK_JOINED_SIZE = 1 << 16  # `all_finite` checks leaves up to this size jointly


def all_finite(tree) -> jax.Array:
  """float32 scalar: 1.0 when every floating leaf of `tree` is finite, else 0.0.

  Leaves of up to `_FINITE_CHECK_JOINED_SIZE` elements are checked together, one check
  per dtype over their concatenation: a reduction per leaf costs compile time (0.4 s of
  the quickstart BN-LSTM's train step, with its ~40 small statistics, parameter and
  optimizer leaves), while copying the small leaves (1 MB there) costs no measurable
  step time.
  """
  small, flags = {}, []
  for x in jax.tree.leaves(tree):
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.inexact):
      continue
    if jnp.size(x) <= _FINITE_CHECK_JOINED_SIZE:
      small.setdefault(dtype, []).append(jnp.ravel(x))
    else:
      flags.append(jnp.all(jnp.isfinite(x)))
  flags += [jnp.all(jnp.isfinite(jnp.concatenate(group))) for group in small.values()]
  return jnp.all(jnp.stack(flags)).astype(jnp.float32) if flags else jnp.float32(1.0)


def eval_step(params, batch_stats, batch, carry, *, model, task: Task):
  """Metric sums of one eval batch with population statistics (train=False).

  Returns `(sums, count, final_carry)`, sums and count psum-ed over devices.
  """
  variables = {'params': params, 'batch_stats': batch_stats}
  (new_carry, logits), _ = task.apply(model, variables, batch, False, carry)
  sums, count = task.loss_sums(logits, batch)
  sums, count = lax.psum((sums, count), AXIS)
  return sums, count, new_carry


def moments_step(params, batch_stats, batch, rng, step, *, model, task: Task):
  """This training batch's per-step batch moments (the `batch_moments` collection).

  Run in training mode with the current parameters; the moments are global (psum-ed by
  the layers), so every device returns the same record.
  """
  variables = {'params': params, 'batch_stats': batch_stats}
  _, mutated = task.apply(model, variables, batch, True, None, rngs=_step_rngs(rng, step),
                          mutable=['batch_stats', 'batch_moments'])
  return mutated.get('batch_moments', {})


# ====================================================================== config
def default_config() -> ml_collections.ConfigDict:
  """Fields every run has; `experiments/configs/*.py` start from this and set the
  task's values (and add `config.data` fields of their dataset)."""
  placeholder = ml_collections.config_dict.placeholder
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.data = ml_collections.ConfigDict({'name': 'mnist'})

  config.model = m = ml_collections.ConfigDict()
  m.variant = 'bn_lstm'          # a name in recurrent.VARIANTS
  m.hidden_size = 100
  m.num_layers = 1
  m.dropout_rate = 0.0
  m.max_length = 0               # T_max of the per-step statistics; 0 = training length
  m.recurrent_init = 'orthogonal'
  m.initial_state = 'zeros'      # 'zeros' | 'learned' | 'noise'
  m.initial_state_noise = 0.1
  m.gamma_init = placeholder(float)   # None = the variant's default (0.1 BN, 1.0 LN)
  m.momentum = 0.99              # running-average momentum of the population statistics
  m.min_step_count = 1           # per-step moments need this many valid sequences; fewer:
                                 # the population rows (RecurrentLayer.min_step_count)
  m.forget_bias = 0.0
  m.unroll = 1
  m.remat = 'auto'               # RecurrentLayer.remat: on CPU, by size (README Speed)
  m.backward = 'auto'            # RecurrentLayer.backward: 'scan' | 'layer' | 'auto' (on CPU
                                 # 'layer' for LSTMs with H >= 8 B; README Speed)
  m.hoist_input = placeholder(bool)
  m.embed_size = placeholder(int)     # language models: None = one-hot inputs
  m.uniform_init_scale = placeholder(float)  # every param but BN's ~ U(-s, s) (Zaremba)

  config.optimizer = o = ml_collections.ConfigDict()
  o.name = 'rmsprop'             # 'rmsprop' | 'adam' | 'sgd'
  o.learning_rate = 1e-3
  o.momentum = 0.9               # rmsprop / sgd (0 = none)
  o.decay = 0.9                  # rmsprop's squared-gradient average
  o.eps = 1e-8
  o.centered = False
  o.b1 = 0.9
  o.b2 = 0.999
  o.clip_norm = 1.0              # global-norm clipping; <= 0 turns it off
  o.schedule = 'constant'        # 'constant' | 'step_decay' (Zaremba et al.)
  o.decay_rate = 0.5
  o.decay_after_epochs = 4       # epochs at the initial rate before the decay starts

  config.train = t = ml_collections.ConfigDict()
  t.batch_size = 100             # global batch (all devices of all processes)
  t.num_steps = 1000
  t.log_every = 50
  t.num_devices = 0              # local devices to use; 0 = all

  config.eval = e = ml_collections.ConfigDict()
  e.every = 500
  e.batch_size = 500
  e.splits = ('valid',)
  e.max_batches = 0              # periodic evals read at most this many batches; 0 = all
  e.test_at_end = True
  e.population_stats = 'estimate'   # 'estimate' (the papers') | 'running' (EMA)
  e.population_batches = 10
  # Examples per estimate batch; 0 = the training batch (the papers'). A multiple k of
  # train.batch_size joins k consecutive training batches into one: the moments of later
  # sites (the cell, upper layers) then match the population-mode network better.
  e.population_batch_size = 0
  e.compare_running = False      # also log `<metric>_running` (EMA statistics) in evals

  config.checkpoint = c = ml_collections.ConfigDict()
  c.every = 500
  c.keep = 2
  c.best_metric = 'valid/accuracy'
  c.best_mode = 'max'

  config.parallel = ml_collections.ConfigDict()
  config.parallel.backend = 'pmap'   # 'pmap' | 'shard_map' (jit of shard_map over a Mesh)

  config.distributed = d = ml_collections.ConfigDict()
  d.enabled = False              # call jax.distributed.initialize() (multi-host)
  d.coordinator_address = ''
  d.num_processes = 0
  d.process_id = -1
  return config


# ====================================================================== config checks
def validate_config(config) -> None:
  """One clear line per bad value, before anything is built."""
  positive = {
      'config.model.hidden_size': config.model.hidden_size,
      'config.model.num_layers': config.model.num_layers,
      'config.train.batch_size': config.train.batch_size,
      'config.train.num_steps': config.train.num_steps,
      'config.train.log_every': config.train.log_every,
      'config.eval.batch_size': config.eval.batch_size,
      'config.eval.every': config.eval.every,
      'config.checkpoint.every': config.checkpoint.every,
      'config.checkpoint.keep': config.checkpoint.keep,
  }
  for name, value in positive.items():
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f'{name} must be a positive integer; got {value!r}.')
  if config.model.get('max_length', 0) < 0:
    raise ValueError(f'config.model.max_length must be >= 0 (0 = the training length); '
                     f'got {config.model.max_length}.')
  parallel.check_backend(config.parallel.backend)
  if config.eval.population_stats not in ('estimate', 'running'):
    raise ValueError("config.eval.population_stats must be 'estimate' or 'running'; got "
                     f'{config.eval.population_stats!r}.')
  population_batch_size = config.eval.get('population_batch_size', 0)
  if population_batch_size < 0 or population_batch_size % config.train.batch_size:
    raise ValueError('config.eval.population_batch_size must be 0 (the training batch) or a '
                     f'multiple of config.train.batch_size={config.train.batch_size}; got '
                     f'{population_batch_size}.')
  if config.eval.population_stats == 'estimate' and config.eval.population_batches <= 0:
    raise ValueError('config.eval.population_batches must be positive with the '
                     f"'estimate' statistics; got {config.eval.population_batches}.")
  if config.checkpoint.best_mode not in ('max', 'min'):
    raise ValueError("config.checkpoint.best_mode must be 'max' or 'min'; got "
                     f'{config.checkpoint.best_mode!r}.')
  if config.checkpoint.best_metric.count('/') != 1:
    raise ValueError("config.checkpoint.best_metric must read 'split/metric' (e.g. "
                     f"'valid/accuracy'); got {config.checkpoint.best_metric!r}.")
  lr = config.optimizer.learning_rate
  if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
    raise ValueError(f'config.optimizer.learning_rate must be a positive finite number; '
                     f'got {lr!r}.')


# ====================================================================== the run
class Trainer:
  """The pmapped steps of one run, and the state's placement on devices."""

  def __init__(self, config, workdir: Optional[str] = None, dataset=None):
    validate_config(config)
    parallel.maybe_initialize_distributed(config)
    self.config = config
    self.devices = parallel.local_devices(config.train.get('num_devices', 0))
    self.num_devices = len(self.devices)
    global_devices = self.num_devices * jax.process_count()
    parallel.check_divisible(config.train.batch_size, global_devices,
                             'config.train.batch_size')
    parallel.check_divisible(config.eval.batch_size, global_devices,
                             'config.eval.batch_size')
    self.dataset = dataset or input_pipeline.get_dataset(
        config, workdir=workdir, process_index=jax.process_index(),
        process_count=jax.process_count())
    self.task = tasks.get(self.dataset.task)
    self.model = create_model(config, self.dataset)
    self.tx = create_optimizer(config, self.dataset.steps_per_epoch)
    common = dict(model=self.model, task=self.task)
    self.backend = parallel.check_backend(config.parallel.backend)
    device_map = functools.partial(parallel.device_map, devices=self.devices,
                                   backend=self.backend)
    self.p_train_step = device_map(functools.partial(
        train_step, tx=self.tx, carries_state=self.dataset.carries_state, **common))
    self.p_eval_step = device_map(functools.partial(eval_step, **common))
    self.p_moments_step = device_map(functools.partial(moments_step, **common),
                                     in_axes=(0, 0, 0, 0, None))
    self.p_population_estimate = device_map(normalization.population_estimate)

  # ---------------------------------------------------------------- placement
  def initial_state(self) -> TrainState:
    """A fresh host state (see `create_train_state`)."""
    return create_train_state(self.config, self.model, self.task, self.tx, self.dataset,
                              self.num_devices)

  def to_devices(self, host_state: TrainState) -> TrainState:
    """Replicate a host state; its carry is already split per device."""
    state = parallel.replicate(host_state.replace(carry=None), self.devices, self.backend)
    carry = host_state.carry
    if carry is not None:
      carry = parallel.put_sharded(carry, self.devices, self.backend)
    return state.replace(carry=carry)

  def to_host(self, state: TrainState) -> TrainState:
    carry = None if state.carry is None else jax.tree.map(np.asarray, state.carry)
    return parallel.unreplicate(state.replace(carry=None)).replace(carry=carry)

  def shard(self, batch, place: bool = False):
    """A host batch `[B, ...]` split over the devices: `[D, B / D, ...]`. Placed on the
    devices when `place` (the loop's prefetch) or when the backend reads only placed
    arrays well (shard_map); pmap splits host arrays itself."""
    batch = parallel.shard(batch, self.num_devices)
    if self.backend == 'pmap' and not place:
      return batch
    return parallel.put_sharded(batch, self.devices, self.backend)

  def train_batch(self, step: int):
    return self.shard(self.dataset.train_batch(step))

  def device_batch(self, step: int):
    """`train_batch(step)` already placed on the devices (the loop's prefetch)."""
    return self.shard(self.dataset.train_batch(step), place=True)

  # ---------------------------------------------------------------- evaluation
  def population_stats(self, state: TrainState, kind: Optional[str] = None):
    """Replicated statistics for evaluation: the running average or the estimate.

    'estimate' averages the batch moments of `population_batches` estimate batches,
    computed with the current parameters. Each is `population_batch_size //
    train.batch_size` consecutive training batches joined (one when the size is 0), read
    from the current step on (a deterministic function of (seed, step)).
    """
    kind = kind or self.config.eval.population_stats
    if kind == 'running' or not jax.tree.leaves(state.batch_stats):
      return state.batch_stats
    step = int(state.step[0])
    joined = max(1, self.config.eval.get('population_batch_size', 0)
                 // self.config.train.batch_size)
    records = []
    for i in range(self.config.eval.population_batches):
      first = step + i * joined
      parts = [self.dataset.train_batch(first + j) for j in range(joined)]
      batch = jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)
      records.append(self.p_moments_step(state.params, state.batch_stats,
                                         self.shard(batch), state.rng, first))
    return self.p_population_estimate(tuple(records))

  def evaluate(self, state: TrainState, split: str, kind: Optional[str] = None,
               max_batches: Optional[int] = None) -> dict:
    """Metrics of `split` with population statistics (never batch statistics).

    `max_batches` (default `config.eval.max_batches`; 0 = all) caps the batches read.
    """
    stats = self.population_stats(state, kind)
    totals, count, carry = None, 0.0, None
    if max_batches is None:
      max_batches = self.config.eval.get('max_batches', 0)
    for i, batch in enumerate(self.dataset.eval_batches(split)):
      if max_batches and i >= max_batches:
        break
      sums, n, new_carry = self.p_eval_step(state.params, stats, self.shard(batch), carry)
      carry = new_carry if self.dataset.carries_state else None
      sums = {k: float(v[0]) for k, v in sums.items()}
      totals = sums if totals is None else {k: totals[k] + v for k, v in sums.items()}
      count += float(n[0])
    if totals is None:
      raise ValueError(f'Split {split!r} has no evaluation batches.')
    return self.task.finalize({k: v / max(count, 1.0) for k, v in totals.items()})


def _write_config(config, workdir: str) -> None:
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True) + '\n')


def _better(value: float, best: Optional[float], mode: str) -> bool:
  if best is None:
    return True
  return value > best if mode == 'max' else value < best


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       dataset=None) -> dict:
  """Train, evaluate, checkpoint; resume from the newest intact checkpoint in `workdir`.

  Returns the last metrics of every split logged, e.g. `{'valid': {...}, 'test': {...}}`.
  Raises FloatingPointError on a non-finite state or metric, naming the first bad step,
  after saving the last good (finite) state; `checkpoint.WorkdirInUse` when another run
  holds the workdir (`checkpoint.WorkdirLock`); ValueError for a bad workdir, config or data.
  """
  _make_workdir(workdir)
  primary = jax.process_index() == 0
  lock = checkpoint_lib.WorkdirLock(workdir).acquire() if primary else None
  try:
    trainer = Trainer(config, workdir, dataset)
    _check_eval_splits(config, trainer)
    if primary:
      _write_config(config, workdir)
    writer = metric_writer.MetricWriter(workdir, enabled=primary)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
    try:
      return _run(config, trainer, writer, ckpt)
    finally:
      ckpt.close()
      writer.close()
  finally:
    if lock is not None:
      lock.release()


def _make_workdir(workdir: str) -> None:
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir {workdir} is a file, not a directory.')
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f'Cannot create the workdir {workdir} ({e.strerror}).') from e


def _check_eval_splits(config, trainer: Trainer) -> None:
  """Every split the run will evaluate has a batch, and `best_metric` names a metric the
  task logs: found now, not hours later."""
  name = config.checkpoint.best_metric.split('/')[1]
  if trainer.task.metrics and name not in trainer.task.metrics:
    raise ValueError(f'config.checkpoint.best_metric={config.checkpoint.best_metric!r} names '
                     f'no metric of the {trainer.dataset.task!r} task; it logs '
                     f'{sorted(trainer.task.metrics)}.')
  for split in config.eval.splits:
    if next(iter(trainer.dataset.eval_batches(split)), None) is None:
      raise ValueError(f'Split {split!r} has no evaluation batches (empty data?).')
  if config.eval.get('test_at_end', False):
    try:
      if next(iter(trainer.dataset.eval_batches('test')), None) is None:
        raise ValueError("Split 'test' has no evaluation batches (empty data?).")
    except ValueError as e:
      raise ValueError(f'{e} The end-of-run test (config.eval.test_at_end) needs a test '
                       'split: give the data one, or pass --config.eval.test_at_end=False.'
                       ) from None


class _Window:
  """Training metrics of the steps since the last log line, summed on the host in step
  order (float64, as `meta['window']` is checkpointed), from values fetched in blocks."""

  def __init__(self, sums: dict, steps: int):
    self.sums, self.steps = dict(sums), steps

  def add(self, metrics: dict) -> None:
    for k, v in metrics.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.steps += 1

  def means(self) -> dict:
    return {k: v / self.steps for k, v in self.sums.items()}

  def reset(self) -> None:
    self.sums, self.steps = {}, 0


def _run(config, trainer: Trainer, writer: metric_writer.MetricWriter, ckpt) -> dict:
  """The loop. It never waits on the device between fetches:

  - step k is dispatched (asynchronously), then batch k+1 is built on the host and put
    on the devices while step k runs (a prefetch of depth 2);
  - each step's metrics, with a device-side flag saying whether its new state and metrics
    are finite (`train_step`'s `finite`), stay on the device until a fetch point: every
    `log_every` steps, and before every evaluation and every save;
  - at a fetch, the first step whose flag is 0 stops the run, named exactly: the loop
    re-runs the (deterministic) steps from the last fetched state to the step before it,
    saves that state (checked finite again on the host) and raises FloatingPointError.
    So every checkpoint holds a state checked finite, and a bad state never evicts one.
  """
  template = trainer.initial_state()
  host_state = template
  meta = {'best': None, 'window': {}, 'window_steps': 0, 'time_s': 0.0}
  if ckpt.latest_step() is not None:
    host_state, meta = ckpt.restore(template)
    logging.info('Resumed from the checkpoint of step %d.', int(host_state.step))
  start = int(host_state.step)
  writer.truncate(start)
  state = trainer.to_devices(host_state)
  num_steps = config.train.num_steps
  last = {}
  eval_metric = config.checkpoint.best_metric  # e.g. 'valid/accuracy'
  timer = _Progress(start, num_steps, meta['time_s'])
  window = _Window(meta['window'], meta['window_steps'])
  checked = {'state': state, 'step': start}  # the newest state whose steps were all checked
  pending = []  # (step done, device metrics) not fetched yet

  def save(state_to_save, step, best=False):
    host = trainer.to_host(state_to_save)
    meta.update(window=window.sums, window_steps=window.steps, time_s=timer.elapsed())
    (ckpt.save_best if best else ckpt.save)(step, host, meta)  # it saves a deep copy

  def fetch(current, current_step):
    """Metrics of the pending steps to the host, in order; stop at a non-finite one."""
    values = jax.device_get([m for _, m in pending])
    for (done, _), m in zip(pending, values):
      m = {k: float(v[0]) for k, v in m.items()}
      if m.pop(FINITE) != 1.0 or not all(math.isfinite(v) for v in m.values()):
        stop_at(done, m)
      window.add(m)
    pending.clear()
    checked.update(state=current, step=current_step)

  def stop_at(bad, metrics):
    good = checked['state']
    for step in range(checked['step'], bad - 1):  # replay up to the last good step
      good, _ = trainer.p_train_step(good, trainer.device_batch(step))
    save(good, bad - 1)
    ckpt.wait()
    raise FloatingPointError(
        f'Non-finite state or training metrics at step {bad} ({metrics}); stopped. The '
        f'last good state (step {bad - 1}) is saved in {ckpt.latest.directory}.')

  batch = trainer.device_batch(start) if start < num_steps else None
  for step in range(start, num_steps):
    state, metrics = trainer.p_train_step(state, batch)
    done = step + 1
    pending.append((done, metrics))
    if done < num_steps:
      batch = trainer.device_batch(done)  # built while step `done` runs
    log = done % config.train.log_every == 0 or done == num_steps
    evaluate = done % config.eval.every == 0 or done == num_steps
    save_now = done % config.checkpoint.every == 0 or done == num_steps
    if not (log or evaluate or save_now):
      continue
    fetch(state, done)
    if log:
      means = window.means()
      writer.write(done, 'train', means, time_s=round(timer.elapsed(), 3))
      last['train'] = means
      window.reset()
      timer.log(done)
    if evaluate:
      for split in config.eval.splits:
        last[split] = trainer.evaluate(state, split)
        extra = {}
        if config.eval.get('compare_running', False):
          running = trainer.evaluate(state, split, 'running')
          extra = {f'{k}_running': v for k, v in running.items()}
        writer.write(done, split, {**last[split], **extra}, time_s=round(timer.elapsed(), 3))
      split, name = eval_metric.split('/')
      if split in last and name not in last[split]:
        raise ValueError(f'config.checkpoint.best_metric={eval_metric!r} names no metric of '
                         f'{split!r}; it has {sorted(last[split])}.')
      if split in last and _better(last[split][name], meta['best'],
                                   config.checkpoint.best_mode):
        meta['best'] = last[split][name]
        save(state, done, best=True)
    if save_now:
      save(state, done)
  if config.eval.get('test_at_end', False) and 'test' not in last:
    last['test'], tested_step = _test_best(trainer, state, ckpt, template)
    writer.write(num_steps, 'test', last['test'], checkpoint_step=tested_step,
                 time_s=round(timer.elapsed(), 3))
  return last


def _test_best(trainer: Trainer, state: TrainState, ckpt, template: TrainState):
  """Test metrics of the best-validation checkpoint (the papers' early-stopped model),
  or of the final state when there is none. Returns `(metrics, step tested)`."""
  ckpt.wait()
  # The whole test split, whatever `eval.max_batches` says for periodic evaluations.
  if ckpt.best.latest_step() is not None:
    try:
      best, _ = ckpt.restore(template, best=True)
      return trainer.evaluate(trainer.to_devices(best), 'test', max_batches=0), int(best.step)
    except ValueError as e:  # every best checkpoint damaged (each one warned about)
      logging.warning('%s Testing the final state instead.', e)
  return trainer.evaluate(state, 'test', max_batches=0), int(state.step[0])


class _Progress:
  """Steps/s and ETA lines (absl logging); wall time accumulated across restarts."""

  def __init__(self, start: int, num_steps: int, previous_s: float):
    self.start, self.num_steps = start, num_steps
    self.t0 = time.time()
    self.previous_s = previous_s

  def elapsed(self) -> float:
    return self.previous_s + time.time() - self.t0

  def log(self, step: int) -> None:
    rate = (step - self.start) / max(time.time() - self.t0, 1e-9)
    eta = (self.num_steps - step) / max(rate, 1e-9)
    logging.info('step %d/%d: %.2f steps/s, ETA %s', step, self.num_steps, rate,
                 time.strftime('%H:%M:%S', time.gmtime(eta)))
