"""Sequence labelling: length-bucketed batches (`TaggingDataset`) and Brown POS tagging.

A label at every step of variable-length sequences (task 'tagging', `SequenceTagger`;
the Kaldi reader, `kaldi.py`, builds the same dataset). Batches (the interface of
`bn_rnn_jax.input_pipeline`):

  {'inputs': int32 [B, T] token ids (Brown) | float32 [B, T, F] frames (Kaldi),
   'labels': int32 [B, T], 'mask': float32 [B, T] (1 = a real step; valid steps first),
   'weights': float32 [B] (0 = a padding example of an evaluation batch)}

T is the length of the batch's bucket (`config.data.buckets`): the smallest bucket
length at least as long as every sequence of the batch. Padded steps hold 0. Training
sequences longer than the largest bucket are dropped; evaluation keeps them all. The
Brown corpus (`config.data.name = 'brown'`) is read from the folder `config.data.path`;
every malformed file, token or missing listed file is one line naming the file.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Iterator, Optional, Sequence

import numpy as np
from absl import logging

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  import ml_collections

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.input_pipeline import eval_index_batches
from bn_rnn_jax.input_pipeline import files
from bn_rnn_jax.input_pipeline import paths
from bn_rnn_jax.input_pipeline import per_process_batch

SPLITS = ('train', 'valid', 'test')
UNK = '<unk>'
BROWN_FILE = re.compile(r'c[a-r](\d\d)')
BROWN_NUM_FILES = 500
Batch = dict


# ====================================================================== batching
def bucket_of(lengths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
  """Index of the smallest bucket length >= each length (len(buckets) if none)."""
  return np.searchsorted(np.asarray(buckets), lengths, side='left')


def pad_batch(inputs: Sequence[np.ndarray], labels: Sequence[np.ndarray], length: int,
              weights: np.ndarray) -> Batch:
  """Sequences `[L_i, ...]` padded with zeros to `[B, length, ...]`, with their mask."""
  feature_shape = inputs[0].shape[1:]
  x = np.zeros((len(inputs), length) + feature_shape, inputs[0].dtype)
  y = np.zeros((len(inputs), length), np.int32)
  mask = np.zeros((len(inputs), length), np.float32)
  for b, (seq, lab) in enumerate(zip(inputs, labels)):
    x[b, :len(seq)] = seq
    y[b, :len(lab)] = lab
    mask[b, :len(seq)] = 1.0
  return {'inputs': x, 'labels': y, 'mask': mask, 'weights': weights.astype(np.float32)}


class TaggingDataset:
  """Variable-length labelled sequences in length buckets.

  Args:
    splits: `{split: (inputs, labels)}`, lists of `[L, ...]` arrays (ids or frames) and
      of `[L]` int labels; 'train' is required.
    num_classes: C.
    vocab_size: token vocabulary (ids inputs) or None (frames).
    buckets: increasing bucket lengths; the largest is the training T_max.
    seed, batch_size, eval_batch_size: global sizes (all processes).
    train_eval_size: sequences of the fixed training subset evaluated as 'train_eval'.
  """
  task = 'tagging'
  carries_state = False

  def __init__(self, splits, *, num_classes: int, vocab_size: Optional[int],
               buckets: Sequence[int], seed: int, batch_size: int, eval_batch_size: int,
               train_eval_size: int = 0, process_index: int = 0, process_count: int = 1):
    buckets = tuple(int(b) for b in buckets)
    if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
      raise ValueError(f'config.data.buckets must be increasing positive lengths; got '
                       f'{buckets}.')
    self.buckets, self.seed = buckets, seed
    self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
    self.process_index, self.process_count = process_index, process_count
    per_process_batch(batch_size, process_count)
    self.splits = {}
    for split, (inputs, labels) in splits.items():
      lengths = np.array([len(s) for s in inputs], np.int64)
      if split == 'train':
        keep = np.nonzero(lengths <= buckets[-1])[0]
        if len(keep) < len(inputs):
          logging.info('Dropped %d of %d training sequences longer than %d steps.',
                       len(inputs) - len(keep), len(inputs), buckets[-1])
        self.num_dropped = len(inputs) - len(keep)
        inputs, labels = [inputs[i] for i in keep], [labels[i] for i in keep]
        lengths = lengths[keep]
      self.splits[split] = (list(inputs), list(labels), lengths)
    if 'train' not in self.splits or not self.splits['train'][0]:
      raise ValueError('The tagging data has no training sequences (after dropping those '
                       f'longer than {buckets[-1]} steps).')
    if train_eval_size > 0:
      inputs, labels, lengths = self.splits['train']
      pick = np.unique(np.linspace(0, len(inputs) - 1, min(train_eval_size, len(inputs)))
                       .round().astype(np.int64))
      self.train_subset = ([inputs[i] for i in pick], [labels[i] for i in pick],
                           lengths[pick])
    else:
      self.train_subset = None
    lengths = self.splits['train'][2]
    members = bucket_of(lengths, buckets)
    self._train_buckets = [np.nonzero(members == k)[0] for k in range(len(buckets))]
    self.steps_per_epoch = sum(len(m) // batch_size for m in self._train_buckets)
    if self.steps_per_epoch == 0:
      raise ValueError(f'batch size {batch_size} exceeds every bucket of the '
                       f'{len(lengths)} training sequences (buckets {buckets}).')
    self.train_length = buckets[-1]
    self.num_classes = num_classes
    self.model_kwargs = {'num_classes': num_classes}
    if vocab_size is not None:
      self.model_kwargs['vocab_size'] = vocab_size
    self._epoch_cache = (None, None)

  def num_sequences(self, split: str) -> int:
    return len(self.splits[split][0])

  def _epoch_plan(self, epoch: int) -> list[np.ndarray]:
    """The global batches (training indices) of one epoch: a function of (seed, epoch)."""
    if self._epoch_cache[0] == epoch:
      return self._epoch_cache[1]
    rng = np.random.default_rng([self.seed, epoch])
    plan = []
    for members in self._train_buckets:
      order = members[rng.permutation(len(members))]
      full = len(order) // self.batch_size * self.batch_size
      plan.extend(order[:full].reshape(-1, self.batch_size))
    plan = [plan[i] for i in rng.permutation(len(plan))]
    self._epoch_cache = (epoch, plan)
    return plan

  def train_batch(self, step: int) -> Batch:
    if step < 0:
      raise ValueError(f'step must be >= 0; got {step}.')
    epoch, index = divmod(step, self.steps_per_epoch)
    batch = self._epoch_plan(epoch)[index]
    local = per_process_batch(self.batch_size, self.process_count)
    batch = batch[self.process_index * local:(self.process_index + 1) * local]
    inputs, labels, lengths = self.splits['train']
    length = self.buckets[int(bucket_of(lengths[batch].max(), self.buckets))]
    return pad_batch([inputs[i] for i in batch], [labels[i] for i in batch], length,
                     np.ones(len(batch)))

  def eval_batches(self, split: str) -> Iterator[Batch]:
    """Fixed-shape batches of `split` ('valid', 'test', or 'train_eval' = the fixed
    training subset), one bucket after the other, padded with weight-0 examples."""
    if split == 'train_eval' and self.train_subset is not None:
      inputs, labels, lengths = self.train_subset
    elif split in self.splits and split != 'train':
      inputs, labels, lengths = self.splits[split]
    else:
      have = sorted(set(self.splits) - {'train'}) + (['train_eval'] if self.train_subset
                                                     else [])
      raise ValueError(f'No evaluation split {split!r}; have {have}.')
    buckets = self.buckets + ((int(lengths.max()),) if lengths.max() > self.buckets[-1]
                              else ())
    members = bucket_of(lengths, buckets)
    for k, length in enumerate(buckets):
      ids = np.nonzero(members == k)[0]
      for index, weights in eval_index_batches(len(ids), self.eval_batch_size,
                                               self.process_index, self.process_count):
        chosen = ids[index]
        yield pad_batch([inputs[i] for i in chosen], [labels[i] for i in chosen], length,
                        weights)


# ====================================================================== Brown
def base_tag(tag: str) -> str:
  """A Brown tag reduced to its base tag: 'NP-TL' -> 'np', 'fw-in' -> 'in',
  'ppss+bem' -> 'ppss', 'nn$-hl' -> 'nn$', 'bez*' -> 'bez*'."""
  tag = tag.lower()
  if tag.startswith('fw-'):
    tag = tag[3:]
  tag = tag.split('+')[0]
  stripped = True
  while stripped:
    stripped = False
    for suffix in ('-tl', '-hl', '-nc'):
      if tag.endswith(suffix) and len(tag) > len(suffix):
        tag, stripped = tag[:-len(suffix)], True
  return tag


def brown_split(file_name: str) -> str:
  """'train' | 'valid' | 'test' of a Brown file `c[a-r]NN` (NN % 10: 0 test, 9 valid)."""
  match = BROWN_FILE.fullmatch(file_name)
  if match is None:
    raise ValueError(f'{file_name!r} is not a Brown corpus file name c[a-r]NN.')
  number = int(match.group(1)) % 10
  return 'test' if number == 0 else 'valid' if number == 9 else 'train'


def read_brown_file(path: str) -> list[tuple[list[str], list[str]]]:
  """`[(words, base tags)]` of one Brown file; a malformed token, text that is not UTF-8
  and a file without sentences are one-line errors naming it."""
  sentences = []
  for line_number, line in enumerate(files.read_text(path).split('\n'), 1):
    tokens = line.split()
    if not tokens:
      continue
    words, tags = [], []
    for token in tokens:
      word, slash, tag = token.rpartition('/')
      if not slash or not word or not tag:
        raise ValueError(f'{path}:{line_number}: token {token!r} is not word/tag.')
      words.append(word)
      tags.append(base_tag(tag))
    sentences.append((words, tags))
  if not sentences:
    raise ValueError(f'{path}: no sentences (an empty or truncated corpus file).')
  return sentences


def listed_brown_files(data_dir: str) -> Optional[tuple[str, set[str]]]:
  """`(list file, the corpus files it names)` from `CONTENTS` (entries `A01.`) or NLTK's
  `cats.txt` (lines `ca01 news`); None when the folder has neither."""
  contents = os.path.join(data_dir, 'CONTENTS')
  if os.path.isfile(contents):
    found = re.findall(r'^([A-R])(\d\d)\.', files.read_text(contents), re.MULTILINE)
    return contents, {f'c{letter.lower()}{number}' for letter, number in found}
  cats = os.path.join(data_dir, 'cats.txt')
  if os.path.isfile(cats):
    lines = files.read_text(cats).split('\n')
    return cats, {line.split()[0] for line in lines if line.split()}
  return None


def _check_complete(data_dir: str, names: Sequence[str]) -> None:
  """A corpus file missing from the folder is an error (or a warning without a list)."""
  listed = listed_brown_files(data_dir)
  if listed is None:
    if len(names) < BROWN_NUM_FILES:
      logging.warning('%s holds %d of the Brown corpus\'s %d files, and no CONTENTS or '
                      'cats.txt to name the missing ones; the splits are smaller than '
                      'documented.', data_dir, len(names), BROWN_NUM_FILES)
    return
  list_file, expected = listed
  missing = sorted(expected - set(names))
  if missing:
    shown = ', '.join(missing[:5]) + (', ...' if len(missing) > 5 else '')
    raise ValueError(f'{data_dir}: {len(missing)} of the {len(expected)} corpus files that '
                     f'{os.path.basename(list_file)} lists are missing ({shown}); copy the '
                     'corpus again.')


def load_brown(data_dir: str) -> dict[str, list[tuple[list[str], list[str]]]]:
  """Sentences of every split (`brown_split`), files in sorted order."""
  data_dir = os.path.abspath(data_dir)
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(f'Brown corpus folder not found: {data_dir}. Point '
                            'config.data.path at the folder of the files ca01 ... cr09.')
  names = sorted(n for n in os.listdir(data_dir) if BROWN_FILE.fullmatch(n))
  if not names:
    raise FileNotFoundError(f'No Brown corpus files c[a-r]NN in {data_dir}.')
  _check_complete(data_dir, names)
  splits = {split: [] for split in SPLITS}
  for name in names:
    splits[brown_split(name)].extend(read_brown_file(os.path.join(data_dir, name)))
  return splits


def brown_vocab(train_sentences, min_count: int) -> list[str]:
  """`<unk>` then the training words seen >= min_count times (frequency order)."""
  counts = collections.Counter(w for words, _ in train_sentences for w in words)
  kept = [w for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
          if n >= min_count]
  return [UNK] + [w for w in kept if w != UNK]


def encode_sentences(sentences, vocab: Sequence[str], tags: Sequence[str]):
  """`(ids, labels)`: lists of int32 `[L]` arrays; unknown words -> `<unk>` (id 0)."""
  word_id = {w: i for i, w in enumerate(vocab)}
  tag_id = {t: i for i, t in enumerate(tags)}
  ids = [np.array([word_id.get(w, 0) for w in words], np.int32) for words, _ in sentences]
  labels = [np.array([tag_id[t] for t in tag_seq], np.int32) for _, tag_seq in sentences]
  return ids, labels


def brown_dataset(config, process_index: int = 0, process_count: int = 1):
  d = config.data
  sentences = load_brown(paths.resolve_path(d, 'path'))
  vocab = brown_vocab(sentences['train'], d.min_count)
  tags = sorted({t for split in SPLITS for _, seq in sentences[split] for t in seq})
  splits = {split: encode_sentences(sentences[split], vocab, tags) for split in SPLITS
            if sentences[split]}
  logging.info('Brown: %s sentences (train/valid/test), %d words, %d tags.',
               '/'.join(str(len(sentences[s])) for s in SPLITS), len(vocab), len(tags))
  dataset = TaggingDataset(
      splits, num_classes=len(tags), vocab_size=len(vocab), buckets=d.buckets,
      seed=config.seed, batch_size=config.train.batch_size,
      eval_batch_size=config.eval.batch_size, train_eval_size=d.train_eval_size,
      process_index=process_index, process_count=process_count)
  dataset.vocab, dataset.tags = vocab, tags
  return dataset


# ====================================================================== entry points
def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1):
  """The Brown dataset (the Kaldi one is `kaldi.get_dataset`)."""
  del workdir
  if config.data.name == 'brown':
    return brown_dataset(config, process_index, process_count)
  raise ValueError(f'tagging.py has no dataset {config.data.name!r}; the Kaldi reader is '
                   'kaldi.py (bn_rnn_jax.input_pipeline.get_dataset picks it).')


def default_data_config(name: str = 'brown') -> ml_collections.ConfigDict:
  """`config.data` of 'brown' or 'kaldi'; paths are relative to the data root unless
  absolute."""
  if name == 'brown':
    return ml_collections.ConfigDict({
        'name': 'brown',
        'root': '',                # '' = $BN_RNN_JAX_DATA (see bn_rnn_jax/input_pipeline)
        'path': 'brown',           # the folder of ca01 ... cr09, under the root
        'min_count': 2,            # rarer training words read as <unk> (so it is trained)
        # Three shapes (each compiles a train, an estimate and an eval program): the
        # median sentence has 18 tokens, 90 % have <= 37, 99.9 % <= 90; the 44 longer
        # training sentences are dropped (evaluation keeps them).
        'buckets': (20, 40, 90),
        'train_eval_size': 2000,   # fixed training subset evaluated as 'train_eval'
    })
  if name == 'kaldi':
    return ml_collections.ConfigDict({
        'name': 'kaldi',
        'root': '',                # '' = $BN_RNN_JAX_DATA (see bn_rnn_jax/input_pipeline)
        # Under the root, e.g. wsj/train_si284/feats.scp and wsj/ali_si284.txt:
        'train_feats': '', 'train_labels': '',
        'valid_feats': '', 'valid_labels': '',   # test_dev93
        'test_feats': '', 'test_labels': '',     # '' = no such split
        'num_classes': 0,          # 0 = 1 + the largest label (3546 pdfs for tri4b)
        'max_frames': 1300,        # Laurent et al.: longer training utterances dropped
        'buckets': (200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200),
        'train_eval_size': 1000,
    })
  raise ValueError(f"tagging datasets are 'brown' and 'kaldi'; got {name!r}.")
