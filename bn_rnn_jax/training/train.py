"""Training as pure functions: the state, its creation, and the steps.

`create_train_state`, `train_step`, `eval_step` and `minibatch_moments_step` are pure
functions of one device's share of a batch, run under `parallel.device_map` (axis
'batch') by `trainer.py`; what is task-specific comes from a `tasks.Task`. A device's
loss is its sum over the *global* count and gradients are psum-ed, so N devices compute
the single-device gradient of the global batch. When `dataset.carries_state`,
`TrainState.carry` holds the final recurrent state of the previous step
(`[devices, batch / devices, H]` leaves), passed as `initial_carries` with the rows where
`batch['reset']` is 1 zeroed; no gradient flows across segments.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bn_rnn_jax import extras
from bn_rnn_jax import initializers
from bn_rnn_jax import modes
from bn_rnn_jax import policy
from bn_rnn_jax import population
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import tasks
from bn_rnn_jax.training.tasks import Task

with extras.needed_by(__name__):
  import optax

AXIS = parallel.AXIS

# The run's random streams all derive from `config.seed`, each at its own offset (changing
# one changes every run's numbers): the model's initial variables, the per-step keys of
# h0 noise and dropout, Zaremba's uniform re-initialisation, and the estimate's h0 noise.
INIT_SEED_OFFSET = 0
STEP_SEED_OFFSET = 1
UNIFORM_INIT_SEED_OFFSET = 2
ESTIMATE_SEED_OFFSET = 3


# ====================================================================== state
@flax.struct.dataclass
class TrainState:
  """Everything a step reads and writes; checkpointed whole.

  step: int32 scalar; params, batch_stats, opt_state; rng: the run's base key (step keys
  are `fold_in(rng, step)`); carry: the carried recurrent state or None.
  """
  step: Any
  params: Any
  batch_stats: Any
  opt_state: Any
  rng: Any
  carry: Any = None


# ====================================================================== construction
def layer_fields(config, train_length: int) -> dict:
  """The `RecurrentLayer` fields of `config.model`, with T_max and the device axis; the
  execution keys (`model.remat`, `model.unroll`, ...) as one `policy.Execution`; the
  initialisers by name (`recurrent_init`, `input_init`) and value (`gamma_init`) as the
  layer's `recurrent_kernel_init`, `kernel_init` and `scale_init`."""
  max_length = config.model.max_length or train_length
  if train_length > max_length:
    raise ValueError(f'Training sequences have T={train_length} steps but '
                     f'config.model.max_length={max_length} (T_max) is smaller.')
  fields = config_lib.layer_fields(config)
  if 'recurrent_init' in fields:
    fields['recurrent_kernel_init'] = initializers.recurrent_initializer(
        fields.pop('recurrent_init'))
  if 'input_init' in fields:
    fields['kernel_init'] = initializers.input_initializer(fields.pop('input_init'))
  if 'gamma_init' in fields:
    fields['scale_init'] = initializers.Constant(float(fields.pop('gamma_init')))
  settings = {name: fields.pop(name) for name in policy.EXECUTION_FIELDS if name in fields}
  execution = policy.Execution(**settings)
  return {**fields, 'execution': execution, 'max_length': max_length, 'axis_name': AXIS}


def create_model(config, dataset):
  """The task's model for `dataset`, its layers configured by `config.model`."""
  fields = layer_fields(config, dataset.train_length)
  return tasks.get(dataset.task).build_model(config, dict(dataset.model_kwargs), fields)


def initial_variables(model, batch, seed: int):
  """Model variables from one (per-device) example batch."""
  rng = jax.random.PRNGKey(seed + INIT_SEED_OFFSET)
  params_rng, noise_rng, dropout_rng = jax.random.split(rng, 3)
  rngs = {'params': params_rng, 'noise': noise_rng, 'dropout': dropout_rng}
  init = call_cached(_jitted_init, model)
  return init(rngs, batch['inputs'], batch.get('mask'))


def call_cached(fn, *args):
  """`fn(*args)` through its `functools.lru_cache`, or uncached where an argument cannot
  be hashed (a model with a dict field: its programs are its own)."""
  try:
    hash(args)
  except TypeError:
    return fn.__wrapped__(*args)
  return fn(*args)


@functools.lru_cache(maxsize=8)
def _jitted_init(model):
  """`model.init` jitted once per model, shared by every state made for it."""
  return jax.jit(lambda rngs, inputs, mask: model.init(rngs, inputs, mask,
                                                       **modes.EVAL.kwargs()))


def zero_carry(model, task: Task, variables, batch) -> Any:
  """Zeros shaped like the model's final carries for `batch` (one device's share)."""
  shapes = jax.eval_shape(
      lambda v, b: task.apply(model, v, b, **modes.EVAL.kwargs(), carry=None)[0][0],
      variables, batch)
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
  variables = initial_variables(model, device_batch, config.seed)
  params = variables['params']
  if config.model.uniform_init_scale:
    params = uniform_init(params, jax.random.PRNGKey(config.seed + UNIFORM_INIT_SEED_OFFSET),
                          config.model.uniform_init_scale)
  carry = None
  if dataset.carries_state:
    zeros = zero_carry(model, task, variables, device_batch)
    carry = jax.tree.map(lambda z: np.broadcast_to(z, (num_devices,) + z.shape).copy(),
                         zeros)
  state = TrainState(step=np.int32(0), params=params,
                     batch_stats=variables.get('batch_stats', {}),
                     opt_state=tx.init(params),
                     rng=jax.random.PRNGKey(config.seed + STEP_SEED_OFFSET), carry=carry)
  return jax.tree.map(np.asarray, state)


# ====================================================================== steps
def step_rngs(rng, step):
  """Per-step keys for h0 noise and dropout, a function of (seed, step) only; the layers
  fold in each example's global row (`sequence.per_example_keys`)."""
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
  rngs = step_rngs(state.rng, state.step)
  carry = state.carry if carries_state else None
  if carries_state and 'reset' in batch:
    carry = _reset_carry(carry, batch['reset'])
  def loss_fn(params):
    variables = {'params': params, 'batch_stats': state.batch_stats}
    (new_carry, logits), mutated = task.apply(
        model, variables, batch, **modes.TRAIN.kwargs(), carry=carry, rngs=rngs,
        mutable=['batch_stats'])
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
  # fetches metrics, which it does before every save (`loop.py`).
  metrics[FINITE] = all_finite((new_state.params, new_state.batch_stats,
                                new_state.opt_state, new_state.carry, metrics))
  return new_state, metrics


FINITE = 'finite'  # the metrics entry of `train_step` that is not a metric


# `all_finite` checks leaves up to this size jointly, one check per dtype: a reduction per
# small leaf (statistics, scales, optimizer moments) costs compile time; copying them is cheap.
_FINITE_CHECK_JOINED_SIZE = 1 << 16


def all_finite(tree) -> jax.Array:
  """float32 scalar: 1.0 when every floating leaf of `tree` is finite, else 0.0."""
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


def eval_step(params, batch_stats, batch, carry, *, model, task: Task,
              batch_statistics: bool = False):
  """Metric sums of one eval batch, deterministic (no dropout, no h0 noise).

  Normalised with the population statistics `batch_stats`, or with `batch_statistics` with
  the moments of this global batch over its real examples; nothing is recorded. Returns
  `(sums, count, final_carry)`, sums and count psum-ed over devices.
  """
  variables = {'params': params, 'batch_stats': batch_stats}
  if batch_statistics:
    (new_carry, logits), _ = task.apply(model, variables, mask_padding(batch),
                                        **modes.BATCH_STATISTICS.kwargs(), carry=carry,
                                        mutable=['batch_stats'])
  else:
    (new_carry, logits), _ = task.apply(model, variables, batch, **modes.EVAL.kwargs(),
                                        carry=carry)
  sums, count = task.loss_sums(logits, batch)
  sums, count = lax.psum((sums, count), AXIS)
  return sums, count, new_carry


def mask_padding(batch):
  """`batch` with its padding examples (`weights` 0) masked out of every step's mask, so
  that batch moments see only real examples; unchanged without `weights`."""
  if 'weights' not in batch:
    return batch
  real = (batch['weights'] > 0).astype(jnp.float32)
  inputs = batch['inputs']
  if isinstance(inputs, dict):  # the reader: its masks are inputs
    inputs = {k: v * real[:, None].astype(v.dtype) if k.endswith('_mask') else v
              for k, v in inputs.items()}
    return {**batch, 'inputs': inputs}
  mask = batch.get('mask')
  mask = jnp.ones(inputs.shape[:2], jnp.float32) if mask is None else mask
  return {**batch, 'mask': mask * real[:, None].astype(mask.dtype)}


def estimate_noise_key(seed: int, step: int, index: int):
  """The key of the h0 noise of the estimate's batch `index` at training step `step`: a
  function of (seed, step, index) only."""
  return jax.random.fold_in(jax.random.fold_in(
      jax.random.PRNGKey(seed + ESTIMATE_SEED_OFFSET), step), index)


def minibatch_moments_step(params, batch_stats, batch, noise_key, *, model, task: Task):
  """This training batch's per-step minibatch moments, one record of the papers' population
  estimate (`population.average_minibatch_moments`): the network run with batch statistics
  and training's h0 noise (from `noise_key`), without dropout, with the current
  parameters; nothing is recorded. The moments are global, the same on every device."""
  variables = {'params': params, 'batch_stats': batch_stats}
  _, mutated = task.apply(model, variables, batch, **modes.BATCH_STATISTICS.kwargs(),
                          carry=None, rngs={'noise': noise_key},
                          mutable=['batch_stats', population.MOMENTS])
  return mutated.get(population.MOMENTS, {})
