"""What checks and targets cost a compiled step: host callbacks in an evaluation step, and
tracing a training step for several target platforms.

* **Callbacks.** A BN-LSTM evaluation step (population statistics, `jax.jit` of
  `apply`) as the layers compile it, against the same step with one `jax.debug.callback`
  per batch-normalised site that checks its counts on the host, which is how a check of
  traced statistics would run in every step. Medians of interleaved repetitions, wall and
  process CPU time.
* **Targets.** Tracing (`jax.jit(...).trace`, no compilation) of the layer's training
  gradient with one target platform (the default) against three (`policy.targets('cpu',
  'cuda', 'tpu')`, which traces one program per distinct policy and keeps the lowering
  platform's with `jax.lax.platform_dependent`): the first trace of a fresh process, and
  the same trace repeated in one process (JAX's caches filled).

  python benchmarks/check_cost.py --out benchmarks/results/check_cost_cpu.json
  python benchmarks/check_cost.py --report benchmarks/results/check_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
from bn_rnn_jax import batch_stats
from bn_rnn_jax import policy
from experiments import machine_facts
# pylint: enable=wrong-import-position

SHAPES = {'a': (64, 784, 1, 100), 'c': (64, 100, 50, 1000)}   # B, T, I, H


def _timed(fn, *args) -> tuple[float, float]:
  """`(wall ms, process CPU ms)` of one blocked call."""
  wall, cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn(*args))
  return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def _trained_layer(shape):
  batch, length, inputs, hidden = shape
  layer = br.make_layer('bn_lstm', hidden, max_length=length)
  x = jax.random.normal(jax.random.key(0), (batch, length, inputs))
  variables = layer.init(jax.random.key(1), x, use_running_average=True)
  stats = jax.tree.map(lambda a: a, variables['batch_stats'])
  for site in stats.values():
    site['count'] = jnp.ones_like(site['count'])   # statistics a batch reached
  return layer, {**variables, 'batch_stats': stats}, x


def callbacks(shape, repeats: int) -> dict:
  """Median evaluation-step times without and with a host check per site."""
  layer, variables, x = _trained_layer(shape)
  # The statistics are set by hand, not a running average this process kept.
  warnings.simplefilter('ignore', batch_stats.RunningAverageWarning)

  def check(count):
    if not np.any(np.asarray(count) > 0):
      raise ValueError('untrained')

  def evaluate(variables, x):
    return layer.apply(variables, x, use_running_average=True)

  def evaluate_checked(variables, x):
    for site in variables['batch_stats'].values():
      jax.debug.callback(check, site['count'])
    return evaluate(variables, x)

  steps = {'plain': jax.jit(evaluate), 'callbacks': jax.jit(evaluate_checked)}
  for step in steps.values():
    _timed(step, variables, x)
  times = {name: [] for name in steps}
  for _ in range(repeats):
    for name, step in steps.items():
      times[name].append(_timed(step, variables, x))
  row = {'callbacks_per_step': len(variables['batch_stats'])}
  for name, values in times.items():
    wall, cpu = zip(*values)
    row[f'{name}_wall_ms'] = statistics.median(wall)
    row[f'{name}_cpu_ms'] = statistics.median(cpu)
  # Paired by repetition (the two steps run back to back), so load drifts cancel.
  ratios = [c[0] / p[0] for p, c in zip(times['plain'], times['callbacks'])]
  row['wall_ratio_range'] = [min(ratios), max(ratios)]
  return row


def _trace_seconds(shape, platforms=()) -> float:
  """Seconds to trace the layer's training gradient for `platforms` (none: the default
  target)."""
  layer, variables, x = _trained_layer(shape)

  def loss(variables, x):
    out, _ = layer.apply(variables, x, use_running_average=False, mutable=['batch_stats'])
    return jnp.sum(out)

  with policy.targets(*(platforms or policy.target_platforms()[:1])):
    start = time.perf_counter()
    jax.jit(jax.grad(loss)).trace(variables, x)
    return time.perf_counter() - start


TARGETS = {'one_target': None, 'three_targets': ('cpu', 'cuda', 'tpu')}


def targets(name: str, repeats: int) -> dict:
  """Median seconds to trace the training gradient for one target and for three: the
  first trace of a fresh process (`cold`, a process per repetition) and a repeated trace
  in one process (`warm`, JAX's caches filled)."""
  row = {}
  for kind, platforms in TARGETS.items():
    cold = [float(subprocess.run(
        [sys.executable, __file__, '--trace', name, '--platforms', ','.join(platforms or ())],
        check=True, capture_output=True, text=True).stdout.split()[-1])
            for _ in range(repeats)]
    warm = [_trace_seconds(SHAPES[name], platforms) for _ in range(repeats + 1)][1:]
    for state, seconds in (('cold', cold), ('warm', warm)):
      row[f'{kind}_{state}_trace_s'] = statistics.median(seconds)
      row[f'{kind}_{state}_trace_range_s'] = [min(seconds), max(seconds)]
  return row


def _traces(row, state) -> str:
  """`median (min-max)` of one target's and of three targets' traces."""
  return ' / '.join(
      f"{row[f'{kind}_{state}_trace_s']:.2f} ({row[f'{kind}_{state}_trace_range_s'][0]:.2f}-"
      f"{row[f'{kind}_{state}_trace_range_s'][1]:.2f})" for kind in TARGETS)


def format_report(result: dict) -> str:
  """The markdown table of a results JSON."""
  lines = ['| shape | eval ms | eval + checks ms | ratio (wall), median (range) | ratio (CPU) | '
           'first trace s, one target / three | repeated trace s, one target / three |',
           '|---|---:|---:|---:|---:|---:|---:|']
  for name, row in result['shapes'].items():
    b, t, i, h = row['shape']
    lines.append(
        f"| ({name}) B{b} T{t} I{i} H{h} | {row['plain_wall_ms']:.1f} | "
        f"{row['callbacks_wall_ms']:.1f} | {row['callbacks_wall_ms'] / row['plain_wall_ms']:.2f} "
        f"({row['wall_ratio_range'][0]:.2f}-{row['wall_ratio_range'][1]:.2f}) | "
        f"{row['callbacks_cpu_ms'] / row['plain_cpu_ms']:.2f} | "
        f"{_traces(row, 'cold')} | {_traces(row, 'warm')} |")
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', default='a,c')
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--out', default=os.path.join('benchmarks', 'results',
                                                    'check_cost_cpu.json'))
  parser.add_argument('--report', help='Print the table of this results JSON and exit.')
  parser.add_argument('--trace', help=argparse.SUPPRESS)       # one cold trace of a shape
  parser.add_argument('--platforms', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.trace:
    print(_trace_seconds(SHAPES[args.trace], tuple(p for p in args.platforms.split(',') if p)))
    return
  if args.report:
    with open(args.report) as f:
      print(format_report(json.load(f)))
    return
  facts = machine_facts.machine()  # the load average before this process adds its own
  shapes = {}
  for name in args.shapes.split(','):
    shape = SHAPES[name]
    shapes[name] = {'shape': list(shape), **callbacks(shape, args.repeats),
                    **targets(name, max(1, args.repeats // 2))}
  out = {'kind': 'check_cost', 'machine': facts, 'command': 'python benchmarks/check_cost.py ' +
         ' '.join(sys.argv[1:]), 'repeats': args.repeats, 'shapes': shapes}
  print(format_report(out))
  with open(args.out, 'w') as f:
    json.dump(out, f, indent=2)
    f.write('\n')


if __name__ == '__main__':
  main()
