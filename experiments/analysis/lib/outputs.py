"""An analysis's result: its JSON, which names its kind and the machine, and its figure;
and the one line a script ends with when its input is wrong."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Optional

import jax
import numpy as np

from bn_rnn_jax import extras
from experiments import machine_facts

#: Where the figures' JSONs and PNGs go by default, and the other results' JSONs.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
FIGURES = os.path.join(ROOT, 'experiments', 'results', 'figures')
RESULTS = os.path.join(ROOT, 'experiments', 'results')


def pyplot():
  """pyplot on the non-interactive Agg backend (scripts and tests run headless); call it
  before the work of an analysis that draws, so that a missing matplotlib refuses first."""
  with extras.needed_by('Drawing a figure'):
    import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def rounded(value):
  """A JSON value with five significant digits per float (the figures' JSONs stay small);
  inf and NaN become strings; arrays become lists."""
  if isinstance(value, dict):
    return {str(k): rounded(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [rounded(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    return rounded(np.asarray(value).tolist())
  if isinstance(value, (np.floating, float)):
    value = float(value)
    return float(f'{value:.5g}') if np.isfinite(value) else str(value)
  if isinstance(value, np.integer):
    return int(value)
  return value


def save(output_dir: str, name: str, kind: str, result: dict[str, Any], figure=None,
         dpi: int = 100, exact: bool = False) -> dict[str, Any]:
  """Write `<output_dir>/<name>.json`: `{'kind': kind, **result, 'machine'}` (the machine
  unless `result` has one), its floats rounded unless `exact`; and, with a `figure`,
  `<name>.png` (then closed: keep the committed PNGs under 300 KB, lower `dpi` for busy
  figures). Nothing here may name a path of this machine. Returns the JSON's dict."""
  os.makedirs(output_dir, exist_ok=True)
  result = {'kind': kind, **result, 'machine': result.get('machine') or
            machine_facts.machine()}
  if figure is not None:
    figure.savefig(os.path.join(output_dir, f'{name}.png'), dpi=dpi, bbox_inches='tight')
    pyplot().close(figure)
  with open(os.path.join(output_dir, f'{name}.json'), 'w') as f:
    json.dump(result if exact else rounded(result), f, indent=1)
    f.write('\n')
  return result


def plot_draws(ax, estimates: dict, references: dict) -> None:
  """Each estimate's draws (`{label: [accuracy per draw]}`) as points and their mean as a
  bar, against `references` (`{label: (value, line style)}`) as horizontal lines."""
  for i, scores in enumerate(estimates.values()):
    ax.scatter([i] * len(scores), scores, color='tab:blue')
    ax.plot([i - 0.2, i + 0.2], [np.mean(scores)] * 2, color='tab:blue')
  for label, (value, style) in references.items():
    ax.axhline(value, label=label, **style)
  ax.set_xticks(range(len(estimates)), list(estimates))
  ax.set_ylabel('validation accuracy')


def script(argv, call: Callable[[], Any], required: Optional[dict] = None):
  """The `main` of an analysis script: stray arguments, and a flag of `required`
  (`{flag name: value}`) without a value, are one line each; so is a `ValueError`,
  `FileNotFoundError` or missing package from `call()` (no run there, no such
  checkpoint). Returns what `call()` returns."""
  if len(argv) > 1:
    sys.exit(f'error: unexpected arguments {argv[1:]}.')
  missing = [name for name, value in (required or {}).items() if not value]
  if missing:
    sys.exit(f'error: --{missing[0]} is required.')
  try:
    return call()
  except (ValueError, FileNotFoundError, extras.MissingExtra) as error:
    sys.exit(f'error: {error}')
