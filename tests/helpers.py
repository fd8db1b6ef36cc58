"""Assertions, array conversions, command runners and the core-tier selection shared by
the test modules (not a test module). The trainer's tiny configs, datasets and fixture
files are in `training_fixtures.py`, the float64 reference in `reference.py`, the real
datasets' paths in `real_data.py`."""

import importlib.util
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import policy
import reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT_CONFIGS = os.path.join(REPO, 'experiments', 'configs')


# ----------------------------------------------------------------------------- tiers
def core_cases(cases, core, ids=None, also=()):
  """`cases` for `pytest.mark.parametrize`, in three tiers.

  The core tier (`pytest -m "not slow"`) runs a test's `core` cases; the default run adds
  the cases in `also` (marked `slow`); the others are marked `exhaustive` (`pytest
  --exhaustive`). A case is a value, or a tuple of values for several argument names;
  `ids`, a function of a case, names it (pytest's own ids otherwise).
  """
  def marks(case):
    if case in core:
      return ()
    return pytest.mark.slow if case in also else pytest.mark.exhaustive

  def param(case):
    values = case if isinstance(case, tuple) else (case,)
    return pytest.param(*values, marks=marks(case), id=None if ids is None else ids(case))
  unknown = [case for case in (*core, *also) if case not in cases]
  assert not unknown, f'cases {unknown} are not among the cases'
  return [param(case) for case in cases]


# ----------------------------------------------------------------------------- arrays
def prefix_mask(lengths, length, dtype=np.float32):
  """`[B, length]` mask with the first `lengths[b]` steps of row b valid (1)."""
  return (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(dtype)


def uneven_batch(features=3, seed=0):
  """`(x [4, 6, features] float32, mask [4, 6])`: random inputs, sequence lengths 6, 4,
  2 and 5 (the padded positions of x hold random values too)."""
  x = np.random.default_rng(seed).normal(size=(4, 6, features)).astype(np.float32)
  return x, prefix_mask([6, 4, 2, 5], 6)


def float64(tree):
  """Every leaf as a float64 NumPy array (for comparisons with the reference)."""
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def float32(tree):
  """Every leaf as a float32 JAX array (the library's compute dtype)."""
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


# ----------------------------------------------------------------------------- layers
def with_execution(fields):
  """`RecurrentLayer` fields with the execution settings among them (`hoist_input`,
  `remat`, `unroll`, `backward`, `batch_sums`; `hoist_input` None = 'auto') gathered
  into one `execution=policy.Execution(...)`, as the layer takes them."""
  fields = dict(fields)
  settings = {name: fields.pop(name) for name in policy.EXECUTION_FIELDS if name in fields}
  if settings.get('hoist_input', policy.AUTO) is None:
    settings['hoist_input'] = policy.AUTO
  return {**fields, 'execution': policy.Execution(**settings)} if settings else fields


# ----------------------------------------------------------------------------- assertions
def reference_params(layer, x_shape, seed):
  """Random float64 parameters in `layer`'s layout (`reference.random_params`, drawn with
  `np.random.default_rng(seed)`), and the shapes of its `batch_stats` ({} without any).

  `x_shape` is `[batch, time, features]` of the input the layer is initialised with.
  """
  shapes = jax.eval_shape(
      lambda: layer.init(jax.random.key(0), jnp.zeros(x_shape), use_running_average=True,
                         deterministic=True))
  params = reference.random_params({k: s.shape for k, s in shapes['params'].items()},
                                   np.random.default_rng(seed))
  return params, shapes.get('batch_stats', {})


def assert_close(actual, expected, rtol=1e-5, what=''):
  """Float32 against float64, elementwise, with an absolute floor `rtol * max|expected|`
  (at least `rtol * 1e-3`): entries near zero are compared at the array's scale."""
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
  scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-3)
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=what)


def assert_trees_close(got, want, *, rtol, atol):
  """Leaf by leaf `assert_allclose`, naming the leaf's path on failure."""
  for (path, a), b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def assert_trees_equal(got, want):
  """Leaf by leaf bitwise equality, naming the leaf's path on failure."""
  for (path, a), b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def one_line(error) -> str:
  """The message of an exception (or of a `pytest.raises` result), checked to be one line
  without a traceback."""
  message = str(error.value if hasattr(error, 'value') else error)
  assert '\n' not in message and 'Traceback' not in message, message
  return message


def last_line_without_traceback(stderr: str) -> str:
  """The last line of a command's stderr, after checking it printed no traceback."""
  assert 'Traceback' not in stderr, stderr[-3000:]
  return stderr.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- commands
def subprocess_env(env=None, **overrides) -> dict:
  """A child process's environment: `env` (os.environ when None) with this repository
  first on PYTHONPATH, ahead of what was there (packages a machine adds there), and
  `overrides` set."""
  env = dict(os.environ if env is None else env)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, env.get('PYTHONPATH')) if p)
  env.update(overrides)
  return env


def run_python(args, *, env=None, cwd=REPO, timeout=300, one_device=False):
  """`python ARGS` in a fresh process with this repository importable.

  `one_device`: without the tests' 8 fake devices, on the CPU, as a user would start it.
  """
  env = subprocess_env(env)
  if one_device:
    env.pop('XLA_FLAGS', None)
    env['JAX_PLATFORMS'] = 'cpu'
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout)


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (for a coordinator)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def load_experiment_config(name: str):
  """The module `experiments/configs/<name>.py`, loaded from its file."""
  path = os.path.join(EXPERIMENT_CONFIGS, name if name.endswith('.py') else f'{name}.py')
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f'_experiment_config_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def write_kaldi_table(spec: str, arrays: dict) -> None:
  """Write `{utterance: array}` with kaldiio's writer (`spec` 'ark:...' or 'ark,scp:...')."""
  import kaldiio  # pylint: disable=g-import-not-at-top
  with kaldiio.WriteHelper(spec) as writer:
    for utt, value in arrays.items():
      writer(utt, value)
