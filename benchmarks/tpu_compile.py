r"""The offline TPU compile check: the `bn_lstm` layer's forward+backward, Flax's LSTM
beside it, and the trainer's train step on four chips, compiled for TPUs by libtpu on a
machine without one.

For each chip of `CHIPS` (a compile-only device of its topology), shape and dtype: the
layer's forms of `compile_targets.FORMS` compiled for TPUs ('default': the TPU's
execution policy; 'cpu_policy': the CPU's, compiled for the TPU beside it;
'remat_none': the TPU's storing every intermediate) and `compile_targets.FLAX`. Then
`TRAIN_CONFIG`'s compiled train step (the trainer's own, mapped over the four chips of
`TRAIN_TOPOLOGY` with its data-parallel axis: the cross-device batch moments are
compiled for TPU too). Per row the JSON records the compile time, `memory_analysis()`
(bytes; temporaries are those in HBM) and, per while loop of the optimised HLO
(forward, then backward; each runs once per time step), `program_facts.while_loops`:
ops, fusions, matmuls, all-reduces and the stashes a step writes, with their memory
space (HBM, or S(1): on-chip). `cost_analysis()` is not used: it does not count loops.
Every row is isolated (a failure is recorded, the rest go on) and the JSON is written
after each.

Nothing here is timed on a TPU: compiling proves the programs build for the chip, with
the memory and per-step work XLA plans; not their speed.

  benchmarks/offline_compile.sh tpu benchmarks/results/tpu_compile.json  # installs libtpu
  python benchmarks/tpu_compile.py --report benchmarks/results/tpu_compile.json

Run by hand with libtpu importable and `JAX_PLATFORMS=cpu`. Exit status 1 if any row
failed to compile.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
import compile_targets  # pylint: disable=g-bad-import-order
from experiments import machine_facts  # pylint: disable=g-bad-import-order
import program_facts  # pylint: disable=g-bad-import-order
import rnn_speed  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

TARGET = 'tpu'
#: Chip name -> the topology whose first device the layer rows compile for.
CHIPS = {'v5e': 'v5e:2x2', 'v6e': 'v6e:2x2'}
TPU_PROGRAMS = [name for name, form in compile_targets.FORMS.items()
                if TARGET in form.platforms] + [compile_targets.FLAX]
#: The train step's paper config (`experiments/configs/`) and its multi-chip topology.
TRAIN_CONFIG = 'seq_mnist'
TRAIN_TOPOLOGY = 'v5e:2x2'

# `--shapes`, `--dtypes`, `--json` and `--report` are rnn_speed.py's flags.
_SHAPES, _DTYPES, _JSON, _REPORT = (rnn_speed._SHAPES, rnn_speed._DTYPES, rnn_speed._JSON,  # pylint: disable=protected-access
                                    rnn_speed._REPORT)  # pylint: disable=protected-access
_CHIPS = flags.DEFINE_list('chips', list(CHIPS), f'TPU chips: {", ".join(CHIPS)}.')
_PROGRAMS = flags.DEFINE_list('programs', TPU_PROGRAMS, 'Layer forms and Flax\'s LSTM.')
_TRAIN_STEP = flags.DEFINE_bool('train_step', True, f'Also compile {TRAIN_CONFIG}\'s train '
                                f'step on {TRAIN_TOPOLOGY}.')


def compiled_facts(lowered, steps: int) -> dict:
  """Compile time, `memory_analysis()` and the per-step facts of each while loop."""
  start = time.perf_counter()
  compiled = lowered.compile()
  seconds = time.perf_counter() - start
  stats = compiled.memory_analysis()
  return {'compile_s': round(seconds, 2),
          'memory': {key: int(getattr(stats, f'{key}_size_in_bytes'))
                     for key in ('temp', 'argument', 'output', 'alias', 'generated_code')},
          'loops': program_facts.while_loops(compiled.as_text(), steps)}


def layer_row(chip: str, program: str, shape: str, dtype: str) -> dict:
  """One program at one shape and dtype, compiled for the first device of `chip`."""
  device = compile_targets.tpu_devices(CHIPS[chip])[0]
  row = {'chip': chip, 'device_kind': device.device_kind, 'program': program,
         'shape': shape, 'dtype': dtype}
  if program != compile_targets.FLAX:
    row['policy'] = compile_targets.resolved_policy(program, shape, TARGET)
  fn, args = compile_targets.program(program, shape, dtype, TARGET)
  placed = compile_targets.placed(args, jax.sharding.SingleDeviceSharding(device))
  # Mosaic (Pallas on TPU) looks the default device up while tracing rank-1 blocks.
  with jax.default_device(device):
    lowered = compile_targets.lower(fn, placed, TARGET)
  return {**row, **compiled_facts(lowered, rnn_speed.SHAPES[shape]['time'])}


def train_step_row() -> dict:
  """`TRAIN_CONFIG`'s train step as the trainer maps it, compiled for `TRAIN_TOPOLOGY`:
  its device-mapped step (`trainer._device_steps`), given abstract per-device copies of a
  real initial state and batch (the config's shapes; MNIST's images are not read)."""
  # pylint: disable=g-import-not-at-top
  import importlib
  from bn_rnn_jax.input_pipeline import mnist
  from bn_rnn_jax.training import tasks
  from bn_rnn_jax.training import train
  from bn_rnn_jax.training import trainer
  # pylint: enable=g-import-not-at-top
  config = importlib.import_module(f'experiments.configs.{TRAIN_CONFIG}').get_config()
  devices = compile_targets.tpu_devices(TRAIN_TOPOLOGY)
  steps = config.data.resolution ** 2
  examples = lambda n: (np.zeros((n, steps, 1), np.float32), np.zeros((n,), np.int32))
  dataset = mnist.SequenceDataset(
      {'train': examples(config.train.batch_size), 'valid': examples(1),
       'test': examples(1)}, seed=config.seed, batch_size=config.train.batch_size,
      eval_batch_size=config.eval.batch_size)
  model = train.create_model(config, dataset)
  task = tasks.get(dataset.task)
  with br.policy.targets(TARGET):
    mapped = trainer._device_steps(  # pylint: disable=protected-access
        model, task, config.optimizer.to_json(), dataset.steps_per_epoch,
        dataset.carries_state, tuple(devices), config.parallel.backend, True)
    state = train.create_train_state(config, model, task, mapped.tx, dataset, len(devices))
    batch = trainer.parallel.shard(dataset.train_batch(0), len(devices))
    per_device = lambda tree, replicate: jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(((len(devices),) if replicate else ())
                                       + np.shape(a), np.asarray(a).dtype), tree)
    row = {'chip': TRAIN_TOPOLOGY.split(':')[0], 'topology': TRAIN_TOPOLOGY,
           'devices': len(devices), 'device_kind': devices[0].device_kind,
           'program': f'train_step:{TRAIN_CONFIG}', 'config': TRAIN_CONFIG,
           'backend': config.parallel.backend, 'global_batch': config.train.batch_size,
           'hidden': config.model.hidden_size, 'steps': steps, 'dtype': config.model.dtype}
    lowered = mapped.train.lower(per_device(state, True), per_device(batch, False))
  text = lowered.as_text()
  row['cross_device_sums'] = text.count('all_reduce') + text.count('all-reduce')
  return {**row, **compiled_facts(lowered, steps)}


def run_row(build, *args) -> dict:
  """`build(*args)`, or the row's error in one line."""
  try:
    return {**build(*args), 'ok': True}
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    first = (str(e).strip().splitlines() or [''])[0][:500]
    return {'program': '/'.join(map(str, args)) or build.__name__, 'ok': False,
            'error': f'{type(e).__name__}: {first}'}


def _stash_text(loops: list[dict]) -> str:
  """'13 HBM + 3 S(1)': the stashes a step writes, by memory space."""
  spaces = {}
  for loop in loops:
    for stash in loop['stashes']:
      spaces[stash['memory']] = spaces.get(stash['memory'], 0) + 1
  return ' + '.join(f'{n} {space}' for space, n in sorted(spaces.items())) or '0'


def format_table(saved: dict) -> str:
  """Markdown: per compiled program, the compile time, temporaries in HBM and per time
  step (forward + backward loop) its ops, fusions, matmuls, cross-device sums and
  stashes."""
  lines = ['| chip | program | shape | dtype | compile s | temp MiB (HBM) | ops / step '
           '(fwd + bwd) | fusions / step | matmuls / step | all-reduces / step | '
           'stashes / step |',
           '|---|---|---|---|---:|---:|---|---|---|---|---|']
  for r in saved['rows']:
    if not r.get('ok'):
      lines.append(f"| | {r['program']} | | | failed: {r['error'][:120]} | | | | | | |")
      continue
    shape = f"({r['shape']})" if 'shape' in r else (
        f"{r['devices']} chips, B{r['global_batch']} T{r['steps']} H{r['hidden']}")
    per_loop = lambda key: ' + '.join(str(loop[key]) for loop in r['loops'])
    lines.append(f"| {r['chip']} | {r['program']} | {shape} | {r['dtype']} | "
                 f"{r['compile_s']:.1f} | {r['memory']['temp'] / 2**20:.0f} | "
                 f"{per_loop('ops')} | {per_loop('fusions')} | {per_loop('matmuls')} | "
                 f"{per_loop('all_reduces')} | {_stash_text(r['loops'])} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  if _REPORT.value:
    with open(_REPORT.value) as f:
      print(format_table(json.load(f)))
    return
  unknown = (set(_CHIPS.value) - set(CHIPS)) | (set(_PROGRAMS.value) - set(TPU_PROGRAMS))
  if unknown:
    raise app.UsageError(f'Unknown chips or programs {sorted(unknown)}; chips: '
                         f'{", ".join(CHIPS)}, programs: {", ".join(TPU_PROGRAMS)}.')
  saved = {'kind': 'tpu_compile', 'machine': machine_facts.machine(),
           'libtpu': machine_facts._version('libtpu'),  # pylint: disable=protected-access
           'skipped': [], 'rows': []}

  def record(row):
    saved['rows'].append(row)
    print(json.dumps({k: v for k, v in row.items() if k != 'loops'}), flush=True)
    if _JSON.value:
      with open(_JSON.value, 'w') as f:
        json.dump(saved, f, indent=1)

  for program in _PROGRAMS.value:
    reason = program != compile_targets.FLAX and compile_targets.form_unavailable(program)
    if reason:
      saved['skipped'].append(reason)
      print(reason, flush=True)
      continue
    shapes = compile_targets.SHAPES if program == compile_targets.FLAX else (
        compile_targets.FORMS[program].shapes)
    for chip in _CHIPS.value:
      for shape in [s for s in _SHAPES.value if s in shapes]:
        for dtype in _DTYPES.value:
          record(run_row(layer_row, chip, program, shape, dtype))
  if _TRAIN_STEP.value:
    record(run_row(train_step_row))
  print(format_table(saved))
  failed = sum(not row['ok'] for row in saved['rows'])
  if failed:
    sys.exit(f'tpu_compile: {failed} of {len(saved["rows"])} rows failed to compile.')


if __name__ == '__main__':
  flags.FLAGS.set_default('shapes', list(compile_targets.SHAPES))
  flags.FLAGS.set_default('dtypes', list(compile_targets.DTYPES))
  app.run(main)
