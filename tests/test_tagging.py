"""Frame tagging (Laurent et al. sec. 5.1): SequenceTagger, the 'tagging' task, and the
Brown and Kaldi readers of `input_pipeline/tagging.py`."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import tasks
from bn_rnn_jax import train
from bn_rnn_jax import config as config_lib
from bn_rnn_jax.input_pipeline import tagging
import real_data
import reference as ref
import training_fixtures as fx
from training_fixtures import compilation_cache  # pylint: disable=unused-import

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')
B, T, I, H, C = 4, 7, 3, 4, 5
LENGTHS = np.array([7, 5, 3, 1])
MASK = (np.arange(T)[None, :] < LENGTHS[:, None]).astype(np.float32)
REAL_BROWN = real_data.path('brown')


def _tagger(variant):
  return models.SequenceTagger(num_classes=C, variant=variant, hidden_size=H, num_layers=2,
                               bidirectional=True, layer_options={'max_length': T})


def _frames(seed=0):
  rng = np.random.default_rng(seed)
  x = (rng.normal(size=(B, T, I)) * MASK[..., None]).astype(np.float32)
  labels = (rng.integers(0, C, size=(B, T)) * MASK).astype(np.int32)
  return x, labels


def _random_variables(model, x, seed=1):
  """Variables with float64-reference random parameters (gamma, beta, biases off their
  initial values), as float32."""
  variables = model.init(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(MASK),
                         train=False)
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), variables['params'])
  def draw(path, value):
    name = path[-1].key
    return ref.random_params({name: value.shape}, rng)[name].astype(np.float32)
  params = jax.tree_util.tree_map_with_path(draw, params)
  return {'params': params, 'batch_stats': variables.get('batch_stats', {})}


_STEPS = {}


def _train_step_fn(variant):
  """Jitted `(params, batch_stats, x, labels, mask) -> (loss, grads, logits, stats)`:
  one compilation per variant, shared by the tests."""
  if variant not in _STEPS:
    model, task = _tagger(variant), tasks.get('tagging')
    def loss_fn(params, batch_stats, x, labels, mask):
      batch = {'inputs': x, 'labels': labels, 'mask': mask, 'weights': jnp.ones((B,))}
      (_, logits), mutated = task.apply(model, {'params': params, 'batch_stats': batch_stats},
                                        batch, train=True, carry=None,
                                        mutable=["batch_stats"])
      sums, count = task.loss_sums(logits, batch)
      return sums['loss'] / count, (logits, mutated['batch_stats'], sums, count)
    _STEPS[variant] = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  return _STEPS[variant]


def _run(variant, variables, x, labels):
  (loss, (logits, stats, sums, count)), grads = _train_step_fn(variant)(
      variables['params'], variables['batch_stats'], x, labels, MASK)
  return dict(loss=loss, logits=logits, stats=stats, sums=sums, count=count, grads=grads)


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  for (path, x), y in zip(jax.tree.leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


# ------------------------------------------------------------------ model and metrics
@pytest.mark.parametrize('junk', ['large', 'nan'])
@pytest.mark.parametrize('variant', VARIANTS)
def test_padding_changes_no_loss_gradient_or_statistic(variant, junk):
  x, labels = _frames()
  model = _tagger(variant)
  variables = _random_variables(model, x)
  rng = np.random.default_rng(5)
  fill = 1e3 * rng.normal(size=x.shape) if junk == 'large' else np.full(x.shape, np.nan)
  x_junk = np.where(MASK[..., None] > 0, x, fill).astype(np.float32)
  labels_junk = np.where(MASK > 0, labels, rng.integers(0, C, size=labels.shape))
  clean = _run(variant, variables, x, labels)
  dirty = _run(variant, variables, x_junk, labels_junk.astype(np.int32))
  assert float(clean['count']) == LENGTHS.sum()
  np.testing.assert_allclose(dirty['loss'], clean['loss'], rtol=1e-6)
  for name in ('loss', 'accuracy', 'fer'):
    np.testing.assert_allclose(dirty['sums'][name], clean['sums'][name], rtol=1e-6)
  valid = MASK > 0
  np.testing.assert_allclose(np.asarray(dirty['logits'])[valid],
                             np.asarray(clean['logits'])[valid], rtol=1e-5, atol=1e-6)
  _assert_trees_close(dirty['grads'], clean['grads'])
  _assert_trees_close(dirty['stats'], clean['stats'])
  assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(clean['grads']))


def test_bidirectional_tagger_reads_each_sequence_alone():
  """Without batch statistics, each row's logits are those of the row run alone and
  unpadded: the backward direction reverses the valid steps only (it starts on a row's
  last valid step, not on its padding)."""
  x, _ = _frames()
  model = _tagger('lstm')
  variables = _random_variables(model, x)
  batched = np.asarray(model.apply(variables, x, MASK, train=False))
  for b, length in enumerate(LENGTHS):
    alone = np.asarray(model.apply(variables, x[b:b + 1, :length], None, train=False))
    np.testing.assert_allclose(batched[b, :length], alone[0], rtol=1e-5, atol=1e-6)
  # A full-row reversal would start the backward pass on padding: not what happens.
  assert np.abs(batched[1, :5] - batched[1, :5][::-1]).max() > 1e-4


@pytest.mark.parametrize('variant', VARIANTS)
def test_stacked_bidirectional_tagger_matches_float64_reference(variant):
  x, labels = _frames()
  model = _tagger(variant)
  variables = _random_variables(model, x)
  out = _run(variant, variables, x, labels)
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), variables['params'])
  rnn = params['rnn']
  # StackedRNN names its layers in creation order: layer l forward, then its backward.
  layers = [(rnn[f'RecurrentLayer_{2 * l}'], rnn[f'RecurrentLayer_{2 * l + 1}'])
            for l in range(2)]
  def reference(layer0_forward_bias):
    stack = [({**layers[0][0], 'bias': layer0_forward_bias}, layers[0][1]), layers[1]]
    return ref.run_bidirectional_tagger(stack, params['softmax']['kernel'],
                                        params['softmax']['bias'], x, MASK, variant)
  logits, moments = reference(layers[0][0]['bias'])
  valid = MASK > 0
  np.testing.assert_allclose(np.asarray(out['logits'])[valid], logits[valid], rtol=2e-4,
                             atol=2e-5)
  fce, fer = ref.frame_metrics(logits, labels, MASK)
  np.testing.assert_allclose(float(out['loss']), fce, rtol=1e-4)
  np.testing.assert_allclose(float(out['sums']['fer'] / out['count']), fer, atol=1e-6)
  # The gradient of the FCE w.r.t. one layer's bias, by finite differences of the reference.
  numeric = ref.numerical_grad(
      lambda a: ref.frame_metrics(reference(a['bias'])[0], labels, MASK)[0],
      {'bias': layers[0][0]['bias']})['bias']
  np.testing.assert_allclose(out['grads']['rnn']['RecurrentLayer_0']['bias'], numeric,
                             rtol=2e-3, atol=2e-5)
  if variant != 'lstm':
    # The input term's moments: sequence-wise (one row) or frame-wise (a row per step).
    stats = out['stats']['rnn']['RecurrentLayer_1']['input']
    mom = moments[0][1]['input']
    mean = mom[0] if variant == 'bn_input_only_seq' else np.stack([m[0] for m in mom])
    np.testing.assert_allclose(np.asarray(stats['mean']).reshape(mean.shape), mean,
                               rtol=1e-4, atol=1e-5)


def test_classifier_bidirectional_reads_both_final_states():
  x, _ = _frames()
  model = models.SequenceClassifier(num_classes=3, variant='lstm', hidden_size=H,
                                    bidirectional=True)
  variables = model.init(jax.random.PRNGKey(0), x, MASK, train=False)
  assert variables['params']['classifier']['kernel'].shape == (2 * H, 3)
  logits = model.apply(variables, x, MASK, train=False)
  # Row 1 (5 valid steps) alone and unpadded gives the same logits.
  alone = model.apply(variables, x[1:2, :5], None, train=False)
  np.testing.assert_allclose(logits[1], alone[0], rtol=1e-5, atol=1e-6)


def test_tagger_input_errors_are_one_line():
  with pytest.raises(ValueError, match=r'token ids \[batch, time\]; got shape \(2, 3, 4\)'):
    models.SequenceTagger(num_classes=3, vocab_size=5, num_layers=1, hidden_size=2).init(
        jax.random.PRNGKey(0), jnp.zeros((2, 3, 4), jnp.int32), train=False)
  with pytest.raises(ValueError, match="kernel_init must be one of"):
    models.SequenceTagger(num_classes=3, kernel_init='he', num_layers=1, hidden_size=2).init(
        jax.random.PRNGKey(0), jnp.zeros((2, 3, 4)), train=False)


# ------------------------------------------------------------------ Kaldi reader
def _kaldi_arrays(lengths, label_lengths=None, dims=3, seed=0):
  """Random `{utterance: features [n, dims]}` and `{utterance: labels [n]}`."""
  rng = np.random.default_rng(seed)
  feats = {f'utt{i}': (rng.normal(size=(n, dims)) * 2 + 5).astype(np.float32)
           for i, n in enumerate(lengths)}
  labels = {u: rng.integers(0, 4, size=n).astype(np.int32)
            for u, n in zip(feats, label_lengths or lengths)}
  return feats, labels


def _write_ark(spec: str, arrays: dict) -> None:
  """Write `{utterance: array}` with kaldiio's writer (`spec` as 'ark:...' or 'ark,scp:...')."""
  import kaldiio  # pylint: disable=g-import-not-at-top
  with kaldiio.WriteHelper(spec) as writer:
    for utt, value in arrays.items():
      writer(utt, value)


def _kaldi_config(tmp_path, **data):
  config = config_lib.default_config()
  config.data = tagging.default_data_config('kaldi')
  config.data.update(dict(max_frames=10, buckets=(5,), train_eval_size=2, **data))
  config.train.batch_size = 2
  config.eval.batch_size = 2
  return config


def test_kaldi_reader_normalises_drops_long_utterances_and_pairs_labels(tmp_path):
  feats, labels = _kaldi_arrays([4, 6, 3, 12, 5])
  _write_ark(f'ark,scp:{tmp_path}/train.ark,{tmp_path}/train.scp', feats)
  with open(tmp_path / 'train_ali.txt', 'w') as f:
    for utt, value in labels.items():
      f.write(f"{utt} {' '.join(map(str, value))}\n")
  valid_feats, valid_labels = _kaldi_arrays([3, 11], seed=1)
  _write_ark(f'ark:{tmp_path}/valid.ark', valid_feats)
  _write_ark(f'ark:{tmp_path}/valid_ali.ark', valid_labels)
  config = _kaldi_config(tmp_path, train_feats=str(tmp_path / 'train.scp'),
                         train_labels=str(tmp_path / 'train_ali.txt'),
                         valid_feats=str(tmp_path / 'valid.ark'),
                         valid_labels=str(tmp_path / 'valid_ali.ark'))
  dataset = tagging.get_dataset(config)
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
  _write_ark(f'ark,scp:{tmp_path}/f.ark,{tmp_path}/f.scp', feats)
  _write_ark(f'ark:{tmp_path}/ali.ark', labels)
  config = _kaldi_config(tmp_path, train_feats=str(tmp_path / 'f.scp'),
                         train_labels=str(tmp_path / 'ali.ark'))
  with pytest.raises(ValueError, match="utterance 'utt1' has 6 feature frames but 5 labels"):
    tagging.get_dataset(config)
  config.data.train_labels = str(tmp_path / 'missing.txt')
  with pytest.raises(FileNotFoundError, match='missing.txt'):
    tagging.get_dataset(config)
  (tmp_path / 'moved.scp').write_text(f'utt0 {tmp_path}/gone.ark:5\n')
  config.data.train_feats = str(tmp_path / 'moved.scp')
  with pytest.raises(FileNotFoundError, match="moved.scp.*cannot read '.*gone.ark'"):
    tagging.get_dataset(config)


# ------------------------------------------------------------------ Brown reader
BROWN_FIXTURE = {
    'ca01': ['\tThe/at Fulton/np-tl jury/nn said/vbd ./.', '',
             '\tThe/at jury/nn did/dod n\'t/*  go/vb ./.', '\tHe/pps said/vbd it/pps ./.'],
    'cb02': ['\tThe/at city/nn-hl was/bedz n\'t/* big/jj and/cc the/at jury/nn said/vbd '
             'so/rb ./.', '\tIt/pps said/vbd ./.'],
    'ca09': ['\tThe/AT jury/NN-TL said/VBD il/fw-at ./.'],
    'cr10': ['\tHe\'s/pps+bez big/jj ./.', '\tThe/at unseen/jj word/nn ./.'],
}


def _write_brown(folder, files=BROWN_FIXTURE):
  os.makedirs(folder, exist_ok=True)
  for name, lines in files.items():
    with open(os.path.join(folder, name), 'w') as f:
      f.write('\n'.join(lines) + '\n')
  with open(os.path.join(folder, 'README'), 'w') as f:
    f.write('not a corpus file\n')
  return str(folder)


def _brown_config(path, **data):
  config = config_lib.default_config()
  config.data = tagging.default_data_config('brown')
  config.data.update(dict(path=path, buckets=(4, 8), train_eval_size=2, min_count=2, **data))
  config.train.batch_size = 2
  config.eval.batch_size = 2
  return config


def test_brown_reader_splits_by_file_reduces_tags_and_batches_in_buckets(tmp_path):
  config = _brown_config(_write_brown(tmp_path / 'brown'))
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
  folder = _write_brown(tmp_path / 'bad', {'ca01': ['\tThe/at jury said/vbd']})
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


# ------------------------------------------------------------------ training
def _synthetic_tagging(batch_size=16, seed=0):
  """Token sequences whose tag is a function of the token and of its right neighbour
  (a bidirectional model can learn it)."""
  rng = np.random.default_rng(seed)
  def split(n):
    ids = [rng.integers(1, 9, size=rng.integers(2, 9)).astype(np.int32) for _ in range(n)]
    labels = [((s + np.append(s[1:], 0)) % 3).astype(np.int32) for s in ids]
    return ids, labels
  return tagging.TaggingDataset(
      {'train': split(64), 'valid': split(12)}, num_classes=3, vocab_size=9,
      buckets=(8,), seed=seed, batch_size=batch_size, eval_batch_size=8)  # one shape


def test_tagging_train_step_on_eight_devices_equals_one():
  config = fx.tiny_config('bn_input_only_seq', **{'model.initial_state': 'zeros'})
  config.model.bidirectional = True
  config.model.embed_size = 6
  config.model.num_layers = 2
  config.model.hidden_size = 4
  config.checkpoint.best_metric = 'valid/fce'
  dataset = _synthetic_tagging()
  results = {n: fx.one_step(config, dataset, n) for n in (8, 1)}
  (_, s8, m8, v8), (init, s1, m1, v1) = results[8], results[1]
  moved = max(float(np.max(np.abs(a - b))) for a, b in
              zip(jax.tree.leaves(s1.params), jax.tree.leaves(init.params)))
  assert moved > 1e-4
  _assert_trees_close(s8.params, s1.params, rtol=2e-5)
  _assert_trees_close(s8.batch_stats, s1.batch_stats, rtol=2e-5)
  for name in ('loss', 'fer', 'grad_norm'):
    np.testing.assert_allclose(m8[name], m1[name], rtol=2e-6, err_msg=name)
  for name in ('fce', 'fer'):
    np.testing.assert_allclose(v8[name], v1[name], rtol=2e-5, err_msg=name)
  assert v1['fer'] == pytest.approx(1.0 - v1['accuracy'])


def test_laurent_and_brown_configs_build_the_papers_model():
  import importlib.util  # pylint: disable=g-import-not-at-top
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         'experiments', 'configs')
  loaded = {}
  for name in ('laurent_speech', 'brown_tagger'):
    spec = importlib.util.spec_from_file_location(name, os.path.join(configs, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loaded[name] = module.get_config()
    config_lib.validate_config(loaded[name])
  config = loaded['laurent_speech']
  options = train.layer_options(config, config.data.max_frames)
  assert options['input_init'] == options['recurrent_init'] == 'glorot_uniform'
  model = tasks.get('tagging').build_model(config, {'num_classes': 3546}, options)
  assert (model.num_layers, model.hidden_size, model.bidirectional, model.variant) == (
      5, 250, True, 'bn_input_only_seq')
  assert model.kernel_init == 'glorot_uniform' and model.vocab_size is None
  assert (config.optimizer.name, config.optimizer.learning_rate, config.optimizer.momentum,
          config.train.batch_size) == ('sgd', 1e-4, 0.9, 24)
  brown = tasks.get('tagging').build_model(loaded['brown_tagger'],
                                           {'num_classes': 104, 'vocab_size': 50}, options)
  assert brown.bidirectional and brown.vocab_size == 50
