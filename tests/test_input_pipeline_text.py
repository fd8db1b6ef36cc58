"""Language-modelling pipelines (PTB words / characters, text8) on small fixture texts.

Expected values are written out by hand or recomputed here with plain Python string
operations, never with the pipeline's own helpers.
"""

import numpy as np
import pytest

from bn_rnn_jax.input_pipeline import text
import real_data

PTB_DIR = real_data.path('ptb')

# Mikolov's format: a leading and a trailing space on every line, one sentence per line.
TRAIN = (' the cat sat on the mat \n'
         ' a <unk> dog ate N apples \n'
         ' the dog sat \n')
VALID = ' the cat ate \n the mat \n'
TEST = ' a dog \n'


def write_ptb(folder, train=TRAIN, valid=VALID, test=TEST):
  for split, content in (('train', train), ('valid', valid), ('test', test)):
    (folder / f'ptb.{split}.txt').write_text(content)
  return str(folder)


def lm_dataset(stream, mode, batch_size=2, seq_length=3, seed=0, **kw):
  vocab = [str(i) for i in range(int(stream.max()) + 1)]
  return text.LanguageModelDataset('fixture', vocab, {'train': stream, 'valid': stream[:37]},
                                   batch_size=batch_size, seq_length=seq_length, mode=mode,
                                   seed=seed, **kw)


# ------------------------------------------------------------------ symbol tables
def test_ptb_chars_encode_spaces_and_line_ends():
  symbols = text.ptb_chars(' a <unk>  b \n c \n\n')
  assert ''.join(symbols) == 'a_<unk>_b\nc\n'
  assert text.ptb_words(' a <unk>  b \n c \n\n') == ['a', '<unk>', 'b', '<eos>', 'c', '<eos>']


def test_ptb_fixture_word_and_char_tables(tmp_path):
  folder = write_ptb(tmp_path)
  vocab, ids = text.load_ptb(folder, 'word')
  # Training counts: the 3, <eos> 3, dog 2, sat 2, then the singletons alphabetically.
  assert vocab == ['<eos>', 'the', 'dog', 'sat', '<unk>', 'N', 'a', 'apples', 'ate', 'cat',
                   'mat', 'on']
  words = TRAIN.replace('\n', ' <eos> ').split()
  assert [vocab[i] for i in ids['train']] == words
  assert [vocab[i] for i in ids['valid']] == 'the cat ate <eos> the mat <eos>'.split()
  assert ids['train'].dtype == np.int32

  vocab, ids = text.load_ptb(folder, 'char')
  train_chars = ''.join('_'.join(line.split()) + '\n' for line in TRAIN.splitlines())
  assert vocab == sorted(set(train_chars))
  assert '_' in vocab and '\n' in vocab and ' ' not in vocab
  assert ''.join(vocab[i] for i in ids['train']) == train_chars
  assert ''.join(vocab[i] for i in ids['valid']) == 'the_cat_ate\nthe_mat\n'
  assert len(ids['train']) == len(train_chars) == 23 + 25 + 12


def test_unknown_symbol_and_missing_file_are_clear_errors(tmp_path):
  folder = write_ptb(tmp_path, valid=' the zebra \n')
  with pytest.raises(ValueError, match="'zebra'.*ptb.valid.txt|ptb.valid.txt.*'zebra'"):
    text.load_ptb(folder, 'word')
  with pytest.raises(ValueError, match="'z'"):
    text.load_ptb(folder, 'char')
  with pytest.raises(FileNotFoundError, match='ptb.train.txt'):
    text.load_ptb(str(tmp_path / 'nowhere'), 'char')
  with pytest.raises(ValueError, match='level'):
    text.load_ptb(folder, 'byte')


def test_text8_splits_from_one_file(tmp_path):
  rng = np.random.default_rng(0)
  content = ''.join(rng.choice(list('abcdefghijklmnopqrstuvwxyz '), size=1000))
  content = 'z ' + content[2:]
  path = tmp_path / 'text8'
  path.write_text(content)
  vocab, ids = text.load_text8(str(path), (900, 50, 50))
  assert vocab == sorted(set(content[:900]))
  assert [len(ids[s]) for s in ('train', 'valid', 'test')] == [900, 50, 50]
  for split, (lo, hi) in zip(('train', 'valid', 'test'), ((0, 900), (900, 950), (950, 1000))):
    assert ''.join(vocab[i] for i in ids[split]) == content[lo:hi]
  with pytest.raises(ValueError, match='1000 characters.*exactly 1001'):
    text.load_text8(str(path), (901, 50, 50))
  # A symbol seen only after the training split is reported.
  path.write_text('a' * 900 + 'b' * 100)
  with pytest.raises(ValueError, match="valid: symbol 'b'"):
    text.load_text8(str(path), (900, 50, 50))
  with pytest.raises(FileNotFoundError, match='text8'):
    text.load_text8(str(tmp_path / 'missing'), (900, 50, 50))


# ------------------------------------------------------------------ segments (characters)
STREAM = np.random.default_rng(5).permutation(103).astype(np.int32)  # distinct symbols


def test_segments_are_non_overlapping_crops_of_one_epoch():
  data = lm_dataset(STREAM, 'segments', batch_size=4, seq_length=3, seed=7)
  # 102 predictions -> 34 examples, slack 0; 34 // 4 = 8 steps.
  assert data.steps_per_epoch == 8
  data = lm_dataset(STREAM[:101], 'segments', batch_size=4, seq_length=3, seed=7)
  # 100 predictions -> 33 examples of 3, slack 1 (the crop offset is 0 or 1).
  assert data.steps_per_epoch == 8
  stream = STREAM[:101]
  for epoch in range(4):
    starts = []
    for step in range(epoch * 8, epoch * 8 + 8):
      batch = data.train_batch(step)
      assert batch['inputs'].shape == batch['targets'].shape == (4, 3)
      assert np.all(batch['mask'] == 1) and np.all(batch['reset'] == 1)
      for row_in, row_tg in zip(batch['inputs'], batch['targets']):
        # Locate the window in the stream by brute force; inputs and targets shift by one.
        start = [s for s in range(len(stream) - 3)
                 if list(stream[s:s + 3]) == list(row_in) and
                 list(stream[s + 1:s + 4]) == list(row_tg)]
        assert start, (row_in, row_tg)
        starts.append(start[0])
    offsets = {s % 3 for s in starts}
    assert len(offsets) == 1 and offsets <= {0, 1}     # one crop offset per epoch
    assert len(set(starts)) == 32                      # distinct, non-overlapping examples


def test_segment_order_is_a_function_of_seed_and_step():
  stream = np.random.default_rng(1).integers(0, 30, size=5000).astype(np.int32)
  a = lm_dataset(stream, 'segments', batch_size=8, seq_length=10, seed=3)
  b = lm_dataset(stream, 'segments', batch_size=8, seq_length=10, seed=3)
  c = lm_dataset(stream, 'segments', batch_size=8, seq_length=10, seed=4)
  steps = [0, 1, a.steps_per_epoch, 3 * a.steps_per_epoch + 5]
  # Out of order in b: a resumed run reads the same batch at the same step.
  for step in reversed(steps):
    np.testing.assert_array_equal(b.train_batch(step)['inputs'], a.train_batch(step)['inputs'])
  assert not np.array_equal(a.train_batch(0)['inputs'], c.train_batch(0)['inputs'])
  # A new epoch reshuffles.
  assert not np.array_equal(a.train_batch(0)['inputs'],
                            a.train_batch(a.steps_per_epoch)['inputs'])


def test_segment_eval_covers_every_prediction_once():
  data = lm_dataset(STREAM, 'segments', batch_size=4, seq_length=3)
  for seq_length, batch_size in ((3, 4), (5, 4), (10, 3), (102, 1)):
    batches = list(data.eval_batches('train', seq_length, batch_size))
    assert len(batches) == data.num_eval_batches('train', seq_length, batch_size)
    inputs, targets = [], []
    for batch in batches:
      assert batch['inputs'].shape == (batch_size, seq_length)
      valid = batch['mask'] > 0
      np.testing.assert_array_equal(batch['weights'], valid.any(axis=1))
      # Valid steps are a prefix of each row (the recurrent layers' mask convention).
      assert np.all(np.diff(batch['mask'], axis=1) <= 0)
      inputs.extend(batch['inputs'][valid])
      targets.extend(batch['targets'][valid])
    np.testing.assert_array_equal(inputs, STREAM[:-1])
    np.testing.assert_array_equal(targets, STREAM[1:])


# ------------------------------------------------------------------ contiguous (words)
def test_contiguous_batches_carry_rows_across_steps():
  data = lm_dataset(STREAM, 'contiguous', batch_size=4, seq_length=5)
  # Rows of 103 // 4 = 25 tokens (3 dropped), 24 predictions -> 4 whole segments.
  assert data.carries_state and data.steps_per_epoch == 4
  rows = STREAM[:100].reshape(4, 25)
  for epoch in range(2):
    batches = [data.train_batch(epoch * 4 + k) for k in range(4)]
    assert [float(b['reset'][0]) for b in batches] == [1.0, 0.0, 0.0, 0.0]
    for k, batch in enumerate(batches):
      np.testing.assert_array_equal(batch['inputs'], rows[:, 5 * k:5 * k + 5])
      np.testing.assert_array_equal(batch['targets'], rows[:, 5 * k + 1:5 * k + 6])
      assert np.all(batch['mask'] == 1)
    # Row b of batch k+1 starts where row b of batch k stopped.
    for prev, nxt in zip(batches, batches[1:]):
      np.testing.assert_array_equal(nxt['inputs'][:, 0], prev['targets'][:, -1])


def test_contiguous_eval_is_carried_and_masked_at_the_end():
  data = lm_dataset(STREAM, 'contiguous', batch_size=4, seq_length=5)
  rows = STREAM[:36].reshape(4, 9)         # valid split = STREAM[:37], 4 rows of 9
  batches = list(data.eval_batches('valid'))
  assert len(batches) == data.num_eval_batches('valid') == 2
  assert [float(b['reset'][0]) for b in batches] == [1.0, 0.0]
  np.testing.assert_array_equal(batches[1]['mask'][0], [1, 1, 1, 0, 0])
  for b in range(4):
    got = np.concatenate([batch['targets'][b][batch['mask'][b] > 0] for batch in batches])
    np.testing.assert_array_equal(got, rows[b, 1:])


def test_process_shares_partition_the_global_batch():
  for mode in ('segments', 'contiguous'):
    full = lm_dataset(STREAM, mode, batch_size=4, seq_length=3, seed=2)
    parts = [lm_dataset(STREAM, mode, batch_size=4, seq_length=3, seed=2,
                        process_index=p, process_count=2) for p in range(2)]
    for step in (0, 5):
      joined = np.concatenate([p.train_batch(step)['inputs'] for p in parts])
      np.testing.assert_array_equal(joined, full.train_batch(step)['inputs'])
  with pytest.raises(ValueError, match='does not divide over 3'):
    lm_dataset(STREAM, 'segments', batch_size=4, process_count=3)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match='mode'):
    lm_dataset(STREAM, 'random')
  with pytest.raises(ValueError, match='cannot fill one batch'):
    lm_dataset(STREAM, 'segments', batch_size=64, seq_length=3)
  with pytest.raises(ValueError, match='step must be >= 0'):
    lm_dataset(STREAM, 'segments').train_batch(-1)
  with pytest.raises(ValueError, match="Unknown split 'dev'"):
    next(lm_dataset(STREAM, 'segments').eval_batches('dev'))


# ------------------------------------------------------------------ the real PTB files
@real_data.needs('ptb', 'ptb.train.txt')
def test_real_ptb_sizes():
  vocab, ids = text.load_ptb(PTB_DIR, 'char')
  assert len(vocab) == 50
  assert {s: len(v) for s, v in ids.items()} == {'train': 5_017_482, 'valid': 393_042,
                                                 'test': 442_423}
  vocab, ids = text.load_ptb(PTB_DIR, 'word')
  assert len(vocab) == 10_000 and vocab[:3] == ['the', '<unk>', '<eos>']
  assert {s: len(v) for s, v in ids.items()} == {'train': 929_589, 'valid': 73_760,
                                                 'test': 82_430}
