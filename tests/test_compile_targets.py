"""The offline compile checks without their compilers: the layer lowered for CUDA from
this CPU machine (the Pallas kernels as Triton calls, on any jax version), the forms
table and the target's policy, what `program_facts.py` reads from XLA's thunk
sequences, ptxas reports and optimised HLO, and the checks' tables and script usage.
The compiles themselves need the GPU and TPU compiler stacks: CI runs them
(`benchmarks/offline_compile.sh`)."""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bn_rnn_jax import policy

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          'benchmarks')
sys.path.insert(0, BENCHMARKS)
# pylint: disable=g-import-not-at-top,wrong-import-position
import compile_targets
import gpu_compile
import program_facts
import tpu_compile
# pylint: enable=g-import-not-at-top,wrong-import-position


PALLAS_FORMS = [(name, shape) for name, form in compile_targets.FORMS.items()
                if form.settings.get('fused_step') in ('pallas', 'persistent')
                for shape in form.shapes]


@pytest.mark.parametrize('form,shape', PALLAS_FORMS,
                         ids=[f'{form}-{shape}' for form, shape in PALLAS_FORMS])
def test_layer_lowers_for_cuda_at_benchmark_shapes(form, shape):
  """The `bn_lstm` layer's Pallas forms, forward and backward, lowered for CUDA from this
  CPU machine (abstract arguments, no device, no CUDA plugin): one Triton kernel in the
  forward pass and one in the backward pass (per step, or for the whole sequence).
  `cuda_lowering` gives jax >= 0.11 the abstract H100 its Triton lowering asks for."""
  fn, args = compile_targets.program(form, shape, 'float32', 'gpu')
  text = compile_targets.lower(fn, args, 'gpu').as_text()
  kernels = program_facts.pallas_kernels(text)
  assert len(kernels) == 2 and kernels[0].endswith('_forward'), kernels
  assert kernels[1].endswith('_backward'), kernels
  assert sum(text.count(f'@{call}(') for call in ('__gpu$xla.gpu.triton',
                                                  'triton_kernel_call_ffi')) == 2


def test_forms_run_their_targets_policy_or_say_why_not():
  """Each form runs with the policy the layer resolves for the target (or the CPU's,
  compiled for a TPU beside it), its own settings kept; a form this version does not
  have is skipped in one line that names it."""
  for name, form in compile_targets.FORMS.items():
    reason = compile_targets.form_unavailable(name)
    if reason:
      assert reason.startswith(f'{name}: skipped') and '\n' not in reason
      continue
    for target in form.platforms:
      got = compile_targets.resolved_policy(name, 'a', target)
      want = dataclasses.asdict(policy.resolve(
          cell='lstm', hidden_size=100, batch=64, batch_norm=True, sequence_input=False,
          platform=form.policy_of or target))
      want.update(form.settings, interpret=False)
      assert got == want, (name, target)


THUNKS = """\
000: kCopy         [source       | next=001 (1)] kCopy
001: kCustomKernel [prev=000 (1) | next=002 (1)] loop_pad_fusion grid: [4, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
002: kWhile         [prev=001 (1) | next=012 (1)]
condition:
    003: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    004: kAsyncStart   [source       | next=008 (1)] stream=computation_stream[1], async_id=4
        006: kDynamicSliceFusion [source | sink] params=1, results=1
            005: kCopy [source | sink] kCopy
    007: kCustomKernel [source       | next=008 (1)] gemm_fusion_dot grid: [256, 1, 1] threads: [64, 1, 1]  shared_memory: 1024 bytes
    008: kCustomKernel [prev=007 (1) | sink        ] my_kernel grid: [4, 1, 1] threads: [128, 1, 1]  shared_memory: 512 bytes
    000: kCommandBuffer [source       | sink        ]
        009: kCustomKernel [source       | sink        ] wrapped_add grid: [1, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
        010: kCopy         [source       | sink        ] kCopy
    011: kAsyncDone    [source       | sink         ] async_id=4
012: kCustomKernel  [prev=002 (1) | sink        ] input_reduce_fusion grid: [7, 1, 1] threads: [1024, 1, 1]  shared_memory: 0 bytes
"""

PTXAS = """\
ptxas info    : Compiling entry function 'my_kernel' for 'sm_90a'
ptxas info    : Function properties for my_kernel
    376 bytes stack frame, 412 bytes spill stores, 536 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 376 bytes cumulative stack size
"""


def test_thunk_sequence_and_ptxas_report():
  """Per while loop, what one iteration launches (its condition's kernel, its body's,
  those of its command buffer; copies, also inside async slices), nothing outside it;
  a kernel's launch and its ptxas registers and spills."""
  assert program_facts.thunk_loops(THUNKS) == [
      {'kernels': 4, 'copies': 2, 'command_buffers': 1}]
  assert program_facts.thunk_launch(THUNKS, 'my_kernel') == {
      'grid': [4, 1, 1], 'threads': [128, 1, 1], 'shared_memory_bytes': 512}
  assert program_facts.thunk_launch(THUNKS, 'absent') is None
  assert program_facts.ptxas_report(PTXAS, 'my_kernel') == {
      'registers': 255, 'stack_bytes': 376, 'spill_store_bytes': 412,
      'spill_load_bytes': 536}
  assert program_facts.ptxas_report(PTXAS, 'absent') is None


def test_while_loops_of_a_compiled_scan():
  """A scan that keeps two `[T, B, H]` values per step for its gradient, compiled here:
  a forward loop that stashes them (written a slice per step), a backward loop that
  only reads them, one matrix product per forward step and two per backward step."""
  steps, batch, hidden = 7, 3, 5

  def loss(w, x):
    def step(h, x_t):
      h = jnp.tanh(h @ w + x_t)
      return h, h
    _, hs = jax.lax.scan(step, jnp.zeros((batch, hidden)), x)
    return jnp.sum(hs ** 2)

  w, x = jnp.eye(hidden), jnp.ones((steps, batch, hidden))
  text = jax.jit(jax.grad(loss)).lower(w, x).compile().as_text()
  forward, backward = program_facts.while_loops(text, steps)
  assert forward['trip_count'] == backward['trip_count'] == steps
  assert forward['stashes'] and all(s['shape'].endswith(f'[{steps},{batch},{hidden}]')
                                    and s['memory'] == 'HBM' for s in forward['stashes'])
  assert not [s for s in backward['stashes'] if s['shape'].endswith(f',{batch},{hidden}]')]
  assert (forward['matmuls'], backward['matmuls']) == (1, 2)
  assert forward['all_reduces'] == backward['all_reduces'] == 0


def test_tables_show_failed_rows_in_one_line():
  """A row that did not compile is a table line with its error, beside the rows that did."""
  error = 'RuntimeError: lowering failed'
  gpu = gpu_compile.format_table({'rows': [
      {'form': 'fused_pallas', 'shape': 'a', 'dtype': 'float32', 'ok': False,
       'error': error}]})
  tpu = tpu_compile.format_table({'rows': [
      {'program': 'default', 'ok': False, 'error': error}]})
  for table in (gpu, tpu):
    assert f'failed: {error}' in table


def test_offline_compile_usage():
  script = os.path.join(BENCHMARKS, 'offline_compile.sh')
  result = subprocess.run(['bash', script, 'cpu', 'out.json'], capture_output=True,
                          text=True, check=False)
  assert result.returncode == 2 and 'usage' in result.stderr
