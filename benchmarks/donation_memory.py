r"""Device memory of the training step with its state donated and not
(`config.train.donate_state`).

  python benchmarks/donation_memory.py [--hidden 1000] [--length 100] [--batch 64]
      [--steps 3] [--backend pmap] [--measure auto] [--quick] [--out PATH]
  python benchmarks/donation_memory.py --report benchmarks/results/donation_memory_cpu.json

The model: character-level PTB's BN-LSTM (`experiments/configs/ptb_char.py`: 1000 units
on one-hot characters of 50 symbols, Adam, batches of 64 rows of 100 characters) on one
device, trained on random characters (no data files). For each arm, donation off and on:

  compiled  XLA's memory analysis of the trainer's compiled step
            (`p_train_step.lower(state, batch).compile().memory_analysis()`): bytes of
            its arguments (state and batch), its outputs (new state and metrics), the
            outputs written into donated arguments (alias) and its temporaries. The peak
            they imply, argument + output - alias + temp, is what the step holds while it
            runs. `xla peak` is XLA's own `peak_memory_in_bytes` (on the CPU it leaves
            the temporaries out). Also whether one step deleted the state it was given.
  measured  where the device keeps memory statistics (GPUs; not the CPU, where these are
            None), `memory_stats()['peak_bytes_in_use']` of device 0 after `--steps`
            steps, each arm and kind in a process of its own (the peak only grows):
              steps  bare steps, the state threaded through (no copy kept);
              loop   the training loop (`loop._Run`: metrics fetched after every step, so
                     the checked copy is made at every step; no evaluation, no writes).
            Each also gives the peak after placing the state (`setup`). The step is
            compiled in this process first, and the measuring processes read it from a
            persistent compilation cache, so the compiler's own scratch memory (GPU
            autotuning) is not in their peaks. `--measure always` runs them on any device
            (the plumbing, with None peaks on the CPU), `never` skips them.

docs/speed.md quotes the CPU's and a GPU's results and what they say.

`--quick` runs a 64-unit model on rows of 20 characters, two steps: a check of the
script (under a minute on 2 CPU cores), not numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from experiments import machine_facts
from experiments.configs import ptb_char
import trainer_overhead
# pylint: enable=wrong-import-position

ARMS = {'off': False, 'on': True}
KINDS = ('steps', 'loop')
QUICK = {'hidden': 64, 'length': 20, 'batch': 16, 'steps': 2}
_SYMBOLS = 50  # character-level PTB's symbol table
_CACHE_ENV = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
              'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}


def make_config(args, donate: bool):
  """ptb_char.py's BN-LSTM at the benchmark's size, on one device, `donate` set."""
  config = ptb_char.get_config('bn_lstm')
  config.model.hidden_size = args.hidden
  config.data.seq_length = config.model.max_length = args.length
  config.train.batch_size = config.eval.batch_size = args.batch
  config.train.num_devices = 1
  config.train.num_steps = args.steps
  config.train.log_every = 1          # the loop fetches (and copies) after every step
  config.eval.every = config.checkpoint.every = args.steps
  config.eval.splits = ()             # the loop alone: no evaluation
  config.eval.test_at_end = False
  config.parallel.backend = args.backend
  config.train.donate_state = donate
  return config


def synthetic_dataset(config):
  """Random characters over 50 symbols, cut as character-level PTB is: eight batches."""
  rng = np.random.default_rng(config.seed)
  size = 8 * config.train.batch_size * config.data.seq_length + 1
  splits = {split: rng.integers(0, _SYMBOLS, size).astype(np.int32)
            for split in ('train', 'valid', 'test')}
  vocab = [chr(ord('!') + i) for i in range(_SYMBOLS)]
  return text.LanguageModelDataset(
      'ptb_char', vocab, splits, batch_size=config.train.batch_size,
      seq_length=config.data.seq_length, seed=config.seed,
      eval_batch_size=config.eval.batch_size)


def make_trainer(args, donate: bool) -> loop.Trainer:
  config = make_config(args, donate)
  return loop.Trainer(config, None, synthetic_dataset(config))


def tree_bytes(tree) -> int:
  return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


def compiled_memory(trainer: loop.Trainer) -> dict:
  """XLA's memory analysis of `trainer`'s step, and whether a step deletes its input."""
  state = trainer.to_devices(trainer.initial_state())
  batch = trainer.device_batch(0)
  stats = trainer.p_train_step.lower(state, batch).compile().memory_analysis()
  out = {name: int(getattr(stats, f'{name}_size_in_bytes'))
         for name in ('argument', 'output', 'alias', 'temp', 'generated_code')}
  out['implied_peak'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  out['xla_peak'] = int(getattr(stats, 'peak_memory_in_bytes', -1))
  first = jax.tree.leaves(state)
  new_state, _ = trainer.p_train_step(state, batch)
  jax.block_until_ready(new_state)
  return {'compiled': out, 'input_deleted': all(x.is_deleted() for x in first)}


def _peak():
  """Device 0's peak bytes in use, or None where the backend keeps no statistics."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else int(stats.get('peak_bytes_in_use', 0))


def measure_in_process(args, donate: bool, kind: str) -> dict:
  """The peaks of one arm and kind (run in a process of its own: the peak only grows)."""
  trainer = make_trainer(args, donate)
  host_state = trainer.initial_state()
  if kind == 'steps':
    state = trainer.to_devices(host_state)
    batches = [trainer.device_batch(step) for step in range(args.steps)]
    setup = _peak()
    for batch in batches:
      state, metrics = trainer.p_train_step(state, batch)
    jax.block_until_ready((state, metrics))
    return {'setup': setup, 'peak': _peak()}
  trainer.initial_state = lambda: host_state  # built once, as the loop would
  with tempfile.TemporaryDirectory() as workdir:
    writer = metric_writer.MetricWriter(workdir, enabled=False)
    run = loop._Run(trainer, writer, trainer_overhead._NoCheckpoints())  # pylint: disable=protected-access
    setup = _peak()
    run.run()
    jax.block_until_ready(run.state)
  return {'setup': setup, 'peak': _peak()}


def _sizes(args) -> list[str]:
  return [f'--hidden={args.hidden}', f'--length={args.length}', f'--batch={args.batch}',
          f'--steps={args.steps}', f'--backend={args.backend}']


def measure_in_subprocess(args, arm: str, kind: str, cache: str) -> dict:
  """`measure_in_process` in a fresh process that reads the compiled step from `cache`."""
  env = {**os.environ, **_CACHE_ENV, 'JAX_COMPILATION_CACHE_DIR': cache}
  command = [sys.executable, os.path.abspath(__file__), *_sizes(args), f'--arm={arm}',
             f'--kind={kind}']
  result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f'{" ".join(command[1:])} failed:\n{result.stderr[-3000:]}')
  return json.loads(result.stdout.strip().splitlines()[-1])


def _use_cache(cache: str) -> None:
  """Write this process's compilations to `cache` (the measuring processes read them)."""
  jax.config.update('jax_compilation_cache_dir', cache)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


def measure(args) -> dict:
  """The results JSON (without the machine): both arms' compiled and measured memory."""
  measured = args.measure == 'always' or (
      args.measure == 'auto' and _peak() is not None)
  with tempfile.TemporaryDirectory() as cache:
    if measured:
      _use_cache(cache)
    arms = {}
    for arm, donate in ARMS.items():
      trainer = make_trainer(args, donate)
      arms[arm] = compiled_memory(trainer)
      arms[arm]['measured'] = ({kind: measure_in_subprocess(args, arm, kind, cache)
                                for kind in KINDS} if measured else None)
    state_bytes = tree_bytes(trainer.initial_state())  # compiled while the cache exists
  return {'config': {'variant': 'bn_lstm', 'optimizer': 'adam', 'hidden': args.hidden,
                     'length': args.length, 'batch': args.batch, 'steps': args.steps,
                     'backend': args.backend, 'devices': 1, 'data': 'random characters'},
          'state_bytes': state_bytes,
          'batch_bytes': tree_bytes(trainer.dataset.train_batch(0)),
          'arms': arms}


def _mb(value) -> str:
  return 'n/a' if value is None else f'{value / 1e6:.2f}'


def format_report(saved: dict) -> str:
  """The table of a results JSON: compiled memory per arm (MB), and the measured peaks."""
  c, machine = saved['config'], saved.get('machine', {})
  lines = [f'B{c["batch"]} T{c["length"]} H{c["hidden"]} {c["variant"]} ({c["optimizer"]}), '
           f'one {machine.get("device_kind", "?")} device, {c["backend"]}; state '
           f'{_mb(saved["state_bytes"])} MB, batch {_mb(saved["batch_bytes"])} MB',
           f'{"donate":6s} {"argument":>9s} {"output":>9s} {"alias":>9s} {"temp":>9s} '
           f'{"peak":>9s} {"xla peak":>9s}  input deleted']
  for arm, r in saved['arms'].items():
    m = r['compiled']
    lines.append(f'{arm:6s} {_mb(m["argument"]):>9s} {_mb(m["output"]):>9s} '
                 f'{_mb(m["alias"]):>9s} {_mb(m["temp"]):>9s} {_mb(m["implied_peak"]):>9s} '
                 f'{_mb(m["xla_peak"]):>9s}  {"yes" if r["input_deleted"] else "no"}')
  off, on = (saved['arms'][a]['compiled']['implied_peak'] for a in ('off', 'on'))
  lines.append(f'(MB; peak = argument + output - alias + temp) donation changes the '
               f'peak by {_mb(on - off)} MB')
  for arm, r in saved['arms'].items():
    if r['measured'] is None:
      lines.append(f'{arm:6s} measured peak: not measured (no memory statistics here)')
      continue
    parts = [f'{kind} {_mb(v["peak"])} MB (setup {_mb(v["setup"])})'
             for kind, v in r['measured'].items()]
    lines.append(f'{arm:6s} measured peak: ' + ', '.join(parts))
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--hidden', type=int, default=1000)
  parser.add_argument('--length', type=int, default=100)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--backend', default='pmap', choices=('pmap', 'shard_map'))
  parser.add_argument('--measure', default='auto', choices=('auto', 'always', 'never'),
                      help='Measure peaks in subprocesses: auto = where the device keeps '
                      'memory statistics.')
  parser.add_argument('--quick', action='store_true', help=f'A check of the script: {QUICK}.')
  parser.add_argument('--out', help='Write the results JSON here.')
  parser.add_argument('--report', help='Print the table of this results JSON and exit.')
  parser.add_argument('--arm', choices=tuple(ARMS), help=argparse.SUPPRESS)
  parser.add_argument('--kind', choices=KINDS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.report:
    with open(args.report) as f:
      print(format_report(json.load(f)))
    return
  if args.quick:
    for name, value in QUICK.items():
      setattr(args, name, value)
  if args.arm:  # a measuring process: one JSON line
    print(json.dumps(measure_in_process(args, ARMS[args.arm], args.kind)))
    return
  facts = machine_facts.machine()
  out = {'kind': 'donation_memory', 'machine': facts,
         'command': 'python benchmarks/donation_memory.py ' +
         ' '.join(sys.argv[1:]), **measure(args)}
  print(format_report(out))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(out, f, indent=2)
      f.write('\n')


if __name__ == '__main__':
  main()
