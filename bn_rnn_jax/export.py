"""A trained model as a self-contained program: `jax.export` with its variables baked in.

  infer = inference_function(model, variables)    # evaluation: population statistics
  specs = symbolic_specs((x, mask), (('batch', 'time', None), ('batch', 'time')))
  save(export(infer, specs), 'model.jax')

Axes named in `symbolic_specs` are symbolic, so one file serves any batch size and length.
The file is the serialized program followed by the line `bn_rnn_jax.export sha256 <hex>`
(the SHA-256 of the bytes before it), which JAX's reader ignores: reloading needs JAX
alone (`jax.export.deserialize`), and `load` checks the line first.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax import export as jax_export

from bn_rnn_jax import batch_stats
from bn_rnn_jax import extras
from bn_rnn_jax import modes


def inference_function(model, variables, **call_kwargs) -> Callable[..., Any]:
  """`f(*args) = model.apply(variables, *args, use_running_average=True,
  deterministic=True, **call_kwargs)`, the variables closed over (constants of an export).
  A site whose statistics were never trained is a one-line ValueError."""
  untrained = batch_stats.untrained_sites(variables.get('batch_stats', {}))
  if untrained:
    raise ValueError(f'Cannot export untrained population statistics (count 0) at '
                     f'{", ".join(untrained)}; train or estimate them first.')

  def infer(*args):
    return model.apply(variables, *args, **modes.EVAL.kwargs(), **call_kwargs)
  return infer


def _is_axes(x) -> bool:
  return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def map_axes(fn: Callable[[tuple, Any], Any], axes: Sequence[Any], args: Sequence[Any]):
  """`fn(names, array)` for every array of `args` and its tuple of axis names in `axes` (a
  matching sequence of pytrees of those tuples); returns a tuple."""
  # As lists, so that only the per-array tuples are leaves.
  return tuple(jax.tree.map(fn, list(axes), list(args), is_leaf=_is_axes))


def symbolic_specs(args: Sequence[Any], axes: Sequence[Any]) -> tuple:
  """`jax.ShapeDtypeStruct`s like `args`, with named axes symbolic.

  Args:
    args: example arrays (or pytrees of them).
    axes: per argument (a matching pytree), a tuple with one entry per axis: a name makes
      that axis symbolic (one name in several places: one size), None keeps its size.

  Returns:
    A tuple of pytrees of `jax.ShapeDtypeStruct`, for `export`.
  """
  scope = jax_export.SymbolicScope()

  def spec(names, array):
    array = np.asarray(array)
    if len(names) != array.ndim:
      raise ValueError(f'axes {names} name {len(names)} axes of an array of shape '
                       f'{array.shape}.')
    dims = ', '.join(str(n) if name is None else name
                     for n, name in zip(array.shape, names))
    return jax.ShapeDtypeStruct(jax_export.symbolic_shape(dims, scope=scope), array.dtype)
  return map_axes(spec, axes, args)


def export(fn: Callable[..., Any], specs: Sequence[Any],
           platforms: Optional[Sequence[str]] = None) -> jax_export.Exported:
  """`jax.export` of `jax.jit(fn)` for arguments shaped as `specs`; `platforms` (e.g.
  `('cpu', 'cuda')`) defaults to the current backend."""
  return jax_export.export(jax.jit(fn), platforms=platforms)(*specs)


#: The start of the line `save` appends to the serialized program: its SHA-256 follows,
#: in hex, then a newline.
CHECKSUM_PREFIX = b'\nbn_rnn_jax.export sha256 '
_CHECKSUM_LINE = len(CHECKSUM_PREFIX) + 64 + 1


def with_checksum(program: bytes) -> bytes:
  """`program` followed by the line holding its SHA-256 (what `save` writes)."""
  return (bytes(program) + CHECKSUM_PREFIX
          + hashlib.sha256(program).hexdigest().encode() + b'\n')


def checked_program(data: bytes, path: str) -> bytes:
  """The program of a saved file's bytes `data`, after checking them against the SHA-256
  line at their end; a one-line ValueError naming `path` when the file is damaged."""
  if not data:
    problem = 'it is empty'
  elif (len(data) < _CHECKSUM_LINE or not data.endswith(b'\n')
        or data[-_CHECKSUM_LINE:-65] != CHECKSUM_PREFIX):
    problem = ('it does not end with the SHA-256 line bn_rnn_jax.export.save writes (cut '
               'short, or not saved by it)')
  elif hashlib.sha256(data[:-_CHECKSUM_LINE]).hexdigest().encode() != data[-65:-1]:
    problem = 'its content does not match the SHA-256 saved with it'
  else:
    return data[:-_CHECKSUM_LINE]
  raise ValueError(f'The exported model {os.path.abspath(path)} is damaged: {problem}; '
                   'export the model again.')


def save(exported: jax_export.Exported, path: str) -> None:
  """Write `exported` to `path` with its SHA-256 line, atomically (a kill leaves any earlier
  file whole); an unwritable path is a one-line ValueError."""
  with extras.needed_by(f'{__name__}.save'):
    data = with_checksum(exported.serialize())
  path = os.path.abspath(path)
  partial = f'{path}.partial-{os.getpid()}'
  try:
    with open(partial, 'wb') as f:
      f.write(data)
    os.replace(partial, path)
  except OSError as e:
    if os.path.exists(partial):
      os.remove(partial)
    raise ValueError(f'Cannot write the exported model {path} ({e.strerror}).') from None


def load(path: str) -> jax_export.Exported:
  """The exported program at `path`, its SHA-256 checked. A file that cannot be read, is
  damaged, or that this JAX cannot read is a one-line ValueError naming the absolute path;
  a missing flatbuffers is `extras.MissingExtra`."""
  path = os.path.abspath(path)
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except OSError as e:
    raise ValueError(f'Cannot read the exported model {path} ({e.strerror}).') from None
  program = checked_program(data, path)
  try:
    with extras.needed_by(f'{__name__}.load'):
      return jax_export.deserialize(bytearray(program))
  except extras.MissingExtra:
    raise
  except Exception as e:  # pylint: disable=broad-except  # the deserializer's many types
    text = ' '.join(f'{type(e).__name__}: {e}'.split())[:200]
    raise ValueError(f'The exported model {path} does not deserialize with jax '
                     f'{jax.__version__} ({text}).') from None


# What the fresh process runs: jax and numpy only. argv: model, inputs .npz, outputs .npz.
# The inputs hold `set{k}_{i}`, the i-th leaf of the k-th argument set.
_RELOAD_PROGRAM = r'''
import sys
import numpy as np
import jax
from jax import export

model_path, inputs_path, outputs_path = sys.argv[1:4]
with open(model_path, 'rb') as f:
  exported = export.deserialize(bytearray(f.read()))
outputs = {}
with np.load(inputs_path) as data:
  sets = sorted({name.split('_')[0] for name in data.files})
  for name in sets:
    leaves = [data[f'{name}_{i}'] for i in range(exported.in_tree.num_leaves)]
    args, kwargs = jax.tree.unflatten(exported.in_tree, leaves)
    for i, leaf in enumerate(jax.tree.leaves(exported.call(*args, **kwargs))):
      outputs[f'{name}_{i}'] = np.asarray(leaf)
project = sorted({m.split('.')[0] for m in sys.modules} & {'bn_rnn_jax', 'flax', 'optax'})
if project:
  sys.exit(f'the fresh process imported {project}')
np.savez(outputs_path, **outputs)
'''


def run_in_fresh_process(path: str, arg_sets: Sequence[tuple],
                         timeout: float = 600.0) -> list[list[np.ndarray]]:
  """Per argument tuple of `arg_sets`, the output leaves of the exported model at `path`,
  run in a new Python process that imports only jax and numpy. RuntimeError (one line)
  when that process fails or imported the project's code."""
  with tempfile.TemporaryDirectory() as tmp:
    inputs, outputs = os.path.join(tmp, 'inputs.npz'), os.path.join(tmp, 'outputs.npz')
    np.savez(inputs, **{f'set{k:04d}_{i}': np.asarray(leaf)
                        for k, args in enumerate(arg_sets)
                        for i, leaf in enumerate(jax.tree.leaves(args))})
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    done = subprocess.run([sys.executable, '-c', _RELOAD_PROGRAM, os.path.abspath(path),
                           inputs, outputs], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode:
      last = (done.stderr.strip().splitlines() or ['no output'])[-1]
      raise RuntimeError(f'Reloading {os.path.abspath(path)} in a fresh process failed: '
                         f'{last}')
    with np.load(outputs) as data:
      return [[data[name] for name in sorted(
          (n for n in data.files if n.startswith(f'set{k:04d}_')),
          key=lambda n: int(n.split('_')[1]))] for k in range(len(arg_sets))]
