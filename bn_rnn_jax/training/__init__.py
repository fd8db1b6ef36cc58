"""The trainer: everything a run needs beyond the layers, models and statistics.

  config         the default config and its checks (imports only ml_collections)
  tasks          the task registry: model, apply, loss sums, metrics per task
  optim          optimizers and schedules
  train          `TrainState` and the pure steps (train, eval, minibatch moments)
  parallel       device layout: replicate / shard, pmap or jit of shard_map
  trainer        `Trainer`: one run's model, optimizer, device-mapped steps, evaluation
  loop           `train_and_evaluate`: the loop, evaluation, resume
  environment    what a run sets up around itself: log lines shown, compilation cache
  workdir        what a workdir remembers: the first launch's config, changes since
  checkpoint     orbax checkpoints (latest K, best), content hashes, workdir lock
  metric_writer  metrics.jsonl, TensorBoard, progress lines

The trainer needs the 'train' extra (setup.py); the layers do not import it. This package
imports none of its modules until one is used, so that `from bn_rnn_jax.training import
config` (what experiment configs import) does not import JAX.
"""

import importlib

_MODULES = ('checkpoint', 'config', 'environment', 'loop', 'metric_writer', 'optim',
            'parallel', 'tasks', 'train', 'trainer', 'workdir')

__all__ = list(_MODULES)


def __getattr__(name):
  if name in _MODULES:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return __all__
