"""The one machine record: what a campaign's, a benchmark's or an analysis's numbers came
from, in every result JSON (no paths), and its one-line description. The benchmarks
(`benchmarks/`) import it from here: they may import `experiments`, which imports
nothing of `benchmarks`.
"""

from __future__ import annotations

import glob
import os
import platform
import subprocess
from importlib import metadata
from typing import Optional



def processor() -> str:
  """The processor's model name (`/proc/cpuinfo`), else what `platform` knows."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def accelerators() -> list[str]:
  """The NVIDIA GPUs' model names, one per GPU ([] where there are none).

  Asks `nvidia-smi`, else reads the driver's `/proc` files: no JAX backend is started, so
  a parent process can record the machine its children will run on.
  """
  try:
    listed = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                            capture_output=True, text=True, timeout=30, check=True).stdout
    return [line.strip() for line in listed.splitlines() if line.strip()]
  except (OSError, subprocess.SubprocessError):
    pass
  models = []
  for path in sorted(glob.glob('/proc/driver/nvidia/gpus/*/information')):
    with open(path) as f:
      models += [line.split(':', 1)[1].strip() for line in f if line.startswith('Model:')]
  return models


#: The libraries whose versions a record names.
LIBRARIES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy')


def _version(distribution: str) -> Optional[str]:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return None


def cuda_versions() -> dict:
  """CUDA runtime, driver and cuDNN versions where jaxlib was built with CUDA ({} else)."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    from jax._src.lib import cuda_versions as cuda  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  if cuda is None or jax.default_backend() != 'gpu':
    return {}
  getters = {'cuda_runtime': 'cuda_runtime_get_version',
             'cuda_driver': 'cuda_driver_get_version', 'cudnn': 'cudnn_get_version',
             'cudnn_built_against': 'cudnn_build_version'}
  facts = {}
  for key, name in getters.items():
    try:
      facts[key] = getattr(cuda, name)()
    except Exception:  # pylint: disable=broad-except
      continue  # absent in this jaxlib, or the library would not load: not recorded
  return facts


def versions() -> dict:
  """The versions of the libraries a number depends on (None for one not installed)."""
  return {name: _version(name) for name in LIBRARIES}


def machine(xla_flags: Optional[str] = None, backend: bool = True) -> dict:
  """The machine record, as a JSON-ready dict: processor, cores, GPUs, the XLA flags
  (`xla_flags`: those of the process the record is about, default this one's), Python
  and library versions, the load average; with `backend`, also what the JAX backend
  reports (backend, device kind and count, matmul precision, CUDA and cuDNN versions),
  which starts it: a parent process records its children's machine without.

  Call it before timed work, so that the load is what else ran.
  """
  facts = {'processor': processor(), 'cores': os.cpu_count(), 'gpus': accelerators(),
           'xla_flags': xla_flags if xla_flags is not None else os.environ.get('XLA_FLAGS', ''),
           'python': platform.python_version(), 'versions': versions(),
           'load_average_1_5_15_min': [round(v, 2) for v in os.getloadavg()]}
  if backend:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.devices()
    facts.update(backend=jax.default_backend(), device_kind=devices[0].device_kind,
                 devices=len(devices),
                 matmul_precision=str(jax.config.jax_default_matmul_precision or 'default'),
                 **cuda_versions())
  return facts


def describe(m: dict) -> str:
  """A machine record in one line: processor; cores; GPUs or backend; XLA flags; versions;
  load average. Records made before there was one record name some facts otherwise
  (`cpu`, `cpu_count`, a top-level `jax`, the load `..._at_start`): read here too."""
  processor_ = m.get('processor') or m.get('cpu')
  cores = m.get('cores') or m.get('cpu_count')
  load, when = m.get('load_average_1_5_15_min'), 'as recorded'
  if not load:
    load, when = m.get('load_average_1_5_15_min_at_start'), 'at the start'
  versions_ = m.get('versions') or {'jax': m.get('jax')}
  backend = m.get('backend', 'cpu')
  device = f" ({m['device_kind']})" if backend != 'cpu' and m.get('device_kind') else ''
  gpus = m.get('gpus') or []
  parts = [f'{processor_}' if processor_ and processor_ != 'unknown' else
           'processor not recorded', f'{cores} cores',
           f"{len(gpus)} GPU ({', '.join(sorted(set(gpus)))})" if gpus else
           f'backend {backend}{device}',
           f"`XLA_FLAGS='{m['xla_flags']}'`" if m.get('xla_flags') else 'XLA flags not recorded',
           ', '.join(f'{k} {v}' for k, v in versions_.items() if v)]
  if load:
    parts.append(f'load average {load[0]:.2f} {when}')
  return '; '.join(parts)
