"""The NNX modules (`bn_rnn_jax.nnx`) against the Linen ones they wrap.

The same BN-LSTM classifier is trained from Linen (`models.SequenceClassifier`, `apply`
with `mutable=['batch_stats']`) and from NNX (`FromLinen` + `nnx.Linear`, `nnx.Optimizer`,
`model.train()`), from the same initial values on the same batches, with the same
optimizer: parameters, running statistics, the papers' estimate and evaluation outputs
must agree. The two are different compiled programs (NNX's graph bookkeeping around the
same operations), so they agree to float32 rounding: `RTOL`, `ATOL` below.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bn_rnn_jax import batch_stats
from bn_rnn_jax import models
from bn_rnn_jax import nnx as br_nnx
from bn_rnn_jax import population
from bn_rnn_jax import stack

B, T, I, H, C = 8, 6, 2, 8, 3
STEPS = 4
RTOL, ATOL = 1e-5, 1e-6
OPTIONS = dict(max_length=T)


def _batches(count, seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    x = rng.normal(size=(B, T, I)).astype(np.float32)
    lengths = rng.integers(2, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    labels = rng.integers(0, C, size=B).astype(np.int32)
    out.append((x, mask, labels))
  return out


TRAIN = _batches(STEPS, 0)
ESTIMATE = _batches(2, 1)
VALID = _batches(1, 2)[0]


class Classifier(nnx.Module):
  """`models.SequenceClassifier(num_classes=C, variant='bn_lstm', hidden_size=H)` in NNX."""

  def __init__(self, rngs: nnx.Rngs):
    rnn = stack.StackedRNN(variant='bn_lstm', hidden_size=H, layer_options=OPTIONS)
    self.rnn = br_nnx.FromLinen(rnn, jnp.zeros((1, T, I)), rngs=rngs)
    self.head = nnx.Linear(H, C, rngs=rngs)

  def __call__(self, x, mask=None):
    carries, _ = self.rnn(x, mask)
    return self.head(models.last_hidden(carries[-1]))


def _loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _train_linen(model, variables, tx):
  @jax.jit
  def step(params, stats, opt_state, x, mask, labels):
    def loss_fn(params):
      logits, updates = model.apply({'params': params, 'batch_stats': stats}, x, mask,
                                    train=True, mutable=['batch_stats'])
      return _loss(logits, labels), updates['batch_stats']
    (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state

  params, stats = variables['params'], variables['batch_stats']
  opt_state = tx.init(params)
  for x, mask, labels in TRAIN:
    params, stats, opt_state = step(params, stats, opt_state, x, mask, labels)
  return {'params': params, 'batch_stats': stats}


def _train_nnx(model, tx):
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, x, mask, labels):
    grads = nnx.grad(lambda model: _loss(model(x, mask), labels))(model)
    optimizer.update(model, grads)

  model.train()
  for x, mask, labels in TRAIN:
    step(model, optimizer, x, mask, labels)


def _close(got, want, what):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w),
                                                       rtol=RTOL, atol=ATOL, err_msg=what),
               got, want)


@pytest.fixture(scope='module')
def trained():
  """Linen and NNX classifiers trained from the same initial values."""
  linen = models.SequenceClassifier(num_classes=C, variant='bn_lstm', hidden_size=H,
                                    layer_options=OPTIONS)
  x, mask, _ = TRAIN[0]
  initial = linen.init(jax.random.key(0), x, mask, train=False)
  model = Classifier(nnx.Rngs(0))
  # The same initial values: the Linen ones copied into the NNX model.
  model.rnn.load_linen_variables({'params': initial['params']['rnn']})
  model.head.kernel[...] = initial['params']['classifier']['kernel']
  model.head.bias[...] = initial['params']['classifier']['bias']
  tx = optax.adam(1e-2)
  variables = _train_linen(linen, initial, tx)
  _train_nnx(model, tx)
  return linen, variables, model, initial


def test_training_gives_the_same_parameters_and_statistics(trained):
  _, variables, model, initial = trained
  params = variables['params']
  _close(model.rnn.linen_variables()['params'], params['rnn'], 'recurrent parameters')
  _close(model.head.kernel[...], params['classifier']['kernel'], 'softmax kernel')
  _close(model.head.bias[...], params['classifier']['bias'], 'softmax bias')
  stats = model.rnn.linen_variables()['batch_stats']
  _close(stats, variables['batch_stats']['rnn'], 'running statistics')
  # Row 0 counts the sequences of every training batch (all valid at step 0).
  assert float(stats['layer_0']['recurrent']['count'][0]) == STEPS * B
  # Training moved the parameters (the comparison is not of two initial states).
  moved = jnp.abs(params['classifier']['kernel'] - initial['params']['classifier']['kernel'])
  assert float(moved.max()) > 1e-2


def test_evaluation_with_running_and_estimated_statistics_agrees(trained):
  linen, variables, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  assert model.rnn.use_running_average
  evaluate = nnx.jit(lambda model, x, mask: model(x, mask))
  _close(evaluate(model, x, mask), linen.apply(variables, x, mask, train=False),
         'outputs with the running average')

  estimate = population.estimate_population_stats(
      linen, variables, [(x, m) for x, m, _ in ESTIMATE])
  br_nnx.estimate_population_stats(model, [(x, m) for x, m, _ in ESTIMATE])
  _close(model.rnn.linen_variables()['batch_stats'], estimate['rnn'], 'estimated statistics')
  assert float(estimate['rnn']['layer_0']['cell']['count'][0]) == len(ESTIMATE) * B
  _close(evaluate(model, x, mask),
         linen.apply({**variables, 'batch_stats': estimate}, x, mask, train=False),
         'outputs with the estimate')
  assert model.rnn.use_running_average  # the estimate left the mode alone


@pytest.mark.slow
def test_train_and_eval_switch_batch_and_population_statistics(trained):
  _, _, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  before = model.rnn.linen_variables()['batch_stats']
  population_out = model(x, mask)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), before,
                                   model.rnn.linen_variables()['batch_stats']))
  model.train()
  batch_out = model(x, mask)
  after = model.rnn.linen_variables()['batch_stats']
  assert float(after['layer_0']['input']['count'][0]) == (
      float(before['layer_0']['input']['count'][0]) + B)
  assert not np.allclose(np.asarray(batch_out), np.asarray(population_out))
  model.eval()


@pytest.mark.slow
def test_step_through_the_wrapped_stack(trained):
  _, _, model, _ = trained
  x, mask, _ = VALID
  model.eval()
  carries, outputs = model.rnn(x, mask)
  step_carries = None
  for t in range(T):
    step_carries, out = model.rnn.step(step_carries, x[:, t], t, mask[:, t])
    np.testing.assert_allclose(out, outputs[:, t], rtol=RTOL, atol=ATOL)
  _close(step_carries, carries, 'stepped carry')


def test_an_untrained_nnx_model_refuses_to_evaluate():
  model = Classifier(nnx.Rngs(1))
  model.eval()
  x, mask, _ = VALID
  with pytest.raises(ValueError, match='no training batch reached'):
    model(x, mask)
  with batch_stats.allow_untrained_statistics():
    assert model(x, mask).shape == (B, C)
