"""What a benchmark's or a campaign's numbers came from, recorded in every result JSON
(no paths). The benchmarks (`benchmarks/`) import it from here: they may import
`experiments`, which imports nothing of `benchmarks`.

`machine()` gives the processor model and cores, the XLA flags and the matmul precision
in force, the versions of jax, jaxlib and flax (and CUDA and cuDNN where the backend has
them), the devices, and the load average when it is called: call it before the timed
work, so that the load is what else ran, not the benchmark itself.
"""

from __future__ import annotations

import glob
import os
import platform
import subprocess
from importlib import metadata
from typing import Optional

import jax


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


def _version(distribution: str) -> Optional[str]:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return None


def cuda_versions() -> dict:
  """CUDA runtime, driver and cuDNN versions where jaxlib was built with CUDA ({} else)."""
  try:
    from jax._src.lib import cuda_versions as versions  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  if versions is None or jax.default_backend() != 'gpu':
    return {}
  getters = {'cuda_runtime': 'cuda_runtime_get_version',
             'cuda_driver': 'cuda_driver_get_version', 'cudnn': 'cudnn_get_version',
             'cudnn_built_against': 'cudnn_build_version'}
  facts = {}
  for key, name in getters.items():
    try:
      facts[key] = getattr(versions, name)()
    except Exception:  # pylint: disable=broad-except
      continue  # absent in this jaxlib, or the library would not load: not recorded
  return facts


def machine() -> dict:
  """The machine, software and load, as a JSON-ready dict."""
  devices = jax.devices()
  return {
      'backend': jax.default_backend(),
      'device_kind': devices[0].device_kind,
      'devices': len(devices),
      'processor': processor(),
      'cpu_count': os.cpu_count(),
      'python': platform.python_version(),
      'jax': jax.__version__,
      'jaxlib': _version('jaxlib'),
      'flax': _version('flax'),
      **cuda_versions(),
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
      'matmul_precision': str(jax.config.jax_default_matmul_precision or 'default'),
      'load_average_1_5_15_min': [round(v, 2) for v in os.getloadavg()],
      'note': 'compare ratios within one run; the load average says what else ran',
  }
