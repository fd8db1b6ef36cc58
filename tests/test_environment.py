"""`environment.py`: what `train_and_evaluate` sets up around a run. A compilation cache
folder that cannot be written is one warning line instead of a warning per program (in a
fresh process, whose cache folder is read-only /sys); the loop's INFO lines are logged
unless the program chose absl's verbosity (the lines themselves: tests/test_loop.py)."""

import logging

from absl import logging as absl_logging

from bn_rnn_jax.training import environment
import helpers

# Three programs compiled inside, one after: JAX warns for each program it cannot write.
_CACHE_SCRIPT = '''
import sys
import jax, jax.numpy as jnp
from bn_rnn_jax.training import environment
with environment.compilation_cache():
  for i in range(3):
    jax.jit(lambda x, i=i: x * i + 1)(jnp.ones(3)).block_until_ready()
print('LEFT', file=sys.stderr, flush=True)
jax.jit(lambda x: x - 1)(jnp.ones(3)).block_until_ready()
'''


def test_an_unwritable_compilation_cache_is_one_line_and_the_setting_comes_back():
  # /sys is read-only even for root (chmod does not stop root).
  done = helpers.run_python(['-c', _CACHE_SCRIPT], one_device=True, env=helpers.subprocess_env(
      JAX_COMPILATION_CACHE_DIR='/sys/kernel', JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0'))
  assert done.returncode == 0, done.stderr[-3000:]
  inside, after = done.stderr.split('LEFT\n')
  lines = [line for line in inside.splitlines() if 'compilation cache' in line]
  assert len(lines) == 1 and lines[0].endswith(
      'The compilation cache folder /sys/kernel cannot be written (Permission denied): this '
      'run reads the programs already there and saves none (set JAX_COMPILATION_CACHE_DIR '
      'to a writable folder to save them).'), inside
  assert "Error writing persistent compilation cache entry for 'jit__lambda'" in after


def test_log_lines_are_left_to_a_program_that_chose_absls_verbosity():
  logger = absl_logging.get_absl_logger()
  with environment.log_lines_shown():
    assert logger.level == logging.INFO
  assert logger.level == logging.NOTSET
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    with environment.log_lines_shown():
      assert logger.level == logging.WARNING
  finally:
    logger.setLevel(logging.NOTSET)
