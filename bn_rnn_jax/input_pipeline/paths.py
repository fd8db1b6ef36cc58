"""Where datasets live: one data root, `config.data.root` or else `$BN_RNN_JAX_DATA`.

A relative dataset path of the config is read under the root, an absolute one as it is;
paths come out absolute, so every error of a reader names the absolute path it tried.
"""

from __future__ import annotations

import os
from typing import Optional

#: The environment variable that names the data root when `config.data.root` is empty.
ENV_VAR = 'BN_RNN_JAX_DATA'
HOW_TO_SET = (f'pass --config.data.root=/path/to/datasets or set the environment variable '
              f'{ENV_VAR}=/path/to/datasets')


def data_root(configured: str = '') -> Optional[str]:
  """The absolute data root: `configured` (config.data.root), else `$BN_RNN_JAX_DATA`, else
  None."""
  root = configured or os.environ.get(ENV_VAR, '')
  return os.path.abspath(os.path.expanduser(root)) if root else None


def resolve_path(data_config, field: str) -> str:
  """The absolute path that `config.data.<field>` names. A one-line ValueError for an empty
  field or a relative path with no root set, FileNotFoundError for a root that is not a folder."""
  path = data_config[field]
  if not path:
    raise ValueError(f'config.data.{field} is empty; name the file or folder (relative to '
                     f'the data root, or absolute).')
  path = os.path.expanduser(str(path))
  if os.path.isabs(path):
    return os.path.normpath(path)
  configured = data_config.get('root', '') or ''
  root = data_root(configured)
  if root is None:
    raise ValueError(f'config.data.{field}={path!r} is relative to the data root, and no '
                     f'data root is set: {HOW_TO_SET}.')
  if not os.path.isdir(root):
    where = 'config.data.root' if configured else f'${ENV_VAR}'
    raise FileNotFoundError(f'The data root {root} ({where}) is not a folder; {HOW_TO_SET}.')
  return os.path.normpath(os.path.join(root, path))
