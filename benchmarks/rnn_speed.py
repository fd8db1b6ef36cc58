"""Forward+backward speed and memory of our recurrent layers against Flax's and cuDNN's LSTM.

Median wall time and median process CPU time of one jitted `value_and_grad` (loss = mean
of squared outputs, gradient w.r.t. every parameter), after warm-up calls, with
`block_until_ready`. All implementations run in one process, interleaved repetition by
repetition, so that they see the same machine load (timings drift 10-25 % between
processes here); the table gives each one's ratio to Flax's
`nn.RNN(nn.OptimizedLSTMCell)` in the same run. Peak memory of the same compiled
fwd+bwd comes from XLA's buffer assignment (`jit(f).lower(...).compile()
.memory_analysis()`), not from a measurement of the process; the instructions per step of
each compiled loop body (forward + backward) come from the same executable's HLO
(`program_facts.py`). The
matmul GFLOP/s column divides the matrix products a fwd+bwd must run (`matmul_gflop`,
counted from the shape) by the wall time: where the products take nearly all the time
(shape (c)), it says how fast they run inside the loop.

  python benchmarks/rnn_speed.py            # full table
  python benchmarks/rnn_speed.py --quick    # fewer repetitions
  python benchmarks/rnn_speed.py --json benchmarks/results/rnn_speed_cpu.json
  python benchmarks/rnn_speed.py --report benchmarks/results/rnn_speed_cpu.json  # table
  python benchmarks/rnn_speed.py --dtypes float32,bfloat16 --json OUT.json  # both

`--dtypes`: the compute dtype of the matrix products (`RecurrentLayer.dtype`, Flax's
`OptimizedLSTMCell(dtype=)`); parameters, state and batch statistics stay float32. Each
row names its dtype, and its ratios are to Flax in the same dtype and to cuDNN (float32,
its only dtype). "bf16 dots" counts the products JAX emits with bfloat16 operands, of
all the fwd+bwd's products (`dot_operands`): Flax's bfloat16 cell runs its backward
products in bfloat16 too; our layer's whole-layer backward pass (`:layer`) does, but
under the autodiff of the scan (`:scan`, the TPU's choice and the GPU's for batch norm) its `dtype` casts the
forward products only (their outputs are float32, so the backward products take float32
cotangents). The JSON records the machine (`experiments/machine_facts.py`: processor,
cores, XLA flags, matmul precision, versions, device, load average) and the rows skipped,
each with one line saying why.

Implementations: `flax_optimized_lstm`; `cudnn_lstm`, cuDNN's LSTM through
`jax.experimental.rnn` (`cudnn_lstm.py`: CUDA GPUs only, float32 only, skipped with one
line elsewhere; its row records `max_abs_diff_to_lstm_ref`, the largest difference of its
outputs from JAX's pure-JAX version of the same LSTM); and `VARIANT[:BACKWARD[:REMAT]]`
for our layer, e.g. `bn_lstm:layer` (whole-layer backward pass) or `bn_lstm:scan:dots`
(autodiff of the scan, storing matmul outputs); without a backward, the layer's 'auto'
(`policy.py`); `bn_lstm:fused:xla`, `bn_lstm:fused:pallas` and `bn_lstm:fused:persistent`
run the BN-LSTM with `Execution(fused_step=...)` (`fused_step.py`, `persistent.py`; Pallas
on accelerators only). And a
float32 floor, not an LSTM: `products_only:scan` and
`products_only:layer` run the matrix products of Flax's fwd+bwd with no gate math
(`products_only`): all of them inside the steps, or only the two the recurrence forces
(`h W_h`, `dz W_h^T`) with the input and weight-gradient products as one large product
each. `bn_lstm_cell` is the BN-LSTM as a cell of Flax's scan,
`nn.RNN(bn_rnn_jax.BNLSTMCell)` (`flax_cells.py`; statistics carried through the scan),
beside our layer's `bn_lstm` and Flax's cell. An LSTM that runs these products with XLA's matmul also runs its gate math, so
the faster of the two bounds the ratio to Flax that any of ours can reach.

The JSON's `batch_sums` (and the second table) time the two ways to sum over the batch
(`batch_sum_speed.py`): per scan step, `jnp.sum(x, axis=0)` against `ones @ x` for
`[B, F]` blocks of the sizes the layers sum at every step.

Shapes: (a) B64 T784 I1 H100 (sequential MNIST); (b) B40 T320 I240 H240, bidirectional,
lengths spread evenly over [T/2, T] (25 % of the steps are padding, masked; Flax gets the
same `seq_lengths`); (c) B64 T100 I50 H1000; (d) B32 T35 I650 H650 (a layer of
`ptb_word.py`'s medium model: Zaremba's and Laurent's medium word-level PTB).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Optional

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from bn_rnn_jax import flax_cells
from bn_rnn_jax import policy
from bn_rnn_jax import stack
from bn_rnn_jax import variants
import batch_sum_speed  # pylint: disable=g-bad-import-order
import cudnn_lstm  # pylint: disable=g-bad-import-order
from experiments import machine_facts  # pylint: disable=g-bad-import-order
import program_facts  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

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
CUDNN = cudnn_lstm.NAME
PRODUCTS_ONLY = 'products_only'
FLOORS = (f'{PRODUCTS_ONLY}:scan', f'{PRODUCTS_ONLY}:layer')
# Whole LSTMs of someone else: the same matrix products as Flax's cell (`matmul_gflop`).
ANCHORS = (REFERENCE, CUDNN)
# Our BN-LSTM as a cell of Flax's `nn.RNN`: its products are Flax's cell's too.
CELL = 'bn_lstm_cell'
# The BN-LSTM with `Execution(fused_step=...)`: plain JAX, and Pallas per step or
# persistent (interpreted on CPU, where its time means nothing: accelerators only).
FUSED = ('bn_lstm:fused:xla', 'bn_lstm:fused:pallas', 'bn_lstm:fused:persistent')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
IMPLS = (*ANCHORS, *FLOORS, 'lstm', 'lstm:scan', 'lstm:layer', 'bn_lstm', 'bn_lstm:scan',
         'bn_lstm:scan:dots', 'bn_lstm:scan:full', 'bn_lstm:layer', CELL, *FUSED)

_SHAPES = flags.DEFINE_list('shapes', ['a', 'b', 'c', 'd'], 'Shapes to run (a-d).')
_IMPLS = flags.DEFINE_list('impls', list(IMPLS), 'Implementations to run.')
_REPEATS = flags.DEFINE_integer('repeats', 9, 'Timed repetitions per implementation.')
_QUICK = flags.DEFINE_bool('quick', False, 'Three repetitions.')
_DTYPES = flags.DEFINE_list('dtypes', ['float32'],
                            f'Compute dtypes of the matrix products: {", ".join(DTYPES)}.')
_BATCH_SUMS = flags.DEFINE_bool('batch_sums', True,
                                 'Also time the two batch sums (batch_sum_speed.py).')
_JSON = flags.DEFINE_string('json', None, 'Write the results to this path.')
_REPORT = flags.DEFINE_string('report', None, 'Print the table of this JSON and exit.')
_CANARY = flags.DEFINE_string('canary', None, "fused_canary.py's JSON: a Pallas form is "
                              'timed only where it passed there at its default settings.')
_UNROLL = flags.DEFINE_integer('unroll', None, 'Override the layers\' execution unroll.')
_HOIST = flags.DEFINE_enum('hoist', None, ['true', 'false'],
                           'Override the layers\' execution hoist_input (default: auto).')


class FlaxLSTM(nn.Module):
  """The reference: `nn.RNN(nn.OptimizedLSTMCell)`, bidirectional if asked; `dtype` is
  the cell's compute dtype (parameters float32)."""
  hidden: int
  bidirectional: bool = False
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x, seq_lengths=None):
    rnn = lambda: nn.RNN(nn.OptimizedLSTMCell(self.hidden, dtype=self.dtype))
    if self.bidirectional:
      return nn.Bidirectional(rnn(), rnn())(x, seq_lengths=seq_lengths)
    return rnn()(x, seq_lengths=seq_lengths)


class CellLSTM(nn.Module):
  """`bn_rnn_jax.RNN(BNLSTMCell)` in training (batch statistics folded into their running
  average), bidirectional if asked; `dtype` as `FlaxLSTM`'s."""
  hidden: int
  max_length: int
  bidirectional: bool = False
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x, seq_lengths=None):
    rnn = lambda: flax_cells.RNN(
        flax_cells.BNLSTMCell(self.hidden, max_length=self.max_length, dtype=self.dtype,
                              use_running_average=False))
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


def _layer(impl: str, shape: dict, dtype: str = 'float32') -> nn.Module:
  variant, *rest = impl.split(':')
  settings = {}   # the layer's `execution` (policy.Execution)
  if rest and rest[0] == 'fused':
    settings['fused_step'] = rest[1]
  elif rest:
    settings['backward'] = rest[0]
  if len(rest) > 1 and 'fused_step' not in settings:
    settings['remat'] = rest[1]
  if flags.FLAGS.is_parsed():  # the command line's overrides (none when imported)
    if _UNROLL.value is not None:
      settings['unroll'] = _UNROLL.value
    if _HOIST.value is not None:
      settings['hoist_input'] = _HOIST.value == 'true'
  make = lambda: variants.make_layer(variant, shape['hidden'], max_length=shape['time'],
                                      dtype=DTYPES[dtype],
                                      execution=policy.Execution(**settings))
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


def _inputs(shape: dict):
  """`x [B, T, I]` and, with padding, the `[B]` lengths and `[B, T]` mask (else None)."""
  x = jax.random.normal(jax.random.key(0), (shape['batch'], shape['time'], shape['features']))
  return (x, *lengths_and_mask(shape)) if shape['padding'] else (x, None, None)


def _cudnn_lengths(shape: dict, lengths):
  """cuDNN's lengths: always given, int32."""
  return jnp.full((shape['batch'],), shape['time'], jnp.int32) if lengths is None else lengths


def _build(impl: str, shape: dict, dtype: str = 'float32'):
  """A jitted `params -> (loss, grads)` function and its parameters."""
  x, lengths, mask = _inputs(shape)
  if impl == CUDNN:
    return cudnn_lstm.build(x, _cudnn_lengths(shape, lengths), shape['hidden'],
                            shape['bidirectional'])
  if impl in FLOORS:
    backward = impl.partition(':')[2]
    def products_step(params):
      return jnp.float32(0.0), [products_only(x, kernels, backward) for kernels in params]
    return jax.jit(products_step), _products_only_kernels(jax.random.key(1), shape)
  if impl == REFERENCE:
    model = FlaxLSTM(shape['hidden'], shape['bidirectional'], DTYPES[dtype])
    variables = model.init(jax.random.key(1), x, lengths)
    def loss_fn(params):
      y = model.apply({'params': params}, x, lengths)
      return jnp.mean(jnp.square(y.astype(jnp.float32)))
  elif impl == CELL:
    model = CellLSTM(shape['hidden'], shape['time'], shape['bidirectional'], DTYPES[dtype])
    variables = model.init(jax.random.key(1), x, lengths)
    def loss_fn(params):
      y, _ = model.apply({**variables, 'params': params}, x, lengths,
                         mutable=['batch_stats'])
      return jnp.mean(jnp.square(y.astype(jnp.float32)))
  else:
    model = _layer(impl, shape, dtype)
    variables = model.init(jax.random.key(1), x, mask, use_running_average=False,
                           deterministic=False)
    def loss_fn(params):
      y, _ = model.apply({**variables, 'params': params}, x, mask, use_running_average=False,
                         deterministic=False, mutable=['batch_stats'])
      return jnp.mean(jnp.square(y.astype(jnp.float32)))
  step = jax.jit(jax.value_and_grad(loss_fn))
  return step, variables['params']


def matmul_gflop(impl: str, shape: dict) -> float:
  """GFLOP of the matrix products one fwd+bwd must run (counted, not measured).

  Per step and direction: the forward `x W_x` and `h W_h` (2 B (I + H) 4H), the backward
  dh and dW_h (2 x 2 B H 4H) and dW_x (2 B I 4H); no dx, the input takes no gradient.
  A layer whose remat resolves to 'full' also recomputes the forward products. Flax's
  cell, cuDNN's and ours (input term in the step on CPU) count the same, so where the products
  take nearly all the time (shape (c)), a ratio to Flax far below 1 would need our
  products to run faster than the same products in Flax's step.
  """
  batch, length = shape['batch'], shape['time']
  inputs, hidden = shape['features'], shape['hidden']
  forward = 2 * batch * (inputs + hidden) * 4 * hidden
  backward = 2 * batch * (2 * hidden + inputs) * 4 * hidden
  per_step = forward + backward
  if impl not in (*ANCHORS, *FLOORS, CELL):
    layer = _layer(impl, shape)
    layer = layer.forward_layer if isinstance(layer, stack.Bidirectional) else layer
    if layer.execution_policy(batch).remat == 'full':
      per_step += forward
  directions = 2 if shape['bidirectional'] else 1
  return directions * length * per_step / 1e9


def _time_once(step, params) -> tuple[float, float]:
  """(wall ms, process CPU ms). CPU time is the steadier number on a shared machine."""
  start, start_cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(step(params))
  return (time.perf_counter() - start) * 1e3, (time.process_time() - start_cpu) * 1e3


def canary_verdicts(path: Optional[str]) -> Optional[dict[str, bool]]:
  """From `fused_canary.py`'s JSON at `path`: for each Pallas impl it checked at its
  default settings, whether every such row passed (none where the canary wrote nothing);
  None without a path (no canary to heed)."""
  if not path:
    return None
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    rows = json.load(f)['rows']
  verdicts = {}
  for row in rows:
    if row.get('config') == 'default' and 'impl' in row:
      verdicts[row['impl']] = verdicts.get(row['impl'], True) and bool(row['ok'])
  return verdicts


def skip_reason(impl: str, dtype: str, cudnn_unavailable: Optional[str],
                canary: Optional[dict[str, bool]] = None) -> Optional[str]:
  """One line saying why `impl` in `dtype` has no row here, or None. With `canary`
  (`canary_verdicts`), a Pallas impl the canary did not pass is not timed."""
  if impl == CUDNN and cudnn_unavailable:
    return cudnn_unavailable
  if impl in (CUDNN, *FLOORS) and dtype != 'float32':
    return f'{impl} {dtype}: skipped, it runs float32 only.'
  pallas = impl.rsplit(':', 1)[-1] in policy.PALLAS_STEPS
  if canary is not None and pallas:
    if impl not in canary:
      return f'{impl}: skipped, the canary did not check it (not timed unchecked).'
    if not canary[impl]:
      return f'{impl}: skipped, it failed the canary (its outputs or gradients are wrong here).'
  if pallas and jax.default_backend() == 'cpu':
    return f'{impl}: skipped, Pallas runs interpreted on CPU (time it on an accelerator).'
  return None


def _cudnn_check(shape: dict, params) -> dict:
  """The cuDNN row's distance from JAX's pure-JAX LSTM on the same weights and inputs."""
  x, lengths, _ = _inputs(shape)
  return {'max_abs_diff_to_lstm_ref': cudnn_lstm.max_abs_diff_to_reference(
      x, params, _cudnn_lengths(shape, lengths), shape['hidden'], shape['bidirectional'])}


def _failure(impl: str, dtype: str, shape_name: str, error: Exception) -> str:
  """One line for a row that failed (the others run on)."""
  first = (str(error).strip().splitlines() or [''])[0][:300]
  return f'{impl} {dtype} at ({shape_name}): failed, {type(error).__name__}: {first}'


def run(shapes, impls, repeats, dtypes=('float32',), on_update=None,
        canary: Optional[dict[str, bool]] = None) -> tuple[list[dict], list[str]]:
  """Rows of every (shape, impl, dtype) that runs here, interleaved repetition by
  repetition within a shape; and one line for each (impl, dtype) skipped, or that
  failed to build, compile or run (a failure loses that row only).

  `on_update(results, skipped)`, where given, is called after every repetition round
  with the rows so far (their medians over the rounds done: a run stopped midway keeps
  them) and after every failure. `canary`: as `skip_reason`'s.
  """
  cudnn_unavailable = cudnn_lstm.unavailable_reason() if CUDNN in impls else None
  runs, skipped = [], []
  for impl in impls:
    for dtype in dtypes:
      reason = skip_reason(impl, dtype, cudnn_unavailable, canary)
      if reason is None:
        runs.append((impl, dtype))
      elif reason not in skipped:
        skipped.append(reason)
  results = []
  update = on_update or (lambda *_: None)

  def failed(key, shape_name, error):
    skipped.append(_failure(*key, shape_name, error))
    update(results, skipped)

  for shape_name in shapes:
    shape = SHAPES[shape_name]
    built, facts = {}, {}
    for key in runs:
      try:
        built[key] = _build(*key[:1], shape, key[1])
        facts[key] = program_facts.compiled(*built[key])
        if key == (CUDNN, 'float32'):
          facts[key].update(_cudnn_check(shape, built[key][1]))
        for _ in range(2):  # compile + warm up
          _time_once(*built[key])
      except Exception as e:  # pylint: disable=broad-except
        built.pop(key, None)
        failed(key, shape_name, e)
    times = {key: [] for key in built}
    done = len(results)
    for _ in range(repeats):
      for key in list(built):
        try:
          times[key].append(_time_once(*built[key]))
        except Exception as e:  # pylint: disable=broad-except
          del built[key], times[key]
          failed(key, shape_name, e)
      del results[done:]
      for (impl, dtype), measured in times.items():
        wall, cpu = zip(*measured)
        results.append({'shape': shape_name, 'impl': impl, 'dtype': dtype,
                        'ms': statistics.median(wall), 'cpu_ms': statistics.median(cpu),
                        'repeats': len(measured), 'matmul_gflop': matmul_gflop(impl, shape),
                        **facts[impl, dtype]})
      update(results, skipped)
  return results, skipped


def shape_label(name: str) -> str:
  s = SHAPES[name]
  label = f"({name}) B{s['batch']} T{s['time']} I{s['features']} H{s['hidden']}"
  if s['bidirectional']:
    label += f", bidir., {round(100 * s['padding'])} % padding"
  return label


def format_table(results: list[dict]) -> str:
  """Markdown: times and their ratios to Flax (same dtype) and to cuDNN (float32), and
  peak memory with its ratio to our lstm of the same backward mode and dtype. Rows
  written before the dtype was recorded are float32."""
  lines = ['| shape | impl | dtype | wall ms | wall / Flax | wall / cuDNN | CPU ms | CPU / Flax '
           '| matmul GFLOP/s | peak MiB | peak / lstm | HLO per step (loops) | bf16 dots |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  dtype_of = lambda r: r.get('dtype', 'float32')
  by_key = {(r['shape'], r['impl'], dtype_of(r)): r for r in results}
  for r in results:
    dtype = dtype_of(r)
    flax_row = by_key.get((r['shape'], REFERENCE, dtype))
    cudnn_row = by_key.get((r['shape'], CUDNN, 'float32'))
    variant, _, mode = r['impl'].partition(':')
    plain = by_key.get((r['shape'], ':'.join(['lstm', mode]) if mode else 'lstm', dtype))
    ratio = lambda key, base: f'{r[key] / base[key]:.2f}' if base else '-'
    rate = f"{r['matmul_gflop'] / (r['ms'] / 1e3):.0f}" if 'matmul_gflop' in r else '-'
    lines.append(
        f"| {shape_label(r['shape'])} | {r['impl']} | {dtype} | {r['ms']:.0f} | "
        f"{ratio('ms', flax_row)} | {ratio('ms', cudnn_row)} | "
        f"{r['cpu_ms']:.0f} | {ratio('cpu_ms', flax_row)} | {rate} | "
        f"{r['peak_bytes'] / 2**20:.1f} | "
        f"{ratio('peak_bytes', plain) if variant in variants.VARIANTS else '-'} | "
        f"{' + '.join(map(str, r.get('loop_instructions', []))) or '-'} | "
        f"{_bf16_share(r)} |")
  return '\n'.join(lines)


def _bf16_share(row: dict) -> str:
  """'bf16 products / all products' of a row ('-' where not recorded)."""
  dots = row.get('dot_operands')
  return f"{dots.get('bf16', 0)}/{sum(dots.values())}" if dots else '-'


def _print_report(saved: dict) -> None:
  print(saved.get('machine'))
  for line in saved.get('skipped', []):
    print(line)
  print(format_table(saved['results']))
  if 'batch_sums' in saved:
    clock = 'cpu' if saved.get('machine', {}).get('backend', 'cpu') == 'cpu' else 'wall'
    print(batch_sum_speed.format_table(saved['batch_sums'], clock))


def main(argv):
  del argv
  if _REPORT.value:
    with open(_REPORT.value) as f:
      _print_report(json.load(f))
    return
  known = set(variants.VARIANTS)
  unknown = [i for i in _IMPLS.value
             if i not in (*ANCHORS, *FLOORS, CELL) and i.split(':')[0] not in known]
  if unknown or set(_SHAPES.value) - set(SHAPES) or set(_DTYPES.value) - set(DTYPES):
    raise app.UsageError(f'Unknown impls {unknown}, shapes {_SHAPES.value} or dtypes '
                         f'{_DTYPES.value}; impls: {", ".join(ANCHORS)}, {", ".join(FLOORS)} '
                         f'{CELL} or VARIANT[:BACKWARD[:REMAT]], shapes: {sorted(SHAPES)}, dtypes: '
                         f'{", ".join(DTYPES)}.')
  repeats = 3 if _QUICK.value else _REPEATS.value
  facts = machine_facts.machine()   # the load average before this process adds its own
  saved = {'kind': 'rnn_speed', 'machine': facts, 'repeats': repeats, 'skipped': [],
           'results': []}

  def write(results, skipped):
    saved.update(results=results, skipped=skipped)
    if _JSON.value:
      with open(_JSON.value, 'w') as f:
        json.dump(saved, f, indent=1)
  write(*run(_SHAPES.value, _IMPLS.value, repeats, _DTYPES.value, on_update=write,
             canary=canary_verdicts(_CANARY.value)))
  if _BATCH_SUMS.value:
    saved['batch_sums'] = batch_sum_speed.run(repeats, _time_once)
    write(saved['results'], saved['skipped'])
  _print_report(saved)


if __name__ == '__main__':
  app.run(main)
