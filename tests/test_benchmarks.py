"""The benchmarks: rnn_speed.py's products-only floor and cuDNN path against NumPy
float64 versions, its rows per dtype, skip lines and isolated failures, the GPU
canary's comparison, launch_profile.py's summary of a
kernel timeline, the machine facts every result records, donation_memory.py's saved
results and quick mode, and accelerator_check.sh's first stage run end to end."""

import json
import os
import subprocess
import sys

import jax
from jax.experimental import rnn
import numpy as np
import pytest

from experiments import machine_facts
import helpers

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          'benchmarks')
sys.path.insert(0, BENCHMARKS)
# pylint: disable=g-import-not-at-top,wrong-import-position
import check_cost
import cudnn_lstm
import donation_memory
import environment
import evaluation_statistics
import fused_canary
import launch_profile
import program_facts
import rnn_speed
# pylint: enable=g-import-not-at-top,wrong-import-position


def numpy_products_only(x, w_x, w_h):
  """Float64: forward z_t = x_t W_x + h_t W_h, h_{t+1} = z_t[:, :H]; backward
  dz_t = [dh, z_t[:, H:]], dh <- dz_t W_h^T, weight gradients summed over t."""
  hidden = w_h.shape[0]
  h = np.zeros((x.shape[0], hidden))
  hs, zs = [], []
  for t in range(x.shape[1]):
    z = x[:, t] @ w_x + h @ w_h
    hs.append(h)
    zs.append(z)
    h = z[:, :hidden]
  dh = np.zeros_like(h)
  dw_x, dw_h = np.zeros_like(w_x), np.zeros_like(w_h)
  for t in reversed(range(x.shape[1])):
    dz = np.concatenate([dh, zs[t][:, hidden:]], axis=1)
    dw_x += x[:, t].T @ dz
    dw_h += hs[t].T @ dz
    dh = dz @ w_h.T
  return dw_x, dw_h


@pytest.mark.parametrize('backward', ['scan', 'layer'])
def test_products_only_matches_numpy_float64(backward):
  shape = dict(batch=3, time=5, features=2, hidden=4, bidirectional=False, padding=0.0)
  (w_x, w_h), = rnn_speed._products_only_kernels(jax.random.key(1), shape)  # pylint: disable=protected-access
  x = np.asarray(jax.random.normal(jax.random.key(0), (3, 5, 2)))
  got = rnn_speed.products_only(x, (w_x, w_h), backward)
  want = numpy_products_only(x.astype(np.float64), np.asarray(w_x, np.float64),
                             np.asarray(w_h, np.float64))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


def test_products_only_recurrent_kernel_keeps_h_norm():
  shape = dict(batch=2, time=3, features=2, hidden=6, bidirectional=True, padding=0.0)
  kernels = rnn_speed._products_only_kernels(jax.random.key(1), shape)  # pylint: disable=protected-access
  assert len(kernels) == 2
  for _, w_h in kernels:
    block = np.asarray(w_h)[:, :6]
    np.testing.assert_allclose(block.T @ block, np.eye(6), atol=1e-5)


# ----------------------------------------------------------------------------- cuDNN's LSTM


@pytest.mark.parametrize('inputs,hidden,bidirectional', [(1, 100, False), (240, 240, True),
                                                         (3, 5, True)])
def test_cudnn_weight_count_and_layout(inputs, hidden, bidirectional):
  """Per direction W_ih [4H, I], W_hh [4H, H], b_ih and b_hh [4H], in one flat vector."""
  count = cudnn_lstm.num_params(inputs, hidden, bidirectional)
  assert count == rnn.get_num_params_in_lstm(inputs, hidden, 1, bidirectional)
  weights = cudnn_lstm.init_weights(jax.random.key(0), inputs, hidden, bidirectional)
  assert weights.shape == (count,)
  w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(weights, inputs, hidden, 1, bidirectional)
  directions = 2 if bidirectional else 1
  for d in range(directions):
    assert w_ih[d].shape == (4 * hidden, inputs) and w_hh[d].shape == (4 * hidden, hidden)
    assert b_ih[d].shape == b_hh[d].shape == (4 * hidden,)


def numpy_cudnn_lstm(x, weights, lengths, hidden, bidirectional):
  """Float64 LSTM of cuDNN's layout: gates (i, f, g, o), two biases; the reverse direction
  runs each sequence backwards from its last valid step; zeros past each length."""
  batch, length, inputs = x.shape
  w = np.asarray(weights, np.float64)
  gates = 4 * hidden
  directions = 2 if bidirectional else 1
  matrices = gates * (inputs + hidden)
  kernels = [(w[d * matrices:d * matrices + gates * inputs].reshape(gates, inputs),
              w[d * matrices + gates * inputs:(d + 1) * matrices].reshape(gates, hidden))
             for d in range(directions)]
  biases = w[directions * matrices:].reshape(directions, 2, gates)
  sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
  out = np.zeros((batch, length, directions * hidden))
  for d, (w_ih, w_hh) in enumerate(kernels):
    for b in range(batch):
      h, c = np.zeros(hidden), np.zeros(hidden)
      steps = range(lengths[b]) if d == 0 else reversed(range(lengths[b]))
      for t in steps:
        z = w_ih @ x[b, t] + w_hh @ h + biases[d, 0] + biases[d, 1]
        i, f, g, o = np.split(z, 4)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        out[b, t, d * hidden:(d + 1) * hidden] = h
  return out


@pytest.mark.parametrize('bidirectional', [False, True])
def test_cudnn_reference_path_matches_numpy(bidirectional):
  """The check the cuDNN row runs against (`rnn.lstm_ref` on our flat weights and
  lengths) computes cuDNN's LSTM: against a float64 NumPy loop, uneven lengths."""
  x = np.asarray(jax.random.normal(jax.random.key(2), (3, 6, 2)))
  lengths = np.array([6, 2, 4], np.int32)
  weights = cudnn_lstm.init_weights(jax.random.key(3), 2, 5, bidirectional)
  got = cudnn_lstm.reference_outputs(x, weights, lengths, 5, bidirectional)
  want = numpy_cudnn_lstm(x.astype(np.float64), weights, lengths, 5, bidirectional)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_cudnn_row_is_skipped_with_one_line_without_cudnn():
  if jax.default_backend() == 'gpu':
    pytest.skip('this backend may have cuDNN')
  reason = cudnn_lstm.unavailable_reason()
  assert reason == f"cudnn_lstm: skipped, the '{jax.default_backend()}' backend has no cuDNN."
  assert '\n' not in reason


# ----------------------------------------------------------------------------- rnn_speed rows

TINY = dict(batch=4, time=3, features=2, hidden=8, bidirectional=False, padding=0.0)


@pytest.mark.exhaustive
def test_rows_for_each_dtype_and_skipped_lines(monkeypatch):
  """Every implementation that runs here gets a row per dtype (ratios within a dtype);
  the rest one line each."""
  monkeypatch.setitem(rnn_speed.SHAPES, 't', TINY)
  impls = ['flax_optimized_lstm', 'cudnn_lstm', 'products_only:scan', 'lstm', 'bn_lstm']
  rows, skipped = rnn_speed.run(['t'], impls, 1, ['float32', 'bfloat16'])
  ran = {(r['impl'], r['dtype']) for r in rows}
  ours = {(i, d) for i in ('flax_optimized_lstm', 'lstm', 'bn_lstm')
          for d in ('float32', 'bfloat16')}
  assert ours | {('products_only:scan', 'float32')} <= ran
  assert ('products_only:scan', 'bfloat16') not in ran
  assert 'products_only:scan bfloat16: skipped, it runs float32 only.' in skipped
  if jax.default_backend() != 'gpu':
    assert not any(r['impl'] == 'cudnn_lstm' for r in rows)
    assert cudnn_lstm.unavailable_reason() in skipped
  for r in rows:
    # At least the outputs [B, T, H] are live at the peak; a time was taken.
    itemsize = 2 if r['dtype'] == 'bfloat16' else 4
    assert r['peak_bytes'] >= TINY['batch'] * TINY['time'] * TINY['hidden'] * itemsize, r
    assert 0 < r['ms'] < 60_000 and r['repeats'] == 1, r
  table = rnn_speed.format_table(rows)
  assert table.count('| (t) B4 T3 I2 H8 |') == len(rows)
  flax_bf16 = next(line for line in table.splitlines()
                   if '| flax_optimized_lstm | bfloat16 |' in line)
  assert flax_bf16.split('|')[5].strip() == '1.00'   # its own reference in bfloat16


def test_a_failing_row_loses_only_itself(monkeypatch):
  """A row that fails to build is one line of `skipped`; the others are timed, and every
  repetition round hands the rows so far to `on_update` (what a stopped run keeps)."""
  monkeypatch.setitem(rnn_speed.SHAPES, 't', TINY)
  build = rnn_speed._build  # pylint: disable=protected-access

  def failing(impl, *args):
    if impl == 'bn_lstm':
      raise RuntimeError('no kernel\nsecond line')
    return build(impl, *args)
  monkeypatch.setattr(rnn_speed, '_build', failing)
  updates = []
  rows, skipped = rnn_speed.run(['t'], ['lstm', 'bn_lstm'], 2, on_update=lambda r, s: (
      updates.append([row['repeats'] for row in r])))
  assert [r['impl'] for r in rows] == ['lstm'] and rows[0]['repeats'] == 2
  assert skipped == ['bn_lstm float32 at (t): failed, RuntimeError: no kernel']
  assert updates == [[], [1], [2]]


def test_canary_compares_every_value():
  """The canary's distance: the worst of every value's largest difference over its
  largest entry, infinite where a value is not finite; a sweep entry's settings."""
  want = {'loss': np.float32(2.0), 'grads': np.array([10.0, -1.0])}
  got = {'loss': np.float32(2.002), 'grads': np.array([10.0, -1.5])}
  assert fused_canary.max_rel_diff(want, got) == pytest.approx(0.05)
  assert fused_canary.max_rel_diff(want, {**got, 'loss': np.float32(np.nan)}) == np.inf
  assert fused_canary.config_settings('8x4') == {'block_h': 8, 'num_warps': 4}
  assert fused_canary.config_settings('default') == {}


def test_only_pallas_forms_the_canary_passed_are_timed(tmp_path):
  """With the canary's JSON, a Pallas form that failed it at its default settings, or that
  it did not check, has no timing row, one line each; a failure in another sweep entry
  does not count against the default settings that are timed."""
  path = tmp_path / 'canary.json'
  assert rnn_speed.canary_verdicts(str(path)) == {}   # the canary wrote nothing
  pallas, persistent = (fused_canary.rnn_speed_impl(form) for form in ('fused_pallas',
                                                                       'persistent'))
  assert {pallas, persistent} <= set(rnn_speed.FUSED)
  rows = [{'form': 'fused_xla', 'ok': True},
          {'form': 'fused_pallas', 'config': 'default', 'impl': pallas, 'ok': True},
          {'form': 'fused_pallas', 'config': '32x4', 'impl': pallas, 'ok': False},
          {'form': 'persistent', 'config': 'default', 'impl': persistent, 'ok': True},
          {'form': 'persistent', 'config': 'default', 'impl': persistent, 'ok': False}]
  path.write_text(json.dumps({'rows': rows}))
  verdicts = rnn_speed.canary_verdicts(str(path))
  assert verdicts == {pallas: True, persistent: False}
  assert rnn_speed.skip_reason(persistent, 'float32', None, verdicts) == (
      f'{persistent}: skipped, it failed the canary (its outputs or gradients are wrong '
      'here).')
  assert 'the canary did not check it' in rnn_speed.skip_reason(pallas, 'float32', None, {})
  assert rnn_speed.skip_reason('bn_lstm', 'float32', None, {}) is None


@pytest.mark.parametrize('bidirectional', helpers.core_cases([False, True], core=[False]))
def test_cell_row_runs_and_updates_its_statistics(monkeypatch, bidirectional):
  """The `br.RNN(BNLSTMCell)` row: a fwd+bwd with batch statistics, timed beside Flax's
  cell, counted with its products; every step's statistics row is recorded."""
  shape = dict(TINY, bidirectional=bidirectional, padding=0.25 if bidirectional else 0.0)
  monkeypatch.setitem(rnn_speed.SHAPES, 't', shape)
  rows, _ = rnn_speed.run(['t'], ['flax_optimized_lstm', rnn_speed.CELL], 1)
  cell, flax_row = (next(r for r in rows if r['impl'] == i)
                    for i in (rnn_speed.CELL, 'flax_optimized_lstm'))
  assert cell['matmul_gflop'] == flax_row['matmul_gflop'] and cell['ms'] > 0
  x, lengths, _ = rnn_speed._inputs(shape)  # pylint: disable=protected-access
  model = rnn_speed.CellLSTM(8, shape['time'], bidirectional)
  variables = model.init(jax.random.key(1), x, lengths)
  _, new = model.apply(variables, x, lengths, mutable=['batch_stats'])
  counts = [leaf for path, leaf in jax.tree.leaves_with_path(new)
            if jax.tree_util.keystr(path).endswith("['count']")]
  # Every step was recorded (each row counts the sequences that reached it).
  assert counts and all(np.all(np.asarray(c) >= 1.0) for c in counts)
  assert rnn_speed.CELL in rnn_speed.format_table(rows)


@pytest.mark.parametrize('impl', helpers.core_cases(
    ['flax_optimized_lstm', 'lstm:scan', 'lstm:layer', 'bn_lstm:scan', 'bn_lstm:layer'],
    core=['bn_lstm:layer']))
def test_bfloat16_rows_run_bfloat16_products(impl):
  """At least the forward input and recurrent products take bfloat16 operands; no
  product of a float32 row does."""
  build = rnn_speed._build  # pylint: disable=protected-access
  bf16 = program_facts.compiled(*build(impl, TINY, 'bfloat16'))
  f32 = program_facts.compiled(*build(impl, TINY, 'float32'))
  assert bf16['dot_operands'].get('bf16', 0) >= 2
  assert 'bf16' not in f32['dot_operands'] and f32['dot_operands']['f32'] >= 4
  assert sum(bf16['dot_operands'].values()) == sum(f32['dot_operands'].values())


@pytest.mark.slow
def test_bfloat16_backward_products_follow_the_backward_pass():
  """Flax's cell and the whole-layer pass run every product of an LSTM in bfloat16; the
  autodiff of the scan runs the three backward ones (dh, dW_h, dW_x) in float32."""
  build = rnn_speed._build  # pylint: disable=protected-access
  dots = {impl: program_facts.compiled(*build(impl, TINY, 'bfloat16'))['dot_operands']
          for impl in ('flax_optimized_lstm', 'lstm:scan', 'lstm:layer')}
  assert dots == {'flax_optimized_lstm': {'bf16': 5}, 'lstm:scan': {'bf16': 2, 'f32': 3},
                  'lstm:layer': {'bf16': 4}}


def test_dot_operand_dtypes_reads_stablehlo():
  text = '\n'.join([
      '%1 = stablehlo.dot_general %0, %a, contracting_dims = [1] x [0] : '
      '(tensor<4x8xbf16>, tensor<8x32xbf16>) -> tensor<4x32xf32>',
      '%2 = stablehlo.dot_general %3, %b, contracting_dims = [0] x [0] : '
      '(tensor<4xf32>, tensor<4x9xf32>) -> tensor<9xf32>',
      '%4 = stablehlo.add %1, %1 : tensor<4x32xf32>'])
  assert program_facts.dot_operand_dtypes(text) == {'bf16': 1, 'f32': 1}


def test_old_results_without_dtype_still_report():
  with open(os.path.join(BENCHMARKS, 'results', 'rnn_speed_cpu.json')) as f:
    saved = json.load(f)
  table = rnn_speed.format_table(saved['results'])
  assert table.count('| float32 |') == len(saved['results'])


def test_machine_facts_name_the_machine_without_paths():
  facts = machine_facts.machine()
  for key in ('processor', 'cores', 'gpus', 'xla_flags', 'versions', 'device_kind',
              'load_average_1_5_15_min', 'matmul_precision'):
    assert key in facts, key
  assert facts['versions']['jax'] == jax.__version__ and facts['versions']['flax']
  assert 'device_kind' not in machine_facts.machine(backend=False)
  text = json.dumps(facts)
  for prefix in ('/tmp/', '/work/', '/root/', '/home/'):
    assert prefix not in text


def test_accelerators_lists_what_nvidia_smi_names(tmp_path, monkeypatch):
  fake = tmp_path / 'nvidia-smi'
  fake.write_text('#!/bin/sh\necho "NVIDIA H200"\necho "NVIDIA H200"\n')
  fake.chmod(0o755)
  monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
  assert machine_facts.accelerators() == ['NVIDIA H200', 'NVIDIA H200']
  fake.write_text('#!/bin/sh\nexit 9\n')  # it does not answer: the driver's files are read
  information = tmp_path / 'information'
  information.write_text('Model: \t NVIDIA H100 80GB HBM3\nIRQ: 0\n')
  monkeypatch.setattr(machine_facts.glob, 'glob', lambda pattern: [str(information)])
  assert machine_facts.accelerators() == ['NVIDIA H100 80GB HBM3']


# ----------------------------------------------------------------------------- the scripts


def test_wheel_list_is_well_formed():
  modules = environment.required_modules()
  assert {'ml_collections==1.1.0', 'kaldiio==2.18.1', 'tensorboardX==2.6.5'} <= set(modules)
  with open(environment.WHEEL_LIST) as f:
    for line in f:
      fields = line.split()
      if fields and not fields[0].startswith('#'):
        assert len(fields) == 3 and '==' in fields[0] and fields[2] in ('download', 'build'), line


def test_accelerator_check_env_stage_runs(tmp_path):
  """The script's first stage, end to end on this machine: env.json names the device and
  finds every package of the wheel list (the suite's own environment has them all)."""
  env = {**os.environ, 'STAGES': 'env', 'PYTHON': sys.executable}
  result = subprocess.run(['bash', os.path.join(BENCHMARKS, 'accelerator_check.sh'),
                           str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  with open(tmp_path / 'env.json') as f:
    saved = json.load(f)
  assert saved['machine']['backend'] == jax.default_backend()
  assert not [m for m, v in saved['modules'].items() if v.startswith('missing')]
  log = (tmp_path / 'check.log').read_text()
  assert '=== env: exit 0' in log and 'all stages passed' in log


def test_accelerator_check_usage_and_unknown_stage(tmp_path):
  script = os.path.join(BENCHMARKS, 'accelerator_check.sh')
  usage = subprocess.run(['bash', script], capture_output=True, text=True, check=False)
  assert usage.returncode == 2 and 'usage:' in usage.stderr
  env = {**os.environ, 'STAGES': 'bogus', 'PYTHON': sys.executable}
  bad = subprocess.run(['bash', script, str(tmp_path)], env=env, capture_output=True,
                       text=True, check=False)
  assert bad.returncode == 1 and "unknown stage 'bogus'" in bad.stdout


def test_launch_profile_summary_of_a_known_timeline():
  # Kernels (ns): [0, 10], [15, 20], [18, 30] overlapping the second, [40, 45]:
  # gaps 5 and 10, busy 10 + 15 + 5 of the 45 ns span; 4 kernels over 2 calls of 1 step.
  events = [(0, 10), (15, 20), (18, 30), (40, 45)]
  got = launch_profile.summarise(events, calls=2, steps=1)
  assert got['kernels'] == 4 and got['kernels_per_step'] == 2.0
  assert got['gap_us'] == pytest.approx(7.5e-3)
  assert got['busy'] == pytest.approx(30 / 45)
  assert got['kernel_us'] == pytest.approx(7.5e-3)  # median of 10, 5, 12, 5 ns
  assert got['ms_per_call'] == pytest.approx(45 / 2 / 1e6)
  assert launch_profile.summarise([], calls=1, steps=1) == {'device_plane': False}


def test_launch_profile_reads_only_the_gpu_streams():
  event = lambda name, start, end: type('E', (), dict(name=name, start_ns=start, end_ns=end))
  line = lambda name, *events: type('L', (), dict(name=name, events=list(events)))
  plane = lambda name, *lines: type('P', (), dict(name=name, lines=list(lines)))
  profile = type('Profile', (), dict(planes=[
      plane('/host:CPU', line('Stream #1', event('k', 0, 1))),
      plane('/device:GPU:0', line('Stream #7(compute)', event('fusion', 5, 9),
                                  event('MemcpyD2H', 9, 12), event('gemm', 1, 3)),
            line('XLA Ops', event('fusion', 5, 9)))]))
  assert launch_profile.kernel_events(profile) == [(1, 3), (5, 9)]


def test_donation_memory_report_renders_the_saved_cpu_results():
  with open(os.path.join(BENCHMARKS, 'results', 'donation_memory_cpu.json')) as f:
    saved = json.load(f)
  off, on = saved['arms']['off'], saved['arms']['on']
  assert on['input_deleted'] and not off['input_deleted']
  assert off['compiled']['alias'] == 0 < on['compiled']['alias'] <= saved['state_bytes']
  report = donation_memory.format_report(saved).splitlines()
  assert report[0].startswith('B64 T100 H1000 bn_lstm')
  assert report[2].split()[-1] == 'no' and report[3].split()[-1] == 'yes'
  assert 'not measured' in report[-1]


@pytest.mark.exhaustive
@pytest.mark.parametrize('measure', ['auto', 'always'])
def test_donation_memory_quick_mode_runs(tmp_path, measure):
  """`--quick` end to end; `--measure always` also runs the measuring processes (peaks
  None on the CPU)."""
  out = tmp_path / 'donation.json'
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, 'donation_memory.py'),
                           '--quick', f'--measure={measure}', f'--out={out}'], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  saved = json.loads(out.read_text())
  assert saved['config']['hidden'] == donation_memory.QUICK['hidden']
  assert saved['arms']['on']['input_deleted'] and not saved['arms']['off']['input_deleted']
  assert saved['arms']['on']['compiled']['alias'] > 0
  measured = saved['arms']['on']['measured']
  if measure == 'always':
    assert set(measured) == set(donation_memory.KINDS)
  assert result.stdout.strip() == donation_memory.format_report(saved)


def test_launch_profile_traces_and_reads_the_profile_here():
  """The trace is written and read back (jax.profiler.ProfileData) with the host's events
  of the traced calls; a CPU has no device plane, so its summary says so instead of
  counting host operations."""
  shape = dict(batch=2, time=3, features=2, hidden=4, bidirectional=False, padding=0.0)
  traced = launch_profile.profile('lstm', shape, calls=1)
  host = next(plane for plane in traced.planes if plane.name == '/host:CPU')
  assert sum(1 for line in host.lines for _ in line.events) > 0
  summary = launch_profile.summarise(launch_profile.kernel_events(traced), 1, shape['time'])
  if jax.default_backend() == 'cpu':
    assert summary == {'device_plane': False}
  else:
    assert summary['device_plane'] and summary['kernels_per_step'] > 0


def test_check_cost_rows_render():
  """An evaluation step with a host callback per site runs (the callbacks see trained
  counts), a one- and a three-target trace return, and the row renders."""
  shape = (4, 6, 2, 8)
  row = {'shape': list(shape), **check_cost.callbacks(shape, repeats=1)}
  assert row['callbacks_per_step'] == 3   # bn_lstm: W_x x, W_h h and c_t
  for kind, platforms in check_cost.TARGETS.items():
    for state in ('cold', 'warm'):
      seconds = check_cost._trace_seconds(shape, platforms or ('cpu',))
      row[f'{kind}_{state}_trace_s'] = seconds
      row[f'{kind}_{state}_trace_range_s'] = [seconds, seconds]
  assert all(row[k] > 0 for k in row if k.endswith('_trace_s'))
  assert row['wall_ratio_range'][0] > 0
  assert check_cost.format_report({'shapes': {'t': row}}).splitlines()[2].startswith(
      '| (t) B4 T6 I2 H8 |')


# ------------------------------------------------------------------------ evaluation statistics
def test_debiased_running_average_is_cumulative_until_the_momentum_takes_over():
  """`evaluation_statistics.debiased_update` on full rows: the first update takes the
  batch value, the k-th moves by max(1 - momentum, 1 / k) (the average of every batch so
  far, then the usual running average); a row no sequence reached does not move."""
  momentum, values = 0.75, [4.0, 1.0, 7.0, 2.0, 5.0, 3.0]
  stats = {'mean': np.zeros((2, 1)), 'var': np.ones((2, 1)), 'count': np.zeros(2)}
  want = 0.0
  for k, value in enumerate(values, 1):
    record = {'mean': np.array([[value], [9.0]]), 'var': np.array([[value], [9.0]]),
              'count': np.array([8.0, 0.0])}
    stats = jax.tree.map(np.asarray, evaluation_statistics.debiased_update(stats, record,
                                                                           momentum))
    want += max(1.0 - momentum, 1.0 / k) * (value - want)
    if k <= 4:    # 1 / k >= 1 - momentum: the plain average so far
      np.testing.assert_allclose(want, np.mean(values[:k]))
    np.testing.assert_allclose(stats['mean'][:, 0], [want, 0.0], rtol=1e-6)
    np.testing.assert_allclose(stats['var'][:, 0], [want, 1.0], rtol=1e-6)
  np.testing.assert_allclose(stats['count'], [48.0, 0.0])


def test_evaluation_statistics_counts_scores_against_batch_statistics():
  """Within one standard error of batch statistics, and worse by more than one: for an
  accuracy higher is better, for bits per character lower."""
  seed = lambda ours, batch, se: {'scores': {'running': {'value': ours, 'se': 0.0},
                                             'batch': {'value': batch, 'se': se}}}
  saved = {'tasks': {
      'digits': {'metric': 'accuracy', 'seeds': {'0': seed(0.80, 0.85, 0.02),
                                                 '1': seed(0.90, 0.85, 0.02)}},
      'ptb_char': {'metric': 'bpc', 'seeds': {'0': seed(2.20, 2.25, 0.01),
                                              '1': seed(2.26, 2.25, 0.02)}}}}
  assert evaluation_statistics.against_batch(saved, 'running') == (1, 1, 4)
  table = evaluation_statistics.format_table(saved)
  assert '| running | 0.800 / 0.900 | 2.200 / 2.260 | 1 of 4 | 1 of 4 |' in table
