"""The optional packages (setup.py's extras), and the one-line error when one is missing.

A module imports an extra's package inside `needed_by`:

  with extras.needed_by(__name__):
    import ml_collections

and without the package that import raises `MissingExtra`, one line naming the package
and the command that installs it (with `exit=True`, the program ends with that line).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

#: Top-level module of each optional package: (its distribution, the extra of setup.py
#: that installs it).
PACKAGES = {
    'ml_collections': ('ml_collections', 'train'),
    'optax': ('optax', 'train'),
    'orbax': ('orbax-checkpoint', 'train'),
    'absl': ('absl-py', 'train'),
    'tensorboardX': ('tensorboardX', 'train'),
    'tensorflow_datasets': ('tensorflow-datasets', 'data'),
    'array_record': ('array_record', 'data'),
    'sklearn': ('scikit-learn', 'data'),
    'kaldiio': ('kaldiio', 'data'),
    'flatbuffers': ('flatbuffers', 'export'),
    'matplotlib': ('matplotlib', 'plot'),
}


class MissingExtra(ModuleNotFoundError):
  """An optional package is not installed; the message says which extra installs it."""


def message(module: str, needed_by: str) -> str:
  """The line that names a missing package `module` (a top-level module of `PACKAGES`),
  what needs it, and how to install it."""
  distribution, extra = PACKAGES[module]
  return (f"{needed_by} needs {distribution} (the '{extra}' extra): pip install -e "
          f"'.[{extra}]' in the bn_rnn_jax repository")


@contextlib.contextmanager
def needed_by(who: str, exit: bool = False) -> Iterator[None]:  # pylint: disable=redefined-builtin
  """Imports inside that fail for want of an optional package raise `MissingExtra` naming it
  and `who` (with `exit`, end the program with that line); other import errors, and a
  `MissingExtra` raised further in, pass unchanged."""
  try:
    yield
  except MissingExtra as e:
    if exit:
      sys.exit(f'error: {e}')
    raise
  except ImportError as e:
    # A package may wrap the ModuleNotFoundError of its own optional import (jax.export
    # does for flatbuffers).
    cause = e.__cause__ if isinstance(e.__cause__, ImportError) else None
    top = (e.name or (cause and cause.name) or '').split('.')[0]
    if top not in PACKAGES:
      raise
    if exit:
      sys.exit(f'error: {message(top, who)}')
    raise MissingExtra(message(top, who), name=e.name) from None
