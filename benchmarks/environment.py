"""The machine a check runs on: device, versions, cuDNN's LSTM, the packages the library
needs. Prints them and writes them to a JSON (no paths).

  python benchmarks/environment.py OUT.json

Part of `accelerator_check.sh` (its first stage).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import cudnn_lstm
from experiments import machine_facts
# pylint: enable=wrong-import-position

WHEEL_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          'accelerator_wheels.txt')


def required_modules(path: str = WHEEL_LIST) -> dict[str, str]:
  """`{distribution==version: module}` of `accelerator_wheels.txt`."""
  modules = {}
  with open(path) as f:
    for line in f:
      fields = line.split()
      if fields and not fields[0].startswith('#'):
        modules[fields[0]] = fields[1]
  return modules


def import_status(modules: dict[str, str]) -> dict[str, str]:
  """`{module: version, or 'missing: <error>'}`."""
  status = {}
  for module in modules.values():
    try:
      imported = importlib.import_module(module)
      status[module] = str(getattr(imported, '__version__', 'imported'))
    except Exception as e:  # pylint: disable=broad-except
      status[module] = f'missing: {type(e).__name__}: {str(e).splitlines()[0][:120]}'
  return status


def environment() -> dict:
  unavailable = cudnn_lstm.unavailable_reason()
  return {'machine': machine_facts.machine(),
          'devices': [str(d) for d in jax.devices()],
          'cudnn_lstm': unavailable or 'available',
          'modules': import_status(required_modules())}


def main(argv):
  if len(argv) != 2:
    sys.exit(f'usage: python {argv[0]} OUT.json')
  env = environment()
  jax.print_environment_info()
  print(json.dumps(env, indent=1))
  with open(argv[1], 'w') as f:
    json.dump(env, f, indent=1)


if __name__ == '__main__':
  main(sys.argv)
