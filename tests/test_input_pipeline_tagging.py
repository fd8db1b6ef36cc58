"""`input_pipeline/kaldi.py` and `tagging.py`: the Kaldi (speech frames) and Brown (POS
tags) readers of the tagging task, on tiny fixture files written here, and on the real
Brown corpus when it is under the data root."""

import numpy as np
import pytest

from bn_rnn_jax.input_pipeline import kaldi
from bn_rnn_jax.input_pipeline import tagging
from bn_rnn_jax.training import config as config_lib
import helpers
import real_data
import training_fixtures as fx

REAL_BROWN = real_data.path('brown')


# ------------------------------------------------------------------ Kaldi
def _kaldi_arrays(lengths, label_lengths=None, dims=3, seed=0):
  """Random `{utterance: features [n, dims]}` and `{utterance: labels [n]}`."""
  rng = np.random.default_rng(seed)
  feats = {f'utt{i}': (rng.normal(size=(n, dims)) * 2 + 5).astype(np.float32)
           for i, n in enumerate(lengths)}
  labels = {u: rng.integers(0, 4, size=n).astype(np.int32)
            for u, n in zip(feats, label_lengths or lengths)}
  return feats, labels


def _kaldi_config(tmp_path, **data):
  config = config_lib.default_config()
  config.data = tagging.default_data_config('kaldi')
  config.data.update(dict(max_frames=10, buckets=(5,), train_eval_size=2, **data))
  config.train.batch_size = 2
  config.eval.batch_size = 2
  return config


def test_kaldi_reader_normalises_drops_long_utterances_and_pairs_labels(tmp_path):
  feats, labels = _kaldi_arrays([4, 6, 3, 12, 5])
  helpers.write_kaldi_table(f'ark,scp:{tmp_path}/train.ark,{tmp_path}/train.scp', feats)
  with open(tmp_path / 'train_ali.txt', 'w') as f:
    for utt, value in labels.items():
      f.write(f"{utt} {' '.join(map(str, value))}\n")
  valid_feats, valid_labels = _kaldi_arrays([3, 11], seed=1)
  helpers.write_kaldi_table(f'ark:{tmp_path}/valid.ark', valid_feats)
  helpers.write_kaldi_table(f'ark:{tmp_path}/valid_ali.ark', valid_labels)
  config = _kaldi_config(tmp_path, train_feats=str(tmp_path / 'train.scp'),
                         train_labels=str(tmp_path / 'train_ali.txt'),
                         valid_feats=str(tmp_path / 'valid.ark'),
                         valid_labels=str(tmp_path / 'valid_ali.ark'))
  dataset = kaldi.get_dataset(config)
  assert dataset.num_dropped == 1                      # utt3 has 12 > 10 frames
  kept = np.concatenate([feats[u] for u in ('utt0', 'utt1', 'utt2', 'utt4')])
  mean, std = kept.astype(np.float64).mean(0), kept.astype(np.float64).std(0)
  assert dataset.model_kwargs == {'num_classes': 4}
  assert dataset.train_length == 10
  batches = list(dataset.eval_batches('valid'))
  # utt0 (3 frames) in bucket 5; utt1 (11 frames, longer than training) in its own bucket.
  assert [b['inputs'].shape for b in batches] == [(2, 5, 3), (2, 11, 3)]
  np.testing.assert_array_equal([b['weights'] for b in batches], [[1, 0], [1, 0]])
  for batch, utt in zip(batches, ('utt0', 'utt1')):
    n = len(valid_feats[utt])
    np.testing.assert_allclose(batch['inputs'][0, :n], (valid_feats[utt] - mean) / std,
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(batch['labels'][0, :n], valid_labels[utt])
    np.testing.assert_array_equal(batch['mask'][0], np.arange(batch['mask'].shape[1]) < n)
    assert not batch['inputs'][0, n:].any()
  frames = np.concatenate([dataset.splits['train'][0][i] for i in range(4)])
  np.testing.assert_allclose(frames.mean(0), 0.0, atol=1e-4)
  np.testing.assert_allclose(frames.std(0), 1.0, atol=1e-3)


def test_kaldi_label_length_mismatch_names_the_utterance(tmp_path):
  feats, labels = _kaldi_arrays([4, 6], label_lengths=[4, 5])
  helpers.write_kaldi_table(f'ark,scp:{tmp_path}/f.ark,{tmp_path}/f.scp', feats)
  helpers.write_kaldi_table(f'ark:{tmp_path}/ali.ark', labels)
  config = _kaldi_config(tmp_path, train_feats=str(tmp_path / 'f.scp'),
                         train_labels=str(tmp_path / 'ali.ark'))
  with pytest.raises(ValueError, match="utterance 'utt1' has 6 feature frames but 5 labels"):
    kaldi.get_dataset(config)
  config.data.train_labels = str(tmp_path / 'missing.txt')
  with pytest.raises(FileNotFoundError, match='missing.txt'):
    kaldi.get_dataset(config)
  (tmp_path / 'moved.scp').write_text(f'utt0 {tmp_path}/gone.ark:5\n')
  config.data.train_feats = str(tmp_path / 'moved.scp')
  with pytest.raises(FileNotFoundError, match="moved.scp.*cannot read '.*gone.ark'"):
    kaldi.get_dataset(config)


# ------------------------------------------------------------------ Brown
def _brown_config(path, **data):
  config = config_lib.default_config()
  config.data = tagging.default_data_config('brown')
  config.data.update(dict(path=path, buckets=(4, 8), train_eval_size=2, min_count=2, **data))
  config.train.batch_size = 2
  config.eval.batch_size = 2
  return config


def test_brown_reader_splits_by_file_reduces_tags_and_batches_in_buckets(tmp_path):
  config = _brown_config(fx.write_brown(tmp_path / 'brown'))
  dataset = tagging.get_dataset(config)
  assert [tagging.brown_split(n) for n in ('ca01', 'cb02', 'ca09', 'cr10', 'cp19')] == [
      'train', 'train', 'valid', 'test', 'valid']
  assert [tagging.base_tag(t) for t in ('NP-TL', 'fw-at', 'pps+bez', 'nn$-hl', 'bez*',
                                        'jj-tl-hl')] == ['np', 'at', 'pps', 'nn$', 'bez*',
                                                         'jj']
  assert {s: dataset.num_sequences(s) for s in dataset.splits} == {
      'train': 4, 'valid': 1, 'test': 2}
  assert dataset.num_dropped == 1    # the 11-token sentence exceeds the largest bucket (8)
  # Training words seen twice or more, by count (ties alphabetically); others -> <unk> = 0.
  assert dataset.vocab == ['<unk>', '.', 'said', 'The', 'jury', "n't"]
  assert dataset.tags == sorted({'at', 'np', 'nn', 'vbd', '.', 'dod', '*', 'vb', 'pps',
                                 'bedz', 'jj', 'cc', 'rb'})
  ids, tags = tagging.encode_sentences([(['The', 'Fulton'], ['at', 'np'])], dataset.vocab,
                                       dataset.tags)
  assert ids[0].tolist() == [3, 0]
  assert tags[0].tolist() == [dataset.tags.index('at'), dataset.tags.index('np')]

  # Kept training lengths 5, 6, 4, 3: two in bucket 4, two in bucket 8, one batch each.
  assert dataset.steps_per_epoch == 2
  epoch = [dataset.train_batch(step) for step in range(2)]
  assert sorted(b['inputs'].shape for b in epoch) == [(2, 4), (2, 8)]
  assert sorted(float(n) for b in epoch for n in b['mask'].sum(1)) == [3, 4, 5, 6]
  for b in epoch:
    assert b['inputs'].dtype == np.int32 and not b['inputs'][b['mask'] == 0].any()
    assert b['mask'][:, 0].all() and (np.diff(b['mask'], axis=1) <= 0).all()  # prefixes
  again = tagging.get_dataset(config).train_batch(1)
  for key in again:
    np.testing.assert_array_equal(epoch[1][key], again[key])

  test = list(dataset.eval_batches('test'))
  assert [b['inputs'].shape for b in test] == [(2, 4)]   # lengths 3 and 4
  np.testing.assert_array_equal(test[0]['weights'], [1, 1])
  assert test[0]['mask'].sum() == 7
  train_eval = list(dataset.eval_batches('train_eval'))  # sentences 0 and 3 (5 and 3)
  assert [b['inputs'].shape for b in train_eval] == [(2, 4), (2, 8)]
  np.testing.assert_array_equal([b['weights'] for b in train_eval], [[1, 0], [1, 0]])
  with pytest.raises(ValueError, match="No evaluation split 'dev'"):
    next(dataset.eval_batches('dev'))


def test_brown_reader_errors_name_the_file_or_path(tmp_path):
  with pytest.raises(FileNotFoundError, match='nowhere'):
    tagging.get_dataset(_brown_config(str(tmp_path / 'nowhere')))
  folder = fx.write_brown(tmp_path / 'bad', {'ca01': ['\tThe/at jury said/vbd']})
  with pytest.raises(ValueError, match=r"ca01:1: token 'jury' is not word/tag"):
    tagging.get_dataset(_brown_config(folder))


@real_data.needs('brown', 'ca01')
def test_brown_reader_on_the_shared_corpus():
  splits = tagging.load_brown(REAL_BROWN)
  tokens = sum(len(words) for split in splits.values() for words, _ in split)
  assert tokens == 1_161_192           # the corpus README's count (data/README.md)
  sizes = {s: len(v) for s, v in splits.items()}
  assert sizes['train'] > 8 * sizes['valid'] > 0 and sizes['test'] > 0
  tags = [t for _, seq in splits['train'] for t in seq]
  values, counts = np.unique(tags, return_counts=True)
  assert values[counts.argmax()] == 'nn'
  assert not any('-tl' in t or '-hl' in t or '+' in t or t.startswith('fw-') for t in values)
