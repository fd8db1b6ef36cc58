r"""Is a recurrent layer's step launch-bound? One `jax.profiler` trace, summarised.

For each implementation (`rnn_speed.py`'s names), the jitted fwd+bwd of a shape is traced
for `--calls` calls after warm-up. The trace's device plane (`/device:GPU:0`, its `Stream`
lines) gives every kernel with its start and end; per implementation the JSON records

  kernels_per_step   kernels of one fwd+bwd over the time steps T (forward and backward
                     together: a step's share of both passes)
  kernel_us          median kernel duration
  gap_us             median idle time between one kernel's end and the next one's start
                     (kernels of all streams merged; overlapping kernels give no gap)
  busy               the share of the traced span in which some kernel runs
  ms_per_call        the traced span over the calls (tracing slows the calls: read
                     rnn_speed.py's untraced times for speed)

and the table adds each time step's kernel time and idle time (`ms_per_call` split by
`busy`, over T).
A step whose kernels are short beside the gaps between them (busy well under one half)
waits on launches, not on arithmetic: fusing the step (fewer, larger kernels) or running
more examples per kernel would speed it up, faster kernels would not.

Where the trace has no device plane (a CPU run), the rows record `device_plane: false`
and the host plane's XLA operations are not counted: on a CPU there are no launches.

  python benchmarks/launch_profile.py --shape a --traced flax_optimized_lstm,lstm,bn_lstm \
      --json OUT.json
  python benchmarks/launch_profile.py --report OUT.json
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import tempfile

from absl import app
from absl import flags
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from experiments import machine_facts  # pylint: disable=g-bad-import-order
import rnn_speed  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

_SHAPE = flags.DEFINE_enum('shape', 'a', list(rnn_speed.SHAPES), 'Shape to trace.')
_IMPLS = flags.DEFINE_list('traced', [rnn_speed.REFERENCE, rnn_speed.CUDNN, 'lstm', 'bn_lstm',
                                     rnn_speed.CELL], 'Implementations to trace.')
_CALLS = flags.DEFINE_integer('calls', 3, 'Traced calls per implementation.')
# `--json` (write the results), `--report` (print a saved table) and `--canary` (time only
# the Pallas forms the canary passed) are rnn_speed.py's flags.
_OUT, _REPORT, _CANARY = (rnn_speed._JSON, rnn_speed._REPORT,  # pylint: disable=protected-access
                          rnn_speed._CANARY)  # pylint: disable=protected-access

NON_KERNELS = ('Memcpy', 'Memset')


def kernel_events(profile) -> list[tuple[int, int]]:
  """`(start_ns, end_ns)` of every kernel on the first GPU plane's streams, sorted."""
  events = []
  for plane in profile.planes:
    if not plane.name.startswith('/device:GPU:'):
      continue
    for line in plane.lines:
      if not line.name.startswith('Stream'):
        continue
      events += [(e.start_ns, e.end_ns) for e in line.events
                 if not e.name.startswith(NON_KERNELS)]
    break
  return sorted(events)


def summarise(events: list[tuple[int, int]], calls: int, steps: int) -> dict:
  """The numbers of the module docstring from sorted `(start_ns, end_ns)` kernels."""
  if not events:
    return {'device_plane': False}
  gaps, busy = [], 0
  current_start, current_end = events[0]
  for start, end in events[1:]:
    if start > current_end:
      gaps.append(start - current_end)
      busy += current_end - current_start
      current_start, current_end = start, end
    else:
      current_end = max(current_end, end)
  busy += current_end - current_start
  span = current_end - events[0][0]
  return {'device_plane': True, 'kernels': len(events),
          'kernels_per_step': len(events) / (calls * steps),
          'kernel_us': statistics.median(e - s for s, e in events) / 1e3,
          'gap_us': statistics.median(gaps) / 1e3 if gaps else 0.0,
          'busy': busy / span if span else 1.0,
          'ms_per_call': span / calls / 1e6}


def profile(impl: str, shape: dict, calls: int):
  """The `jax.profiler.ProfileData` of `calls` traced fwd+bwd calls of `impl` at `shape`
  (float32), after two untraced ones; None when the trace wrote no xplane.pb."""
  step, params = rnn_speed._build(impl, shape)  # pylint: disable=protected-access
  for _ in range(2):
    jax.block_until_ready(step(params))
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir):
      for _ in range(calls):
        jax.block_until_ready(step(params))
    paths = glob.glob(os.path.join(logdir, '**', '*.xplane.pb'), recursive=True)
    if not paths:
      return None
    with open(paths[0], 'rb') as f:
      return jax.profiler.ProfileData.from_serialized_xspace(f.read())


def trace(impl: str, shape: dict, calls: int) -> dict:
  """The summary of `calls` traced fwd+bwd calls of `impl` at `shape` (float32)."""
  traced = profile(impl, shape, calls)
  if traced is None:
    return {'device_plane': False, 'error': 'the trace wrote no xplane.pb'}
  return summarise(kernel_events(traced), calls, shape['time'])


def format_table(saved: dict) -> str:
  """The JSON's rows, with each step's kernel time and idle time (from `busy`)."""
  steps = rnn_speed.SHAPES[saved['shape']]['time']
  lines = ['| impl | kernels / step | kernel µs (median) | gap µs (median) | busy | '
           'µs / step: kernels | µs / step: idle |',
           '|---|---:|---:|---:|---:|---:|---:|']
  for row in saved['rows']:
    if not row.get('device_plane'):
      lines.append(f"| {row['impl']} | no device plane | | | | | |")
      continue
    per_step = row['ms_per_call'] * 1e3 / steps
    lines.append(f"| {row['impl']} | {row['kernels_per_step']:.1f} | {row['kernel_us']:.1f} "
                 f"| {row['gap_us']:.1f} | {row['busy']:.2f} | {per_step * row['busy']:.0f} "
                 f"| {per_step * (1 - row['busy']):.0f} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  if _REPORT.value:
    with open(_REPORT.value) as f:
      print(format_table(json.load(f)))
    return
  facts = machine_facts.machine()
  shape = rnn_speed.SHAPES[_SHAPE.value]
  cudnn_unavailable = rnn_speed.cudnn_lstm.unavailable_reason()
  canary = rnn_speed.canary_verdicts(_CANARY.value)
  saved = {'kind': 'launch_profile', 'machine': facts, 'shape': _SHAPE.value,
           'calls': _CALLS.value, 'skipped': [], 'rows': []}
  for impl in _IMPLS.value:
    # Each row on its own: one that fails is a line of `skipped`, and the JSON is written
    # as each row finishes.
    reason = rnn_speed.skip_reason(impl, 'float32', cudnn_unavailable, canary)
    if reason is None:
      try:
        saved['rows'].append({'impl': impl, **trace(impl, shape, _CALLS.value)})
      except Exception as e:  # pylint: disable=broad-except
        reason = rnn_speed._failure(impl, 'float32', _SHAPE.value, e)  # pylint: disable=protected-access
    if reason:
      saved['skipped'].append(reason)
      print(reason, flush=True)
    if _OUT.value:
      with open(_OUT.value, 'w') as f:
        json.dump(saved, f, indent=1)
  print(format_table(saved))


if __name__ == '__main__':
  app.run(main)
