r"""The offline GPU compile check: the `bn_lstm` layer's forward+backward compiled for an
H100 by XLA's GPU compiler on a machine without a GPU, per execution form, with what
each time step launches and what each Pallas kernel costs in registers.

Each (form, shape, dtype) of `compile_targets.FORMS` (the GPU ones) is compiled in a
process of its own (a failure or a timeout loses that row only; the JSON is written
after every row) for a compile-only H100 (`compile_targets.h100_device`), with the
GPU's execution policy (traced under `policy.targets('gpu')`; the row records it). Per
row the JSON records the compile time, XLA's memory
analysis, and per while loop of the program (forward, then backward: each runs once per
time step):

  kernels, copies, command_buffers   what one iteration launches, from XLA's thunk
                                     sequence (`program_facts.thunk_loops`): kernels
                                     (fusions, cuBLAS calls, Pallas kernels; those
                                     inside CUDA graphs too), device-to-device copies
  ops, fusions, matmuls, stashes     the optimised HLO's loop body
                                     (`program_facts.while_loops`)

and per Pallas kernel: registers per thread, stack and spills (`ptxas -v`, through
`logging_ptxas.sh`), threads, shared memory and grid (the thunk's launch).

It needs the GPU machines' own stack, not the project's CPU one: Python 3.12 with
`benchmarks/requirements-gpu-compile.txt` (jax/jaxlib 0.11.2, the CUDA 13 plugin and
the CUDA 13 `ptxas`). `benchmarks/offline_compile.sh gpu OUT.json` makes that
environment and runs this; by hand, in it:

  python benchmarks/gpu_compile.py --json benchmarks/results/gpu_compile_h100.json
  python benchmarks/gpu_compile.py --report benchmarks/results/gpu_compile_h100.json

Exit status 1 if any row failed to compile.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from absl import app
from absl import flags
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import compile_targets  # pylint: disable=g-bad-import-order
from experiments import machine_facts  # pylint: disable=g-bad-import-order
import program_facts  # pylint: disable=g-bad-import-order
import rnn_speed  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

TARGET = 'gpu'
GPU_FORMS = [name for name, form in compile_targets.FORMS.items() if TARGET in form.platforms]
LOGGING_PTXAS = os.path.join(compile_targets.HERE, 'logging_ptxas.sh')

# `--shapes`, `--dtypes`, `--json` and `--report` are rnn_speed.py's flags.
_SHAPES, _DTYPES, _JSON, _REPORT = (rnn_speed._SHAPES, rnn_speed._DTYPES, rnn_speed._JSON,  # pylint: disable=protected-access
                                    rnn_speed._REPORT)  # pylint: disable=protected-access
_FORMS = flags.DEFINE_list('forms', GPU_FORMS, 'Execution forms (compile_targets.FORMS).')
_PTXAS = flags.DEFINE_string('ptxas', None, 'The real ptxas (default: the first on PATH).')
_ROW_TIMEOUT = flags.DEFINE_integer('row_timeout', 900, 'Seconds one row may take (ptxas '
                                    'takes minutes on the persistent kernels).')
_ROW = flags.DEFINE_string('row', None, 'FORM,SHAPE,DTYPE: compile this one row here, into '
                           '--row_dir (what each row\'s own process runs).')
_ROW_DIR = flags.DEFINE_string('row_dir', None, 'Where --row finds its dumps and writes.')


def find_ptxas() -> Optional[str]:
  """A CUDA 13 `ptxas`: the first on PATH, else the toolkit's usual place."""
  return shutil.which('ptxas') or shutil.which('ptxas', path='/usr/local/cuda/bin')


def ptxas_version(ptxas: str) -> str:
  """`ptxas --version`'s release line ('Cuda compilation tools, release 13.0, V13.0.88')."""
  out = subprocess.run([ptxas, '--version'], capture_output=True, text=True, check=False)
  return next((line for line in out.stdout.splitlines() if line.startswith('Cuda')), '')


# ------------------------------------------------------------------ one row, in its process
def compile_row(form: str, shape: str, dtype: str, row_dir: str) -> dict:
  """Compile one row for the compile-only H100 and read what it launches. XLA writes
  its dumps to `row_dir/dump` and the logging ptxas its reports to `row_dir/ptxas`
  (the parent process sets both)."""
  device = compile_targets.h100_device()
  row = {'form': form, 'shape': shape, 'dtype': dtype,
         'policy': compile_targets.resolved_policy(form, shape, TARGET)}
  fn, args = compile_targets.program(form, shape, dtype, TARGET)
  start = time.perf_counter()
  lowered = compile_targets.lower(
      fn, compile_targets.placed(args, jax.sharding.SingleDeviceSharding(device)), TARGET)
  row['lower_s'] = round(time.perf_counter() - start, 2)
  start = time.perf_counter()
  compiled = lowered.compile()
  row['compile_s'] = round(time.perf_counter() - start, 2)
  stats = compiled.memory_analysis()
  row['temp_bytes'] = int(stats.temp_size_in_bytes)
  row['argument_bytes'] = int(stats.argument_size_in_bytes)
  steps = rnn_speed.SHAPES[shape]['time']
  row['hlo_loops'] = program_facts.while_loops(compiled.as_text(), steps)
  thunks = glob.glob(os.path.join(row_dir, 'dump',
                                  f'*.jit_{form}_{shape}_{dtype}.thunk_sequence_after_thunk_passes.txt'))
  if len(thunks) != 1:
    raise RuntimeError(f'expected one thunk sequence in {row_dir}/dump, found {len(thunks)}')
  with open(thunks[0]) as f:
    thunk_text = f.read()
  row['thunk_loops'] = program_facts.thunk_loops(thunk_text)
  reports = ''
  for path in sorted(glob.glob(os.path.join(row_dir, 'ptxas', '*.txt'))):
    with open(path) as f:
      reports += f.read()
  row['pallas_kernels'] = {}
  for name in program_facts.pallas_kernels(lowered.as_text()):
    registers = program_facts.ptxas_report(reports, name)
    launch = program_facts.thunk_launch(thunk_text, name)
    if registers is None or launch is None:
      # A CUDA wheel's ptxas in this environment would be run instead of PATH's.
      raise RuntimeError(f'no ptxas report or no launch of the Pallas kernel {name} (ptxas '
                         f'reports: {len(reports)} characters)')
    row['pallas_kernels'][name] = {**registers, **launch}
  row['ok'] = True
  return row


# ------------------------------------------------------------------ the rows, one process each
def run_row(form: str, shape: str, dtype: str, ptxas: str) -> dict:
  """One row in a process of its own, with its own XLA dump and ptxas logs."""
  with tempfile.TemporaryDirectory() as row_dir:
    cuda = os.path.join(row_dir, 'cuda', 'bin')
    os.makedirs(cuda)
    os.makedirs(os.path.join(row_dir, 'ptxas'))
    shutil.copy(LOGGING_PTXAS, os.path.join(cuda, 'ptxas'))
    # XLA runs the first ptxas on PATH (and looks in its CUDA directory).
    env = {**os.environ, 'PATH': f"{cuda}:{os.environ.get('PATH', '')}",
           'REAL_PTXAS': ptxas, 'PTXAS_LOG_DIR': os.path.join(row_dir, 'ptxas'),
           'JAX_SKIP_CUDA_CONSTRAINTS_CHECK': '1', 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': f"--xla_dump_to={os.path.join(row_dir, 'dump')} "
                        f"--xla_gpu_cuda_data_dir={os.path.dirname(cuda)}"}
    command = [sys.executable, os.path.abspath(__file__), f'--row={form},{shape},{dtype}',
               f'--row_dir={row_dir}']
    row = {'form': form, 'shape': shape, 'dtype': dtype, 'ok': False}
    # Its own session, so that a timeout also stops the ptxas it is waiting for.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
      _, stderr = process.communicate(timeout=_ROW_TIMEOUT.value)
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.communicate()
      return {**row, 'error': f'timed out after {_ROW_TIMEOUT.value} s'}
    result = os.path.join(row_dir, 'row.json')
    if process.returncode == 0 and os.path.exists(result):
      with open(result) as f:
        return json.load(f)
    lines = [l for l in stderr.splitlines() if l.strip()]
    return {**row, 'error': f'exit {process.returncode}: ' + (lines[-1][:500] if lines else '')}


def per_step(row: dict, key: str) -> int:
  """A thunk count of one time step: the forward loop's plus the backward loop's."""
  return sum(loop[key] for loop in row['thunk_loops'])


def format_table(saved: dict) -> str:
  """Markdown: per row, the compile time and what a time step launches and stores; then
  per Pallas kernel, registers, spills, shared memory and grid."""
  lines = ['| shape | form | dtype | compile s | kernels / step (fwd + bwd) | copies / step | '
           'CUDA graphs / step | stashes / step | temp MiB |',
           '|---|---|---|---:|---|---:|---:|---:|---:|']
  kernels = ['| shape | form | dtype | Pallas kernel | registers | spill stores / loads, B | '
             'threads | shared memory, B | grid (of 132 SMs) |',
             '|---|---|---|---|---:|---|---:|---:|---:|']
  for r in saved['rows']:
    label = f"({r['shape']})"
    if not r.get('ok'):
      lines.append(f"| {label} | {r['form']} | {r['dtype']} | failed: {r['error'][:120]} "
                   '| | | | | |')
      continue
    stashes = sum(len(loop['stashes']) for loop in r['hlo_loops'])
    launches = ' + '.join(str(loop['kernels']) for loop in r['thunk_loops']) or (
        'no time loop outside the kernels')
    lines.append(f"| {label} | {r['form']} | {r['dtype']} | {r['compile_s']:.1f} | "
                 f"{per_step(r, 'kernels')} ({launches}) | {per_step(r, 'copies')} | "
                 f"{per_step(r, 'command_buffers')} | {stashes} | "
                 f"{r['temp_bytes'] / 2**20:.0f} |")
    for name, k in r['pallas_kernels'].items():
      kernels.append(f"| {label} | {r['form']} | {r['dtype']} | {name} | {k['registers']} | "
                     f"{k['spill_store_bytes']} / {k['spill_load_bytes']} | {k['threads'][0]} "
                     f"| {k['shared_memory_bytes']} | {k['grid'][0]} |")
  return '\n'.join(lines) + '\n\n' + '\n'.join(kernels)


def main(argv):
  del argv
  if _ROW.value:
    jax.config.update('jax_platforms', 'cpu')
    form, shape, dtype = _ROW.value.split(',')
    row = compile_row(form, shape, dtype, _ROW_DIR.value)
    with open(os.path.join(_ROW_DIR.value, 'row.json'), 'w') as f:
      json.dump(row, f)
    return
  if _REPORT.value:
    with open(_REPORT.value) as f:
      print(format_table(json.load(f)))
    return
  unknown = set(_FORMS.value) - set(GPU_FORMS)
  if unknown:
    raise app.UsageError(f'Unknown GPU forms {sorted(unknown)}; have {", ".join(GPU_FORMS)}.')
  # The host runs on its CPU; the H100 is a compile-only device of the CUDA plugin, which
  # must not look for a GPU (each row's process is told so too).
  jax.config.update('jax_platforms', 'cpu')
  ptxas = _PTXAS.value or find_ptxas()
  if not ptxas:
    sys.exit('gpu_compile: no ptxas on PATH: install the CUDA 13 toolkit, or pass '
             '--ptxas=/path/to/cuda-13/bin/ptxas.')
  saved = {'kind': 'gpu_compile', 'machine': machine_facts.machine(),
           'target': {'device': compile_targets.H100_KIND, 'compute_capability': '9.0',
                      'compile_only': True, 'ptxas': ptxas_version(ptxas),
                      'jax_cuda_plugin': machine_facts._version('jax-cuda13-plugin')},  # pylint: disable=protected-access
           'skipped': [], 'rows': []}

  def write():
    if _JSON.value:
      with open(_JSON.value, 'w') as f:
        json.dump(saved, f, indent=1)

  for form in _FORMS.value:
    reason = compile_targets.form_unavailable(form)
    if reason:
      saved['skipped'].append(reason)
      print(reason, flush=True)
      write()
      continue
    for shape in [s for s in _SHAPES.value if s in compile_targets.FORMS[form].shapes]:
      for dtype in _DTYPES.value:
        row = run_row(form, shape, dtype, ptxas)
        saved['rows'].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != 'hlo_loops'}), flush=True)
        write()
  print(format_table(saved))
  failed = sum(not row['ok'] for row in saved['rows'])
  if failed:
    sys.exit(f'gpu_compile: {failed} of {len(saved["rows"])} rows failed to compile.')


if __name__ == '__main__':
  # Every shape a GPU form is compiled at (each form keeps to its own).
  flags.FLAGS.set_default('shapes', sorted({shape for name in GPU_FORMS
                                            for shape in compile_targets.FORMS[name].shapes}))
  flags.FLAGS.set_default('dtypes', list(compile_targets.DTYPES))
  app.run(main)
