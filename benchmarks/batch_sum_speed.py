"""The two ways to sum over the batch (`policy.Execution.batch_sums`), timed per scan step.

Per scan step, `jnp.sum(x, axis=0)` ('reduce') against `ones @ x` ('contraction') for
`[B, F]` blocks of the sizes the layers sum at every step. XLA's CPU reduction over the
batch axis slows several times once F passes about 512 at B64; accelerators are why
`policy.py` picks 'reduce' off the CPU. `rnn_speed.py` runs this after its table and
writes the rows to its JSON's `batch_sums`.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp

SHAPES = ((64, 100), (64, 400), (64, 512), (64, 600), (64, 800), (64, 1000), (128, 400),
          (64, 4000))
STEPS = 784
SUMS = {'reduce': lambda x: jnp.sum(x, axis=0),
        'ones_contraction': lambda x: jnp.ones((x.shape[0],), x.dtype) @ x}


def _scanned_sum(batch_sum):
  """A jitted scan whose every step sums its `[B, F]` carry over B and feeds it back."""
  def step(carry, _):
    return carry + 1e-3 * batch_sum(carry), None
  return jax.jit(lambda x: jax.lax.scan(step, x, None, length=STEPS)[0])


def run(repeats: int, time_once) -> list[dict]:
  """Microseconds per scan step of both sums, interleaved: process CPU time (the
  steadier number on a shared CPU) and wall time (the one that counts where a device
  runs the loop). `time_once(fn, x)` returns `(wall ms, CPU ms)` of one blocked call."""
  results = []
  for shape in SHAPES:
    x = jax.random.normal(jax.random.key(0), shape)
    loops = {name: _scanned_sum(f) for name, f in SUMS.items()}
    for loop in loops.values():
      jax.block_until_ready(loop(x))
    times = {name: [] for name in loops}
    for _ in range(repeats):
      for name, loop in loops.items():
        times[name].append([ms * 1e3 / STEPS for ms in time_once(loop, x)])
    row = {'shape': list(shape)}
    for name, values in times.items():
      wall, cpu = zip(*values)
      row[f'{name}_cpu_us_per_step'] = statistics.median(cpu)
      row[f'{name}_wall_us_per_step'] = statistics.median(wall)
    results.append(row)
  return results


def format_table(results: list[dict], clock: str = 'cpu') -> str:
  """Markdown of `run`'s rows by `clock` ('cpu' or 'wall'; rows written before wall
  times were recorded have CPU times only)."""
  lines = [f'| [B, F] | reduce us/step ({clock}) | ones contraction us/step ({clock}) | '
           'reduce / contraction |', '|---|---|---|---|']
  for r in results:
    if f'reduce_{clock}_us_per_step' not in r:
      return f'(no {clock} times in these results)'
    reduce_us = r[f'reduce_{clock}_us_per_step']
    dot_us = r[f'ones_contraction_{clock}_us_per_step']
    lines.append(f"| {r['shape']} | {reduce_us:.1f} | {dot_us:.1f} | "
                 f"{reduce_us / dot_us:.1f} |")
  return '\n'.join(lines)
