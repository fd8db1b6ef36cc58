"""Forward+backward speed and memory of our recurrent layers against Flax's LSTM.

Median wall time and median process CPU time of one jitted `value_and_grad` (loss = mean
of squared outputs, gradient w.r.t. every parameter), after warm-up calls, with
`block_until_ready`. All implementations run in one process, interleaved repetition by
repetition, so that they see the same machine load (timings drift 10-25 % between
processes here); the table gives each one's ratio to Flax's
`nn.RNN(nn.OptimizedLSTMCell)` in the same run. Peak memory of the same compiled
fwd+bwd comes from XLA's buffer assignment (`jit(f).lower(...).compile()
.memory_analysis()`), not from a measurement of the process; the instructions per step of
each compiled loop body (forward + backward) come from the same executable's HLO. The
matmul GFLOP/s column divides the matrix products a fwd+bwd must run (`matmul_gflop`,
counted from the shape) by the wall time: where the products take nearly all the time
(shape (c)), it says how fast they run inside the loop.

  python benchmarks/rnn_speed.py            # full table
  python benchmarks/rnn_speed.py --quick    # fewer repetitions
  python benchmarks/rnn_speed.py --json benchmarks/results/rnn_speed_cpu.json
  python benchmarks/rnn_speed.py --report benchmarks/results/rnn_speed_cpu.json  # table

Implementations: `flax_optimized_lstm`, and `VARIANT[:BACKWARD[:REMAT]]` for our layer,
e.g. `bn_lstm:layer` (whole-layer backward pass) or `bn_lstm:scan:dots` (autodiff of
the scan, storing matmul outputs); without a backward, the layer's 'auto'. And a floor,
not an LSTM: `products_only:scan` and `products_only:layer` run the matrix products of
Flax's fwd+bwd with no gate math (`products_only`): all of them inside the steps, or
only the two the recurrence forces (`h W_h`, `dz W_h^T`) with the input and weight-
gradient products as one large product each. An LSTM that runs these products with
XLA's matmul also runs its gate math, so the faster of the two bounds the ratio to Flax
that any of ours can reach.

The JSON's `batch_sums` (and the second table) time what `normalization.batch_sum` does
on CPU: per scan step, `jnp.sum(x, axis=0)` against `ones @ x` for `[B, F]` blocks of the
sizes the layers sum at every step (XLA's CPU reduction over the batch axis slows several
times once F passes about 512 at B64).

Shapes: (a) B64 T784 I1 H100 (sequential MNIST); (b) B40 T320 I240 H240, bidirectional,
lengths spread evenly over [T/2, T] (25 % of the steps are padding, masked; Flax gets the
same `seq_lengths`); (c) B64 T100 I50 H1000; (d) B32 T35 I650 H650 (a layer of
`ptb_word.py`'s medium model: Zaremba's and Laurent's medium word-level PTB).
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import stack
from bn_rnn_jax import variants

SHAPES = {
    'a': dict(batch=64, time=784, features=1, hidden=100, bidirectional=False, padding=0.0),
    'b': dict(batch=40, time=320, features=240, hidden=240, bidirectional=True,
              padding=0.25),
    'c': dict(batch=64, time=100, features=50, hidden=1000, bidirectional=False,
              padding=0.0),
    'd': dict(batch=32, time=35, features=650, hidden=650, bidirectional=False,
              padding=0.0),
}
REFERENCE = 'flax_optimized_lstm'
PRODUCTS_ONLY = 'products_only'
FLOORS = (f'{PRODUCTS_ONLY}:scan', f'{PRODUCTS_ONLY}:layer')
IMPLS = (REFERENCE, *FLOORS, 'lstm', 'lstm:scan', 'lstm:layer', 'bn_lstm', 'bn_lstm:scan',
         'bn_lstm:scan:dots', 'bn_lstm:scan:full', 'bn_lstm:layer')

_SHAPES = flags.DEFINE_list('shapes', ['a', 'b', 'c', 'd'], 'Shapes to run (a-d).')
_IMPLS = flags.DEFINE_list('impls', list(IMPLS), 'Implementations to run.')
_REPEATS = flags.DEFINE_integer('repeats', 9, 'Timed repetitions per implementation.')
_QUICK = flags.DEFINE_bool('quick', False, 'Three repetitions.')
_JSON = flags.DEFINE_string('json', None, 'Write the results to this path.')
_REPORT = flags.DEFINE_string('report', None, 'Print the table of this JSON and exit.')
_UNROLL = flags.DEFINE_integer('unroll', None, 'Override RecurrentLayer.unroll.')
_HOIST = flags.DEFINE_enum('hoist', None, ['true', 'false'],
                           'Override RecurrentLayer.hoist_input (default: the layer\'s auto).')


class FlaxLSTM(nn.Module):
  """The reference: `nn.RNN(nn.OptimizedLSTMCell)`, bidirectional if asked."""
  hidden: int
  bidirectional: bool = False

  @nn.compact
  def __call__(self, x, seq_lengths=None):
    rnn = lambda: nn.RNN(nn.OptimizedLSTMCell(self.hidden))
    if self.bidirectional:
      return nn.Bidirectional(rnn(), rnn())(x, seq_lengths=seq_lengths)
    return rnn()(x, seq_lengths=seq_lengths)


def lengths_and_mask(shape: dict):
  """`[B]` lengths spread evenly over [T (1 - 2 padding), T] and the `[B, T]` mask."""
  batch, length = shape['batch'], shape['time']
  shortest = round(length * (1.0 - 2.0 * shape['padding']))
  lengths = np.round(np.linspace(shortest, length, batch)).astype(np.int32)
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
  return jnp.asarray(lengths), jnp.asarray(mask)


def _layer(impl: str, shape: dict) -> nn.Module:
  variant, *rest = impl.split(':')
  overrides = {}
  if rest:
    overrides['backward'] = rest[0]
  if len(rest) > 1:
    overrides['remat'] = rest[1]
  if _UNROLL.value is not None:
    overrides['unroll'] = _UNROLL.value
  if _HOIST.value is not None:
    overrides['hoist_input'] = _HOIST.value == 'true'
  make = lambda: variants.make_layer(variant, shape['hidden'], max_length=shape['time'],
                                      **overrides)
  if shape['bidirectional']:
    return stack.Bidirectional(make(), make())
  return make()


def products_only(x, kernels, backward: str = 'scan'):
  """The matrix products of one LSTM direction's fwd+bwd and (almost) nothing else: a
  floor for any implementation that runs them with XLA's matmul on this machine.

  x: `[B, T, I]`; kernels: `(W_x [I, 4H], W_h [H, 4H])`. Forward, per step, `z = x W_x +
  h W_h`, the next `h` being z's first H columns (a slice, no gate math; `W_h[:, :H]` is
  orthogonal, so h neither vanishes nor explodes). Backward, in reverse, `dz = [dh,
  z[:, H:]]` and `dh = dz W_h^T`, then `dW_h = sum_t h_t^T dz_t`, `dW_x = sum_t x_t^T dz_t`.
  `backward='scan'` runs every product inside the steps (the weight gradients summed step
  by step, as the autodiff of a scan does); `'layer'` runs inside the steps only the two
  the recurrence forces (`h W_h` and `dz W_h^T`) and the rest as one large product each
  (`x W_x` before the forward scan, the weight gradients after the reverse one). Either
  way the products are `matmul_gflop`'s count for Flax's cell. Returns `(dW_x, dW_h)`.
  """
  w_x, w_h = kernels
  hidden = w_h.shape[0]
  xs = jnp.swapaxes(x, 0, 1)
  h0 = jnp.zeros((x.shape[0], hidden), x.dtype)
  cotangent = lambda dh, z_t: jnp.concatenate([dh, z_t[:, hidden:]], axis=1)
  batched = backward == 'layer'

  def forward_step(h, x_in):
    z = (x_in if batched else x_in @ w_x) + h @ w_h
    return z[:, :hidden], (h, z)
  _, (hs, zs) = jax.lax.scan(forward_step, h0,
                             jnp.einsum('tbi,ig->tbg', xs, w_x) if batched else xs)

  if batched:
    def backward_step(dh, z_t):
      dz = cotangent(dh, z_t)
      return dz @ w_h.T, dz
    _, dzs = jax.lax.scan(backward_step, h0, zs, reverse=True)
    return jnp.einsum('tbi,tbg->ig', xs, dzs), jnp.einsum('tbh,tbg->hg', hs, dzs)

  def backward_step(carry, step):
    dh, dw_x, dw_h = carry
    x_t, h_t, z_t = step
    dz = cotangent(dh, z_t)
    return (dz @ w_h.T, dw_x + x_t.T @ dz, dw_h + h_t.T @ dz), None
  zero = jnp.zeros_like
  (_, dw_x, dw_h), _ = jax.lax.scan(backward_step, (h0, zero(w_x), zero(w_h)),
                                    (xs, hs, zs), reverse=True)
  return dw_x, dw_h


def _products_only_kernels(key, shape: dict):
  """`(W_x, W_h)` per direction, `W_h[:, :H]` orthogonal (see `products_only`)."""
  inputs, hidden = shape['features'], shape['hidden']
  kernels = []
  for direction in range(2 if shape['bidirectional'] else 1):
    k_x, k_h, k_o = jax.random.split(jax.random.fold_in(key, direction), 3)
    w_h = jax.random.normal(k_h, (hidden, 4 * hidden)) / np.sqrt(hidden)
    w_h = w_h.at[:, :hidden].set(jax.nn.initializers.orthogonal()(k_o, (hidden, hidden)))
    kernels.append((jax.random.normal(k_x, (inputs, 4 * hidden)) / np.sqrt(inputs), w_h))
  return kernels


def _build(impl: str, shape: dict):
  """A jitted `params -> (loss, grads)` function and its parameters."""
  x = jax.random.normal(jax.random.key(0), (shape['batch'], shape['time'], shape['features']))
  lengths, mask = lengths_and_mask(shape) if shape['padding'] else (None, None)
  if impl in FLOORS:
    backward = impl.partition(':')[2]
    def products_step(params):
      return jnp.float32(0.0), [products_only(x, kernels, backward) for kernels in params]
    return jax.jit(products_step), _products_only_kernels(jax.random.key(1), shape)
  if impl == REFERENCE:
    model = FlaxLSTM(shape['hidden'], shape['bidirectional'])
    variables = model.init(jax.random.key(1), x, lengths)
    def loss_fn(params):
      return jnp.mean(jnp.square(model.apply({'params': params}, x, lengths)))
  else:
    model = _layer(impl, shape)
    variables = model.init(jax.random.key(1), x, mask, train=True)
    def loss_fn(params):
      (_, y), _ = model.apply({**variables, 'params': params}, x, mask, train=True,
                              mutable=['batch_stats'])
      return jnp.mean(jnp.square(y))
  step = jax.jit(jax.value_and_grad(loss_fn))
  return step, variables['params']


def matmul_gflop(impl: str, shape: dict) -> float:
  """GFLOP of the matrix products one fwd+bwd must run (counted, not measured).

  Per step and direction: the forward `x W_x` and `h W_h` (2 B (I + H) 4H), the backward
  dh and dW_h (2 x 2 B H 4H) and dW_x (2 B I 4H); no dx, the input takes no gradient.
  A layer whose remat resolves to 'full' also recomputes the forward products. Flax's
  cell and ours (input term in the step on CPU) count the same, so where the products
  take nearly all the time (shape (c)), a ratio to Flax far below 1 would need our
  products to run faster than the same products in Flax's step.
  """
  batch, length = shape['batch'], shape['time']
  inputs, hidden = shape['features'], shape['hidden']
  forward = 2 * batch * (inputs + hidden) * 4 * hidden
  backward = 2 * batch * (2 * hidden + inputs) * 4 * hidden
  per_step = forward + backward
  if impl != REFERENCE and impl not in FLOORS:
    layer = _layer(impl, shape)
    layer = layer.forward_layer if isinstance(layer, stack.Bidirectional) else layer
    if layer.execution_policy(batch).remat == 'full':
      per_step += forward
  directions = 2 if shape['bidirectional'] else 1
  return directions * length * per_step / 1e9


def compiled_facts(step, params) -> dict:
  """Peak memory and loop size of the compiled fwd+bwd.

  Memory is XLA's buffer assignment, in bytes: arguments + outputs + temporaries - aliased
  (the CPU client's `peak_memory_in_bytes` leaves the temporaries out), and the
  temporaries alone (the activations the backward pass keeps). `loop_instructions` counts,
  for each `while` loop of the optimised HLO in program order (forward scans, then the
  backward ones), the instructions its body runs per step, bookkeeping (parameter,
  tuple, get-tuple-element, constant, bitcast) left out: the per-step kernel count.
  """
  compiled = step.lower(params).compile()
  stats = compiled.memory_analysis()
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes
          + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
  return {'peak_bytes': int(peak), 'temp_bytes': int(stats.temp_size_in_bytes),
          'loop_instructions': loop_instructions(compiled.as_text())}


_BOOKKEEPING = ('parameter', 'tuple', 'get-tuple-element', 'constant', 'bitcast')


def loop_instructions(hlo_text: str) -> list[int]:
  """Per `while` loop of an HLO module's text, the non-bookkeeping instructions of its body."""
  computations, name = {}, None
  for line in hlo_text.split('\n'):
    header = re.match(r'^(?:ENTRY )?%?(\S+) .*\{$', line)
    if header:
      name = header.group(1)
      computations[name] = []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      computations[name].append(line)
  counts = []
  for lines in computations.values():
    for line in lines:
      loop = re.search(r' while\(.*body=%?([\w.\-]+)', line)
      if loop:
        ops = [re.search(r'= \S+ ([\w\-]+)\(', l) for l in computations[loop.group(1)]]
        counts.append(sum(1 for op in ops if op and op.group(1) not in _BOOKKEEPING))
  return counts


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
    memory = {impl: compiled_facts(*built[impl]) for impl in impls}
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
                      'cpu_ms': statistics.median(cpu), 'repeats': repeats,
                      'matmul_gflop': matmul_gflop(impl, shape), **memory[impl]})
  return results


BATCH_SUM_SHAPES = ((64, 100), (64, 400), (64, 512), (64, 600), (64, 800), (64, 1000),
                    (128, 400), (64, 4000))
BATCH_SUM_STEPS = 784


def _scanned_sum(batch_sum):
  """A jitted scan whose every step sums its `[B, F]` carry over B and feeds it back."""
  def step(carry, _):
    return carry + 1e-3 * batch_sum(carry), None
  return jax.jit(lambda x: jax.lax.scan(step, x, None, length=BATCH_SUM_STEPS)[0])


def time_batch_sums(repeats: int) -> list[dict]:
  """Process CPU microseconds per scan step of a batch-axis reduction and of the same sum
  as a contraction with ones, interleaved."""
  sums = {'reduce': lambda x: jnp.sum(x, axis=0),
          'ones_contraction': lambda x: jnp.ones((x.shape[0],), x.dtype) @ x}
  results = []
  for shape in BATCH_SUM_SHAPES:
    x = jax.random.normal(jax.random.key(0), shape)
    loops = {name: _scanned_sum(f) for name, f in sums.items()}
    for loop in loops.values():
      jax.block_until_ready(loop(x))
    times = {name: [] for name in loops}
    for _ in range(repeats):
      for name, loop in loops.items():
        times[name].append(_time_once(loop, x)[1] * 1e3 / BATCH_SUM_STEPS)
    results.append({'shape': list(shape), **{f'{name}_cpu_us_per_step': statistics.median(t)
                                             for name, t in times.items()}})
  return results


def format_batch_sums(results: list[dict]) -> str:
  lines = ['| [B, F] | reduce us/step | ones contraction us/step | reduce / contraction |',
           '|---|---|---|---|']
  for r in results:
    reduce_us, dot_us = r['reduce_cpu_us_per_step'], r['ones_contraction_cpu_us_per_step']
    lines.append(f"| {r['shape']} | {reduce_us:.1f} | {dot_us:.1f} | "
                 f"{reduce_us / dot_us:.1f} |")
  return '\n'.join(lines)


def shape_label(name: str) -> str:
  s = SHAPES[name]
  label = f"({name}) B{s['batch']} T{s['time']} I{s['features']} H{s['hidden']}"
  if s['bidirectional']:
    label += f", bidir., {round(100 * s['padding'])} % padding"
  return label


def format_table(results: list[dict]) -> str:
  """Markdown: times and their ratios to Flax, and peak memory with its ratio to our lstm
  of the same backward mode."""
  lines = ['| shape | impl | wall ms | wall / Flax | CPU ms | CPU / Flax | matmul GFLOP/s '
           '| peak MiB | peak / lstm | HLO per step (loops) |',
           '|---|---|---|---|---|---|---|---|---|---|']
  by_key = {(r['shape'], r['impl']): r for r in results}
  for r in results:
    ref = by_key.get((r['shape'], REFERENCE))
    variant, _, mode = r['impl'].partition(':')
    plain = by_key.get((r['shape'], ':'.join(['lstm', mode]) if mode else 'lstm'))
    ratio = lambda key, base: f'{r[key] / base[key]:.2f}' if base else '-'
    rate = f"{r['matmul_gflop'] / (r['ms'] / 1e3):.0f}" if 'matmul_gflop' in r else '-'
    lines.append(
        f"| {shape_label(r['shape'])} | {r['impl']} | {r['ms']:.0f} | {ratio('ms', ref)} | "
        f"{r['cpu_ms']:.0f} | {ratio('cpu_ms', ref)} | {rate} | "
        f"{r['peak_bytes'] / 2**20:.1f} | "
        f"{ratio('peak_bytes', plain) if variant in variants.VARIANTS else '-'} | "
        f"{' + '.join(map(str, r.get('loop_instructions', []))) or '-'} |")
  return '\n'.join(lines)


def machine() -> dict:
  """What the numbers came from (no paths)."""
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return {'backend': jax.default_backend(), 'devices': jax.device_count(), 'cpu': cpu,
          'cpu_count': os.cpu_count(), 'jax': jax.__version__,
          'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'load_average_1_5_15_min': [round(v, 2) for v in os.getloadavg()],
          'note': 'compare ratios within one run; the load average says what else ran'}


def main(argv):
  del argv
  if _REPORT.value:
    with open(_REPORT.value) as f:
      saved = json.load(f)
    print(saved.get('machine'))
    print(format_table(saved['results']))
    if 'batch_sums' in saved:
      print(format_batch_sums(saved['batch_sums']))
    return
  known = set(variants.VARIANTS)
  unknown = [i for i in _IMPLS.value
             if i not in (REFERENCE, *FLOORS) and i.split(':')[0] not in known]
  if unknown or set(_SHAPES.value) - set(SHAPES):
    raise app.UsageError(f'Unknown impls {unknown} or shapes {_SHAPES.value}; impls: '
                         f'{REFERENCE}, {", ".join(FLOORS)} or VARIANT[:BACKWARD[:REMAT]], '
                         f'shapes: {sorted(SHAPES)}.')
  repeats = 3 if _QUICK.value else _REPEATS.value
  facts = machine()   # the load average before this process adds its own
  results = run(_SHAPES.value, _IMPLS.value, repeats)
  batch_sums = time_batch_sums(repeats)
  print(f'{facts} repeats={repeats}')
  print(format_table(results))
  print(format_batch_sums(batch_sums))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump({'machine': facts, 'results': results, 'batch_sums': batch_sums}, f,
                indent=1)


if __name__ == '__main__':
  app.run(main)
