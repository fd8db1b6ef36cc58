r"""Overhead of the training loop: steps/s of the loop (`loop._Run`) against the bare
compiled step.

  python benchmarks/trainer_overhead.py [--steps_quickstart 60] [--steps_mnist 8]
      [--population [--population_repeats 3]]
      [--out benchmarks/results/trainer_overhead_cpu.json]
  python benchmarks/trainer_overhead.py --report benchmarks/results/trainer_overhead_cpu.json

For each shape (the quickstart's: 8x8 digits, T=64, B=64, H=100 BN-LSTM; seq-MNIST's:
T=784, B=100, H=100 BN-LSTM), on the same batches and the same compiled step:
  bare   `p_train_step` called back to back on batches already on the device, one block
         at the end: what the device can do;
  loop   `loop._Run` (prefetch, metrics fetched every `log_every` steps, the finiteness
         check, the final save's device-to-host copy), without evaluation or writes to
         disk (a no-op checkpointer, no eval splits);
  sync   a loop that waits on every step: build the batch on the host, run the step,
         convert its metrics to Python floats every step;
  host   only the host work the loop adds per step (build a batch, put it on the device):
         `host/step` = its time over a bare step bounds the loop's overhead even when
         nothing overlaps (a machine too loaded for the ratios to settle).
Repeats alternate the three; the table gives medians and ratios (target loop/bare >= 0.95).
Where the MNIST files are not under the data root (`$BN_RNN_JAX_DATA`), the seq-MNIST
shape trains on random pixels of the same shape (the row's `data` says which): the loop's
work does not depend on the pixels.

`--population` also times the quickstart's bn_lstm and lstm runs end to end (300 steps,
`experiments/configs/quickstart.py`; medians of `--population_repeats` pairs, each run
from empty compilation caches), the share of bn_lstm's time spent in the population
estimate at each evaluation (`Trainer.population_stats`), and each run's XLA compile
time (a fixed cost that weighs on a run this short).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from bn_rnn_jax import input_pipeline
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from experiments import machine_facts
from experiments.configs import quickstart as quickstart_config
from experiments.configs import seq_mnist as seq_mnist_config
# pylint: enable=wrong-import-position


class _NoCheckpoints:
  """The loop's checkpointer, minus the disk (the device-to-host copy still happens)."""
  latest = best = None

  def latest_step(self):
    return None

  def save(self, step, state, meta):
    del step, state, meta

  save_best = save

  def wait(self):
    pass


def _config(name: str, num_steps: int):
  config = (quickstart_config if name == 'quickstart' else seq_mnist_config).get_config()
  config.model.variant = 'bn_lstm'
  config.train.num_devices = 1
  config.train.num_steps = num_steps
  config.eval.splits = ()            # the loop alone: no evaluation ...
  config.eval.test_at_end = False
  config.eval.every = num_steps
  config.checkpoint.every = num_steps
  if name == 'mnist':
    config.train.log_every = 4       # seq-MNIST logs every 100 of ~1 s steps; here 4 of 8
  return config


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _timed(fn, *args):
  wall, cpu = time.perf_counter(), _cpu()
  fn(*args)
  return time.perf_counter() - wall, _cpu() - cpu


def _dataset(config):
  """`(dataset, what it is)`: the config's data, or for seq-MNIST without its files under
  the data root, random pixels of the same shape (60,000 - 5,000 training sequences)."""
  if config.data.name != 'mnist':
    return None, config.data.name
  try:
    if os.path.isdir(input_pipeline.resolve_path(config.data, 'mnist_dir')):
      return None, 'mnist'
  except (ValueError, FileNotFoundError):
    pass  # no data root set, or it is not a folder
  rng = np.random.default_rng(0)
  split = lambda n: (rng.random((n, 784, 1), np.float32), rng.integers(0, 10, n, np.int32))
  splits = {'train': split(55_000), 'valid': split(1_000), 'test': split(1_000)}
  return (mnist.SequenceDataset(splits, seed=config.seed, batch_size=config.train.batch_size,
                                eval_batch_size=config.eval.batch_size),
          'random pixels, 784 steps (no MNIST under the data root)')


def measure(name: str, num_steps: int, repeats: int) -> dict:
  config = _config(name, num_steps)
  dataset, data = _dataset(config)
  trainer = loop.Trainer(config, None, dataset)
  host_state = trainer.initial_state()
  # Built once: building it (model.init under a fresh jit) is setup, not the loop's work.
  trainer.initial_state = lambda: host_state
  start = trainer.to_devices(host_state)
  batches = [trainer.device_batch(step) for step in range(num_steps)]
  workdir = tempfile.mkdtemp()
  writer = metric_writer.MetricWriter(workdir, enabled=False)

  def fresh():
    """A copy of the first state for `bare` and `sync`, made before the clock starts:
    their steps donate the state they start from (`config.train.donate_state`)."""
    return (jax.block_until_ready(trainer.copy_state(start)),)

  def bare(state):
    for batch in batches:
      state, metrics = trainer.p_train_step(state, batch)
    jax.block_until_ready((state, metrics))

  def run_loop():
    loop._Run(trainer, writer, _NoCheckpoints()).run()  # pylint: disable=protected-access

  def sync(state):
    for step in range(num_steps):
      state, metrics = trainer.p_train_step(state, trainer.train_batch(step))
      metrics = {k: float(v[0]) for k, v in metrics.items()}

  def host_work():  # what the loop adds per step on the host: build and place a batch
    for step in range(num_steps):
      jax.block_until_ready(trainer.device_batch(step))

  kinds = {'bare': bare, 'loop': run_loop, 'sync': sync, 'host': host_work}
  args = lambda kind: fresh() if kind in ('bare', 'sync') else ()
  for kind, fn in kinds.items():  # compile and warm up
    fn(*args(kind))
  times = {kind: [] for kind in kinds}
  for _ in range(repeats):
    for kind, fn in kinds.items():
      times[kind].append(_timed(fn, *args(kind)))
  result = {'shape': _shape(config, trainer), 'data': data, 'steps': num_steps,
            'repeats': repeats}
  for kind, values in times.items():
    result[f'{kind}_steps_per_s'] = num_steps / statistics.median(w for w, _ in values)
    result[f'{kind}_cpu_s_per_step'] = statistics.median(c for _, c in values) / num_steps
  # Load-independent bound: even with no overlap at all, the loop's extra host work per
  # step costs this fraction of a step.
  result['host_work_over_step'] = result['bare_steps_per_s'] / result['host_steps_per_s']
  result['loop_over_bare'] = result['loop_steps_per_s'] / result['bare_steps_per_s']
  result['sync_over_bare'] = result['sync_steps_per_s'] / result['bare_steps_per_s']
  return result


def _shape(config, trainer) -> str:
  batch = trainer.dataset.train_batch(0)['inputs']
  return (f'B{config.train.batch_size} T{batch.shape[1]} I{batch.shape[2]} '
          f'H{config.model.hidden_size} {config.model.variant}')


_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


def population_share(repeats: int) -> dict:
  """The quickstart's 300-step runs (lstm, then bn_lstm, `repeats` times), the estimate's
  share, and the time XLA spent compiling (`jax.monitoring`'s backend compile events,
  every program of the run: steps, estimate, evaluation). Each run starts with empty
  compilation caches, as a fresh process would; the ratios are of the per-variant
  medians, and each repeat's own ratio is listed too (one pair of runs moves by 10 %
  here)."""
  spent = {'s': 0.0, 'compile_s': 0.0}

  def on_event(event, duration, **kwargs):
    del kwargs
    if event == _COMPILE_EVENT:
      spent['compile_s'] += duration

  jax.monitoring.register_event_duration_secs_listener(on_event)
  original = loop.Trainer.population_stats

  def timed(self, state, kind=None):
    t0 = time.perf_counter()
    stats = jax.block_until_ready(original(self, state, kind))
    spent['s'] += time.perf_counter() - t0
    return stats

  loop.Trainer.population_stats = timed
  runs = {'lstm': [], 'bn_lstm': []}
  try:
    for _ in range(repeats):
      for variant, variant_runs in runs.items():
        config = quickstart_config.get_config()
        config.model.variant = variant
        jax.clear_caches()
        spent['s'] = spent['compile_s'] = 0.0
        with tempfile.TemporaryDirectory() as workdir:
          wall, cpu = _timed(lambda: loop.train_and_evaluate(config, workdir))
        variant_runs.append({'wall_s': wall, 'cpu_s': cpu, 'population_s': spent['s'],
                             'compile_s': spent['compile_s']})
  finally:
    loop.Trainer.population_stats = original
  result = {variant: {key: statistics.median(r[key] for r in variant_runs)
                      for key in variant_runs[0]} for variant, variant_runs in runs.items()}
  bn, lstm = result['bn_lstm'], result['lstm']
  result['repeats'] = repeats
  result['runs'] = runs
  result['bn_lstm_over_lstm_per_repeat'] = [
      b['wall_s'] / l['wall_s'] for b, l in zip(runs['bn_lstm'], runs['lstm'])]
  result['bn_lstm_population_share'] = bn['population_s'] / bn['wall_s']
  result['bn_lstm_over_lstm'] = bn['wall_s'] / lstm['wall_s']
  result['bn_lstm_over_lstm_without_population'] = (
      (bn['wall_s'] - bn['population_s']) / lstm['wall_s'])
  result['bn_lstm_over_lstm_without_compile'] = (
      (bn['wall_s'] - bn['compile_s']) / (lstm['wall_s'] - lstm['compile_s']))
  result['evaluations'] = config.train.num_steps // config.eval.every
  result['population_batches'] = config.eval.population_batches
  return result


def format_report(saved: dict) -> str:
  """The tables of a results JSON: steps/s per shape, and the quickstart's end-to-end
  timing when it was measured."""
  lines = [f'{"shape":34s} {"bare steps/s":>12s} {"loop steps/s":>12s} {"loop/bare":>9s} '
           f'{"sync/bare":>9s} {"host/step":>9s}']
  for r in saved['shapes']:
    lines.append(f'{r["shape"]:34s} {r["bare_steps_per_s"]:12.2f} {r["loop_steps_per_s"]:12.2f} '
                 f'{r["loop_over_bare"]:9.3f} {r["sync_over_bare"]:9.3f} '
                 f'{r["host_work_over_step"]:9.4f}')
  p = saved.get('quickstart_population')
  if p:
    per_repeat = ', '.join(f'{r:.2f}' for r in p['bn_lstm_over_lstm_per_repeat'])
    lines.append(
        f'quickstart (300 steps, medians of {p["repeats"]}): lstm {p["lstm"]["wall_s"]:.1f} s, '
        f'bn_lstm {p["bn_lstm"]["wall_s"]:.1f} s ({p["bn_lstm_over_lstm"]:.2f}x; per '
        f'repeat {per_repeat}), of which the '
        f'population estimate {p["bn_lstm"]["population_s"]:.1f} s '
        f'({100 * p["bn_lstm_population_share"]:.0f} %); compilation: lstm '
        f'{p["lstm"]["compile_s"]:.1f} s, bn_lstm {p["bn_lstm"]["compile_s"]:.1f} s '
        f'({p["bn_lstm_over_lstm_without_compile"]:.2f}x without it)')
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps_quickstart', type=int, default=60)
  parser.add_argument('--steps_mnist', type=int, default=8)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--population', action='store_true')
  parser.add_argument('--population_repeats', type=int, default=3,
                      help='Pairs of quickstart runs behind the --population medians.')
  parser.add_argument('--out', default=os.path.join('benchmarks', 'results',
                                                    'trainer_overhead_cpu.json'))
  parser.add_argument('--report', help='Print the tables of this results JSON and exit.')
  args = parser.parse_args()
  if args.report:
    with open(args.report) as f:
      print(format_report(json.load(f)))
    return
  facts = machine_facts.machine()  # the load average before this process adds its own
  rows = [measure('quickstart', args.steps_quickstart, args.repeats),
          measure('mnist', args.steps_mnist, args.repeats)]
  out = {'kind': 'trainer_overhead', 'machine': facts,
         'command': 'python benchmarks/trainer_overhead.py ' +
         ' '.join(sys.argv[1:]), 'shapes': rows}
  if args.population:
    out['quickstart_population'] = population_share(args.population_repeats)
  print(format_report(out))
  with open(args.out, 'w') as f:
    json.dump(out, f, indent=2)
    f.write('\n')


if __name__ == '__main__':
  main()
