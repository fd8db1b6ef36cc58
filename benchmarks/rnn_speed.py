"""Forward+backward speed of our recurrent layers against Flax's OptimizedLSTMCell.

Median wall time of one jitted `value_and_grad` (loss = mean of squared outputs, gradient
w.r.t. every parameter), after a warm-up call, with `block_until_ready`. All
implementations run in one process, interleaved repetition by repetition, so that they see
the same machine load (timings drift 10-25 % between processes here).

  python benchmarks/rnn_speed.py            # full table
  python benchmarks/rnn_speed.py --quick    # fewer repetitions (< 1 minute)
  python benchmarks/rnn_speed.py --json benchmarks/results/rnn_speed_cpu.json

Shapes: (a) B64 T784 I1 H100 (sequential MNIST); (c) B64 T100 I50 H1000.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import recurrent

SHAPES = {
    'a': dict(batch=64, time=784, features=1, hidden=100),
    'c': dict(batch=64, time=100, features=50, hidden=1000),
}
IMPLS = ('flax_optimized_lstm', 'lstm', 'bn_lstm', 'ln_lstm')

_SHAPES = flags.DEFINE_list('shapes', ['a', 'c'], 'Shapes to run (a, c).')
_IMPLS = flags.DEFINE_list('impls', list(IMPLS), 'Implementations to run.')
_REPEATS = flags.DEFINE_integer('repeats', 15, 'Timed repetitions per implementation.')
_QUICK = flags.DEFINE_bool('quick', False, 'Few repetitions (under a minute in all).')
_JSON = flags.DEFINE_string('json', None, 'Write {"results": [...]} to this path.')
_UNROLL = flags.DEFINE_integer('unroll', None, 'Override RecurrentLayer.unroll.')
_HOIST = flags.DEFINE_enum('hoist', None, ['true', 'false'],
                           'Override RecurrentLayer.hoist_input (default: the layer\'s auto).')


class FlaxLSTM(nn.Module):
  """The reference: `nn.RNN(nn.OptimizedLSTMCell)`."""
  hidden: int

  @nn.compact
  def __call__(self, x):
    return nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x)


def _build(impl: str, shape: dict) -> Callable:
  """A jitted `params -> (loss, grads)` closure and its parameters."""
  x = jax.random.normal(jax.random.key(0), (shape['batch'], shape['time'], shape['features']))
  if impl == 'flax_optimized_lstm':
    model = FlaxLSTM(shape['hidden'])
    variables = model.init(jax.random.key(1), x)
    def loss_fn(params):
      return jnp.mean(jnp.square(model.apply({'params': params}, x)))
  else:
    overrides = {}
    if _UNROLL.value is not None:
      overrides['unroll'] = _UNROLL.value
    if _HOIST.value is not None:
      overrides['hoist_input'] = _HOIST.value == 'true'
    model = recurrent.make_layer(impl, shape['hidden'], max_length=shape['time'], **overrides)
    variables = model.init(jax.random.key(1), x, train=True)
    def loss_fn(params):
      (_, y), _ = model.apply({**variables, 'params': params}, x, train=True,
                              mutable=['batch_stats'])
      return jnp.mean(jnp.square(y))
  step = jax.jit(jax.value_and_grad(loss_fn))
  return step, variables['params']


def _time_once(step, params) -> tuple[float, float]:
  """(wall ms, process CPU ms). CPU time is the steadier number on a shared machine."""
  start, start_cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(step(params))
  return (time.perf_counter() - start) * 1e3, (time.process_time() - start_cpu) * 1e3


def run(shapes, impls, repeats) -> list[dict]:
  results = []
  for shape_name in shapes:
    shape = SHAPES[shape_name]
    built = {impl: _build(impl, shape) for impl in impls}
    for step, params in built.values():  # compile + warm up
      _time_once(step, params)
      _time_once(step, params)
    times = {impl: [] for impl in impls}
    for _ in range(repeats):
      for impl, (step, params) in built.items():
        times[impl].append(_time_once(step, params))
    for impl in impls:
      wall, cpu = zip(*times[impl])
      results.append({'shape': shape_name, 'impl': impl, 'ms': statistics.median(wall),
                      'cpu_ms': statistics.median(cpu), 'repeats': repeats})
  return results


def format_table(results: list[dict]) -> str:
  lines = ['| shape | impl | median fwd+bwd (ms) | ratio to flax_optimized_lstm '
           '| CPU ms | CPU ratio |', '|---|---|---|---|---|---|']
  reference = {r['shape']: r for r in results if r['impl'] == 'flax_optimized_lstm'}
  for r in results:
    shape = SHAPES[r['shape']]
    label = (f"({r['shape']}) B{shape['batch']} T{shape['time']} I{shape['features']} "
             f"H{shape['hidden']}")
    ref = reference.get(r['shape'])
    ratio = r['ms'] / ref['ms'] if ref else float('nan')
    cpu_ratio = r['cpu_ms'] / ref['cpu_ms'] if ref else float('nan')
    lines.append(f"| {label} | {r['impl']} | {r['ms']:.1f} | {ratio:.2f} | "
                 f"{r['cpu_ms']:.0f} | {cpu_ratio:.2f} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  unknown = set(_IMPLS.value) - set(IMPLS) - set(recurrent.VARIANTS)
  if unknown or set(_SHAPES.value) - set(SHAPES):
    raise app.UsageError(f'Unknown impls {sorted(unknown)} or shapes {_SHAPES.value}; '
                         f'impls: {IMPLS}, shapes: {sorted(SHAPES)}.')
  repeats = 3 if _QUICK.value else _REPEATS.value
  results = run(_SHAPES.value, _IMPLS.value, repeats)
  print(f'backend={jax.default_backend()} devices={jax.device_count()} repeats={repeats}')
  print(format_table(results))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump({'backend': jax.default_backend(), 'results': results}, f, indent=1)


if __name__ == '__main__':
  app.run(main)
