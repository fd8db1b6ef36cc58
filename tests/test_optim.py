"""`optim.py`: the learning-rate schedules and the optimizers of the papers' experiments,
one update each against its formula in NumPy."""

import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax.training import optim
import training_fixtures as fx


def test_step_decay_schedule_is_zaremba():
  config = fx.tiny_config(**{'optimizer.name': 'sgd', 'optimizer.learning_rate': 1.0,
                             'optimizer.momentum': 0.0, 'optimizer.schedule': 'step_decay',
                             'optimizer.decay_rate': 0.5,
                             'optimizer.decay_after_epochs': 4})
  schedule = optim.learning_rate_schedule(config, steps_per_epoch=10)
  # lr 1 for epochs 0-3, then halved at the start of every further epoch.
  expected = {0: 1.0, 39: 1.0, 40: 0.5, 49: 0.5, 50: 0.25, 65: 0.125}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, err_msg=f'step {step}')


def test_constant_schedule_is_the_learning_rate():
  config = fx.tiny_config(**{'optimizer.learning_rate': 0.25})
  assert optim.learning_rate_schedule(config, steps_per_epoch=10) == 0.25


def test_optimizer_clips_global_norm_then_rmsprop():
  config = fx.tiny_config(**{'optimizer.clip_norm': 1.0, 'optimizer.momentum': 0.0,
                             'optimizer.decay': 0.9, 'optimizer.eps': 0.0})
  tx = optim.create_optimizer(config, steps_per_epoch=1)
  params = {'w': jnp.zeros(2)}
  grads = {'w': jnp.array([30.0, 40.0])}  # norm 50 -> clipped to [0.6, 0.8]
  updates, _ = tx.update(grads, tx.init(params), params)
  clipped = np.array([0.6, 0.8])
  # RMSProp's first step: -lr * g / sqrt((1 - decay) g^2) = -lr * sign(g) / sqrt(0.1).
  np.testing.assert_allclose(updates['w'], -1e-3 * clipped / np.sqrt(0.1 * clipped**2),
                             rtol=1e-5)


def test_adam_first_step_and_unclipped_sgd_with_momentum():
  grads = np.array([0.3, -2.0, 5.0])
  params = {'w': jnp.zeros(3)}
  adam = optim.create_optimizer(fx.tiny_config(**{
      'optimizer.name': 'adam', 'optimizer.learning_rate': 0.01, 'optimizer.clip_norm': None,
      'optimizer.eps': 1e-8}), steps_per_epoch=1)
  updates, _ = adam.update({'w': jnp.asarray(grads)}, adam.init(params), params)
  # Bias-corrected first step: m / sqrt(v) = g / |g|.
  np.testing.assert_allclose(updates['w'], -0.01 * np.sign(grads), rtol=1e-5)

  sgd = optim.create_optimizer(fx.tiny_config(**{
      'optimizer.name': 'sgd', 'optimizer.learning_rate': 0.1, 'optimizer.momentum': 0.9,
      'optimizer.clip_norm': None}), steps_per_epoch=1)
  state = sgd.init(params)
  first, state = sgd.update({'w': jnp.asarray(grads)}, state, params)
  second, _ = sgd.update({'w': jnp.asarray(grads)}, state, params)
  np.testing.assert_allclose(first['w'], -0.1 * grads, rtol=1e-6)
  np.testing.assert_allclose(second['w'], -0.1 * (0.9 * grads + grads), rtol=1e-6)


@pytest.mark.parametrize('field,value,message', [
    ('optimizer.name', 'lamb', "optimizer.name must be 'rmsprop', 'adam' or 'sgd'; got 'lamb'"),
    ('optimizer.schedule', 'cosine',
     "optimizer.schedule must be 'constant' or 'step_decay'; got 'cosine'"),
])
def test_unknown_optimizer_or_schedule_is_one_line(field, value, message):
  with pytest.raises(ValueError, match=message):
    optim.create_optimizer(fx.tiny_config(**{field: value}), steps_per_epoch=1)
