"""The trainer (the 'train' extra): config, tasks, optimizers, the pure steps, the device
layout, the loop, checkpoints and metrics. No module is imported until it is used, so
`from bn_rnn_jax.training import config` (what experiment configs do) imports no JAX."""

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
