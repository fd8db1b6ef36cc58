"""Reading and caching data files, with every failure one line naming the file.

Shared by the readers of this package:
  * `decode_text`, `read_text`: UTF-8 text with `\\n` line ends (CRLF and CR read as LF,
    a byte-order mark dropped), so a file reads the same from a folder and from an
    archive; a byte that is not UTF-8 is an error naming the file, offset and line.
  * `verify_gzip`: a gzip file read to its end, so that the CRC-32 and length of every
    member are checked before the file is used (`tarfile` stops at the end-of-archive
    marker and never reads the gzip trailer).
  * `file_digest`, `arrays_checksum`: SHA-256 of a file's bytes, of a dict of arrays.
  * `save_arrays`, `load_arrays`: an `.npz` cache written under a unique temporary name
    and renamed into place (concurrent writers never collide, a killed one leaves no
    partial file), read back without unpickling, and checked: a damaged file, or one
    built from other data or settings, is reported as a warning and ignored.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from typing import Any, Optional

import numpy as np
from absl import logging

META_KEY = '__meta__'


# ====================================================================== text
def decode_text(data: bytes, name: str) -> str:
  """`data` decoded as UTF-8 with `\\n` line ends; `name` goes into the error."""
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    line = data.count(b'\n', 0, e.start) + 1
    raise ValueError(f'{name}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset '
                     f'{e.start} (line {line}): {e.reason}.') from None
  if text.startswith('\ufeff'):
    text = text[1:]
  return text.replace('\r\n', '\n').replace('\r', '\n')


def read_text(path: str) -> str:
  """The text of the file `path` (see `decode_text`)."""
  with open(path, 'rb') as f:
    return decode_text(f.read(), path)


# ====================================================================== archives
def verify_gzip(path: str) -> None:
  """Read the gzip file `path` to its end; a damaged one is a one-line ValueError."""
  try:
    with gzip.open(path, 'rb') as f:
      while f.read(1 << 20):
        pass
  except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
    raise ValueError(f'{path}: damaged gzip archive, it fails the gzip check of its '
                     f'CRC-32 and length ({e}); copy or download it again.') from None


def file_digest(path: str) -> str:
  """SHA-256 (hex) of the bytes of `path`."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


# ====================================================================== array caches
def arrays_checksum(arrays: dict[str, np.ndarray]) -> str:
  """SHA-256 (hex) over the names, dtypes, shapes and bytes of `arrays`."""
  digest = hashlib.sha256()
  for key in sorted(arrays):
    value = np.ascontiguousarray(arrays[key])
    digest.update(f'{key}|{value.dtype.str}|{value.shape}|'.encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def save_arrays(file: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bool:
  """Write `arrays` with `meta` (JSON) and their checksum to the `.npz` file `file`.

  Atomic: written to a uniquely named temporary file in the same folder, then renamed.
  A folder that cannot be written is a warning (the caller goes on without a cache);
  returns whether the file was written.
  """
  stored = {**meta, 'checksum': arrays_checksum(arrays)}
  folder = os.path.dirname(file) or '.'
  try:
    os.makedirs(folder, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=os.path.basename(file) + '.',
                                       suffix='.partial')
  except OSError as e:
    logging.warning('Cannot write the cache %s (%s); going on without it.', file, e)
    return False
  try:
    with os.fdopen(handle, 'wb') as f:
      np.savez(f, **arrays, **{META_KEY: np.asarray(json.dumps(stored, sort_keys=True))})
      f.flush()
      os.fsync(f.fileno())
    os.replace(partial, file)
  except OSError as e:
    logging.warning('Cannot write the cache %s (%s); going on without it.', file, e)
    return False
  finally:
    if os.path.exists(partial):
      os.unlink(partial)
  return True


def load_arrays(file: str, meta: dict[str, Any]) -> Optional[dict[str, np.ndarray]]:
  """The arrays `save_arrays(file, arrays, meta)` wrote, or None.

  None when there is no such file, and, with a warning saying why, when the file is
  damaged (unreadable, truncated, its checksum wrong) or was written with another `meta`
  (stale: other source data or settings). Never unpickles.
  """
  if not os.path.exists(file):
    return None
  try:
    with np.load(file, allow_pickle=False) as npz:
      arrays = {k: npz[k] for k in npz.files}
    stored = json.loads(str(arrays.pop(META_KEY)))
  except Exception as e:  # pylint: disable=broad-except
    # Anything unreadable (a truncated zip, flipped bits, another format) only costs a
    # rebuild: the cache holds nothing that cannot be made again from the source.
    logging.warning('The cache %s is damaged (%s: %s); building it again.', file,
                    type(e).__name__, str(e).split('\n')[0])
    return None
  if not isinstance(stored, dict) or stored.pop('checksum', None) != arrays_checksum(arrays):
    logging.warning('The cache %s is damaged (its checksum does not match its arrays); '
                    'building it again.', file)
    return None
  changed = sorted(k for k in set(stored) | set(meta) if stored.get(k) != meta.get(k))
  if changed:
    logging.warning('The cache %s is stale (built from another %s); building it again.',
                    file, ', '.join(changed))
    return None
  return arrays
