"""Kaldi features and per-frame alignments (`config.data.name = 'kaldi'`; Laurent et al.
sec. 5.1), validated when loaded, as a `tagging.TaggingDataset`.

Per split, features from a `feats.scp` or `.ark` and labels from an alignment (text lines
`utt-id label label ...`, as `ali-to-pdf ... ark,t:-` prints, or an int-vector `.ark` /
`.scp`), read with `kaldiio`; `config.data.{train,valid,test}_{feats,labels}` ('' = no
such split). Refused in one line naming the file (and utterance or line):
  * a table that does not read to its end, holds no utterance, or repeats one;
  * features that are not `[frames, dims]`, hold NaN or inf, or differ in dimension from
    the first training utterance's;
  * an utterance with features but no labels, or with another number of labels than
    frames; labels outside `[0, num_classes)` (`config.data.num_classes`, 0 = 1 + the
    largest label).
Labels without features are ignored, with a warning. Features are normalised per
dimension with the training set's mean and standard deviation.
"""

from __future__ import annotations

import os
import struct
from typing import Iterator, Optional, Sequence

import numpy as np
from absl import logging

from bn_rnn_jax import extras
from bn_rnn_jax.input_pipeline import files
from bn_rnn_jax.input_pipeline import paths
from bn_rnn_jax.input_pipeline import tagging

SPLITS = tagging.SPLITS
# What kaldiio raises on a truncated or damaged ark (its parser does not wrap them).
_DAMAGED = (ValueError, RuntimeError, AssertionError, EOFError, struct.error, OSError,
            UnicodeDecodeError)


def _kaldiio():
  with extras.needed_by('Reading Kaldi files'):
    import kaldiio  # pylint: disable=g-import-not-at-top
  return kaldiio


def _one_line(error: Exception) -> str:
  return ' '.join(str(error).split()) or type(error).__name__


def _check_file(path: str, what: str) -> None:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'Kaldi {what} file not found: {path}.')


def read_scp(path: str) -> list[tuple[int, str, str]]:
  """`(line number, utterance, ark spec)` of every line of a Kaldi `.scp`."""
  entries, seen = [], {}
  for number, line in enumerate(files.read_text(path).split('\n'), 1):
    if not line.strip():
      continue
    fields = line.strip().split(maxsplit=1)
    if len(fields) != 2:
      raise ValueError(f'{path}:{number}: expected "utterance-id ark-path[:offset]"; got '
                       f'{line.strip()[:60]!r}.')
    utt, spec = fields
    if utt in seen:
      raise ValueError(f'{path}:{number}: utterance {utt!r} appears twice (also line '
                       f'{seen[utt]}).')
    seen[utt] = number
    entries.append((number, utt, spec))
  return entries


def _scp_entries(path: str, what: str) -> Iterator[tuple[str, np.ndarray]]:
  kaldiio = _kaldiio()
  for number, utt, spec in read_scp(path):
    try:
      yield utt, np.asarray(kaldiio.load_mat(spec))
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
      # An scp names its arks relative to the working directory, as Kaldi's tools do.
      ark = os.path.abspath(e.filename) if e.filename else spec
      raise FileNotFoundError(f'Kaldi {what} {path}: cannot read {ark!r} ({e.strerror}; '
                              'scp paths are relative to the working directory).') from None
    except _DAMAGED as e:
      raise ValueError(f'{path}:{number}: cannot read the {what} of utterance {utt!r} from '
                       f'{spec} ({_one_line(e)}): a truncated or damaged ark.') from None


def _ark_entries(path: str, what: str) -> Iterator[tuple[str, np.ndarray]]:
  reader, last = _kaldiio().load_ark(path), None
  while True:
    try:
      utt, value = next(reader)
    except StopIteration:
      return
    except _DAMAGED as e:
      where = f'after utterance {last!r}' if last else 'at its first utterance'
      raise ValueError(f'{path}: cannot read the {what} {where} ({_one_line(e)}): a '
                       'truncated or damaged ark.') from None
    last = utt
    yield utt, np.asarray(value)


def read_kaldi_table(path: str, what: str = 'features') -> dict[str, np.ndarray]:
  """`{utt: array}` of a Kaldi `.scp` or `.ark` (matrices or int vectors), read to its end;
  a repeated utterance and an empty table are errors."""
  _check_file(path, what)
  entries = _scp_entries(path, what) if path.endswith('.scp') else _ark_entries(path, what)
  table = {}
  for utt, value in entries:
    if utt in table:
      raise ValueError(f'{path}: utterance {utt!r} appears twice.')
    table[utt] = value
  if not table:
    raise ValueError(f'Kaldi {what} {path} holds no utterance.')
  return table


def read_alignments(path: str) -> dict[str, np.ndarray]:
  """Per-frame labels: int-vector `.ark`/`.scp`, or text lines `utt-id label label ...`."""
  if path.endswith(('.ark', '.scp')):
    return {utt: v.astype(np.int64) for utt, v in read_kaldi_table(path, 'alignment').items()}
  _check_file(path, 'alignment')
  labels, lines = {}, {}
  for number, line in enumerate(files.read_text(path).split('\n'), 1):
    fields = line.split()
    if not fields:
      continue
    utt = fields[0]
    if utt in labels:
      raise ValueError(f'{path}:{number}: utterance {utt!r} appears twice (also line '
                       f'{lines[utt]}).')
    try:
      labels[utt] = np.array([int(v) for v in fields[1:]], np.int64)
    except ValueError:
      raise ValueError(f'{path}:{number}: labels of {utt!r} are not integers.') from None
    lines[utt] = number
  if not labels:
    raise ValueError(f'Kaldi alignment {path} holds no utterance.')
  return labels


def pair_utterances(features: dict[str, np.ndarray], labels: dict[str, np.ndarray],
                    where: str) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
  """Names, features `[T, F]` and labels `[T]` of every featured utterance, sorted."""
  names, inputs, targets = sorted(features), [], []
  for utt in names:
    if utt not in labels:
      raise ValueError(f'{where}: utterance {utt!r} has features but no alignment.')
    frames, label = features[utt], labels[utt]
    if frames.ndim != 2:
      raise ValueError(f'{where}: features of {utt!r} have shape {frames.shape}, not '
                       '[frames, dims].')
    if len(label) != len(frames):
      raise ValueError(f'{where}: utterance {utt!r} has {len(frames)} feature frames but '
                       f'{len(label)} labels.')
    bad = ~np.isfinite(frames).all(axis=1)
    if bad.any():
      raise ValueError(f'{where}: the features of utterance {utt!r} hold NaN or inf (frame '
                       f'{int(np.argmax(bad))} of {len(frames)}).')
    inputs.append(frames.astype(np.float32))
    targets.append(label)
  unused = len(set(labels) - set(features))
  if unused:
    logging.warning('%s: %d utterances of the alignment have no features; ignored.', where,
                    unused)
  return names, inputs, targets


def check_dimensions(splits: dict[str, tuple], where: dict[str, str]) -> int:
  """The one feature dimension of every utterance (the first training one's)."""
  names, inputs, _ = splits['train']
  dims, first = inputs[0].shape[1], names[0]
  for split, (names, inputs, _) in splits.items():
    for utt, frames in zip(names, inputs):
      if frames.shape[1] != dims:
        raise ValueError(f'{where[split]}: utterance {utt!r} has {frames.shape[1]}-dim '
                         f'features; the training utterance {first!r} has {dims}.')
  return dims


def check_labels(splits: dict[str, tuple], where: dict[str, str], num_classes: int) -> int:
  """`num_classes` (1 + the largest label when 0), every label checked within it."""
  largest = max(int(l.max()) for _, _, labels in splits.values() for l in labels if len(l))
  num_classes = num_classes or largest + 1
  for split, (names, _, labels) in splits.items():
    for utt, label in zip(names, labels):
      bad = (label < 0) | (label >= num_classes)
      if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f'{where[split]}: utterance {utt!r} has label {int(label[i])} at '
                         f'frame {i}; labels must lie in [0, {num_classes}) '
                         '(config.data.num_classes; 0 = 1 + the largest label).')
  return num_classes


def feature_normalizer(frames: Sequence[np.ndarray], eps: float = 1e-5):
  """Per-dimension `(mean [F], std [F])` over all frames of the training utterances."""
  stacked = np.concatenate(frames, axis=0).astype(np.float64)
  return stacked.mean(0), np.sqrt(stacked.var(0) + eps)


def read_splits(data) -> tuple[dict[str, tuple], dict[str, str]]:
  """`({split: (names, features, labels)}, {split: where})` of `config.data`."""
  splits, where = {}, {}
  for split in SPLITS:
    if not data.get(f'{split}_feats', ''):
      continue
    if not data.get(f'{split}_labels', ''):
      raise ValueError(f'config.data.{split}_feats is set but config.data.{split}_labels is '
                       'empty; name the alignment of that split.')
    feats = paths.resolve_path(data, f'{split}_feats')
    labels = paths.resolve_path(data, f'{split}_labels')
    where[split] = f'{split} ({feats})'
    splits[split] = pair_utterances(read_kaldi_table(feats), read_alignments(labels),
                                    where[split])
  if 'train' not in splits:
    raise ValueError('config.data.train_feats must name the training feats.scp or .ark.')
  return splits, where


def kaldi_dataset(config, process_index: int = 0, process_count: int = 1):
  """The `tagging.TaggingDataset` of `config.data`."""
  d = config.data
  splits, where = read_splits(d)
  check_dimensions(splits, where)
  num_classes = check_labels(splits, where, d.num_classes)
  train_inputs = [x for x in splits['train'][1] if len(x) <= d.max_frames]
  mean, std = feature_normalizer(train_inputs or splits['train'][1])
  splits = {s: ([((x - mean) / std).astype(np.float32) for x in inputs],
                [l.astype(np.int32) for l in labels])
            for s, (_, inputs, labels) in splits.items()}
  buckets = tuple(b for b in d.buckets if b < d.max_frames) + (d.max_frames,)
  dataset = tagging.TaggingDataset(
      splits, num_classes=num_classes, vocab_size=None, buckets=buckets, seed=config.seed,
      batch_size=config.train.batch_size, eval_batch_size=config.eval.batch_size,
      train_eval_size=d.train_eval_size, process_index=process_index,
      process_count=process_count)
  dataset.feature_mean, dataset.feature_std = mean, std
  return dataset


def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1):
  del workdir
  return kaldi_dataset(config, process_index, process_count)
