"""What a compiled fwd+bwd says about itself: peak memory, per-step kernels, the dtypes of
its matrix products (the columns of `rnn_speed.py` that are not timings)."""

from __future__ import annotations

import re


def compiled(step, params) -> dict:
  """Peak memory and loop size of the compiled fwd+bwd.

  Memory is XLA's buffer assignment, in bytes: arguments + outputs + temporaries - aliased
  (the CPU client's `peak_memory_in_bytes` leaves the temporaries out), and the
  temporaries alone (the activations the backward pass keeps). `loop_instructions` counts,
  for each `while` loop of the optimised HLO in program order (forward scans, then the
  backward ones), the instructions its body runs per step, bookkeeping (parameter,
  tuple, get-tuple-element, constant, bitcast) left out: the per-step kernel count.
  `dot_operands` counts the program's matrix products by operand dtype as JAX emits
  them (before XLA, which may upcast bfloat16 products where the backend lacks them).
  """
  lowered = step.lower(params)
  executable = lowered.compile()
  stats = executable.memory_analysis()
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes
          + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
  return {'peak_bytes': int(peak), 'temp_bytes': int(stats.temp_size_in_bytes),
          'loop_instructions': loop_instructions(executable.as_text()),
          'dot_operands': dot_operand_dtypes(lowered.as_text())}


def dot_operand_dtypes(stablehlo_text: str) -> dict[str, int]:
  """`{dtype of the first operand: count}` of the `dot_general`s of a StableHLO module."""
  pattern = r'stablehlo\.dot_general [^\n]*?: \(tensor<(?:[0-9?]+x)*([a-z]\w*)>'
  counts = {}
  for dtype in re.findall(pattern, stablehlo_text):
    counts[dtype] = counts.get(dtype, 0) + 1
  return counts


_BOOKKEEPING = ('parameter', 'tuple', 'get-tuple-element', 'constant', 'bitcast')


def loop_instructions(hlo_text: str) -> list[int]:
  """Per `while` loop of an HLO module's text, the non-bookkeeping instructions of its body."""
  computations, name = {}, None
  for line in hlo_text.split('\n'):
    header = re.match(r'^(?:ENTRY )?%?(\S+) .*\{$', line)
    if header:
      name = header.group(1)
      computations[name] = []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      computations[name].append(line)
  counts = []
  for lines in computations.values():
    for line in lines:
      loop = re.search(r' while\(.*body=%?([\w.\-]+)', line)
      if loop:
        ops = [re.search(r'= \S+ ([\w\-]+)\(', l) for l in computations[loop.group(1)]]
        counts.append(sum(1 for op in ops if op and op.group(1) not in _BOOKKEEPING))
  return counts
