"""Optimizers and learning-rate schedules of the papers' experiments, from `config.optimizer`.
"""

from __future__ import annotations

import jax.numpy as jnp

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  import optax


def learning_rate_schedule(config, steps_per_epoch: int):
  """Constant, or Zaremba's step decay: the initial rate for `decay_after_epochs` epochs,
  then multiplied by `decay_rate` at the start of every further epoch."""
  o = config.optimizer
  if o.schedule == 'constant':
    return o.learning_rate
  if o.schedule == 'step_decay':
    start, rate, lr = o.decay_after_epochs, o.decay_rate, o.learning_rate
    def schedule(count):
      epoch = count // steps_per_epoch
      return lr * rate ** jnp.maximum(0, epoch - start + 1).astype(jnp.float32)
    return schedule
  raise ValueError(f"config.optimizer.schedule must be 'constant' or 'step_decay'; got "
                   f'{o.schedule!r}.')


def create_optimizer(config, steps_per_epoch: int) -> optax.GradientTransformation:
  """RMSProp+momentum (seq-MNIST), Adam (char LM) or SGD (word PTB), after global-norm
  gradient clipping when `config.optimizer.clip_norm` is set."""
  o = config.optimizer
  lr = learning_rate_schedule(config, steps_per_epoch)
  if o.name == 'rmsprop':
    opt = optax.rmsprop(lr, decay=o.decay, eps=o.eps, momentum=o.momentum or None,
                        centered=o.centered)
  elif o.name == 'adam':
    opt = optax.adam(lr, b1=o.b1, b2=o.b2, eps=o.eps)
  elif o.name == 'sgd':
    opt = optax.sgd(lr, momentum=o.momentum or None)
  else:
    raise ValueError(f"config.optimizer.name must be 'rmsprop', 'adam' or 'sgd'; got "
                     f'{o.name!r}.')
  if o.clip_norm is None:
    return opt
  return optax.chain(optax.clip_by_global_norm(o.clip_norm), opt)
