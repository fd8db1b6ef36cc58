"""Device layout in one place (DESIGN.md decision 5).

Train and eval steps are written for one device's batch and mapped over the local devices
with `jax.pmap(..., axis_name=AXIS)`; inside them gradients and metric sums are psum-ed
over AXIS and the recurrent layers (built with `axis_name=AXIS`) psum the sums and counts
of their batch moments, so every device sees the moments of the global batch. On one
device the same code runs under a 1-device pmap. Multi-host runs call
`jax.distributed.initialize()` first; each process then feeds its own share of the global
batch to its local devices, and the psums span all processes' devices.

Layout of arrays under pmap: replicated state has a leading axis of the local device
count (`replicate`); data (and a carried recurrent state) is split along its batch axis
into `[devices, batch / devices, ...]` (`shard`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from absl import logging

AXIS = 'batch'


def maybe_initialize_distributed(config) -> None:
  """`jax.distributed.initialize()` when `config.distributed.enabled` (multi-host).

  Empty fields are left to JAX's auto-detection (SLURM, TPU pods, ...).
  """
  dist = config.get('distributed')
  if dist is None or not dist.get('enabled', False):
    return
  if jax.distributed.is_initialized():
    return
  kwargs = {}
  if dist.get('coordinator_address'):
    kwargs['coordinator_address'] = dist.coordinator_address
  if dist.get('num_processes', 0):
    kwargs['num_processes'] = dist.num_processes
  if dist.get('process_id', -1) >= 0:
    kwargs['process_id'] = dist.process_id
  logging.info('jax.distributed.initialize(%s)', kwargs)
  jax.distributed.initialize(**kwargs)


def local_devices(num_devices: int = 0) -> list[Any]:
  """The first `num_devices` local devices (0 = all of them)."""
  devices = jax.local_devices()
  if num_devices < 0 or num_devices > len(devices):
    raise ValueError(f'config.train.num_devices={num_devices} but this process has '
                     f'{len(devices)} local devices (0 = use all).')
  return devices[:num_devices] if num_devices else devices


def check_divisible(global_batch: int, num_devices: int, what: str = 'batch size') -> int:
  """Per-device batch; a clear error when the global batch does not split evenly."""
  if global_batch <= 0:
    raise ValueError(f'{what} must be positive; got {global_batch}.')
  if global_batch % num_devices:
    raise ValueError(f'{what} {global_batch} does not divide evenly over {num_devices} '
                     f'devices; use a multiple of {num_devices}.')
  return global_batch // num_devices


def pmap(fn: Callable, devices: Optional[Sequence[Any]] = None, **kwargs) -> Callable:
  """`jax.pmap(fn, axis_name=AXIS)` over `devices` (all local devices when None).

  An explicit device list is only valid in a single-process run: across processes pmap
  must span every device, so there it is left to JAX.
  """
  if jax.process_count() > 1:
    devices = None
  return jax.pmap(fn, axis_name=AXIS, devices=devices, **kwargs)


def put_sharded(tree: Any, devices: Sequence[Any]) -> Any:
  """Place host arrays `[D, ...]` one slice per device, as pmap outputs are placed.

  Going through a pmapped identity (same axis name) gives the arrays the sharding that
  the steps' outputs have, so a step compiled for the first state is not compiled again
  for the second.
  """
  return _identity(tuple(devices))(tree)


@functools.lru_cache(maxsize=None)
def _identity(devices: tuple) -> Callable:
  return pmap(lambda x: x, list(devices))


def replicate(tree: Any, devices: Sequence[Any]) -> Any:
  """A copy of every leaf on every device: leading axis `len(devices)`."""
  stacked = jax.tree.map(
      lambda x: np.broadcast_to(np.asarray(x), (len(devices),) + np.shape(x)), tree)
  return put_sharded(stacked, devices)


def unreplicate(tree: Any) -> Any:
  """Device 0's copy of a replicated tree, as host numpy arrays."""
  return jax.tree.map(lambda x: np.asarray(x[0]), tree)


def shard(tree: Any, num_devices: int) -> Any:
  """Split the leading (batch) axis of every leaf: `[B, ...]` -> `[D, B / D, ...]`."""
  def split(x):
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] % num_devices:
      raise ValueError(f'An array of shape {x.shape} does not split over {num_devices} '
                       'devices along its first (batch) axis.')
    return x.reshape((num_devices, x.shape[0] // num_devices) + x.shape[1:])
  return jax.tree.map(split, tree)


def unshard(tree: Any) -> Any:
  """Inverse of `shard`: `[D, B / D, ...]` -> `[B, ...]` host arrays."""
  return jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:]), tree)
