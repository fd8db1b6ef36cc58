"""Attentive Reader (Cooijmans sec. 5.4): the DeepMind Q&A reader, the model, its variants,
and training through the task-generic loop (8 devices, kill and resume)."""

import os
import tarfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import checkpoint
from bn_rnn_jax import metric_writer
from bn_rnn_jax import models
from bn_rnn_jax import tasks
from bn_rnn_jax import train
from bn_rnn_jax import config as config_lib
from bn_rnn_jax import loop
from bn_rnn_jax.input_pipeline import reading
import real_data
import reference
import training_fixtures as fx
from training_fixtures import compilation_cache  # pylint: disable=unused-import

WORDS = ('the', 'a', 'house', 'runs', 'said', 'of', 'and', 'river', 'old', 'new')
SPLITS = {'training': 24, 'validation': 8, 'test': 8}
MAX_LENGTH = 48   # T_max of the tiny readers; the fixtures' batches are 32 wide
REAL_DATA = real_data.path('brown_cloze')


# ====================================================================== fixtures
def question_text(rng, index):
  """A `.question` file in DeepMind's layout with 2-4 entities; lengths vary."""
  num_entities = int(rng.integers(2, 5))
  context = []
  for entity in range(num_entities):
    context += list(rng.choice(WORDS, int(rng.integers(1, 4)))) + [f'@entity{entity}', '.']
  context += list(rng.choice(WORDS, int(rng.integers(0, 5))))
  answer = int(rng.integers(0, num_entities))
  query = list(rng.choice(WORDS, 3)) + ['@placeholder', '@entity0' if answer else 'river']
  lines = '\n'.join(f'@entity{e}:Name {e}' for e in range(num_entities))
  return f'http://x/{index}\n\n{" ".join(context)}\n\n{" ".join(query)}\n\n@entity{answer}' \
         f'\n\n{lines}'


def write_questions(root, seed=0):
  rng = np.random.default_rng(seed)
  for folder, count in SPLITS.items():
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(count):
      with open(os.path.join(root, folder, f'{folder}{i:03d}.question'), 'w') as f:
        f.write(question_text(rng, i))
  return root


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """`<tmp>/cloze/questions/{training,validation,test}` and `<tmp>/cloze.tgz` of it."""
  base = tmp_path_factory.mktemp('reading')
  write_questions(str(base / 'cloze' / 'questions'))
  with tarfile.open(str(base / 'cloze.tgz'), 'w:gz') as archive:
    archive.add(str(base / 'cloze'), arcname='cloze')
  return base


@pytest.fixture(scope='module')
def arrays(data_dir):
  return reading.load(str(data_dir / 'cloze'))


def tiny_dataset(arrays, batch_size=8, seed=0):
  return reading.ReadingDataset(arrays, batch_size=batch_size, seed=seed, eval_batch_size=8,
                                length_multiple=32)


def tiny_reader(arrays, variant, max_length=None):
  max_length = max_length or MAX_LENGTH
  return models.AttentiveReader(
      vocab_size=len(arrays['vocab']), num_entities=int(arrays['num_entities']),
      variant=variant, hidden_size=4, embed_size=3,
      layer_options=dict(max_length=max_length, remat='none'))


# ====================================================================== reader
def test_folder_layouts_and_archive_read_alike(data_dir, arrays, tmp_path):
  as_split_folders = reading.load(str(data_dir / 'cloze' / 'questions'))
  from_archive = reading.load(str(data_dir / 'cloze.tgz'))
  for other in (as_split_folders, from_archive):
    assert sorted(other) == sorted(arrays)
    for key in arrays:
      np.testing.assert_array_equal(other[key], arrays[key], err_msg=key)
  assert len(arrays['train/answer']) == SPLITS['training']
  vocab = list(arrays['vocab'])
  assert vocab[:3] == ['<pad>', '<unk>', '@placeholder']
  assert vocab[3:3 + int(arrays['num_entities'])] == [
      f'@entity{i}' for i in range(int(arrays['num_entities']))]


def test_cache_is_read_back_without_parsing(data_dir, arrays, tmp_path, monkeypatch):
  cache = str(tmp_path / 'cache')
  first = reading.load(str(data_dir / 'cloze.tgz'), cache_dir=cache)
  assert len(os.listdir(cache)) == 1
  def no_parse(*args, **kwargs):
    raise AssertionError('parsed again instead of reading the cache')
  monkeypatch.setattr(reading, 'parse_source', no_parse)
  second = reading.load(str(data_dir / 'cloze.tgz'), cache_dir=cache)
  for key in first:
    np.testing.assert_array_equal(second[key], first[key], err_msg=key)
  with pytest.raises(AssertionError, match='parsed again'):  # another option: a new key
    reading.load(str(data_dir / 'cloze.tgz'), vocab_size=20, cache_dir=cache)


@pytest.mark.parametrize('text, problem', [
    ('http://x\n\nthe @entity0 .\n\nthe @placeholder', 'found 3 block'),
    ('http://x\n\nthe @entity0 .\n\nthe query\n\n@entity0\n\n@entity0:A', 'no @placeholder'),
    ('http://x\n\nthe @entity0 .\n\n@placeholder runs\n\nParis\n\n@entity0:A', 'not an @entity'),
    ('http://x\n\nthe @entity0 .\n\n@placeholder runs\n\n@entity0\n\nA', 'does not read'),
])
def test_malformed_file_is_one_line_naming_it(tmp_path, text, problem):
  root = write_questions(str(tmp_path / 'data'))
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


def test_training_batches_are_a_function_of_seed_and_step(arrays):
  dataset = tiny_dataset(arrays)
  a, b = dataset.train_batch(3), dataset.train_batch(3)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  other = dataset.train_batch(4)
  assert not np.array_equal(other['inputs']['document'][:, :4], a['inputs']['document'][:, :4])
  # Shards of two processes put together are the one-process batch.
  halves = [reading.ReadingDataset(arrays, batch_size=8, seed=0, process_index=p,
                                   process_count=2).train_batch(3) for p in (0, 1)]
  whole = jax.tree.map(lambda *x: np.concatenate(x), *halves)
  for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(a)):
    np.testing.assert_array_equal(x, y)


def test_entity_shuffle_moves_the_answer_with_its_entity(arrays):
  dataset = tiny_dataset(arrays, batch_size=16)
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


def test_eval_batches_cover_the_split_once_with_fixed_width(arrays):
  dataset = tiny_dataset(arrays)
  batches = list(dataset.eval_batches('valid'))
  assert sum(float(b['weights'].sum()) for b in batches) == SPLITS['validation']
  assert all(b['inputs']['document'].shape[1] % 32 == 0 for b in batches)
  labels = np.concatenate([b['labels'][b['weights'] > 0] for b in batches])
  assert sorted(labels) == sorted(arrays['valid/answer'])


def test_top_k_sentences_keeps_the_best_matching_in_order():
  context = 'a b . c d . e f . g h'.split()
  assert reading.top_k_sentences(context, ['c', 'h', 'x', '@placeholder'], 2) == \
      'c d . g h'.split()
  assert reading.top_k_sentences(context, ['zz'], 5) == context


def test_frequency_baselines_match_a_count_over_the_files(data_dir, arrays):
  """The baselines recounted from the raw text of the validation files."""
  hits = {'most_frequent': 0, 'exclusive_frequency': 0, 'random_candidate': 0.0}
  folder = data_dir / 'cloze' / 'questions' / 'validation'
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
  assert reading.frequency_baselines(arrays, 'valid') == pytest.approx(expected)


# ====================================================================== model
def _batch(arrays, size=6):
  return tiny_dataset(arrays, batch_size=size).train_batch(0)


@pytest.fixture(scope='module')
def shapes(arrays):
  batch = _batch(arrays)
  return {v: jax.eval_shape(lambda: tiny_reader(arrays, v).init(
      jax.random.PRNGKey(0), batch['inputs'], train=False)) for v in models.READER_VARIANTS}


def _sites(tree, prefix=''):
  out = set()
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out.add('/'.join(str(getattr(k, 'key', k)) for k in path))
  return out


def test_every_variant_has_the_papers_normalisation_sites(shapes):
  attention_norms = ('document_attention_norm', 'query_attention_norm',
                     'read_combination_norm', 'query_combination_norm')
  for variant, variables in shapes.items():
    params, stats = variables['params'], variables.get('batch_stats', {})
    bn = variant.startswith('bn_')
    bidirectional = variant in ('bn_e_star_star', 'lstm_bidirectional')
    for encoder in ('document_encoder', 'query_encoder'):
      # A bidirectional stack holds its forward and backward layers (Flax's names).
      names = ('RecurrentLayer_0', 'RecurrentLayer_1') if bidirectional else ('layer_0',)
      assert set(params[encoder]) == set(names), (variant, encoder)
      for name in names:
        assert ({'input_scale', 'recurrent_scale', 'cell_scale'} <= set(
            params[encoder][name])) == bn, variant
        if bn:
          # Per-step rows for the recurrent term and the cell; the input term per step
          # (bn_lstm, bn_everywhere) or sequence-wise, one row (BN-e*, BN-e**).
          one_stats = stats[encoder][name]
          assert one_stats['recurrent']['mean'].shape[0] == MAX_LENGTH
          assert one_stats['cell']['mean'].shape[0] == MAX_LENGTH
          assert one_stats['input']['mean'].shape[0] == (1 if 'star' in variant
                                                         else MAX_LENGTH)
    everywhere = variant in ('bn_everywhere', 'bn_e_star', 'bn_e_star_star')
    for name in attention_norms:
      assert (name in params) == everywhere, (variant, name)
      if everywhere:
        assert set(params[name]) == {'scale', 'bias'}
    if everywhere:
      rows = stats['document_attention_norm']['stats']['mean'].shape[0]
      assert rows == (MAX_LENGTH if variant == 'bn_everywhere' else 1)
      assert stats['query_attention_norm']['stats']['mean'].shape[0] == 1


def _apply(model, variables, inputs, train=True):
  logits, mutated = model.apply(variables, inputs, train=train,
                                mutable=['batch_stats', 'intermediates'])
  return logits, mutated['intermediates']['attention'][0], mutated.get('batch_stats')


@pytest.fixture(scope='module')
def compiled(arrays):
  """Jitted train-mode apply and init per variant (shared by the tests below)."""
  out = {}
  batch = _batch(arrays)
  for variant in ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star_star'):
    model = tiny_reader(arrays, variant)
    variables = model.init(jax.random.PRNGKey(1), batch['inputs'], train=False)
    out[variant] = (model, variables, jax.jit(lambda v, x, m=model: _apply(m, v, x)))
  return out


def _with_junk_padding(inputs, rng, extra=0):
  junk = dict(inputs)
  for key in ('document', 'query'):
    ids, mask = inputs[key], inputs[f'{key}_mask']
    if extra:
      ids = np.pad(ids, ((0, 0), (0, extra)))
      mask = np.pad(mask, ((0, 0), (0, extra)))
    noise = rng.integers(0, 10, ids.shape).astype(np.int32)
    junk[key] = np.where(mask > 0, ids, noise)
    junk[f'{key}_mask'] = mask
  return junk


def test_padding_gets_zero_attention_and_never_changes_the_loss(arrays, compiled):
  batch = _batch(arrays)
  rng = np.random.default_rng(0)
  for variant, (model, variables, apply) in compiled.items():
    logits, attention, _ = apply(variables, batch['inputs'])
    mask = batch['inputs']['document_mask']
    assert np.all(np.asarray(attention)[mask == 0] == 0.0)
    np.testing.assert_allclose(np.asarray(attention).sum(1), 1.0, rtol=1e-5)
    junk_logits, junk_attention, _ = apply(variables, _with_junk_padding(batch['inputs'], rng))
    np.testing.assert_array_equal(np.asarray(junk_logits), np.asarray(logits), err_msg=variant)
  # Longer padding (more all-padding steps at the end) changes nothing either.
  for variant in ('lstm', 'bn_e_star_star', 'bn_lstm'):
    model, variables, _ = compiled[variant]
    logits, _, _ = _apply(model, variables, batch['inputs'])
    longer, attention, _ = _apply(model, variables,
                                  _with_junk_padding(batch['inputs'], rng, extra=7))
    assert np.all(np.asarray(attention)[:, -7:] == 0.0)
    np.testing.assert_allclose(np.asarray(longer), np.asarray(logits), rtol=1e-5, atol=1e-6,
                               err_msg=variant)


def test_bn_lstm_statistics_count_the_zero_padding_as_the_paper_did(arrays, compiled):
  """bn_lstm's input-term moments at step t are those of all B rows, the padded ones
  being zeros (Cooijmans sec. 5.4), against the masked moments of BN-e*; steps that no
  document reached are not written."""
  batch = _batch(arrays)
  model, variables, apply = compiled['bn_lstm']
  _, _, stats = apply(variables, batch['inputs'])
  x = batch['inputs']
  mask = x['document_mask']
  embed = np.asarray(variables['params']['embed']['embedding'], np.float64)
  kernel = np.asarray(variables['params']['document_encoder']['layer_0']['input_kernel'],
                      np.float64)
  z = (embed[x['document']] * mask[..., None]) @ kernel           # [B, T, 4H], 0 on padding
  longest = int(mask.sum(1).max())
  assert mask[:, :longest].min() == 0                            # some rows are padded
  site = stats['document_encoder']['layer_0']['input']
  np.testing.assert_allclose(np.asarray(site['mean'])[:longest], z.mean(0)[:longest],
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(site['var'])[:longest], z.var(0)[:longest],
                             rtol=1e-3, atol=1e-6)
  masked_mean = (z * mask[..., None]).sum(0) / np.maximum(mask.sum(0), 1)[:, None]
  assert not np.allclose(masked_mean[:longest], z.mean(0)[:longest], atol=1e-4)
  assert np.all(np.asarray(site['count'])[:longest] == 1)
  assert np.all(np.asarray(site['count'])[longest:] == 0)


def test_non_candidates_are_never_predicted_and_gradients_stay_finite(arrays, compiled):
  batch = _batch(arrays)
  model, variables, apply = compiled['lstm']
  candidates = batch['inputs']['candidates']
  outsider = int(np.argmin(candidates.sum(0)))   # an entity missing from some document
  assert candidates[:, outsider].min() == 0
  params = jax.tree.map(np.array, variables['params'])
  params['output']['bias'][outsider] = 1e6       # it would win every argmax if allowed
  logits, _, _ = apply({**variables, 'params': params}, batch['inputs'])
  logits = np.asarray(logits)
  predicted = logits.argmax(1)
  assert np.all(candidates[np.arange(len(predicted)), predicted] == 1)
  probabilities = np.asarray(jax.nn.softmax(jnp.asarray(logits)))
  assert np.all(probabilities[candidates == 0] == 0.0)
  def loss(p):
    out, _ = model.apply({**variables, 'params': p}, batch['inputs'], train=True,
                         mutable=['batch_stats'])
    sums, count = tasks.get('reading_comprehension').loss_sums(out, batch)
    return sums['loss'] / count
  grads = jax.grad(loss)(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(grads['output']['bias'])[outsider]) < 1e-6 or \
      candidates[:, outsider].max() == 1


def test_late_steps_with_few_or_no_valid_documents(arrays, compiled):
  """One long document among short ones; the last columns are padding for every row:
  finite loss and gradients, and no population row past the longest document written."""
  batch = _batch(arrays)
  inputs = dict(batch['inputs'])
  lengths = np.full(6, 3)
  lengths[0] = 20
  steps = np.arange(inputs['document'].shape[1])[None, :]
  inputs['document_mask'] = (steps < lengths[:, None]).astype(np.float32)
  inputs['document'] = np.where(inputs['document_mask'] > 0, inputs['document'], 0)
  inputs['candidates'] = reading.candidate_mask(inputs['document'], int(arrays['num_entities']))
  labels = inputs['candidates'].argmax(1).astype(np.int32)
  for variant in ('bn_everywhere', 'bn_e_star_star'):
    model, variables, apply = compiled[variant]
    logits, _, stats = apply(variables, inputs)
    assert np.all(np.isfinite(np.asarray(logits)[inputs['candidates'] > 0]))
    for path, leaf in jax.tree_util.tree_flatten_with_path(stats)[0]:
      name = jax.tree_util.keystr(path)
      assert np.all(np.isfinite(leaf)), name
      if 'document' in name and name.endswith("['count']") and leaf.shape[0] == MAX_LENGTH:
        assert np.all(leaf[:20] == 1) and np.all(leaf[20:] == 0), name
    def loss(p, m=model, v=variables):
      out, _ = m.apply({**v, 'params': p}, inputs, train=True, mutable=['batch_stats'])
      return tasks.get('reading_comprehension').loss_sums(
          out, {'inputs': inputs, 'labels': labels, 'weights': np.ones(6, np.float32)})[0]['loss']
    grads = jax.jit(jax.grad(loss))(variables['params'])
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads)), variant


def test_a_question_drawn_twice_keeps_bn_e_star_gradients_finite(arrays):
  """Two copies of one query outlast the other queries of the batch, beside different
  documents: zero per-step variance in the query encoder, and the gradient grows about
  32x per step (the BN-e* runs' non-finite stop). The configs' `min_step_count` (8 there,
  3 here for a batch of 6) normalises those steps with the population rows."""
  inputs = dict(_batch(arrays)['inputs'])
  query, query_mask = np.array(inputs['query']), np.array(inputs['query_mask'])
  length = min(20, query.shape[1])
  query_mask[:] = 0
  query_mask[:, :3] = 1
  query_mask[:2, :length] = 1
  query[1] = query[0]
  inputs['query'] = np.where(query_mask > 0, query, 0)
  inputs['query_mask'] = query_mask
  assert not np.array_equal(inputs['document'][0], inputs['document'][1])
  labels = inputs['candidates'].argmax(1).astype(np.int32)

  def largest_gradient(min_step_count):
    model = models.AttentiveReader(
        vocab_size=len(arrays['vocab']), num_entities=int(arrays['num_entities']),
        variant='bn_e_star', hidden_size=4, embed_size=3, layer_options=dict(
            max_length=MAX_LENGTH, remat='none', min_step_count=min_step_count))
    variables = model.init(jax.random.PRNGKey(1), inputs, train=False)
    def loss(p):
      out, _ = model.apply({**variables, 'params': p}, inputs, train=True,
                           mutable=['batch_stats'])
      return tasks.get('reading_comprehension').loss_sums(
          out, {'inputs': inputs, 'labels': labels, 'weights': np.ones(6, np.float32)})[0]['loss']
    grads = jax.jit(jax.grad(loss))(variables['params'])
    largest = [float(np.max(np.abs(g))) for g in jax.tree.leaves(grads)]
    return max(largest) if np.all(np.isfinite(largest)) else np.inf   # max() skips NaN

  unguarded, guarded = largest_gradient(1), largest_gradient(3)
  assert unguarded > 1e8, unguarded   # inf when not finite
  assert np.isfinite(guarded) and guarded < 1e3, guarded


@pytest.mark.parametrize('variant, spec', [
    ('bn_e_star_star', dict(layer_variant='bn_lstm_sequence_input', bidirectional=True,
                            attention_norm='sequence')),
    ('lstm', dict(layer_variant='lstm', bidirectional=False, attention_norm=None)),
])
def test_matches_the_float64_reference(arrays, compiled, variant, spec):
  batch = _batch(arrays)
  model, variables, apply = compiled[variant]
  rng = np.random.default_rng(2)
  # Parameters away from their initial values, so that every gamma and beta matters.
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(np.float32),
                        variables['params'])
  logits, attention, _ = apply({**variables, 'params': params}, batch['inputs'])
  x = batch['inputs']
  ref_logits, ref_attention = reference.attentive_reader(
      jax.tree.map(lambda a: np.asarray(a, np.float64), params), x['document'],
      x['document_mask'], x['query'], x['query_mask'], x['candidates'], **spec)
  np.testing.assert_allclose(np.asarray(attention), ref_attention, rtol=2e-4, atol=2e-6)
  valid = x['candidates'] > 0
  np.testing.assert_allclose(np.asarray(logits)[valid], ref_logits[valid], rtol=2e-4,
                             atol=2e-5)


# ====================================================================== training
def _config(**overrides):
  config = fx.tiny_config('bn_e_star', **{
      'model.hidden_size': 4, 'model.embed_size': 3, 'model.remat': 'none',
      'optimizer.name': 'adam', 'optimizer.clip_norm': 10.0, 'optimizer.learning_rate': 1e-2,
      'train.batch_size': 16, 'eval.batch_size': 8, 'eval.population_batches': 2,
      'checkpoint.best_metric': 'valid/error', 'checkpoint.best_mode': 'min', **overrides})
  return config


@pytest.mark.parametrize('min_step_count', [1, 3])
def test_train_step_on_eight_devices_equals_one(arrays, min_step_count):
  # With min_step_count=3 (2 examples per device) the fallback holds only if the valid
  # counts are those of the global batch.
  config = _config(**{'model.min_step_count': min_step_count})
  dataset = reading.ReadingDataset(arrays, batch_size=16, seed=0, eval_batch_size=8,
                                   length_multiple=32)
  results = {n: fx.one_step(config, dataset, n) for n in (8, 1)}
  (_, s8, metrics8, valid8), (init, s1, metrics1, valid1) = results[8], results[1]
  loss8, loss1 = metrics8['loss'], metrics1['loss']
  moved = max(float(np.max(np.abs(a - b))) for a, b in
              zip(jax.tree.leaves(s1.params), jax.tree.leaves(init.params)))
  assert moved > 1e-4
  np.testing.assert_allclose(loss8, loss1, rtol=2e-6)
  for tree8, tree1 in ((s8.params, s1.params), (s8.batch_stats, s1.batch_stats)):
    for (path, a), b in zip(jax.tree.leaves_with_path(tree8), jax.tree.leaves(tree1)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
  for name in ('loss', 'accuracy'):
    np.testing.assert_allclose(valid8[name], valid1[name], rtol=2e-5)


def test_kill_and_resume_is_exact(arrays, tmp_path):
  config = _config(**{'train.num_steps': 5, 'train.log_every': 2, 'eval.every': 2,
                      'checkpoint.every': 2, 'train.num_devices': 1,
                      'eval.test_at_end': True})
  dataset = reading.ReadingDataset(arrays, batch_size=16, seed=0, eval_batch_size=8,
                                   length_multiple=32)
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  loop.train_and_evaluate(config, straight, dataset)
  with pytest.raises(fx.Killed):
    loop.train_and_evaluate(config, resumed, fx.KillAt(dataset, 3))
  loop.train_and_evaluate(config, resumed, dataset)
  states = []
  for workdir in (straight, resumed):
    trainer = loop.Trainer(config, workdir, dataset)
    ckpt = checkpoint.Checkpointer(workdir, keep=config.checkpoint.keep)
    try:
      states.append(ckpt.restore(trainer.initial_state())[0])
    finally:
      ckpt.close()
  assert int(states[0].step) == int(states[1].step) == 5
  for (path, a), b in zip(jax.tree.leaves_with_path(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  strip = lambda w: [{k: v for k, v in r.items() if k != 'time_s'}
                     for r in metric_writer.read_metrics(w)]
  assert strip(straight) == strip(resumed)
  assert {r['split'] for r in strip(straight)} == {'train', 'valid', 'test'}


# ====================================================================== real data
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
def test_config_file_builds_every_variant_and_the_cpu_preset():
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'experiments',
                      'configs', 'attentive_reader.py')
  spec = importlib.util.spec_from_file_location('attentive_reader_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for variant in models.READER_VARIANTS:
    for arg in (variant, f'{variant},cpu'):
      config = module.get_config(arg)
      config_lib.validate_config(config)
      fast = variant in ('bn_e_star', 'bn_e_star_star')
      assert (config.train.batch_size, config.optimizer.learning_rate) == (
          (40, 8e-4) if fast else (64, 8e-5))
      assert config.model.hidden_size == (64 if arg.endswith(',cpu') else 240)
      # The guard on few-row per-step statistics reaches the layers of the masked variants.
      assert train.layer_options(config, 100)['min_step_count'] == (8 if fast else 1)
  with pytest.raises(ValueError, match='variant must be one of'):
    module.get_config('gru')
  with pytest.raises(ValueError, match=r"'gpu' is no variant and no preset; .* presets are "
                                       r"\('cpu', 'tiny'\)"):
    module.get_config('lstm,gpu')
