r"""The first stage of a GPU check: the compiled Pallas forms of the `bn_lstm` layer
against its pure-JAX fused path (`fused_step='xla'`), before anything is timed.

For each shape, the layer's loss and every parameter gradient (one jitted
`value_and_grad`, lengths spread over [T/2, T] so that masks count) with
`Execution(fused_step='xla')`, then with each Pallas form of `compile_targets.FORMS`
(every form whose `fused_step` is neither 'none' nor 'xla', at the shapes it holds)
and each `--configs` entry (`block_h` x `num_warps`): a row passes when every
value is within `--rtol` of the largest entry of the 'xla' path's (matmuls at full
float32 precision, so only the kernels' pointwise math differs). Each row is isolated (a
failure is recorded, the others run) and the JSON is written after each. Times are
recorded too (first call and median), at that precision.

  python benchmarks/fused_canary.py --json OUT.json [--shapes a,c] [--configs 32x4,8x4]

Exit status 0 only if every row compiled, ran and matched. Run it in a process of its
own under `timeout` (`accelerator_check.sh`'s canary stage). On CPU the Pallas kernels
run interpreted: `--steps 4` there checks the script, not the GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
import compile_targets  # pylint: disable=g-bad-import-order
from experiments import machine_facts  # pylint: disable=g-bad-import-order
import rnn_speed  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

REFERENCE = 'fused_xla'
#: The forms checked: those that run kernels of their own (Pallas).
CHECKED = [name for name, form in compile_targets.FORMS.items()
           if form.settings.get('fused_step') in br.policy.PALLAS_STEPS]
#: `Execution` fields a `--configs` entry sets, in order ('32x4': block_h 32, 4 warps).
CONFIG_FIELDS = ('block_h', 'num_warps')

# `--shapes`, `--repeats` (timed calls per row, after the first) and `--json` are
# rnn_speed.py's flags.
_SHAPES, _REPEATS, _JSON = (rnn_speed._SHAPES, rnn_speed._REPEATS, rnn_speed._JSON)  # pylint: disable=protected-access
_CONFIGS = flags.DEFINE_list('configs', ['default'], "'default' (the layer's own block_h and "
                             "num_warps) or BLOCK_HxNUM_WARPS, e.g. 32x4,8x8.")
_STEPS = flags.DEFINE_integer('steps', None, 'Override T (CPU checks of the script).')
_RTOL = flags.DEFINE_float('rtol', 1e-3, 'Largest difference, relative to the largest '
                           'entry of each value of the xla path.')


def rnn_speed_impl(form: str) -> str:
  """The name `rnn_speed.py` and `launch_profile.py` time the form under."""
  return f"bn_lstm:fused:{compile_targets.FORMS[form].settings['fused_step']}"


def config_settings(config: str) -> dict:
  """`Execution` settings of a `--configs` entry."""
  return {} if config == 'default' else dict(zip(CONFIG_FIELDS, map(int, config.split('x'))))


def inputs(shape: dict, steps: int):
  """`x [B, T, I]` and a `[B, T]` mask of lengths spread over [T/2, T]."""
  key = jax.random.key(0)
  x = jax.random.normal(key, (shape['batch'], steps, shape['features']))
  lengths = np.linspace(steps // 2, steps, shape['batch']).round().astype(int)
  return x, jnp.asarray((np.arange(steps)[None] < lengths[:, None]).astype(np.float32))


def loss_and_grads(settings: dict, shape: dict, steps: int):
  """A jitted `params -> (loss, grads)` of the layer with these `Execution` settings, and
  its parameters (the same for every form: they do not depend on the execution)."""
  layer = br.make_layer('bn_lstm', shape['hidden'], max_length=steps,
                        execution=br.Execution(**settings))
  x, mask = inputs(shape, steps)
  mode = dict(use_running_average=False, deterministic=False)
  variables = layer.init(jax.random.key(1), x, mask, **mode)

  def loss(params):
    y, _ = layer.apply({**variables, 'params': params}, x, mask, **mode,
                       mutable=['batch_stats'])
    return jnp.mean(jnp.square(y))
  return jax.jit(jax.value_and_grad(loss)), variables['params']


def timed(step, params, calls: int):
  """`(value, first call s, median ms of the next calls)`."""
  start = time.perf_counter()
  value = jax.block_until_ready(step(params))
  first = time.perf_counter() - start
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(step(params))
    times.append((time.perf_counter() - start) * 1e3)
  return value, round(first, 2), round(statistics.median(times), 3) if times else None


def max_rel_diff(want, got) -> float:
  """The largest |got - want| over each value's largest |want|, over all values (inf
  where `got` is not finite)."""
  worst = 0.0
  for u, v in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
    if not np.all(np.isfinite(v)):
      return float('inf')
    worst = max(worst, float(np.max(np.abs(u - v)) / max(float(np.max(np.abs(u))), 1e-30)))
  return worst


def error_line(e: Exception) -> str:
  return f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:300]}'


def main(argv):
  del argv
  # Both paths run the same XLA products: at full float32 precision the comparison sees
  # the kernels' pointwise math only.
  jax.config.update('jax_default_matmul_precision', 'highest')
  saved = {'kind': 'fused_canary', 'machine': machine_facts.machine(), 'rtol': _RTOL.value, 'rows': []}
  ok = True

  def record(row):
    nonlocal ok
    ok &= bool(row['ok'])
    saved['rows'].append(row)
    print(json.dumps(row), flush=True)
    if _JSON.value:
      with open(_JSON.value, 'w') as f:
        json.dump(saved, f, indent=1)

  for shape_name in _SHAPES.value:
    shape = rnn_speed.SHAPES[shape_name]
    steps = _STEPS.value or shape['time']
    base = {'shape': shape_name, 'T': steps}
    try:
      step, params = loss_and_grads(compile_targets.FORMS[REFERENCE].settings, shape, steps)
      want, first, ms = timed(step, params, _REPEATS.value)
      record({**base, 'form': REFERENCE, 'first_call_s': first, 'ms': ms, 'ok': True})
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      record({**base, 'form': REFERENCE, 'ok': False, 'error': error_line(e)})
      continue
    for form in [f for f in CHECKED if shape_name in compile_targets.FORMS[f].shapes]:
      for config in _CONFIGS.value:
        row = {**base, 'form': form, 'config': config, 'impl': rnn_speed_impl(form)}
        reason = compile_targets.form_unavailable(form)
        if reason:
          record({**row, 'ok': True, 'skipped': reason})
          continue
        try:
          settings = {**compile_targets.FORMS[form].settings, **config_settings(config)}
          got, row['first_call_s'], row['ms'] = timed(
              *loss_and_grads(settings, shape, steps), _REPEATS.value)
          row['max_rel_diff'] = max_rel_diff(want, got)
          row['ok'] = row['max_rel_diff'] <= _RTOL.value
        except Exception as e:  # pylint: disable=broad-except
          traceback.print_exc()
          row.update(ok=False, error=error_line(e))
        record(row)
  sys.exit(0 if ok else 1)


if __name__ == '__main__':
  flags.FLAGS.set_default('shapes', list(compile_targets.SHAPES))
  flags.FLAGS.set_default('repeats', 5)
  app.run(main)
