"""`train.py`'s pure pieces: one `train_step` against a float64 reference gradient, the
finiteness check, and Zaremba's uniform initialisation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import variants
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import tasks
from bn_rnn_jax.training import train
import helpers
import reference as ref

B, T, I, H, C = 6, 4, 2, 3, 3
LEARNING_RATE = 0.5


def _batch():
  rng = np.random.default_rng(0)
  lengths = np.array([4, 2, 3, 4, 1, 4])
  return {'inputs': rng.normal(size=(B, T, I)).astype(np.float32),
          'mask': helpers.prefix_mask(lengths, T),
          'labels': rng.integers(0, C, size=B).astype(np.int32),
          'weights': np.array([1, 1, 1, 1, 1, 0], np.float32)}   # the last is padding


def _reference_mean_loss(params, batch):
  """Mean cross-entropy over the weighted examples, float64."""
  (_, h), _, _ = ref.run_layer(params['rnn']['layer_0'], batch['inputs'], batch['mask'],
                               'lstm')
  logits = h @ params['classifier']['kernel'] + params['classifier']['bias']
  z = logits - logits.max(-1, keepdims=True)
  log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
  ce = -log_probs[np.arange(B), batch['labels']]
  return float((ce * batch['weights']).sum() / batch['weights'].sum())


@pytest.mark.slow
def test_train_step_takes_the_sgd_step_of_the_reference_gradient():
  """Plain LSTM classifier, SGD: the new parameters are `params - lr * grad` of the mean
  loss over the valid examples (reference gradient by finite differences), on 2 devices
  with the batch split between them; the metrics are the global batch's."""
  model = models.SequenceClassifier(C, variants.make_layer('lstm', H, axis_name=train.AXIS))
  task, tx = tasks.get('classification'), optax.sgd(LEARNING_RATE)
  batch = _batch()
  params = model.init(jax.random.key(0), batch['inputs'], batch['mask'],
                      use_running_average=True, deterministic=True)['params']
  state = train.TrainState(step=np.int32(0), params=params, batch_stats={},
                           opt_state=tx.init(params), rng=jax.random.PRNGKey(1))
  devices = jax.local_devices()[:2]
  step = parallel.pmap(lambda s, b: train.train_step(s, b, model=model, task=task, tx=tx,
                                                     carries_state=False), devices)
  new_state, metrics = step(parallel.replicate(state, devices),
                            parallel.shard(batch, len(devices)))
  new_params = helpers.float64(parallel.unreplicate(new_state.params))

  leaves, treedef = jax.tree.flatten(helpers.float64(params))
  names = [str(i) for i in range(len(leaves))]
  loss = lambda a: _reference_mean_loss(
      jax.tree.unflatten(treedef, [a[n] for n in names]), batch)
  grads = ref.numerical_grad(loss, dict(zip(names, leaves)))
  for (path, got), value, name in zip(jax.tree.leaves_with_path(new_params), leaves, names):
    helpers.assert_close(got, value - LEARNING_RATE * grads[name], rtol=2e-4,
                         what=jax.tree_util.keystr(path))
  metrics = parallel.unreplicate(metrics)
  np.testing.assert_allclose(metrics['loss'], loss(dict(zip(names, leaves))), rtol=1e-5)
  grad_norm = np.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
  np.testing.assert_allclose(metrics['grad_norm'], grad_norm, rtol=1e-4)
  assert metrics[train.FINITE] == 1.0
  assert int(parallel.unreplicate(new_state.step)) == 1


@pytest.mark.parametrize('bad_leaf', ['small_f32', 'small_bf16', 'large_f32', None])
@pytest.mark.parametrize('bad_value', [np.nan, np.inf, -np.inf])
def test_all_finite_checks_every_floating_leaf(bad_leaf, bad_value):
  """Small leaves are checked jointly (per dtype) and large ones alone; a single bad
  entry anywhere gives 0.0, integer leaves are ignored (NumPy decides)."""
  size = train._FINITE_CHECK_JOINED_SIZE  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  tree = {'small_f32': [rng.normal(size=(3, 5)).astype(np.float32), np.float32(2.0)],
          'small_bf16': rng.normal(size=7).astype(jnp.bfloat16),
          'large_f32': rng.normal(size=size + 1).astype(np.float32),
          'ints': np.arange(4)}
  if bad_leaf is not None:
    leaf = tree[bad_leaf][0] if bad_leaf == 'small_f32' else tree[bad_leaf]
    leaf.flat[rng.integers(leaf.size)] = bad_value
  expected = all(np.all(np.isfinite(np.asarray(x, np.float64)))
                 for x in jax.tree.leaves(tree) if np.asarray(x).dtype.kind != 'i')
  assert expected == (bad_leaf is None)
  got = float(jax.jit(train.all_finite)(tree))
  assert got == float(expected)


def test_uniform_init_keeps_normalisation_parameters():
  params = {'embed': {'embedding': np.zeros((50, 8), np.float32)},
            'rnn': {'layer_0': {'input_kernel': np.zeros((8, 32), np.float32),
                                'input_scale': np.full((32,), 0.1, np.float32),
                                'cell_bias': np.zeros((8,), np.float32),
                                'bias': np.zeros((32,), np.float32)}}}
  out = train.uniform_init(params, jax.random.PRNGKey(0), 0.05)
  np.testing.assert_array_equal(out['rnn']['layer_0']['input_scale'], np.float32(0.1))
  np.testing.assert_array_equal(out['rnn']['layer_0']['cell_bias'], 0.0)
  for value in (out['embed']['embedding'], out['rnn']['layer_0']['input_kernel'],
                out['rnn']['layer_0']['bias']):
    assert 0.04 < np.abs(value).max() <= 0.05
