r"""Population statistics on 784-step MNIST: why the batch size of the estimate matters.

Early in training on in-order sequential MNIST, a BN-LSTM evaluated with the papers'
population estimate (minibatch moments averaged over training batches of the training
size) scores well below the same parameters evaluated with batch statistics. This script
trains the model of Cooijmans et al. sec. 5.1 briefly and evaluates one set of parameters
with:

  * batch statistics of each validation batch (training mode, for reference);
  * the estimate from `n` batches of `size` examples, for several (n, size), each drawn
    `draws` times from the training set;
  * the estimate from a few large batches with one site's statistics replaced by the
    average over training-size batches (which site carries the loss).

Finding (see the README): the input and recurrent terms' statistics barely depend on how
they are estimated, but the cell's do. Each training-size batch normalises its rare-ink
pixel steps with its own, very noisy statistics, which moves the whole batch's cells
together; averaging those per-batch cell moments misses the spread that the
population-mode network (upstream sites on averaged statistics) has. Moments of larger
batches match that network: the gap closes.

  python -m experiments.analysis.estimate_batch_size [--mnist_dir=...] [--output_dir=...]
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import population
from bn_rnn_jax.training import loop
from experiments.analysis import common

_STEPS = flags.DEFINE_integer('eb_steps', 300, 'Training steps before the evaluation.')
_BATCH = flags.DEFINE_integer('eb_batch_size', 100, 'Training batch size.')
_VALID = flags.DEFINE_integer('eb_valid_examples', 2000, 'Validation examples scored.')
_DRAWS = flags.DEFINE_integer('eb_draws', 3, 'Random draws of each estimate.')
_PERMUTE = flags.DEFINE_bool('eb_permute', False,
                             'Permuted MNIST (pixel order drawn with --seed); writes '
                             'estimate_batch_size_pmnist.{png,json}.')

DEFAULT_SETTINGS = ((10, 1), (4, 2.5), (1, 10), (2, 10))  # (batches, size / batch_size)


def accuracy(trainer: loop.Trainer, state, batch_stats) -> float:
  """Validation accuracy (the config's first `eval.max_batches` batches) with these host
  population statistics."""
  return common.evaluate_with(trainer, state, batch_stats)['accuracy']


def batch_statistics_accuracy(trainer: loop.Trainer, state) -> float:
  """Accuracy in training mode: every validation batch normalised by its own moments."""
  model = common.unmapped_model(trainer)
  variables = common.host_variables(trainer, state)

  @jax.jit
  def correct(batch, key):
    logits, _ = model.apply(variables, batch['inputs'], use_running_average=False,
                            deterministic=False, rngs={'noise': key},
                            mutable=['batch_stats'])
    hits = (jnp.argmax(logits, -1) == batch['labels']) * batch['weights']
    return jnp.sum(hits), jnp.sum(batch['weights'])
  totals = np.zeros(2)
  batches = trainer.dataset.eval_batches('valid')
  for i in range(trainer.config.eval.max_batches):
    batch = next(batches)
    totals += np.asarray(correct(batch, jax.random.PRNGKey(i)), np.float64)
  return float(totals[0] / totals[1])


def estimate(trainer: loop.Trainer, variables, num_batches: int, size: int,
             rng: np.random.RandomState) -> dict:
  """The papers' estimate (`population.estimate_population_stats`) from `num_batches`
  random training batches of `size` examples."""
  inputs = trainer.dataset.splits['train']['inputs']
  index = rng.randint(0, inputs.shape[0], (num_batches, size))
  return population.estimate_population_stats(
      common.unmapped_model(trainer), variables, [(inputs[i],) for i in index])


def run(output_dir: str, mnist_dir: Optional[str], num_steps: int = 300,
        batch_size: int = 100, hidden_size: int = 100, valid_examples: int = 2000,
        draws: int = 3, image_size: int = 28,
        settings: Sequence[tuple[int, float]] = DEFAULT_SETTINGS, seed: int = 0,
        permute: bool = False) -> dict:
  """Writes `estimate_batch_size.{png,json}` (`..._pmnist` when `permute`); returns
  the JSON dict.

  `settings`: (number of batches, batch size as a multiple of `batch_size`) per estimate.
  JSON: `batch_statistics` accuracy; `estimates[label]` = accuracies of the draws;
  `site_from_small[site]` = accuracy of the largest estimate with `site` replaced by the
  average over training-size batches.
  """
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  config = common.mnist_config(
      mnist_dir, resolution=image_size, permutation_seed=seed if permute else None,
      hidden_size=hidden_size, batch_size=batch_size, eval_examples=valid_examples,
      seed=seed, variant='bn_lstm', recurrent_init='identity', initial_state='noise',
      initial_state_noise=0.1)
  trainer = loop.Trainer(config)
  length = trainer.dataset.train_length
  state, history = common.fit(trainer, trainer.to_devices(trainer.initial_state()),
                              num_steps)
  logging.info('Trained %d steps (last loss %.3f)', num_steps, history['train_loss'][-1])
  variables = common.host_variables(trainer, state)

  result = {'batch_statistics': batch_statistics_accuracy(trainer, state),
            'estimates': {}, 'site_from_small': {}}
  rng = np.random.RandomState(seed)
  largest = None
  for num_batches, multiple in settings:
    size = int(round(multiple * batch_size))
    label = f'{num_batches} x {size}'
    scores = []
    for _ in range(draws):
      stats = estimate(trainer, variables, num_batches, size, rng)
      scores.append(accuracy(trainer, state, stats))
      if num_batches * size >= (largest[0] if largest else 0):
        largest = (num_batches * size, stats)
    result['estimates'][label] = scores
    logging.info('%s: %s', label, scores)

  small = estimate(trainer, variables, 10, batch_size, rng)
  layer = 'layer_0'
  for site in largest[1]['rnn'][layer]:
    mixed = jax.tree.map(lambda a: a, largest[1])
    mixed['rnn'][layer][site] = small['rnn'][layer][site]
    result['site_from_small'][site] = accuracy(trainer, state, mixed)

  plt = common.matplotlib_pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  labels = list(result['estimates'])
  for i, label in enumerate(labels):
    scores = result['estimates'][label]
    axes[0].scatter([i] * len(scores), scores, color='tab:blue')
    axes[0].plot([i - 0.2, i + 0.2], [np.mean(scores)] * 2, color='tab:blue')
  axes[0].axhline(result['batch_statistics'], color='tab:red', ls='--',
                  label='batch statistics')
  axes[0].set_xticks(range(len(labels)), [f'{label}' for label in labels])
  axes[0].set_xlabel('estimate: batches x examples per batch')
  axes[0].set_ylabel('validation accuracy')
  axes[0].legend()
  axes[0].set_title('Population estimate by batch size of the estimate', fontsize=10)
  sites = list(result['site_from_small'])
  axes[1].bar(range(len(sites)), [result['site_from_small'][s] for s in sites])
  axes[1].axhline(np.mean(result['estimates'][labels[-1]]), color='k', ls=':',
                  label=f'all sites from {labels[-1]}')
  axes[1].axhline(np.mean(result['estimates'][labels[0]]), color='tab:gray', ls='-.',
                  label=f'all sites from {labels[0]}')
  axes[1].set_xticks(range(len(sites)), sites)
  axes[1].set_ylabel('validation accuracy')
  axes[1].set_title(f'{labels[-1]} with one site from 10 x {batch_size}', fontsize=10)
  axes[1].legend(fontsize=8)
  task = 'permuted MNIST' if permute else 'MNIST'
  fig.suptitle(f'BN-LSTM {hidden_size} units, {length}-step {task}, after {num_steps} '
               f'steps (batch {batch_size})', fontsize=10)
  fig.tight_layout()
  result.update({'data': common.data_description(config, trainer.dataset),
                 'steps': num_steps, 'batch_size': batch_size,
                 'hidden_size': hidden_size, 'length': length,
                 'valid_examples': valid_examples, 'seconds': time.time() - start})
  name = 'estimate_batch_size_pmnist' if permute else 'estimate_batch_size'
  common.save_outputs(output_dir, name, fig, result, dpi=70)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  run(common.OUTPUT_DIR.value, common.MNIST_DIR.value, num_steps=_STEPS.value,
      batch_size=_BATCH.value, valid_examples=_VALID.value, draws=_DRAWS.value,
      seed=common.SEED.value, permute=_PERMUTE.value)


if __name__ == '__main__':
  app.run(main)
