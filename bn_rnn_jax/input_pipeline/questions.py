"""DeepMind Q&A `.question` files: one file parsed, and every file of a source found.

A source (`config.data.path`) is read as distributed: a folder
`<path>/questions/{training,validation,test}/*.question` or `<path>/{training,...}/`, a
`.tgz` / `.tar.gz` holding either layout for one data set (one holding two is refused),
or a folder holding exactly one such archive, checked through gzip to its end first.
A `.question` file is five blocks separated by blank lines: url, context, query (with
`@placeholder`), answer (`@entityN`) and one `@entityN:name` line per entity. Every error
is one line naming the file (for an archive, `<archive>:<member>`).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zlib
from typing import Any, Iterator, Optional

from bn_rnn_jax.input_pipeline import files

PLACEHOLDER = '@placeholder'
SPLIT_FOLDERS = {'train': 'training', 'valid': 'validation', 'test': 'test'}
ARCHIVE_SUFFIXES = ('.tgz', '.tar.gz')


# ====================================================================== one file
def entity_index(token: str) -> Optional[int]:
  """N of an `@entityN` token; None for any other token."""
  if token.startswith('@entity') and token[7:].isdigit():
    return int(token[7:])
  return None


def parse_question(text: str, name: str) -> dict[str, Any]:
  """One `.question` file's text as `{'url', 'context', 'query', 'answer'}`: token lists and
  the answer's entity index; a one-line error naming `name` for a file not in the format."""
  blocks = text.strip('\n').split('\n\n')
  if len(blocks) < 4:
    raise ValueError(f'{name}: malformed question file: expected url, context, query, '
                     f'answer and entity blocks separated by blank lines; found '
                     f'{len(blocks)} block(s).')
  url, context, query, answer = (b.strip() for b in blocks[:4])
  context, query = context.split(), query.split()
  if not context:
    raise ValueError(f'{name}: malformed question file: the context is empty.')
  if PLACEHOLDER not in query:
    raise ValueError(f'{name}: malformed question file: the query has no {PLACEHOLDER}.')
  index = entity_index(answer)
  if index is None:
    raise ValueError(f'{name}: malformed question file: the answer {answer[:40]!r} is not '
                     'an @entityN marker.')
  for line in blocks[4:] if len(blocks) > 4 else ():
    for entry in line.split('\n'):
      if entry and entity_index(entry.split(':', 1)[0]) is None:
        raise ValueError(f'{name}: malformed question file: entity line {entry[:40]!r} '
                         'does not read @entityN:name.')
  return {'url': url, 'context': context, 'query': query, 'answer': index}


# ====================================================================== sources
def _archive_in(folder: str) -> Optional[str]:
  archives = [f for f in sorted(os.listdir(folder)) if f.endswith(ARCHIVE_SUFFIXES)]
  if len(archives) > 1:
    raise ValueError(f'{folder} holds {len(archives)} archives ({", ".join(archives)}); set '
                     'config.data.path to the one to read.')
  return os.path.join(folder, archives[0]) if archives else None


def resolve_source(path: str) -> tuple[str, str]:
  """`('archive', file)` or `('folder', folder holding training/ validation/ test/)`,
  both absolute."""
  path = os.path.abspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f'Reading-comprehension data not found: {path} does not exist '
                            '(set config.data.path to a DeepMind Q&A folder or .tgz).')
  if os.path.isfile(path):
    if not path.endswith(ARCHIVE_SUFFIXES):
      raise ValueError(f'{path}: expected a folder or a .tgz / .tar.gz archive.')
    return 'archive', path
  for root in (os.path.join(path, 'questions'), path):
    if os.path.isdir(os.path.join(root, 'training')):
      return 'folder', root
  archive = _archive_in(path)
  if archive is not None:
    return 'archive', archive
  raise FileNotFoundError(f'{path} holds neither questions/training/ nor training/ '
                          '(*.question files) nor one .tgz archive of them.')


def _split_of(parts: list[str]) -> Optional[str]:
  for split, folder in SPLIT_FOLDERS.items():
    if len(parts) >= 2 and parts[-2] == folder:
      return split
  return None


def _folder_files(location: str) -> Iterator[tuple[str, str]]:
  """`(split, file)` of every `.question` file of a folder source, in sorted order."""
  for split, folder in SPLIT_FOLDERS.items():
    directory = os.path.join(location, folder)
    if not os.path.isdir(directory):
      raise FileNotFoundError(f'Missing split folder {directory}.')
    for name in sorted(os.listdir(directory)):
      if name.endswith('.question'):
        yield split, os.path.join(directory, name)


def _archive_members(location: str) -> Iterator[tuple[str, str, bytes]]:
  """`(split, member name, bytes)` of every `.question` member of a verified archive."""
  files.verify_gzip(location)
  roots = {}
  try:
    with tarfile.open(location, 'r:gz') as archive:
      for member in archive:
        parts = member.name.split('/')
        split = _split_of(parts)
        if not (member.isfile() and member.name.endswith('.question')) or split is None:
          continue
        root = '/'.join(parts[:-2]) or '.'
        roots.setdefault(root, member.name)
        if len(roots) > 1:
          first, second = roots.values()
          raise ValueError(f'{location} holds more than one data set ({first} and '
                           f'{member.name} lie under different folders); give one archive '
                           'per data set.')
        try:
          data = archive.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
          raise ValueError(f'{location}:{member.name}: cannot read this member '
                           f'({e}).') from None
        yield split, member.name, data
  except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
    raise ValueError(f'{location}: cannot read the archive ({e}).') from None


def iter_question_files(kind: str, location: str) -> Iterator[tuple[str, str, str]]:
  """`(split, name, text)` of every `.question` file of a resolved source; `name` is the
  file, or `<archive>:<member>`."""
  if kind == 'archive':
    for split, member, data in _archive_members(location):
      name = f'{location}:{member}'
      yield split, name, files.decode_text(data, name)
    return
  for split, file in _folder_files(location):
    yield split, file, files.read_text(file)


def source_digest(kind: str, location: str) -> str:
  """SHA-256 (hex) of a resolved source's content: the archive's bytes, or the names and
  bytes of every `.question` file of the folder."""
  if kind == 'archive':
    return files.file_digest(location)
  digest = hashlib.sha256()
  for split, file in _folder_files(location):
    with open(file, 'rb') as f:
      data = f.read()
    digest.update(f'{split}/{os.path.basename(file)}\0{len(data)}\0'.encode())
    digest.update(data)
  return digest.hexdigest()
