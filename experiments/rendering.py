"""Every result renders itself: a result JSON names its kind (`"kind"`), and the module
that makes results of that kind renders them (its `RENDERERS = {kind: function(result,
source, *args) -> text}`, `source` the JSON's path without `.json`, whose base name is
the result's name).

The renderers are found by discovery, in every module of `PACKAGES` that defines
`RENDERERS`; a kind no module renders is a benchmark's, rendered by
`benchmarks/<kind>.py --report <json>`. `python experiments/report.py`,
`python -m experiments.campaign report` and `docs/tables.py` render through here.
"""

from __future__ import annotations

import functools
import glob
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where renderers are looked for (modules whose name starts with '_' are not).
PACKAGES = ('experiments.analysis.lib', 'experiments.campaign')


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, Callable[..., str]]:
  """`{kind: renderer}` of every module of `PACKAGES` (a kind two modules claim is an
  error naming both)."""
  found, owner = {}, {}
  for package in PACKAGES:
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
      if info.name.startswith('_'):
        continue
      module = importlib.import_module(f'{package}.{info.name}')
      for kind, renderer in getattr(module, 'RENDERERS', {}).items():
        if kind in found:
          raise ValueError(f'Kind {kind!r} is rendered by {owner[kind]} and by '
                           f'{module.__name__}.')
        found[kind], owner[kind] = renderer, module.__name__
  return found


def load(path: str) -> dict:
  """The result JSON at `path` (absolute, or from the repository root); one that does
  not read, or names no kind, is a one-line ValueError naming it."""
  path = os.path.join(ROOT, path)
  try:
    with open(path) as f:
      result = json.load(f)
  except ValueError as e:
    raise ValueError(f'{path} is not a result JSON ({" ".join(str(e).split())}).') from None
  if not isinstance(result, dict) or not isinstance(result.get('kind'), str):
    raise ValueError(f'{path} names no kind ("kind"), so nothing can render it.')
  return result


def render(result: dict, source: str = '', *args: str) -> str:
  """The text of an in-memory result by its kind's renderer (`source`: where it is, its
  path without `.json`; default its kind)."""
  kind = result.get('kind')
  if kind not in registry():
    raise ValueError(f'No renderer of kind {kind!r}; the kinds are '
                     f'{", ".join(sorted(registry()))}.')
  return registry()[kind](result, source or kind, *args)


def render_file(path: str, *args: str) -> str:
  """The text of the result JSON at `path` (absolute, or from the repository root)."""
  result = load(path)
  if result['kind'] in registry():
    return render(result, os.path.join(ROOT, path)[:-len('.json')], *args)
  script = os.path.join(ROOT, 'benchmarks', f"{result['kind']}.py")
  if not os.path.isfile(script):
    raise ValueError(f"{os.path.join(ROOT, path)}: no renderer of kind {result['kind']!r} "
                     f'(no module of {", ".join(PACKAGES)} renders it, and no {script}).')
  done = subprocess.run([sys.executable, script, '--report', os.path.join(ROOT, path)],
                        cwd=ROOT, capture_output=True, text=True, check=False,
                        env={**os.environ, 'PYTHONPATH': os.pathsep.join(
                            [ROOT, os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)})
  if done.returncode:
    raise RuntimeError(f'{script} --report {path} failed: {done.stderr.strip()[-500:]}')
  return done.stdout.strip()


def figures(folder: str = os.path.join(ROOT, 'experiments', 'results', 'figures')) -> str:
  """Every result JSON of `folder` (the figures'), by file name, as its kind renders it,
  one bullet a line; then each one's run time in seconds."""
  lines, seconds = [], []
  for path in sorted(glob.glob(os.path.join(folder, '*.json'))):
    name, result = os.path.basename(path)[:-len('.json')], load(path)
    lines += render(result, path[:-len('.json')]).split('\n')
    if 'seconds' in result:
      seconds.append(f"{name} {result['seconds']:.0f}")
  return '\n'.join('* ' + line for line in lines + ['seconds: ' + ', '.join(seconds)])
