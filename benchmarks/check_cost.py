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
  platform's with `jax.lax.platform_dependent`).

  python benchmarks/check_cost.py --out benchmarks/results/check_cost_cpu.json
  python benchmarks/check_cost.py --report benchmarks/results/check_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
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
  return row


def targets(shape, repeats: int) -> dict:
  """Median seconds to trace the training gradient for one target and for three."""
  layer, variables, x = _trained_layer(shape)

  def loss(variables, x):
    out, _ = layer.apply(variables, x, use_running_average=False, mutable=['batch_stats'])
    return jnp.sum(out)

  def trace(platforms):
    with policy.targets(*platforms):
      start = time.perf_counter()
      jax.jit(jax.grad(loss)).trace(variables, x)
      return time.perf_counter() - start

  kinds = {'one_target': (policy.target_platforms()[0],),
           'three_targets': ('cpu', 'cuda', 'tpu')}
  for platforms in kinds.values():
    trace(platforms)
  seconds = {name: [] for name in kinds}
  for _ in range(repeats):
    for name, platforms in kinds.items():
      seconds[name].append(trace(platforms))
  return {f'{name}_trace_s': statistics.median(values) for name, values in seconds.items()}


def format_report(result: dict) -> str:
  """The markdown table of a results JSON."""
  lines = ['| shape | eval ms | eval + checks ms | ratio (wall) | ratio (CPU) | trace s, '
           'one target | trace s, three targets |', '|---|---:|---:|---:|---:|---:|---:|']
  for name, row in result['shapes'].items():
    b, t, i, h = row['shape']
    lines.append(
        f"| ({name}) B{b} T{t} I{i} H{h} | {row['plain_wall_ms']:.1f} | "
        f"{row['callbacks_wall_ms']:.1f} | {row['callbacks_wall_ms'] / row['plain_wall_ms']:.2f} | "
        f"{row['callbacks_cpu_ms'] / row['plain_cpu_ms']:.2f} | {row['one_target_trace_s']:.2f} | "
        f"{row['three_targets_trace_s']:.2f} |")
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', default='a,c')
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--out', default=os.path.join('benchmarks', 'results',
                                                    'check_cost_cpu.json'))
  parser.add_argument('--report', help='Print the table of this results JSON and exit.')
  args = parser.parse_args()
  if args.report:
    with open(args.report) as f:
      print(format_report(json.load(f)))
    return
  facts = machine_facts.machine()  # the load average before this process adds its own
  shapes = {}
  for name in args.shapes.split(','):
    shape = SHAPES[name]
    shapes[name] = {'shape': list(shape), **callbacks(shape, args.repeats),
                    **targets(shape, max(1, args.repeats // 2))}
  out = {'kind': 'check_cost', 'machine': facts, 'command': 'python benchmarks/check_cost.py ' +
         ' '.join(sys.argv[1:]), 'repeats': args.repeats, 'shapes': shapes}
  print(format_report(out))
  with open(args.out, 'w') as f:
    json.dump(out, f, indent=2)
    f.write('\n')


if __name__ == '__main__':
  main()
