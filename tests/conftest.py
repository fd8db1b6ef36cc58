"""Test session setup: 8 fake CPU devices and a persistent compilation cache, set before
JAX is imported anywhere, fast compilation outside the exhaustive tier
(`pytest_configure`), and the data root of the tests that read real datasets.

Multi-device code (pmap over axis 'batch') is tested on these; single-device code runs
on device 0 as usual.

One persistent XLA cache serves every test run on a machine, in this process and in every
process a test starts (they inherit `JAX_COMPILATION_CACHE_DIR`; those with one CPU device
get their own entries): `$JAX_COMPILATION_CACHE_DIR` when set, otherwise a folder of the
user's cache named for the installed jax and jaxlib (`persistent_cache_dir`), kept between
runs so that a second run reads back what the first compiled. Tests build new jitted
closures, Trainers and processes for programs compiled before, and
`release_compiled_programs` drops the in-memory ones after each module.

Tiers: the default run leaves out the tests marked `exhaustive` (cross products, every arm
and preset, the bare-venv install, the notebook, the documentation builds); `--exhaustive`
runs only those. `-m "not slow"` narrows either to its core tier.

Real datasets are read under `$BN_RNN_JAX_DATA` (`bn_rnn_jax.input_pipeline`). When it is
unset, it is pointed at the read-only copy the CI machines keep next to the checkout
(`_SHARED_DATA` below) where that exists; the tests that need a dataset skip, naming it,
where it is missing.

What the test modules share lives in four modules that are not tests: `helpers.py`
(assertions, conversions, commands, the core tier's case selection), `training_fixtures.py`
(tiny configs, datasets and fixture files of the tests that train), `reference.py` (the
float64 NumPy reference) and `real_data.py` (the real datasets' paths).
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')


def persistent_cache_dir() -> str:
  """`$XDG_CACHE_HOME` (or ~/.cache) `/bn_rnn_jax/xla-jax<version>-jaxlib<version>`."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  versions = f"jax{metadata.version('jax')}-jaxlib{metadata.version('jaxlib')}"
  return os.path.join(root, 'bn_rnn_jax', f'xla-{versions}')


if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  os.environ['JAX_COMPILATION_CACHE_DIR'] = persistent_cache_dir()
# Every program, however small or quick to compile (the tests' are both).
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'

_SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'shared', 'data')
if not os.environ.get('BN_RNN_JAX_DATA') and os.path.isdir(_SHARED_DATA):
  os.environ['BN_RNN_JAX_DATA'] = _SHARED_DATA

import gc  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope='module')
def release_compiled_programs():
  """Drop each module's compiled programs when it ends.

  Every XLA:CPU executable keeps memory mappings for its code; one process running the
  whole suite kept about 61,000 near the end, and Linux's default `vm.max_map_count` is
  65,530. Past it the next compilation dies with a segmentation fault (it did, in
  test_tagging, once the suite had grown); with this fixture the most seen was about
  17,000. The suite takes about 8 % longer (programs a later module needs again are
  compiled again, or read back from the persistent cache).
  """
  yield
  jax.clear_caches()
  gc.collect()


def pytest_addoption(parser):
  parser.addoption('--exhaustive', action='store_true',
                   help='run only the tests marked exhaustive (the default run leaves them out)')


# XLA's backend (LLVM) optimisation level outside the exhaustive tier.
FAST_COMPILE_FLAG = '--xla_backend_optimization_level=0'


def pytest_configure(config):
  """Outside the exhaustive tier, compile without XLA's backend optimisations.

  The suite's programs are tiny: compiling them costs more than running them. The level
  changes the machine code XLA:CPU generates, and float32 results differ in the last
  bits; every test of the default tier passes at both levels, within the tolerance it
  already has. Read when JAX starts its backend, after this hook; inherited by the
  processes tests start with this environment. The exhaustive tier, and the processes
  started as a user starts them (without the tests' XLA_FLAGS), compile as every run does.
  """
  if not config.getoption('exhaustive'):
    os.environ['XLA_FLAGS'] = f"{os.environ['XLA_FLAGS']} {FAST_COMPILE_FLAG}"


def pytest_collection_modifyitems(config, items):
  """Keep the tier asked for: the exhaustive tests with --exhaustive, the others without."""
  exhaustive = config.getoption('exhaustive')
  keep, drop = [], []
  for item in items:
    (keep if (item.get_closest_marker('exhaustive') is not None) == exhaustive
     else drop).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
