"""`input_pipeline/reading.py`: DeepMind-format cloze questions (a folder, split folders or
an archive) read into arrays, cached, batched with the entity shuffle, and the frequency
baselines; on tiny fixture questions, and on the real brown_cloze set when it is under
the data root."""

import os

import jax
import numpy as np
import pytest

from bn_rnn_jax.input_pipeline import reading
import real_data
import training_fixtures as fx
from training_fixtures import cloze_arrays, cloze_dir  # pylint: disable=unused-import

REAL_DATA = real_data.path('brown_cloze')
SPLITS = fx.QUESTION_SPLITS


def test_folder_layouts_and_archive_read_alike(cloze_dir, cloze_arrays, tmp_path):
  as_split_folders = reading.load(str(cloze_dir / 'cloze' / 'questions'))
  from_archive = reading.load(str(cloze_dir / 'cloze.tgz'))
  for other in (as_split_folders, from_archive):
    assert sorted(other) == sorted(cloze_arrays)
    for key in cloze_arrays:
      np.testing.assert_array_equal(other[key], cloze_arrays[key], err_msg=key)
  assert len(cloze_arrays['train/answer']) == SPLITS['training']
  vocab = list(cloze_arrays['vocab'])
  assert vocab[:3] == ['<pad>', '<unk>', '@placeholder']
  assert vocab[3:3 + int(cloze_arrays['num_entities'])] == [
      f'@entity{i}' for i in range(int(cloze_arrays['num_entities']))]


def test_cache_is_read_back_without_parsing(cloze_dir, cloze_arrays, tmp_path, monkeypatch):
  cache = str(tmp_path / 'cache')
  first = reading.load(str(cloze_dir / 'cloze.tgz'), cache_dir=cache)
  assert len(os.listdir(cache)) == 1
  def no_parse(*args, **kwargs):
    raise AssertionError('parsed again instead of reading the cache')
  monkeypatch.setattr(reading, 'parse_source', no_parse)
  second = reading.load(str(cloze_dir / 'cloze.tgz'), cache_dir=cache)
  for key in first:
    np.testing.assert_array_equal(second[key], first[key], err_msg=key)
  with pytest.raises(AssertionError, match='parsed again'):  # another option: a new key
    reading.load(str(cloze_dir / 'cloze.tgz'), vocab_size=20, cache_dir=cache)


@pytest.mark.parametrize('text, problem', [
    ('http://x\n\nthe @entity0 .\n\nthe @placeholder', 'found 3 block'),
    ('http://x\n\nthe @entity0 .\n\nthe query\n\n@entity0\n\n@entity0:A', 'no @placeholder'),
    ('http://x\n\nthe @entity0 .\n\n@placeholder runs\n\nParis\n\n@entity0:A', 'not an @entity'),
    ('http://x\n\nthe @entity0 .\n\n@placeholder runs\n\n@entity0\n\nA', 'does not read'),
])
def test_malformed_file_is_one_line_naming_it(tmp_path, text, problem):
  root = fx.write_questions(str(tmp_path / 'data'))
  bad = os.path.join(root, 'validation', 'zz_bad.question')
  with open(bad, 'w') as f:
    f.write(text)
  with pytest.raises(ValueError, match='zz_bad.question: malformed') as error:
    reading.load(root)
  assert problem in str(error.value) and '\n' not in str(error.value)


def test_missing_source_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match='nowhere'):
    reading.load(str(tmp_path / 'nowhere'))
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(FileNotFoundError, match='empty holds neither'):
    reading.load(str(tmp_path / 'empty'))


def test_training_batches_are_a_function_of_seed_and_step(cloze_arrays):
  dataset = fx.tiny_reading_dataset(cloze_arrays)
  a, b = dataset.train_batch(3), dataset.train_batch(3)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  other = dataset.train_batch(4)
  assert not np.array_equal(other['inputs']['document'][:, :4], a['inputs']['document'][:, :4])
  # Shards of two processes put together are the one-process batch.
  halves = [reading.ReadingDataset(cloze_arrays, batch_size=8, seed=0, process_index=p,
                                   process_count=2).train_batch(3) for p in (0, 1)]
  whole = jax.tree.map(lambda *x: np.concatenate(x), *halves)
  for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(a)):
    np.testing.assert_array_equal(x, y)


def test_entity_shuffle_moves_the_answer_with_its_entity(cloze_arrays):
  dataset = fx.tiny_reading_dataset(cloze_arrays, batch_size=16)
  index, permutations = dataset.train_indices(5)
  plain = dataset.batch('train', index)
  shuffled = dataset.train_batch(5)
  assert not np.array_equal(shuffled['labels'], plain['labels'])  # ids did change
  offset = reading.ENTITY_OFFSET
  for b in range(16):
    doc, new_doc = plain['inputs']['document'][b], shuffled['inputs']['document'][b]
    # Where the answer was mentioned, the new answer id is mentioned, and only there.
    np.testing.assert_array_equal(doc == plain['labels'][b] + offset,
                                  new_doc == shuffled['labels'][b] + offset)
    # Every entity keeps its mentions; words are untouched.
    for e in range(dataset.num_entities):
      np.testing.assert_array_equal(doc == e + offset, new_doc == permutations[b, e] + offset)
    words = (doc < offset) | (doc >= offset + dataset.num_entities)
    np.testing.assert_array_equal(doc[words], new_doc[words])
    # Candidates are the entities of the (new) document, and include the answer.
    present = np.unique(new_doc[(new_doc >= offset) & (new_doc < offset + dataset.num_entities)])
    np.testing.assert_array_equal(np.nonzero(shuffled['inputs']['candidates'][b])[0],
                                  present - offset)
    assert shuffled['inputs']['candidates'][b, shuffled['labels'][b]] == 1


def test_eval_batches_cover_the_split_once_with_fixed_width(cloze_arrays):
  dataset = fx.tiny_reading_dataset(cloze_arrays)
  batches = list(dataset.eval_batches('valid'))
  assert sum(float(b['weights'].sum()) for b in batches) == SPLITS['validation']
  assert all(b['inputs']['document'].shape[1] % 32 == 0 for b in batches)
  labels = np.concatenate([b['labels'][b['weights'] > 0] for b in batches])
  assert sorted(labels) == sorted(cloze_arrays['valid/answer'])


def test_top_k_sentences_keeps_the_best_matching_in_order():
  context = 'a b . c d . e f . g h'.split()
  assert reading.top_k_sentences(context, ['c', 'h', 'x', '@placeholder'], 2) == \
      'c d . g h'.split()
  assert reading.top_k_sentences(context, ['zz'], 5) == context


def test_frequency_baselines_match_a_count_over_the_files(cloze_dir, cloze_arrays):
  """The baselines recounted from the raw text of the validation files."""
  hits = {'most_frequent': 0, 'exclusive_frequency': 0, 'random_candidate': 0.0}
  folder = cloze_dir / 'cloze' / 'questions' / 'validation'
  for name in sorted(os.listdir(folder)):
    url, context, query, answer, _ = open(folder / name).read().split('\n\n')
    counts = {}
    for token in context.split():
      if token.startswith('@entity'):
        counts[token] = counts.get(token, 0) + 1
    ranked = sorted(counts, key=lambda e: (-counts[e], int(e[7:])))
    hits['most_frequent'] += ranked[0] == answer
    rest = [e for e in ranked if e not in query.split()] or ranked
    hits['exclusive_frequency'] += rest[0] == answer
    hits['random_candidate'] += 1 / len(counts)
  expected = {k: v / SPLITS['validation'] for k, v in hits.items()}
  assert reading.frequency_baselines(cloze_arrays, 'valid') == pytest.approx(expected)


@real_data.needs('brown_cloze', 'training')
def test_real_brown_cloze_folder():
  """The real set reads, every answer is a candidate of its document (brown_cloze's
  contexts always contain the answer), and the shuffle keeps that true."""
  data = reading.load(REAL_DATA)
  sizes = {s: len(data[f'{s}/answer']) for s in ('train', 'valid', 'test')}
  assert all(n > 0 for n in sizes.values())
  dataset = reading.ReadingDataset(data, batch_size=64, seed=0, eval_batch_size=64)
  for batch in [dataset.train_batch(0)] + list(dataset.eval_batches('valid')):
    rows = np.arange(len(batch['labels']))
    assert np.all(batch['inputs']['candidates'][rows, batch['labels']] == 1)
    doc = batch['inputs']['document']
    assert np.all(doc[batch['inputs']['document_mask'] == 0] == 0)
  baselines = reading.frequency_baselines(data, 'valid')
  assert 0.0 < baselines['most_frequent'] <= baselines['exclusive_frequency'] + 0.05


# ====================================================================== config
