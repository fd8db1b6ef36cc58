"""What `train_and_evaluate` sets up around a run, as context managers that leave the
process's logging, warning filters and JAX config as they found them."""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import tempfile
import warnings
from typing import Iterator, Optional

import jax

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  from absl import logging


@contextlib.contextmanager
def log_lines_shown(*filters: std_logging.Filter) -> Iterator[None]:
  """Inside, absl's INFO lines (progress, evaluations, checkpoints) are logged, to the
  program's handlers or else stderr, when the program has not chosen absl's verbosity
  (no absl handler, no `absl.logging.set_verbosity`); `filters` apply to absl's lines
  meanwhile."""
  logger = logging.get_absl_logger()
  if (logging.get_absl_handler() in std_logging.getLogger().handlers
      or logger.level != std_logging.NOTSET):
    yield
    return
  logger.setLevel(std_logging.INFO)
  for log_filter in filters:
    logger.addFilter(log_filter)
  try:
    yield
  finally:
    for log_filter in filters:
      logger.removeFilter(log_filter)
    logger.setLevel(std_logging.NOTSET)


#: The starts of the warnings JAX gives for each program it cannot write to, or read
#: from, its persistent compilation cache.
_CACHE_WARNINGS = ('Error writing persistent compilation cache entry',
                   'Error reading persistent compilation cache entry')


def unwritable_cache_folder() -> Optional[str]:
  """Why JAX's persistent compilation cache folder (`jax_compilation_cache_dir`, e.g.
  from `JAX_COMPILATION_CACHE_DIR`) cannot be written, or None when it can or none is
  set (a remote path, `scheme://...`, is not checked)."""
  folder = jax.config.jax_compilation_cache_dir
  if not folder or '://' in folder:
    return None
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


@contextlib.contextmanager
def compilation_cache() -> Iterator[None]:
  """Inside, a persistent compilation cache folder that cannot be written is one warning line,
  and JAX neither writes programs to it nor warns per program (it still reads them)."""
  problem = unwritable_cache_folder()
  if problem is None:
    yield
    return
  logging.warning('The compilation cache folder %s cannot be written (%s): this run '
                  'reads the programs already there and saves none (set '
                  'JAX_COMPILATION_CACHE_DIR to a writable folder to save them).',
                  os.path.abspath(jax.config.jax_compilation_cache_dir), problem)
  minimum = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update('jax_persistent_cache_min_compile_time_secs', float('inf'))
  try:
    with warnings.catch_warnings():
      for start in _CACHE_WARNINGS:
        warnings.filterwarnings('ignore', message=start, category=UserWarning)
      yield
  finally:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', minimum)
