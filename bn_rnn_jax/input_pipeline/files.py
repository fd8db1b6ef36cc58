"""Reading and caching data files, every failure one line naming the file: UTF-8 text,
gzip archives checked to their end, SHA-256 digests, and checked `.npz` caches."""

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
  """`data` decoded as UTF-8 with `\\n` line ends (CRLF and CR read as LF, a byte-order
  mark dropped); a byte that is not UTF-8 is an error naming `name`, offset and line."""
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
  """Read the gzip file `path` to its end, checking every member's CRC-32 and length
  (`tarfile` stops at the end-of-archive marker); a damaged one is a one-line ValueError."""
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
  """Write `arrays` with `meta` (JSON) and their checksum to the `.npz` file `file`, atomically
  (a unique temporary file, renamed). Returns whether it was written: an unwritable folder
  is a warning."""
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
  """The arrays `save_arrays(file, arrays, meta)` wrote, read without unpickling; None when
  missing, and, with a warning, when damaged or written with another `meta` (stale)."""
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
