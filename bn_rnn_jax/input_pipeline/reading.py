"""Reading comprehension: DeepMind Q&A cloze questions (Hermann et al. 2015).

Sources and the `.question` format: `questions.py`. Ids: `0 <pad>`, `1 <unk>`,
`2 @placeholder`, then the entity markers `@entity0 .. @entity{E-1}` (E = 1 + the largest
entity index of any split), then the training words by frequency (ties alphabetically),
`config.data.vocab_size` symbols in all (0 = no cap); any other word is `<unk>`.
Questions whose answer entity does not occur in their context are dropped, in every
split, and counted in `dropped` [3] (train, valid, test). The parsed ids are cached in
`config.data.cache_dir` (default `<workdir>/data_cache`), keyed on the source's content
and the options.

Batches (the interface of `bn_rnn_jax.input_pipeline`, without a top-level 'mask'):
  {'inputs': {'document': int32 [B, T], 'document_mask': float32 [B, T],
              'query': int32 [B, Q], 'query_mask': float32 [B, Q],
              'candidates': float32 [B, E] (1 = the entity occurs in the document)},
   'labels': int32 [B] (the answer's entity index), 'weights': float32 [B]}
T and Q are the batch's longest document and query rounded up to a multiple of
`config.data.length_multiple`; padding is `<pad>` with mask 0. Training samples with
replacement and renames each example's entities (`shuffle_entities`); evaluation reads a
split once, shortest documents first.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
from absl import logging

from bn_rnn_jax import extras
from bn_rnn_jax import input_pipeline
from bn_rnn_jax.input_pipeline import files
from bn_rnn_jax.input_pipeline import paths
from bn_rnn_jax.input_pipeline.questions import entity_index
from bn_rnn_jax.input_pipeline.questions import iter_question_files
from bn_rnn_jax.input_pipeline.questions import parse_question
from bn_rnn_jax.input_pipeline.questions import PLACEHOLDER
from bn_rnn_jax.input_pipeline.questions import resolve_source
from bn_rnn_jax.input_pipeline.questions import source_digest
from bn_rnn_jax.input_pipeline.questions import SPLIT_FOLDERS

FORMAT_VERSION = 2
PAD, UNK = '<pad>', '<unk>'
SPECIALS = (PAD, UNK, PLACEHOLDER)
ENTITY_OFFSET = len(SPECIALS)             # id of @entity0
SENTENCE_ENDS = frozenset({'.', '!', '?'})


def top_k_sentences(context: Sequence[str], query: Sequence[str], k: int) -> list[str]:
  """The k context sentences sharing most distinct tokens with the query (not counting
  `@placeholder`; ties: the earlier), in their order (Cooijmans et al. App. C)."""
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


def _largest_entity(rows: Iterable[dict[str, Any]]) -> tuple[int, str]:
  """`(largest entity index, the file that holds it)` over examples."""
  largest, where = -1, ''
  for e in rows:
    indices = [e['answer']] + [entity_index(t) for t in e['context'] + e['query']]
    top = max(i for i in indices if i is not None)
    if top > largest:
      largest, where = top, e['name']
  return largest, where


def _read_examples(kind: str, location: str, top_k: int) -> dict[str, list[dict]]:
  """Parsed questions of every split in file-name order, the unanswerable ones dropped;
  each example keeps its file as 'name'."""
  examples = {split: [] for split in SPLIT_FOLDERS}
  dropped = {split: [] for split in SPLIT_FOLDERS}
  stripped = 0
  for split, name, text in iter_question_files(kind, location):
    example = parse_question(text, name)
    example['name'] = name
    answer = f'@entity{example["answer"]}'
    if answer not in example['context']:
      dropped[split].append(name)
      continue
    if top_k:
      example['context'] = top_k_sentences(example['context'], example['query'], top_k)
      stripped += answer not in example['context']
    examples[split].append(example)
  for split, rows in examples.items():
    if not rows:
      raise ValueError(f'{location}: no usable .question files in the '
                       f'{SPLIT_FOLDERS[split]} split ({len(dropped[split])} dropped as '
                       'unanswerable).')
    rows.sort(key=lambda e: e['name'])
    if dropped[split]:
      logging.warning('Dropped %d of %d %s questions whose answer entity does not occur in '
                      'the context (they cannot be answered), e.g. %s.', len(dropped[split]),
                      len(dropped[split]) + len(rows), SPLIT_FOLDERS[split],
                      min(dropped[split]))
  if top_k:
    logging.info('top_k_sentences=%d left the answer out of the context of %d questions; '
                 'they stay and count as errors.', top_k, stripped)
  examples['dropped'] = [len(dropped[split]) for split in SPLIT_FOLDERS]
  return examples


def parse_source(path: str, vocab_size: int = 0, top_k: int = 0) -> dict[str, np.ndarray]:
  """Parse every split of a source into token ids: the arrays `load` caches.

  Keys: 'vocab' [V] str, 'num_entities', 'dropped' [3] (unanswerable questions dropped in
  train, valid, test), and per split s: `s/document`, `s/document_offsets`, `s/query`,
  `s/query_offsets`, `s/answer` [N] (ragged rows: ids[offsets[i]:offsets[i+1]]).
  """
  kind, location = resolve_source(path)
  examples = _read_examples(kind, location, top_k)
  dropped = examples.pop('dropped')
  largest, where = _largest_entity(e for rows in examples.values() for e in rows)
  num_entities = largest + 1
  logging.info('%s: %d entity symbols (the largest, @entity%d, in %s).', location,
               num_entities, largest, where)
  if vocab_size and vocab_size <= ENTITY_OFFSET + num_entities:
    raise ValueError(f'{where}: @entity{largest} needs {num_entities} entity symbols, which '
                     f'with the {ENTITY_OFFSET} special ones leave no room for words in '
                     f'config.data.vocab_size={vocab_size}.')
  vocab = build_vocab([e['context'] + e['query'] for e in examples['train']], num_entities,
                      vocab_size)
  ids = {w: i for i, w in enumerate(vocab)}
  arrays = {'vocab': np.asarray(vocab), 'num_entities': np.int64(num_entities),
            'dropped': np.asarray(dropped, np.int64)}
  for split, rows in examples.items():
    for field, key in (('context', 'document'), ('query', 'query')):
      arrays[f'{split}/{key}'], arrays[f'{split}/{key}_offsets'] = _ragged(
          [encode_tokens(e[field], ids) for e in rows])
    arrays[f'{split}/answer'] = np.asarray([e['answer'] for e in rows], np.int32)
  return arrays


def cache_file(cache_dir: str, location: str, vocab_size: int, top_k: int) -> str:
  """The cache file of a resolved source and the options that shape its tokens."""
  slot = json.dumps({'path': os.path.realpath(location), 'vocab_size': vocab_size,
                     'top_k': top_k, 'version': FORMAT_VERSION}, sort_keys=True)
  return os.path.join(cache_dir, f'reading_{hashlib.sha256(slot.encode()).hexdigest()[:16]}'
                                 '.npz')


def load(path: str, vocab_size: int = 0, top_k: int = 0,
         cache_dir: Optional[str] = None) -> dict[str, np.ndarray]:
  """`parse_source`, read from / written to `cache_dir` when one is given, keyed on the
  source's content and the options."""
  if cache_dir is None:
    return parse_source(path, vocab_size, top_k)
  kind, location = resolve_source(path)
  meta = {'source_sha256': source_digest(kind, location), 'vocab_size': vocab_size,
          'top_k': top_k, 'version': FORMAT_VERSION}
  file = cache_file(cache_dir, location, vocab_size, top_k)
  arrays = files.load_arrays(file, meta)
  if arrays is None:
    arrays = parse_source(path, vocab_size, top_k)
    files.save_arrays(file, arrays, meta)
  elif arrays['dropped'].any():
    logging.warning('%s: %s unanswerable questions (train/valid/test) were dropped when the '
                    'cache %s was built.', location, '/'.join(map(str, arrays['dropped'])),
                    file)
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
  """Rename entity e of example b to `permutations[b, e]` (`[B, E]`, each row a permutation)
  in its document, query, candidates and label alike: the answer keeps its entity."""
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
  """Accuracy on `split` of the salience baselines (Hermann et al. 2015 sec. 4): the most
  frequent context entity, the most frequent one absent from the query (ties: the lowest
  id), and the expected accuracy of a random candidate."""
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
  arrays = load(paths.resolve_path(d, 'path'), vocab_size=d.get('vocab_size', 0),
                top_k=d.get('top_k_sentences', 0), cache_dir=cache_dir)
  return ReadingDataset(arrays, batch_size=config.train.batch_size, seed=config.seed,
                        eval_batch_size=config.eval.get('batch_size', None),
                        length_multiple=d.get('length_multiple', 32),
                        length_groups=d.get('length_groups', 1),
                        process_index=process_index, process_count=process_count)


def default_data_config(name: str = 'brown_cloze_large'):
  """`config.data` of a cloze set; `path` is relative to the data root unless absolute."""
  with extras.needed_by(f'{__name__}.default_data_config'):
    import ml_collections  # pylint: disable=g-import-not-at-top
  sources = {'brown_cloze_large': 'brown_cloze_large/brown_cloze_large.tgz',
             'brown_cloze': 'brown_cloze', 'cnn': 'cnn.tgz', 'dailymail': 'dailymail.tgz'}
  if name not in sources:
    raise ValueError(f'Unknown reading-comprehension set {name!r}; choose one of '
                     f'{sorted(sources)}.')
  data = ml_collections.ConfigDict()
  data.name = name
  data.root = ''                # '' = $BN_RNN_JAX_DATA (see bn_rnn_jax/input_pipeline)
  data.path = sources[name]     # folder or .tgz in the DeepMind layout, under the root
  data.vocab_size = 0           # symbols in all (0 = every training word)
  data.top_k_sentences = 0      # Cooijmans App. C CNN shortcut (they used 4); 0 = off
  data.length_multiple = 32     # pad T and Q to a multiple of this (few XLA programs)
  data.length_groups = 1        # > 1: sample each batch within one document-length group
  data.cache_dir = ''           # '' = <workdir>/data_cache
  return data
