"""Language-modelling input pipelines: PTB words, PTB characters, text8.

Each reads its standard files from `config.data.path` (PTB as UTF-8, a byte that is not
an error naming the file, offset and line; text8 as ASCII) into one integer stream per
split; the symbol tables come from the training split, and a symbol missing from them is
an error. Batches (the interface of `bn_rnn_jax.input_pipeline`):

  {'inputs': int32 [B, T], 'targets': int32 [B, T] (inputs shifted by one),
   'mask': float32 [B, T] (1 = a real prediction),
   'reset': float32 [B] (1 = start the row from the zero state),
   'weights': float32 [B] (0 = an all-padding row of an evaluation batch)}

Character sets train on independent shuffled segments ('segments', `reset` always 1),
word PTB on contiguous rows with the state carried across batches ('contiguous',
`reset` 1 on the first batch of an epoch and of an evaluation pass).
"""

from __future__ import annotations

import collections
import os
from typing import Iterator, Optional, Sequence

import numpy as np

from bn_rnn_jax import extras
from bn_rnn_jax.input_pipeline import files
from bn_rnn_jax.input_pipeline import paths

SPLITS = ('train', 'valid', 'test')
EOS = '<eos>'
CHAR_SPACE = '_'
CHAR_EOL = '\n'
TEXT8_SPLIT_SIZES = (90_000_000, 5_000_000, 5_000_000)

Batch = dict


# ------------------------------------------------------------------------------ reading


def _read(path: str) -> str:
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'Language-model data file not found: {path}. Point config.data.path at the '
        'folder (PTB) or file (text8) that holds it.')
  return files.read_text(path)


def ptb_words(text: str) -> list[str]:
  """Mikolov's PTB text -> word tokens: each non-blank line's words followed by `<eos>`."""
  tokens = []
  for line in text.split('\n'):
    words = line.split()
    if words:
      tokens.extend(words)
      tokens.append(EOS)
  return tokens


def ptb_chars(text: str) -> list[str]:
  """Mikolov's PTB text -> character symbols: per non-blank line its words joined by `'_'`,
  then `'\\n'` (`' a <unk> b \\n'` -> `a _ < u n k > _ b \\n`)."""
  symbols = []
  for line in text.split('\n'):
    words = line.split()
    if words:
      symbols.extend(CHAR_SPACE.join(words))
      symbols.append(CHAR_EOL)
  return symbols


def frequency_vocab(tokens: Sequence[str]) -> list[str]:
  """Symbols by decreasing count, ties alphabetically (TensorFlow's PTB reader order)."""
  counts = collections.Counter(tokens)
  return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def sorted_vocab(tokens: Sequence[str]) -> list[str]:
  """The sorted set of symbols (character tables)."""
  return sorted(set(tokens))


def encode(tokens: Sequence[str], vocab: Sequence[str], what: str = 'text') -> np.ndarray:
  """Tokens -> int32 ids `[N]`; a token missing from `vocab` is an error naming it."""
  index = {s: i for i, s in enumerate(vocab)}
  try:
    return np.fromiter((index[t] for t in tokens), dtype=np.int32, count=len(tokens))
  except KeyError as e:
    raise ValueError(f'{what}: symbol {e.args[0]!r} is not in the {len(vocab)}-symbol '
                     'table built from the training split.') from None


def load_ptb(data_dir: str, level: str) -> tuple[list[str], dict[str, np.ndarray]]:
  """PTB as `(vocab, {split: int32 ids [N]})`; `level` is 'word' or 'char'."""
  if level not in ('word', 'char'):
    raise ValueError(f"PTB level must be 'word' or 'char'; got {level!r}.")
  tokenize = ptb_words if level == 'word' else ptb_chars
  split_files = {s: os.path.join(os.path.abspath(data_dir), f'ptb.{s}.txt') for s in SPLITS}
  tokens = {s: tokenize(_read(split_files[s])) for s in SPLITS}
  vocab = (frequency_vocab if level == 'word' else sorted_vocab)(tokens['train'])
  ids = {s: encode(t, vocab, f'{split_files[s]} ({level} level)') for s, t in tokens.items()}
  return vocab, ids


def load_text8(path: str, split_sizes: Sequence[int] = TEXT8_SPLIT_SIZES
               ) -> tuple[list[str], dict[str, np.ndarray]]:
  """text8 as `(vocab, {split: int32 ids})`, consecutive slices of `split_sizes`; a file
  that does not hold exactly their sum, or is not ASCII, is an error."""
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'text8 file not found: {path} (config.data.path must name '
                            'the unzipped `text8` file).')
  raw = np.fromfile(path, dtype=np.uint8)
  if raw.size != sum(split_sizes):
    raise ValueError(f'{path} holds {raw.size} characters but the splits {tuple(split_sizes)} '
                     f'need exactly {sum(split_sizes)}.')
  if raw.size and raw.max() >= 128:
    raise ValueError(f'{path} is not plain ASCII; text8 holds only a-z and spaces.')
  bounds = np.cumsum((0,) + tuple(split_sizes))
  parts = {s: raw[bounds[k]:bounds[k + 1]] for k, s in enumerate(SPLITS)}
  codes = np.unique(parts['train'])
  vocab = [chr(c) for c in codes]
  lookup = np.full(128, -1, np.int32)
  lookup[codes] = np.arange(codes.size, dtype=np.int32)
  ids = {}
  for s, part in parts.items():
    ids[s] = lookup[part]
    if ids[s].size and ids[s].min() < 0:
      bad = chr(part[np.argmax(ids[s] < 0)])
      raise ValueError(f'text8 {s}: symbol {bad!r} is not in the {len(vocab)}-symbol table '
                       'built from the training split.')
  return vocab, ids


# ------------------------------------------------------------------------------ batching


def segment_layout(num_symbols: int, seq_length: int) -> tuple[int, int]:
  """`(examples per epoch, crop slack)` of non-overlapping segments of length T in a stream
  of N symbols: `examples = (N - 1) // T`, slack `(N - 1) - examples * T`."""
  examples = (num_symbols - 1) // seq_length
  if examples <= 0:
    raise ValueError(f'A stream of {num_symbols} symbols is too short for one training '
                     f'example of length {seq_length}.')
  return examples, (num_symbols - 1) - examples * seq_length


def epoch_order(seed: int, epoch: int, num_examples: int, slack: int) -> tuple[int, np.ndarray]:
  """`(crop offset, example permutation)` of one epoch: a function of (seed, epoch) only."""
  rng = np.random.default_rng([seed, epoch])
  offset = int(rng.integers(0, slack + 1))
  return offset, rng.permutation(num_examples)


def gather_segments(stream: np.ndarray, starts: np.ndarray, seq_length: int) -> Batch:
  """Examples starting at `starts [B]`: inputs `stream[s:s+T]`, targets `stream[s+1:s+T+1]`."""
  index = starts[:, None] + np.arange(seq_length + 1)[None, :]
  window = stream[index]
  return {'inputs': window[:, :-1].astype(np.int32), 'targets': window[:, 1:].astype(np.int32),
          'mask': np.ones(window[:, 1:].shape, np.float32)}


def contiguous_rows(stream: np.ndarray, batch_size: int) -> np.ndarray:
  """Zaremba's layout: the stream cut into `batch_size` contiguous rows `[B, N // B]`."""
  row_length = stream.size // batch_size
  if row_length < 2:
    raise ValueError(f'A stream of {stream.size} tokens is too short for {batch_size} rows.')
  return stream[:batch_size * row_length].reshape(batch_size, row_length)


def contiguous_batch(rows: np.ndarray, index: int, seq_length: int) -> Batch:
  """Batch `index` of a row layout: columns `[index*T, index*T + T)`, targets shifted by
  one; a last batch shorter than T is padded (mask 0)."""
  predictions = rows.shape[1] - 1
  start = index * seq_length
  if not 0 <= start < predictions:
    raise ValueError(f'Batch {index} starts at column {start}, past the {predictions} '
                     'predictions of each row.')
  stop = min(start + seq_length, predictions)
  width = stop - start
  pad = ((0, 0), (0, seq_length - width))
  inputs = np.pad(rows[:, start:stop], pad)
  targets = np.pad(rows[:, start + 1:stop + 1], pad)
  mask = np.pad(np.ones((rows.shape[0], width), np.float32), pad)
  return {'inputs': inputs.astype(np.int32), 'targets': targets.astype(np.int32),
          'mask': mask}


def padded_segments(stream: np.ndarray, seq_length: int, batch_size: int) -> Iterator[Batch]:
  """All N-1 predictions of a stream as segments of length T from offset 0, in order; the
  last segment is masked and the last batch filled with padding rows, so every batch is
  `[batch_size, seq_length]`."""
  predictions = stream.size - 1
  if predictions <= 0:
    raise ValueError(f'A stream of {stream.size} symbols has nothing to predict.')
  num_segments = -(-predictions // seq_length)
  padded = np.zeros(num_segments * seq_length + 1, np.int32)
  padded[:stream.size] = stream
  valid = np.zeros(num_segments * seq_length, np.float32)
  valid[:predictions] = 1.0
  inputs = padded[:-1].reshape(num_segments, seq_length)
  targets = padded[1:].reshape(num_segments, seq_length)
  mask = valid.reshape(num_segments, seq_length)
  for start in range(0, num_segments, batch_size):
    stop = min(start + batch_size, num_segments)
    fill = ((0, batch_size - (stop - start)), (0, 0))
    yield {'inputs': np.pad(inputs[start:stop], fill), 'targets': np.pad(targets[start:stop], fill),
           'mask': np.pad(mask[start:stop], fill)}


# ------------------------------------------------------------------------------ datasets


def _share(batch: Batch, process_index: int, process_count: int) -> Batch:
  """This process's contiguous share of the rows of a global batch."""
  rows = batch['inputs'].shape[0]
  local = rows // process_count
  part = slice(process_index * local, (process_index + 1) * local)
  return {k: v[part] for k, v in batch.items()}


def _finish(batch: Batch, reset: bool) -> Batch:
  """Per-row `reset` and `weights` (a row is a real example when any step is valid)."""
  rows = batch['inputs'].shape[0]
  batch['reset'] = np.full((rows,), float(reset), np.float32)
  batch['weights'] = (batch['mask'].sum(axis=1) > 0).astype(np.float32)
  return batch


class LanguageModelDataset:
  """One language-modelling task; the interface of `bn_rnn_jax.input_pipeline`.

  Args:
    name: 'ptb_word' | 'ptb_char' | 'text8'.
    vocab: the symbols; id i is `vocab[i]`.
    splits: `{split: int32 ids [N]}`.
    batch_size, seq_length: global training batch `[B, T]`.
    mode: 'segments' (independent shuffled examples) or 'contiguous' (carried state).
    seed: seed of the 'segments' order (the contiguous order is fixed).
    eval_batch_size: global rows of evaluation batches (default: batch_size).
    process_index, process_count: this process's contiguous share of every batch's rows.
  """
  task = 'language_model'

  def __init__(self, name: str, vocab: Sequence[str], splits: dict[str, np.ndarray], *,
               batch_size: int, seq_length: int, mode: str = 'segments', seed: int = 0,
               eval_batch_size: Optional[int] = None, process_index: int = 0,
               process_count: int = 1):
    if mode not in ('segments', 'contiguous'):
      raise ValueError(f"mode must be 'segments' or 'contiguous'; got {mode!r}.")
    if batch_size <= 0 or seq_length <= 0:
      raise ValueError(f'batch_size ({batch_size}) and seq_length ({seq_length}) must be '
                       'positive.')
    self.name, self.vocab, self.splits = name, list(vocab), splits
    self.batch_size, self.seq_length, self.mode, self.seed = batch_size, seq_length, mode, seed
    self.eval_batch_size = eval_batch_size or batch_size
    self.process_index, self.process_count = process_index, process_count
    for rows in (self.batch_size, self.eval_batch_size):
      if rows % process_count:
        raise ValueError(f'batch size {rows} does not divide over {process_count} processes.')
    self.train_length = seq_length
    self.model_kwargs = {'vocab_size': len(self.vocab)}
    self.carries_state = mode == 'contiguous'
    # What one position is: the task scores words by perplexity, characters by bpc.
    self.unit = 'word' if name == 'ptb_word' else 'character'
    train = splits['train']
    if mode == 'segments':
      self._examples, self._slack = segment_layout(train.size, seq_length)
      if self._examples < batch_size:
        raise ValueError(f'{self._examples} training examples of length {seq_length} '
                         f'cannot fill one batch of {batch_size}.')
      self.steps_per_epoch = self._examples // batch_size
    else:
      # Whole segments only, as Zaremba's `epoch_size = (batch_len - 1) // num_steps`.
      self._rows = contiguous_rows(train, batch_size)
      self.steps_per_epoch = (self._rows.shape[1] - 1) // seq_length
      if self.steps_per_epoch == 0:
        raise ValueError(f'Rows of {self._rows.shape[1]} tokens are too short for one '
                         f'training segment of length {seq_length}.')
    self._order_cache = {}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def num_symbols(self, split: str) -> int:
    return int(self._split(split).size)

  # -- training
  def _epoch_order(self, epoch: int):
    if epoch not in self._order_cache:
      if len(self._order_cache) > 2:
        self._order_cache.clear()
      self._order_cache[epoch] = epoch_order(self.seed, epoch, self._examples, self._slack)
    return self._order_cache[epoch]

  def train_batch(self, step: int) -> Batch:
    """This process's rows of training batch `step` (0-based); pure in (seed, step)."""
    if step < 0:
      raise ValueError(f'step must be >= 0; got {step}.')
    epoch, index = divmod(int(step), self.steps_per_epoch)
    if self.mode == 'contiguous':
      batch = contiguous_batch(self._rows, index, self.seq_length)
    else:
      offset, order = self._epoch_order(epoch)
      examples = order[index * self.batch_size:(index + 1) * self.batch_size]
      batch = gather_segments(self.splits['train'], offset + examples * self.seq_length,
                              self.seq_length)
    reset = index == 0 or self.mode == 'segments'
    return _share(_finish(batch, reset), self.process_index, self.process_count)

  # -- evaluation
  def _split(self, split: str) -> np.ndarray:
    if split not in self.splits:
      raise ValueError(f'Unknown split {split!r}; have {sorted(self.splits)}.')
    return self.splits[split]

  def eval_batches(self, split: str, seq_length: Optional[int] = None,
                   batch_size: Optional[int] = None) -> Iterator[Batch]:
    """Every prediction of `split` once, in order. `seq_length` (default: the training
    length) may be anything up to `num_symbols(split) - 1` (with batch_size 1: the split as
    one sequence); `batch_size` is global (default: eval_batch_size)."""
    stream = self._split(split)
    seq_length = seq_length or self.seq_length
    batch_size = batch_size or self.eval_batch_size
    if batch_size % self.process_count:
      raise ValueError(f'batch size {batch_size} does not divide over {self.process_count} '
                       'processes.')
    if self.mode == 'segments':
      batches = ((b, True) for b in padded_segments(stream, seq_length, batch_size))
    else:
      rows = contiguous_rows(stream, batch_size)
      batches = ((contiguous_batch(rows, k, seq_length), k == 0)
                 for k in range(-(-(rows.shape[1] - 1) // seq_length)))
    for batch, reset in batches:
      yield _share(_finish(batch, reset), self.process_index, self.process_count)

  def num_eval_batches(self, split: str, seq_length: Optional[int] = None,
                       batch_size: Optional[int] = None) -> int:
    stream = self._split(split)
    seq_length = seq_length or self.seq_length
    batch_size = batch_size or self.eval_batch_size
    if self.mode == 'segments':
      return -(-(-(-(stream.size - 1) // seq_length)) // batch_size)
    return -(-(stream.size // batch_size - 1) // seq_length)


def load_splits(config) -> tuple[str, list[str], dict[str, np.ndarray]]:
  """`(name, vocab, {split: ids})` of `config.data` (name and path)."""
  name = config.data.name
  if name in ('ptb_word', 'ptb_char'):
    path = paths.resolve_path(config.data, 'path')
    vocab, splits = load_ptb(path, 'word' if name == 'ptb_word' else 'char')
  elif name == 'text8':
    vocab, splits = load_text8(paths.resolve_path(config.data, 'path'),
                               tuple(config.data.get('text8_split_sizes', TEXT8_SPLIT_SIZES)))
  else:
    raise ValueError(f"Unknown language-model dataset {name!r}; expected 'ptb_word', "
                     "'ptb_char' or 'text8'.")
  return name, vocab, splits


def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1) -> LanguageModelDataset:
  """The dataset of `config.data` (name, path, seq_length, optional text8_split_sizes),
  `config.train.batch_size`, `config.eval.batch_size` and `config.seed`: word PTB in
  contiguous rows, the character sets in segments."""
  del workdir  # Nothing to save: the symbol tables are rebuilt from the files.
  name, vocab, splits = load_splits(config)
  return LanguageModelDataset(
      name, vocab, splits, batch_size=config.train.batch_size,
      seq_length=config.data.seq_length,
      mode='contiguous' if name == 'ptb_word' else 'segments', seed=config.seed,
      eval_batch_size=config.eval.get('batch_size', None),
      process_index=process_index, process_count=process_count)


def default_data_config(name: str = 'ptb_char'):
  """`config.data` fields of this module's datasets; `path` is relative to the data root
  unless absolute."""
  with extras.needed_by(f'{__name__}.default_data_config'):
    import ml_collections  # pylint: disable=g-import-not-at-top
  defaults = {'ptb_char': ('ptb', 100), 'ptb_word': ('ptb', 20), 'text8': ('text8', 180)}
  if name not in defaults:
    raise ValueError(f'Unknown language-model dataset {name!r}; choose one of '
                     f'{sorted(defaults)}.')
  data = ml_collections.ConfigDict()
  data.name = name
  data.root = ''                                # '' = $BN_RNN_JAX_DATA
  data.path, data.seq_length = defaults[name]   # PTB folder or the text8 file; T
  if name == 'text8':
    data.text8_split_sizes = TEXT8_SPLIT_SIZES  # first 90M / next 5M / last 5M
  return data
