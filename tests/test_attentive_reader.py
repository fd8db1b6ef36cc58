"""Attentive Reader (Cooijmans sec. 5.4): the model and its variants against the float64
reference, padding and few-document steps, and training through the task-generic loop
(8 devices, kill and resume). The question reader is in `test_input_pipeline_reading.py`,
the config file in `test_experiment_configs.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import policy
from bn_rnn_jax.input_pipeline import reading
from bn_rnn_jax.training import tasks
from bn_rnn_jax.training import loop
import helpers
import reference
import training_fixtures as fx
from training_fixtures import cloze_arrays, cloze_dir  # pylint: disable=unused-import

MAX_LENGTH = 48   # T_max of the tiny readers; the fixtures' batches are 32 wide


# ====================================================================== fixtures
def tiny_reader(arrays, variant, max_length=None):
  max_length = max_length or MAX_LENGTH
  return models.attentive_reader(
      variant, len(arrays['vocab']), int(arrays['num_entities']), 4, embed_size=3,
      layer_fields=dict(max_length=max_length, execution=policy.Execution(remat='none')))


# ====================================================================== model
def _batch(arrays, size=6):
  return fx.tiny_reading_dataset(arrays, batch_size=size).train_batch(0)


@pytest.fixture(scope='module')
def shapes(cloze_arrays):
  batch = _batch(cloze_arrays)
  return {v: jax.eval_shape(lambda: tiny_reader(cloze_arrays, v).init(
      jax.random.PRNGKey(0), batch['inputs'], use_running_average=True,
      deterministic=True)) for v in models.READER_VARIANTS}


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
      # A bidirectional stack's layer holds its forward and backward layers.
      assert set(params[encoder]) == {'layer_0'}, (variant, encoder)
      names = ('forward_layer', 'backward_layer') if bidirectional else (None,)
      layer = lambda tree, name: tree['layer_0'] if name is None else tree['layer_0'][name]
      for name in names:
        assert ({'input_scale', 'recurrent_scale', 'cell_scale'} <= set(
            layer(params[encoder], name))) == bn, variant
        if bn:
          # Per-step rows for the recurrent term and the cell; the input term per step
          # (bn_lstm, bn_everywhere) or sequence-wise, one row (BN-e*, BN-e**).
          one_stats = layer(stats[encoder], name)
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
  logits, mutated = model.apply(variables, inputs, use_running_average=not train,
                                deterministic=not train,
                                mutable=['batch_stats', 'intermediates'])
  return logits, mutated['intermediates']['attention'][0], mutated.get('batch_stats')


@pytest.fixture(scope='module')
def compiled(cloze_arrays):
  """Jitted train-mode apply and init per variant (shared by the tests below)."""
  out = {}
  batch = _batch(cloze_arrays)
  for variant in ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star_star'):
    model = tiny_reader(cloze_arrays, variant)
    variables = model.init(jax.random.PRNGKey(1), batch['inputs'], use_running_average=True,
                           deterministic=True)
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


@pytest.mark.slow
def test_padding_gets_zero_attention_and_never_changes_the_loss(cloze_arrays, compiled):
  batch = _batch(cloze_arrays)
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


@pytest.mark.slow
def test_bn_lstm_statistics_count_the_zero_padding_as_the_paper_did(cloze_arrays, compiled):
  """bn_lstm's input-term moments at step t are those of all B rows, the padded ones
  being zeros (Cooijmans sec. 5.4), against the masked moments of BN-e*; steps that no
  document reached are not written."""
  batch = _batch(cloze_arrays)
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
  # Rows count the documents that reach them (the moments' weight), padding or not.
  np.testing.assert_array_equal(np.asarray(site['count'])[:longest], mask.sum(0)[:longest])
  assert np.all(np.asarray(site['count'])[longest:] == 0)


@pytest.mark.slow
def test_non_candidates_are_never_predicted_and_gradients_stay_finite(cloze_arrays, compiled):
  batch = _batch(cloze_arrays)
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
  # An entity made no row's candidate (and no row's answer) gets no gradient on its output
  # bias, where an answer gets one.
  unused = next(e for e in range(candidates.shape[1]) if e not in batch['labels'])
  absent = dict(batch, inputs=dict(batch['inputs'], candidates=np.where(
      np.arange(candidates.shape[1]) == unused, 0, candidates)))
  def loss(p):
    out, _ = model.apply({**variables, 'params': p}, absent['inputs'],
                         use_running_average=False, deterministic=False,
                         mutable=['batch_stats'])
    sums, count = tasks.get('reading_comprehension').loss_sums(out, absent)
    return sums['loss'] / count
  grads = jax.grad(loss)(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  bias_grad = np.abs(np.asarray(grads['output']['bias']))
  assert bias_grad[unused] < 1e-6
  assert bias_grad[batch['labels'][0]] > 1e-6


@pytest.mark.slow
def test_late_steps_with_few_or_no_valid_documents(cloze_arrays, compiled):
  """One long document among short ones; the last columns are padding for every row:
  finite loss and gradients, and no population row past the longest document written."""
  batch = _batch(cloze_arrays)
  inputs = dict(batch['inputs'])
  lengths = np.full(6, 3)
  lengths[0] = 20
  steps = np.arange(inputs['document'].shape[1])[None, :]
  inputs['document_mask'] = (steps < lengths[:, None]).astype(np.float32)
  inputs['document'] = np.where(inputs['document_mask'] > 0, inputs['document'], 0)
  inputs['candidates'] = reading.candidate_mask(inputs['document'],
                                                int(cloze_arrays['num_entities']))
  labels = inputs['candidates'].argmax(1).astype(np.int32)
  for variant in ('bn_everywhere', 'bn_e_star_star'):
    model, variables, apply = compiled[variant]
    logits, _, stats = apply(variables, inputs)
    assert np.all(np.isfinite(np.asarray(logits)[inputs['candidates'] > 0]))
    for path, leaf in jax.tree_util.tree_flatten_with_path(stats)[0]:
      name = jax.tree_util.keystr(path)
      assert np.all(np.isfinite(leaf)), name
      if 'document' in name and name.endswith("['count']") and leaf.shape[0] == MAX_LENGTH:
        assert np.all(leaf[:20] >= 1) and np.all(leaf[20:] == 0), name
    def loss(p, m=model, v=variables):
      out, _ = m.apply({**v, 'params': p}, inputs, use_running_average=False,
                       deterministic=False, mutable=['batch_stats'])
      return tasks.get('reading_comprehension').loss_sums(
          out, {'inputs': inputs, 'labels': labels, 'weights': np.ones(6, np.float32)})[0]['loss']
    grads = jax.jit(jax.grad(loss))(variables['params'])
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads)), variant


# The layer's own: test_recurrent.py::test_coinciding_rows_at_late_steps_keep_the_gradient_bounded.
@pytest.mark.exhaustive
def test_a_question_drawn_twice_keeps_bn_e_star_gradients_finite(cloze_arrays):
  """Two copies of one query outlast the other queries of the batch, beside different
  documents: zero per-step variance in the query encoder, and the gradient grows about
  32x per step (the BN-e* runs' non-finite stop). The configs' `min_step_count` (8 there,
  3 here for a batch of 6) normalises those steps with the population rows."""
  inputs = dict(_batch(cloze_arrays)['inputs'])
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
    model = models.attentive_reader(
        'bn_e_star', len(cloze_arrays['vocab']), int(cloze_arrays['num_entities']), 4,
        embed_size=3, layer_fields=dict(max_length=MAX_LENGTH,
                                        execution=policy.Execution(remat='none'),
                                        min_step_count=min_step_count))
    variables = model.init(jax.random.PRNGKey(1), inputs, use_running_average=True,
                           deterministic=True)
    def loss(p):
      out, _ = model.apply({**variables, 'params': p}, inputs, use_running_average=False,
                           deterministic=False, mutable=['batch_stats'])
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
@pytest.mark.slow
def test_matches_the_float64_reference(cloze_arrays, compiled, variant, spec):
  batch = _batch(cloze_arrays)
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


@pytest.mark.exhaustive  # devices: tests/test_eight_devices_equal_one.py
@pytest.mark.parametrize('min_step_count', [1, 3])
def test_train_step_on_eight_devices_equals_one(cloze_arrays, min_step_count):
  # With min_step_count=3 (2 examples per device) the fallback holds only if the valid
  # counts are those of the global batch.
  config = _config(**{'model.min_step_count': min_step_count})
  dataset = fx.tiny_reading_dataset(cloze_arrays, batch_size=16)
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


@pytest.mark.exhaustive  # the resume guarantee itself: tests/test_loop.py
def test_kill_and_resume_is_exact(cloze_arrays, tmp_path):
  config = _config(**{'train.num_steps': 5, 'train.log_every': 2, 'eval.every': 2,
                      'checkpoint.every': 2, 'train.num_devices': 1,
                      'eval.test_at_end': True})
  dataset = fx.tiny_reading_dataset(cloze_arrays, batch_size=16)
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  loop.train_and_evaluate(config, straight, dataset)
  with pytest.raises(fx.Killed):
    loop.train_and_evaluate(config, resumed, fx.KillAt(dataset, 3))
  loop.train_and_evaluate(config, resumed, dataset)
  states = [fx.restore(config, workdir, dataset)[0] for workdir in (straight, resumed)]
  assert int(states[0].step) == int(states[1].step) == 5
  helpers.assert_trees_equal(states[0], states[1])
  records = fx.records_without_time(straight)
  assert records == fx.records_without_time(resumed)
  assert {r['split'] for r in records} == {'train', 'valid', 'test'}
