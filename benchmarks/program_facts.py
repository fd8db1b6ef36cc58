"""What a compiled fwd+bwd says about itself: peak memory, per-step kernels, the dtypes of
its matrix products (the columns of `rnn_speed.py` that are not timings); and, for the
offline compile checks (`gpu_compile.py`, `tpu_compile.py`), what each time step of its
loops runs and stores (optimised HLO), launches (XLA GPU's thunk sequence), and what
its Pallas kernels cost in registers (`ptxas -v`)."""

from __future__ import annotations

import re
from typing import Optional


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
_MATMULS = ('dot', 'convolution')
_ALL_REDUCES = ('all-reduce', 'all-reduce-start')


def computations(hlo_text: str) -> dict[str, list[str]]:
  """`{computation name: its instruction lines}` of an HLO module's text."""
  found, name = {}, None
  for line in hlo_text.split('\n'):
    header = re.match(r'^(?:ENTRY )?%?(\S+) .*\{$', line)
    if header:
      name = header.group(1)
      found[name] = []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      found[name].append(line)
  return found


def _opcode(line: str) -> Optional[str]:
  """An instruction line's opcode (its result may be a tuple, with spaces)."""
  match = re.match(r'\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][a-z0-9\-]*)\(', line)
  return match.group(1) if match else None


def _tuple_elements(text: str) -> list[str]:
  """The top-level elements of `(a, b, ...)` at the start of `text`, comments dropped."""
  text = re.sub(r'/\*.*?\*/', '', text)
  elements, depth, current = [], 0, ''
  for char in text[1:]:
    if char in '([{':
      depth += 1
    elif char in ')]}':
      if depth == 0:
        break
      depth -= 1
    if char == ',' and depth == 0:
      elements.append(current.strip())
      current = ''
    else:
      current += char
  return elements + [current.strip()]


def _matmuls(name: str, found: dict[str, list[str]]) -> int:
  """Matrix products in computation `name` and the computations it calls (fusions)."""
  count = 0
  for line in found.get(name, []):
    count += _opcode(line) in _MATMULS
    for called in re.findall(r'calls=%?([\w.\-]+)', line):
      count += _matmuls(called, found)
  return count


def _stashes(body: list[str], steps: Optional[int]) -> list[dict]:
  """The `[steps, ...]` buffers of a loop's state that its body writes (a slice per
  step): shape and memory space ('HBM', or 'S(n)', an alternate space: on TPU, on-chip)."""
  root = next((l for l in body if l.lstrip().startswith('ROOT ')), '')
  parameter = next((re.match(r'\s*%?([\w.\-]+) =', l).group(1) for l in body
                    if _opcode(l) == 'parameter'), None)
  if not root or parameter is None or _opcode(root) != 'tuple':
    return []
  shapes = _tuple_elements(root.split(' = ', 1)[1])
  operands = _tuple_elements(root[root.index(' tuple(') + 6:])
  passed = {}   # instruction name -> the state element it reads unchanged
  for line in body:
    gte = re.match(rf'\s*%?([\w.\-]+) = .* get-tuple-element\(%?{re.escape(parameter)}\), '
                   r'index=(\d+)', line)
    if gte:
      passed[gte.group(1)] = int(gte.group(2))
  stashes = []
  for index, (shape, operand) in enumerate(zip(shapes, operands)):
    dims = re.match(r'(\w+)\[([\d,]+)\]', shape)
    if not dims or passed.get(operand.lstrip('%')) == index:
      continue
    sizes = [int(d) for d in dims.group(2).split(',')]
    if len(sizes) >= 2 and sizes[0] == steps:
      space = re.search(r'S\((\d+)\)', shape)
      stashes.append({'shape': f'{dims.group(1)}[{dims.group(2)}]',
                      'memory': f'S({space.group(1)})' if space else 'HBM'})
  return stashes


def while_loops(hlo_text: str, steps: Optional[int] = None) -> list[dict]:
  """Per `while` loop of an optimised HLO module, in the text's order: its trip count
  (where the text records it; else `steps`), and per step the body's `ops`
  (instructions without the bookkeeping: parameter, tuple, get-tuple-element,
  constant, bitcast; a multi-output fusion counts once), `fusions`, `all_reduces`
  (cross-device sums), `matmuls` (dots and convolutions, inside its fusions too) and
  `stashes` (`_stashes`: what a step stores for later steps or the backward pass)."""
  found = computations(hlo_text)
  loops = []
  for lines in found.values():
    for line in lines:
      loop = re.search(r' while\(.*body=%?([\w.\-]+)', line)
      if not loop:
        continue
      body = found[loop.group(1)]
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
      trip_count = int(trips.group(1)) if trips else steps
      opcodes = [_opcode(l) for l in body]
      loops.append({'trip_count': trip_count,
                    'ops': sum(1 for op in opcodes if op and op not in _BOOKKEEPING),
                    'fusions': opcodes.count('fusion'),
                    'all_reduces': sum(1 for op in opcodes if op in _ALL_REDUCES),
                    'matmuls': _matmuls(loop.group(1), found),
                    'stashes': _stashes(body, trip_count)})
  return loops


def loop_instructions(hlo_text: str) -> list[int]:
  """Per `while` loop of an HLO module's text, the non-bookkeeping instructions of its body."""
  return [loop['ops'] for loop in while_loops(hlo_text)]


# XLA GPU's thunk sequence (`--xla_dump_to`, `*.thunk_sequence_after_thunk_passes.txt`):
# what the compiled program runs, in order; a while loop's condition and body are nested.
_THUNK = re.compile(r'^(\s*)\d+: (k\w+)\s*\[[^\]]*\]\s*(.*)$')
_COPIES = ('kCopy', 'kMemcpy', 'kMemset', 'kMemzero')
_NOT_LAUNCHES = ('kWhile', 'kAsyncStart', 'kAsyncDone', 'kCommandBuffer',
                 'kDynamicSliceFusion', 'kSequential', 'kConditional', 'kWaitForStreams')


def thunk_loops(thunk_text: str) -> list[dict]:
  """Per while loop of a thunk sequence (in order): what one iteration (its condition and
  body) launches: `kernels` (XLA's fusions, library calls such as cuBLAS, custom kernels
  such as Pallas's; also those inside command buffers), `copies` (device-to-device
  copies and memsets) and `command_buffers` (CUDA graphs the body launches whole)."""
  loops, open_loops = [], []   # open: (indent, counts) of the loops around a line
  for line in thunk_text.split('\n'):
    thunk = _THUNK.match(line)
    if not thunk:
      continue
    indent, kind = len(thunk.group(1)), thunk.group(2)
    while open_loops and indent <= open_loops[-1][0]:
      open_loops.pop()
    for _, counts in open_loops:
      if kind.startswith(_COPIES):
        counts['copies'] += 1
      elif kind == 'kCommandBuffer':
        counts['command_buffers'] += 1
      elif kind not in _NOT_LAUNCHES:
        counts['kernels'] += 1
    if kind == 'kWhile':
      counts = {'kernels': 0, 'copies': 0, 'command_buffers': 0}
      loops.append(counts)
      open_loops.append((indent, counts))
  return loops


def thunk_launch(thunk_text: str, kernel: str) -> Optional[dict]:
  """The grid, threads per block and shared memory of the first launch of `kernel` in a
  thunk sequence (None if it has none)."""
  for line in thunk_text.split('\n'):
    thunk = _THUNK.match(line)
    if thunk and thunk.group(3).split(' ')[0] == kernel:
      facts = re.search(r'grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+)',
                        thunk.group(3))
      if facts:
        return {'grid': [int(v) for v in facts.group(1).split(',')],
                'threads': [int(v) for v in facts.group(2).split(',')],
                'shared_memory_bytes': int(facts.group(3))}
  return None


def ptxas_report(report_text: str, kernel: str) -> Optional[dict]:
  """`ptxas -v`'s registers, stack frame and spills of `kernel` (None if not reported)."""
  match = re.search(
      rf'Function properties for {re.escape(kernel)}\n\s*(\d+) bytes stack frame, (\d+) '
      r'bytes spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers', report_text)
  if not match:
    return None
  stack, stores, loads, registers = map(int, match.groups())
  return {'registers': registers, 'stack_bytes': stack, 'spill_store_bytes': stores,
          'spill_load_bytes': loads}


def pallas_kernels(stablehlo_text: str) -> list[str]:
  """The names of the Pallas (Triton) kernels a lowered module calls, in order."""
  names = []
  for line in stablehlo_text.split('\n'):
    if 'xla.gpu.triton' in line or 'triton_kernel_call' in line:
      name = re.search(r'name = "([^"]+)"', line)
      if name and name.group(1) not in names:
        names.append(name.group(1))
  return names
