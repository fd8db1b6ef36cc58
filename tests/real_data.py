"""The real datasets under the data root `$BN_RNN_JAX_DATA` (tests/conftest.py points it
at the project machines' copy when present): their paths, and a skip marker for the
tests that read one (not a test module)."""

import os

import pytest

from bn_rnn_jax import input_pipeline


def path(*parts: str) -> str:
  """`<data root>/<parts>` (a placeholder root when none is set: it does not exist)."""
  root = input_pipeline.data_root() or f'<${input_pipeline.ENV_VAR} unset>'
  return os.path.join(root, *parts)


def needs(*parts: str):
  """Skip, naming what is missing, unless `<data root>/<parts>` exists."""
  if input_pipeline.data_root() is None:
    return pytest.mark.skip(reason=f'${input_pipeline.ENV_VAR} is not set: no real '
                                   f'{parts[0]} data to read')
  target = path(*parts)
  return pytest.mark.skipif(not os.path.exists(target), reason=f'{target} not found (the '
                            f'real data under ${input_pipeline.ENV_VAR})')
