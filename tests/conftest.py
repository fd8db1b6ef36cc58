"""Test session setup: 8 fake CPU devices and a persistent compilation cache, set before
JAX is imported anywhere, and the data root of the tests that read real datasets.

Multi-device code (pmap over axis 'batch') is tested on these; single-device code runs
on device 0 as usual.

One persistent XLA cache serves the whole session, in this process and in every process
a test starts (they inherit `JAX_COMPILATION_CACHE_DIR`; those with one CPU device get
their own entries): tests build new jitted closures, Trainers and processes for programs
compiled before, and `release_compiled_programs` drops the in-memory ones after each
module. A cache named by `$JAX_COMPILATION_CACHE_DIR` is used as it is; otherwise the
session makes a temporary one and removes it at the end.

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
import shutil
import tempfile

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

_SESSION_CACHE = None
if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  _SESSION_CACHE = tempfile.mkdtemp(prefix='bn_rnn_jax_tests_xla_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _SESSION_CACHE
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
  compiled again, or read back from the session's persistent cache).
  """
  yield
  jax.clear_caches()
  gc.collect()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _SESSION_CACHE:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
