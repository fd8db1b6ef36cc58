"""Device layout in one place: steps written for one device's batch, mapped over the
devices with axis name AXIS by `jax.pmap` or by `jax.jit` of `jax.shard_map` over a
one-axis mesh (`config.parallel.backend`, 'pmap' or 'shard_map'), with the same layout:

  replicated state  a leading axis of the local device count (`replicate`)
  data, carry       split along the batch axis: `[devices, batch / devices, ...]` (`shard`)

Gradients, metric sums and the layers' moment sums and counts are psum-ed over AXIS,
across every process's devices in a multi-process run, where each process feeds its own
share of the global batch.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bn_rnn_jax import extras
from bn_rnn_jax.training import workdir as workdir_lib
from bn_rnn_jax.training.config import PARALLEL_BACKENDS as BACKENDS

with extras.needed_by(__name__):
  from absl import logging

AXIS = 'batch'


def maybe_initialize_distributed(config) -> None:
  """`jax.distributed.initialize()` when `config.distributed.enabled`, before anything starts
  a JAX backend; empty fields are left to JAX's auto-detection (SLURM, TPU pods). A process
  whose peers have not all started within `config.distributed.init_timeout_s` seconds ends
  with one line (`_end_waiting_for_peers`), not JAX's C++ abort."""
  dist = config.get('distributed')
  if dist is None or not dist.get('enabled', False):
    return
  if jax.distributed.is_initialized():
    return
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  kwargs = {}
  if dist.get('coordinator_address'):
    kwargs['coordinator_address'] = dist.coordinator_address
  if dist.get('num_processes') is not None:
    kwargs['num_processes'] = dist.num_processes
  if dist.get('process_id') is not None and dist.process_id >= 0:
    kwargs['process_id'] = dist.process_id
  if dist.get('heartbeat_timeout_s') is not None:
    kwargs['heartbeat_timeout_seconds'] = int(dist.heartbeat_timeout_s)
  timeout = dist.get('init_timeout_s')
  if timeout is not None:
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
      raise ValueError('config.distributed.init_timeout_s must be None (JAX\'s default) or a '
                       f'positive integer; got {timeout!r}.')
    kwargs['initialization_timeout'] = timeout + _INIT_GRACE_S
  logging.info('jax.distributed.initialize(%s)', kwargs)
  watchdog = None
  if timeout is not None:
    watchdog = threading.Timer(timeout, _end_waiting_for_peers, (kwargs, timeout))
    watchdog.daemon = True
    watchdog.start()
  try:
    jax.distributed.initialize(**kwargs)
  except RuntimeError as e:
    raise ValueError(f'jax.distributed.initialize({_kwargs_text(kwargs)}) failed: '
                     f'{" ".join(str(e).split())}') from None
  finally:
    if watchdog is not None:
      watchdog.cancel()


#: How much longer than `config.distributed.init_timeout_s` JAX's own client waits, so
#: that the line of `_end_waiting_for_peers` comes first.
_INIT_GRACE_S = 30


def _end_waiting_for_peers(kwargs: dict, timeout: int) -> None:
  """End this process with one line: its `jax.distributed.initialize` has waited
  `timeout` seconds for the other processes (run in a timer thread)."""
  where = kwargs.get('coordinator_address', 'the auto-detected coordinator')
  who = (f'process {kwargs["process_id"]}' if 'process_id' in kwargs else 'this process')
  count = kwargs.get('num_processes')
  sys.stdout.flush()
  sys.stderr.write(
      f'error: {who} of a {count or "multi"}-process run waited {timeout} s at {where} and '
      'the other processes did not all start (config.distributed.init_timeout_s); start '
      'every process with the same command, each with its own distributed.process_id.\n')
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


def _kwargs_text(kwargs: dict) -> str:
  return ', '.join(f'{k}={v!r}' for k, v in kwargs.items())


class ProcessLost(RuntimeError):
  """A process of a multi-process run stopped (killed, crashed, unreachable)."""


#: Text of the runtime errors a collective or the coordination service raises when a peer
#: process is gone.
_LOST_SIGNS = ('gloo', 'connection reset', 'connection refused', 'connection closed',
               'heartbeat', 'coordination service', 'broken pipe', 'socket closed')


def process_lost(error: BaseException) -> Optional[ProcessLost]:
  """The `ProcessLost` that `error` (a runtime error of a multi-process run) means, or
  None when it is not about a lost peer."""
  if jax.process_count() == 1 or not isinstance(error, jax.errors.JaxRuntimeError):
    return None
  text = ' '.join(str(error).split())
  if not any(sign in text.lower() for sign in _LOST_SIGNS):
    return None
  return ProcessLost(
      f'A process of this {jax.process_count()}-process run was lost ({text[:200]}); this '
      f'process (process {jax.process_index()}) stopped. Relaunch every process with the '
      'same command: the run resumes from its last checkpoint.')


#: Fields that legitimately differ between the processes of one run.
PER_PROCESS_FIELDS = ('distributed.process_id',)


def check_same_config(config) -> None:
  """Every process of a multi-process run holds process 0's config (but for
  PER_PROCESS_FIELDS); otherwise every process raises one ValueError naming the fields."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  mine = {k: v for k, v in workdir_lib.flat_config(config).items() if k not in PER_PROCESS_FIELDS}
  text = np.frombuffer(json.dumps(mine, sort_keys=True).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray(text.size, np.int64)))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:text.size] = text
  texts = np.asarray(multihost_utils.process_allgather(padded))
  configs = [json.loads(bytes(t[:n]).decode()) for t, n in zip(texts, sizes)]
  problems = []
  for index, other in enumerate(configs[1:], start=1):
    fields = sorted(k for k in set(configs[0]) | set(other)
                    if configs[0].get(k, '<absent>') != other.get(k, '<absent>'))
    if fields:
      shown = ', '.join(f'{k} ({configs[0].get(k, "<absent>")!r} vs '
                        f'{other.get(k, "<absent>")!r})' for k in fields[:8])
      more = f' and {len(fields) - 8} more' if len(fields) > 8 else ''
      problems.append(f'process {index} differs from process 0 in {shown}{more}')
  if problems:
    raise ValueError(f'The processes of this run hold different configs: '
                     f'{"; ".join(problems)}. Launch every process with the same config.')


def local_devices(num_devices: Optional[int] = None) -> list[Any]:
  """The first `num_devices` local devices (None = all of them)."""
  devices = jax.local_devices()
  if num_devices is None:
    return devices
  if num_devices <= 0 or num_devices > len(devices):
    raise ValueError(f'config.train.num_devices={num_devices} but this process has '
                     f'{len(devices)} local devices (None = use all).')
  return devices[:num_devices]


def check_divisible(global_batch: int, num_devices: int, what: str = 'batch size') -> int:
  """Per-device batch; a clear error when the global batch does not split evenly."""
  if global_batch <= 0:
    raise ValueError(f'{what} must be positive; got {global_batch}.')
  if global_batch % num_devices:
    raise ValueError(f'{what} {global_batch} does not divide evenly over {num_devices} '
                     f'devices; use a multiple of {num_devices}.')
  return global_batch // num_devices


def pmap(fn: Callable, devices: Optional[Sequence[Any]] = None, **kwargs) -> Callable:
  """`jax.pmap(fn, axis_name=AXIS)` over `devices` (all local devices when None); an
  explicit device list only in a single-process run."""
  if jax.process_count() > 1:
    devices = None
  return jax.pmap(fn, axis_name=AXIS, devices=devices, **kwargs)


def check_backend(backend: str) -> str:
  if backend not in BACKENDS:
    raise ValueError(f'config.parallel.backend must be one of {BACKENDS}; got {backend!r}.')
  return backend


def device_map(fn: Callable, devices: Optional[Sequence[Any]] = None, backend: str = 'pmap',
               in_axes: Any = 0, donate_argnums: Sequence[int] = ()) -> Callable:
  """Map `fn`, written for one device's share, over `devices` with axis name AXIS.

  Arguments with in_axes 0 carry a leading device axis, None ones go to every device as
  they are; outputs get a leading device axis. The arguments at `donate_argnums` are
  donated: the call deletes their buffers. Same call and layout for both backends.
  """
  donate_argnums = tuple(donate_argnums)
  if check_backend(backend) == 'pmap':
    return pmap(fn, devices, in_axes=in_axes, donate_argnums=donate_argnums)
  return _shard_map(fn, tuple(devices or jax.local_devices()), in_axes, donate_argnums)


def device_mesh(devices: Sequence[Any]) -> jax.sharding.Mesh:
  """The one-axis mesh of the shard_map backend (every process's devices when several)."""
  if jax.process_count() > 1:
    devices = jax.devices()
  return jax.sharding.Mesh(np.asarray(devices), (AXIS,))


def _shard_map(fn: Callable, devices: tuple, in_axes: Any,
               donate_argnums: tuple = ()) -> Callable:
  mesh = device_mesh(devices)

  def arg_axes(args):
    return in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)

  def per_device(*args):
    # Each device's block of a leading-axis argument is `[1, ...]`: the pmap slice.
    args = [jax.tree.map(lambda x: x[0], a) if axis == 0 else a
            for a, axis in zip(args, arg_axes(args))]
    return jax.tree.map(lambda x: x[None], fn(*args))

  def mapped(*args):
    specs = tuple(PartitionSpec(AXIS) if axis == 0 else PartitionSpec()
                  for axis in arg_axes(args))
    # check_vma=False: outputs are psum-ed (replicated) or per-device by construction,
    # exactly as under pmap.
    return jax.shard_map(per_device, mesh=mesh, in_specs=specs,
                         out_specs=PartitionSpec(AXIS), check_vma=False)(*args)

  return jax.jit(mapped, donate_argnums=donate_argnums)


def put_sharded(tree: Any, devices: Sequence[Any], backend: str = 'pmap') -> Any:
  """Place host arrays `[D, ...]` one slice per device, with the sharding of the steps'
  outputs, so a step compiled for the first state is not compiled again for the next."""
  if check_backend(backend) == 'pmap':
    return _identity(tuple(devices))(tree)
  sharding = NamedSharding(device_mesh(devices), PartitionSpec(AXIS))
  if jax.process_count() > 1:
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)
  return jax.device_put(tree, sharding)


@functools.lru_cache(maxsize=None)
def _identity(devices: tuple) -> Callable:
  return pmap(lambda x: x, list(devices))


def copy_on_devices(tree: Any, devices: Sequence[Any], backend: str = 'pmap') -> Any:
  """A copy of a device tree (leading device axis) in new device buffers, placed as the
  steps' outputs are: it stays valid when `tree` is donated to a step."""
  return _copier(tuple(devices), check_backend(backend))(tree)


@functools.lru_cache(maxsize=None)
def _copier(devices: tuple, backend: str) -> Callable:
  return device_map(lambda tree: jax.tree.map(jnp.copy, tree), list(devices), backend)


def replicate(tree: Any, devices: Sequence[Any], backend: str = 'pmap') -> Any:
  """A copy of every leaf on every device: leading axis `len(devices)`."""
  stacked = jax.tree.map(
      lambda x: np.broadcast_to(np.asarray(x), (len(devices),) + np.shape(x)), tree)
  return put_sharded(stacked, devices, backend)


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
