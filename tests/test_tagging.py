"""Frame tagging (Laurent et al. sec. 5.1): the stacked bidirectional `SequenceTagger`
trained through the 'tagging' task, against the float64 reference, with padding that
changes nothing, on 8 devices as on 1. The readers are in
`test_input_pipeline_tagging.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import variants
from bn_rnn_jax.input_pipeline import tagging
from bn_rnn_jax.training import tasks
import helpers
import reference as ref
import training_fixtures as fx

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')
B, T, I, H, C = 4, 7, 3, 4, 5
LENGTHS = np.array([7, 5, 3, 1])
MASK = helpers.prefix_mask(LENGTHS, T)


def _tagger(variant):
  return models.SequenceTagger(C, variants.make_layer(variant, H, max_length=T), num_layers=2,
                               bidirectional=True)


def _frames(seed=0):
  rng = np.random.default_rng(seed)
  x = (rng.normal(size=(B, T, I)) * MASK[..., None]).astype(np.float32)
  labels = (rng.integers(0, C, size=(B, T)) * MASK).astype(np.int32)
  return x, labels


def _random_variables(model, x, seed=1):
  """Variables with float64-reference random parameters (gamma, beta, biases off their
  initial values), as float32."""
  variables = model.init(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(MASK),
                         use_running_average=True, deterministic=True)
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
                                        batch, use_running_average=False,
                                        deterministic=False, carry=None,
                                        mutable=["batch_stats"])
      sums, count = task.loss_sums(logits, batch)
      return sums['loss'] / count, (logits, mutated['batch_stats'], sums, count)
    _STEPS[variant] = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  return _STEPS[variant]


def _run(variant, variables, x, labels):
  (loss, (logits, stats, sums, count)), grads = _train_step_fn(variant)(
      variables['params'], variables['batch_stats'], x, labels, MASK)
  return dict(loss=loss, logits=logits, stats=stats, sums=sums, count=count, grads=grads)


# ------------------------------------------------------------------ model and loss
@pytest.mark.parametrize('variant,junk', helpers.core_cases(
    [(v, junk) for v in VARIANTS for junk in ('large', 'nan')], core=[],
    also=[('bn_input_only_seq', 'nan')]))
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
  helpers.assert_trees_close(dirty['grads'], clean['grads'], rtol=1e-5, atol=1e-6)
  helpers.assert_trees_close(dirty['stats'], clean['stats'], rtol=1e-5, atol=1e-6)
  assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(clean['grads']))


@pytest.mark.slow
def test_bidirectional_tagger_reads_each_sequence_alone():
  """Without batch statistics, each row's logits are those of the row run alone and
  unpadded: the backward direction reverses the valid steps only (it starts on a row's
  last valid step, not on its padding)."""
  x, _ = _frames()
  model = _tagger('lstm')
  variables = _random_variables(model, x)
  batched = np.asarray(model.apply(variables, x, MASK, use_running_average=True,
                                   deterministic=True))
  for b, length in enumerate(LENGTHS):
    alone = np.asarray(model.apply(variables, x[b:b + 1, :length], None,
                                   use_running_average=True, deterministic=True))
    np.testing.assert_allclose(batched[b, :length], alone[0], rtol=1e-5, atol=1e-6)
  # A full-row reversal would start the backward pass on padding: not what happens.
  assert np.abs(batched[1, :5] - batched[1, :5][::-1]).max() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize('variant', VARIANTS)
def test_stacked_bidirectional_tagger_matches_float64_reference(variant):
  x, labels = _frames()
  model = _tagger(variant)
  variables = _random_variables(model, x)
  out = _run(variant, variables, x, labels)
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), variables['params'])
  rnn = params['rnn']
  # Each layer of the stack holds its forward and its backward layer.
  layers = [(rnn[f'layer_{l}']['forward_layer'], rnn[f'layer_{l}']['backward_layer'])
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
  np.testing.assert_allclose(out['grads']['rnn']['layer_0']['forward_layer']['bias'], numeric,
                             rtol=2e-3, atol=2e-5)
  if variant != 'lstm':
    # The input term's moments: sequence-wise (one row) or frame-wise (a row per step).
    stats = out['stats']['rnn']['layer_0']['backward_layer']['input']
    mom = moments[0][1]['input']
    mean = mom[0] if variant == 'bn_input_only_seq' else np.stack([m[0] for m in mom])
    np.testing.assert_allclose(np.asarray(stats['mean']).reshape(mean.shape), mean,
                               rtol=1e-4, atol=1e-5)


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


@pytest.mark.exhaustive  # devices: tests/test_eight_devices_equal_one.py
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
  helpers.assert_trees_close(s8.params, s1.params, rtol=2e-5, atol=1e-6)
  helpers.assert_trees_close(s8.batch_stats, s1.batch_stats, rtol=2e-5, atol=1e-6)
  for name in ('loss', 'fer', 'grad_norm'):
    np.testing.assert_allclose(m8[name], m1[name], rtol=2e-6, err_msg=name)
  for name in ('fce', 'fer'):
    np.testing.assert_allclose(v8[name], v1[name], rtol=2e-5, err_msg=name)
  assert v1['fer'] == pytest.approx(1.0 - v1['accuracy'])
