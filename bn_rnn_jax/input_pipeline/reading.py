"""Reading comprehension: the DeepMind Q&A cloze format (Hermann et al. 2015).

Source layouts (`config.data.path`), read as they are distributed, never unpacked by hand:
  * a folder `<path>/questions/{training,validation,test}/*.question` (as `cnn.tgz` unpacks),
  * a folder `<path>/{training,validation,test}/*.question` (as `brown_cloze/` has them),
  * a `.tgz` / `.tar.gz` archive holding either layout (`cnn.tgz`, `brown_cloze_large.tgz`),
    or a folder holding exactly one such archive; members are read with `tarfile`.

A `.question` file (DeepMind's `generate_questions.py`, no final newline) is five blocks
separated by blank lines: url, context (one line of tokens), query (with `@placeholder`),
answer (`@entityN`), and one `@entityN:surface form` line per entity. A file that does not
have this shape is an error naming the file and what is wrong.

Symbols. Ids `0 <pad>`, `1 <unk>`, `2 @placeholder`, `3 .. 3+E-1` the entity markers
`@entity0 .. @entity{E-1}` (E = 1 + the largest entity index in any split), then the
training words by frequency (ties alphabetically), capped at `config.data.vocab_size`
symbols in all (0 = every training word; Cooijmans et al. App. C used 65,829 words on CNN).
Words outside the vocabulary, and words that occur only in validation or test, are `<unk>`.

Caching. Parsing 28k files takes seconds to a minute, so the token ids are written once to
`<cache_dir>/reading_<key>.npz` (`config.data.cache_dir`, default `<workdir>/data_cache`;
no cache when both are unset) and read back on the next start. The key hashes the source's
path, size and modification times, the vocabulary cap, the top-k option and the format
version, so a changed source or option parses again. The data folder may be read-only.

Batches (numpy, a pure function of `(seed, step)`; the dataset interface of
`bn_rnn_jax.input_pipeline`):
  {'inputs': {'document': int32 [B, T], 'document_mask': float32 [B, T],
              'query': int32 [B, Q], 'query_mask': float32 [B, Q],
              'candidates': float32 [B, E] (1 = this entity occurs in the document)},
   'labels': int32 [B] (the answer's entity index), 'weights': float32 [B]}
T and Q are the batch's longest document and query, rounded up to a multiple of
`config.data.length_multiple`, so that XLA compiles one program per few lengths. Padding
(mask 0) holds `<pad>`. There is no top-level 'mask': the model takes both masks from
'inputs'.

Training (Cooijmans et al. App. C): examples are sampled with replacement, and every
example's entity ids are permuted at random (`shuffle_entities`: the answer, the
candidates and every `@entityN` of the document and query move together), both drawn from
`numpy.random.default_rng([seed, step])`, so resuming at step k reads what an uninterrupted
run reads. `config.data.length_groups > 1` turns on length bucketing: the training
examples are sorted by document length into that many groups of equal size, each step
draws a group (probability by size) and samples its batch inside it (less padding).

Evaluation: `eval_batches(split)` covers 'valid' or 'test' once, in order of document
length (shortest first; ties in file-name order), in batches of `config.eval.batch_size`
padded with weight-0 examples; entities are not shuffled.

The paper's CNN shortcut (App. C) is `config.data.top_k_sentences = k` (they used 4; 0 =
off, the default): only the k context sentences that share the most distinct tokens with
the query (ties: earlier) are kept, in their original order. Sentences end at `.`, `!` or
`?` tokens. The answer can be stripped that way; such examples stay, can never be
answered, and count as errors (as the paper's 57 % upper bound on CNN validation).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import tarfile
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from bn_rnn_jax import input_pipeline

FORMAT_VERSION = 1
PAD, UNK, PLACEHOLDER = '<pad>', '<unk>', '@placeholder'
SPECIALS = (PAD, UNK, PLACEHOLDER)
ENTITY_OFFSET = len(SPECIALS)             # id of @entity0
SPLIT_FOLDERS = {'train': 'training', 'valid': 'validation', 'test': 'test'}
SENTENCE_ENDS = frozenset({'.', '!', '?'})
ARCHIVE_SUFFIXES = ('.tgz', '.tar.gz')


# ====================================================================== parsing
def entity_index(token: str) -> Optional[int]:
  """N of an `@entityN` token; None for any other token."""
  if token.startswith('@entity') and token[7:].isdigit():
    return int(token[7:])
  return None


def parse_question(text: str, name: str) -> dict[str, Any]:
  """One `.question` file's text as `{'url', 'context', 'query', 'answer'}`.

  context and query are token lists, answer the entity index. `name` (the file) goes into
  the one-line error raised for a file that is not in the DeepMind format.
  """
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


def top_k_sentences(context: Sequence[str], query: Sequence[str], k: int) -> list[str]:
  """The k context sentences sharing most distinct tokens with the query, in order.

  Cooijmans et al. App. C ("the 4 most relevant sentences ... by a string matching
  procedure"); ties go to the earlier sentence. `@placeholder` does not count.
  """
  sentences, current = [], []
  for token in context:
    current.append(token)
    if token in SENTENCE_ENDS:
      sentences.append(current)
      current = []
  if current:
    sentences.append(current)
  if len(sentences) <= k:
    return list(context)
  words = set(query) - {PLACEHOLDER}
  scores = [len(words.intersection(s)) for s in sentences]
  keep = sorted(sorted(range(len(sentences)), key=lambda i: (-scores[i], i))[:k])
  return [token for i in keep for token in sentences[i]]


# ====================================================================== sources
def _archive_in(folder: str) -> Optional[str]:
  archives = [f for f in sorted(os.listdir(folder)) if f.endswith(ARCHIVE_SUFFIXES)]
  return os.path.join(folder, archives[0]) if len(archives) == 1 else None


def resolve_source(path: str) -> tuple[str, str]:
  """`('archive', file)` or `('folder', folder holding training/ validation/ test/)`."""
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


def _split_of(member: str) -> Optional[str]:
  parts = member.split('/')
  for split, folder in SPLIT_FOLDERS.items():
    if len(parts) >= 2 and parts[-2] == folder:
      return split
  return None


def iter_question_files(kind: str, location: str) -> Iterator[tuple[str, str, str]]:
  """`(split, name, text)` of every `.question` file of a resolved source."""
  if kind == 'archive':
    try:
      with tarfile.open(location, 'r:*') as archive:
        for member in archive:
          if member.isfile() and member.name.endswith('.question'):
            split = _split_of(member.name)
            if split is not None:
              text = archive.extractfile(member).read().decode('utf-8')
              yield split, f'{location}:{member.name}', text
    except (tarfile.TarError, EOFError, OSError) as e:
      raise ValueError(f'{location}: cannot read the archive ({e}).') from None
    return
  for split, folder in SPLIT_FOLDERS.items():
    directory = os.path.join(location, folder)
    if not os.path.isdir(directory):
      raise FileNotFoundError(f'Missing split folder {directory}.')
    for name in sorted(os.listdir(directory)):
      if name.endswith('.question'):
        file = os.path.join(directory, name)
        with open(file, encoding='utf-8') as f:
          yield split, file, f.read()


def source_fingerprint(kind: str, location: str) -> dict[str, Any]:
  """What the cache key depends on: path, sizes and modification times."""
  if kind == 'archive':
    stat = os.stat(location)
    return {'path': os.path.realpath(location), 'size': stat.st_size,
            'mtime': stat.st_mtime}
  parts = {'path': os.path.realpath(location)}
  for folder in SPLIT_FOLDERS.values():
    directory = os.path.join(location, folder)
    parts[folder] = [len(os.listdir(directory)), os.stat(directory).st_mtime]
  return parts


# ====================================================================== encoding
def build_vocab(documents: Iterable[Sequence[str]], num_entities: int,
                vocab_size: int = 0) -> list[str]:
  """Specials, `@entity0..@entity{E-1}`, then training words by frequency (ties
  alphabetically), `vocab_size` symbols in all (0 = no cap)."""
  counts = collections.Counter(
      t for tokens in documents for t in tokens
      if t not in SPECIALS and entity_index(t) is None)
  fixed = list(SPECIALS) + [f'@entity{i}' for i in range(num_entities)]
  words = sorted(counts, key=lambda w: (-counts[w], w))
  if vocab_size:
    if vocab_size <= len(fixed):
      raise ValueError(f'config.data.vocab_size={vocab_size} leaves no room for words: '
                       f'the {len(fixed)} special and entity symbols come first.')
    words = words[:vocab_size - len(fixed)]
  return fixed + words


def encode_tokens(tokens: Sequence[str], ids: dict[str, int]) -> np.ndarray:
  unk = ids[UNK]
  return np.asarray([ids.get(t, unk) for t in tokens], np.int32)


def _ragged(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated rows and their `[N + 1]` offsets."""
  offsets = np.zeros(len(rows) + 1, np.int64)
  offsets[1:] = np.cumsum([len(r) for r in rows])
  flat = np.concatenate(rows) if rows else np.zeros(0, np.int32)
  return flat.astype(np.int32), offsets


def parse_source(path: str, vocab_size: int = 0, top_k: int = 0) -> dict[str, np.ndarray]:
  """Parse every split of a source into token ids: the arrays `load` caches.

  Keys: 'vocab' [V] str, 'num_entities', and per split s: `s/document`, `s/document_offsets`,
  `s/query`, `s/query_offsets`, `s/answer` [N] (ragged rows: ids[offsets[i]:offsets[i+1]]).
  """
  kind, location = resolve_source(path)
  examples = {split: [] for split in SPLIT_FOLDERS}
  for split, name, text in iter_question_files(kind, location):
    example = parse_question(text, name)
    if top_k:
      example['context'] = top_k_sentences(example['context'], example['query'], top_k)
    example['name'] = name
    examples[split].append(example)
  for split, rows in examples.items():
    if not rows:
      raise ValueError(f'{location}: no .question files in the {SPLIT_FOLDERS[split]} split.')
    rows.sort(key=lambda e: e['name'])
  largest = max(max([e['answer']] + [entity_index(t) for t in e['context'] + e['query']
                                     if entity_index(t) is not None])
                for rows in examples.values() for e in rows)
  num_entities = largest + 1
  vocab = build_vocab([e['context'] + e['query'] for e in examples['train']], num_entities,
                      vocab_size)
  ids = {w: i for i, w in enumerate(vocab)}
  arrays = {'vocab': np.asarray(vocab), 'num_entities': np.int64(num_entities)}
  for split, rows in examples.items():
    for field, key in (('context', 'document'), ('query', 'query')):
      arrays[f'{split}/{key}'], arrays[f'{split}/{key}_offsets'] = _ragged(
          [encode_tokens(e[field], ids) for e in rows])
    arrays[f'{split}/answer'] = np.asarray([e['answer'] for e in rows], np.int32)
  return arrays


def load(path: str, vocab_size: int = 0, top_k: int = 0,
         cache_dir: Optional[str] = None) -> dict[str, np.ndarray]:
  """`parse_source`, read from / written to `cache_dir` when one is given."""
  if cache_dir is None:
    return parse_source(path, vocab_size, top_k)
  kind, location = resolve_source(path)
  key = json.dumps({'source': source_fingerprint(kind, location), 'vocab_size': vocab_size,
                    'top_k': top_k, 'version': FORMAT_VERSION}, sort_keys=True)
  file = os.path.join(cache_dir, f'reading_{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz')
  if os.path.exists(file):
    with np.load(file, allow_pickle=False) as cached:
      return {k: cached[k] for k in cached.files}
  arrays = parse_source(path, vocab_size, top_k)
  os.makedirs(cache_dir, exist_ok=True)
  partial = file + '.partial.npz'
  np.savez(partial, **arrays)
  os.replace(partial, file)   # a killed run never leaves half a cache behind
  return arrays


# ====================================================================== batches
def pad_rows(flat: np.ndarray, offsets: np.ndarray, index: np.ndarray,
             multiple: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows `index` of a ragged array as `([B, T] ids, [B, T] mask)`, T the longest row
  rounded up to `multiple`; padding is `<pad>` (id 0) with mask 0."""
  lengths = offsets[index + 1] - offsets[index]
  width = max(1, int(lengths.max()))
  width = -(-width // multiple) * multiple
  ids = np.zeros((len(index), width), np.int32)
  steps = np.arange(width)[None, :]
  mask = steps < lengths[:, None]
  positions = np.minimum(offsets[index][:, None] + steps, max(len(flat) - 1, 0))
  ids[mask] = flat[positions[mask]]
  return ids, mask.astype(np.float32)


def candidate_mask(document: np.ndarray, num_entities: int) -> np.ndarray:
  """`[B, E]` float32: 1 where entity e occurs in the document `[B, T]` (padding is id 0,
  not an entity, so it adds nothing)."""
  entity = document - ENTITY_OFFSET
  is_entity = (entity >= 0) & (entity < num_entities)
  mask = np.zeros((document.shape[0], num_entities), np.float32)
  rows = np.broadcast_to(np.arange(document.shape[0])[:, None], document.shape)
  mask[rows[is_entity], entity[is_entity]] = 1.0
  return mask


def shuffle_entities(batch: dict[str, Any], permutations: np.ndarray) -> dict[str, Any]:
  """Rename entity e of example b to `permutations[b, e]` everywhere in it.

  permutations: `[B, E]` int, each row a permutation of 0..E-1. The documents' and
  queries' `@entityN` ids, the candidate mask and the label all move together, so the
  answer stays the same entity under a new name.
  """
  inputs = dict(batch['inputs'])
  num_entities = permutations.shape[1]
  def rename(ids):
    entity = ids - ENTITY_OFFSET
    is_entity = (entity >= 0) & (entity < num_entities)
    renamed = np.take_along_axis(permutations, np.where(is_entity, entity, 0), axis=1)
    return np.where(is_entity, renamed + ENTITY_OFFSET, ids).astype(np.int32)
  inputs['document'] = rename(inputs['document'])
  inputs['query'] = rename(inputs['query'])
  candidates = np.zeros_like(inputs['candidates'])
  np.put_along_axis(candidates, permutations, inputs['candidates'], axis=1)
  inputs['candidates'] = candidates
  labels = np.take_along_axis(permutations, batch['labels'][:, None], axis=1)[:, 0]
  return {**batch, 'inputs': inputs, 'labels': labels.astype(np.int32)}


class ReadingDataset:
  """Cloze reading comprehension (the dataset interface of `bn_rnn_jax.input_pipeline`).

  `arrays` is what `load` returns. Batch sizes are global; each process gets its share.
  """
  task = 'reading_comprehension'
  carries_state = False

  def __init__(self, arrays: dict[str, np.ndarray], *, batch_size: int, seed: int,
               eval_batch_size: Optional[int] = None, length_multiple: int = 32,
               length_groups: int = 1, process_index: int = 0, process_count: int = 1):
    self.arrays = arrays
    self.vocab = [str(w) for w in arrays['vocab']]
    self.num_entities = int(arrays['num_entities'])
    self.batch_size = batch_size
    self.eval_batch_size = eval_batch_size or batch_size
    self.seed = seed
    if length_multiple <= 0 or length_groups <= 0:
      raise ValueError(f'config.data.length_multiple ({length_multiple}) and '
                       f'config.data.length_groups ({length_groups}) must be positive.')
    self.length_multiple = length_multiple
    self.process_index, self.process_count = process_index, process_count
    self.local_batch = input_pipeline.per_process_batch(batch_size, process_count)
    lengths = self.lengths('train', 'document')
    self.num_train = len(lengths)
    # Length groups: training examples sorted by document length, cut into equal parts.
    self.groups = np.array_split(np.argsort(lengths, kind='stable'), length_groups)
    longest = max(int(self.lengths(split, key).max()) for split in ('train',)
                  for key in ('document', 'query'))
    self.train_length = -(-longest // length_multiple) * length_multiple
    self.model_kwargs = {'vocab_size': len(self.vocab), 'num_entities': self.num_entities}
    self.steps_per_epoch = max(1, self.num_train // batch_size)

  def lengths(self, split: str, key: str) -> np.ndarray:
    offsets = self.arrays[f'{split}/{key}_offsets']
    return offsets[1:] - offsets[:-1]

  def num_examples(self, split: str) -> int:
    return len(self.arrays[f'{split}/answer'])

  def batch(self, split: str, index: np.ndarray) -> dict[str, Any]:
    """Examples `index` of `split`, unshuffled, padded (weights 1)."""
    a, m = self.arrays, self.length_multiple
    document, document_mask = pad_rows(a[f'{split}/document'],
                                       a[f'{split}/document_offsets'], index, m)
    query, query_mask = pad_rows(a[f'{split}/query'], a[f'{split}/query_offsets'], index, m)
    return {'inputs': {'document': document, 'document_mask': document_mask,
                       'query': query, 'query_mask': query_mask,
                       'candidates': candidate_mask(document, self.num_entities)},
            'labels': a[f'{split}/answer'][index].astype(np.int32),
            'weights': np.ones(len(index), np.float32)}

  def train_indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """`(example indices, entity permutations)` of the global batch of `step`."""
    if step < 0:
      raise ValueError(f'step must be >= 0; got {step}.')
    rng = np.random.default_rng([self.seed, step])
    sizes = np.asarray([len(g) for g in self.groups], np.float64)
    group = self.groups[rng.choice(len(self.groups), p=sizes / sizes.sum())]
    index = group[rng.integers(0, len(group), self.batch_size)]
    permutations = np.argsort(rng.random((self.batch_size, self.num_entities)), axis=1)
    return index, permutations

  def train_batch(self, step: int) -> dict[str, Any]:
    index, permutations = self.train_indices(step)
    part = slice(self.process_index * self.local_batch,
                 (self.process_index + 1) * self.local_batch)
    # Pad to the global batch's longest document, so every process has the same shape.
    batch = shuffle_entities(self.batch('train', index), permutations)
    return {k: ({n: x[part] for n, x in v.items()} if isinstance(v, dict) else v[part])
            for k, v in batch.items()}

  def eval_batches(self, split: str) -> Iterator[dict[str, Any]]:
    split = {'validation': 'valid'}.get(split, split)
    if f'{split}/answer' not in self.arrays:
      raise ValueError(f"Unknown split {split!r}; have 'train', 'valid', 'test'.")
    n = self.num_examples(split)
    # Shortest documents first: batches of similar lengths carry little padding.
    order = np.argsort(self.lengths(split, 'document'), kind='stable')
    for start in range(0, n, self.eval_batch_size):
      index = np.arange(start, start + self.eval_batch_size)
      weights = (index < n).astype(np.float32)
      batch = self.batch(split, order[np.where(index < n, index, 0)])
      batch['weights'] = weights
      local = self.eval_batch_size // self.process_count
      part = slice(self.process_index * local, (self.process_index + 1) * local)
      yield {k: ({n_: x[part] for n_, x in v.items()} if isinstance(v, dict) else v[part])
             for k, v in batch.items()}


# ====================================================================== baselines
def frequency_baselines(arrays: dict[str, np.ndarray], split: str) -> dict[str, float]:
  """Accuracy of the data's salience baselines on `split` (Hermann et al. 2015 sec. 4):
  most frequent context entity, and exclusive frequency (the most frequent context entity
  that does not occur in the query); ties go to the lowest id (the earliest mention). Also
  the expected accuracy of a random candidate (mean of 1 / #entities in the context)."""
  num_entities = int(arrays['num_entities'])
  document, query = arrays[f'{split}/document'], arrays[f'{split}/query']
  doc_off, query_off = arrays[f'{split}/document_offsets'], arrays[f'{split}/query_offsets']
  answers = arrays[f'{split}/answer']
  hits = {'most_frequent': 0, 'exclusive_frequency': 0, 'random_candidate': 0.0}
  for i, answer in enumerate(answers):
    entity = document[doc_off[i]:doc_off[i + 1]] - ENTITY_OFFSET
    counts = np.bincount(entity[(entity >= 0) & (entity < num_entities)],
                         minlength=num_entities)
    hits['most_frequent'] += int(np.argmax(counts) == answer)
    hits['random_candidate'] += 1.0 / max(int(np.count_nonzero(counts)), 1)
    in_query = query[query_off[i]:query_off[i + 1]] - ENTITY_OFFSET
    exclusive = counts.copy()
    exclusive[in_query[(in_query >= 0) & (in_query < num_entities)]] = 0
    pick = np.argmax(exclusive) if exclusive.max() > 0 else np.argmax(counts)
    hits['exclusive_frequency'] += int(pick == answer)
  return {k: v / len(answers) for k, v in hits.items()}


# ====================================================================== entry points
def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1) -> ReadingDataset:
  """The dataset of `config.data` (fields: see `default_data_config`)."""
  d = config.data
  cache_dir = d.get('cache_dir') or (os.path.join(workdir, 'data_cache') if workdir else None)
  arrays = load(d.path, vocab_size=d.get('vocab_size', 0), top_k=d.get('top_k_sentences', 0),
                cache_dir=cache_dir)
  return ReadingDataset(arrays, batch_size=config.train.batch_size, seed=config.seed,
                        eval_batch_size=config.eval.get('batch_size', None),
                        length_multiple=d.get('length_multiple', 32),
                        length_groups=d.get('length_groups', 1),
                        process_index=process_index, process_count=process_count)


def default_data_config(name: str = 'brown_cloze_large'):
  """`config.data` of a cloze set (paths relative to the working directory; the project
  machines keep the sets in `../shared/data/`). For CNN / Daily Mail set `path` to the
  `cnn.tgz` / `dailymail.tgz` you have (or the folder it unpacks to)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  paths = {'brown_cloze_large': '../shared/data/brown_cloze_large/brown_cloze_large.tgz',
           'brown_cloze': '../shared/data/brown_cloze', 'cnn': 'data/cnn.tgz',
           'dailymail': 'data/dailymail.tgz'}
  if name not in paths:
    raise ValueError(f'Unknown reading-comprehension set {name!r}; choose one of '
                     f'{sorted(paths)}.')
  data = ml_collections.ConfigDict()
  data.name = name
  data.path = paths[name]       # folder or .tgz in the DeepMind layout
  data.vocab_size = 0           # symbols in all (0 = every training word)
  data.top_k_sentences = 0      # Cooijmans App. C CNN shortcut (they used 4); 0 = off
  data.length_multiple = 32     # pad T and Q to a multiple of this (few XLA programs)
  data.length_groups = 1        # > 1: sample each batch within one document-length group
  data.cache_dir = ''           # '' = <workdir>/data_cache
  return data
