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

from bn_rnn_jax import models
from experiments.analysis import common

_STEPS = flags.DEFINE_integer('eb_steps', 300, 'Training steps before the evaluation.')
_BATCH = flags.DEFINE_integer('eb_batch_size', 100, 'Training batch size.')
_VALID = flags.DEFINE_integer('eb_valid_examples', 2000, 'Validation examples scored.')
_DRAWS = flags.DEFINE_integer('eb_draws', 3, 'Random draws of each estimate.')
_PERMUTE = flags.DEFINE_bool('eb_permute', False,
                             'Permuted MNIST (pixel order drawn with --seed); writes '
                             'estimate_batch_size_pmnist.{png,json}.')

DEFAULT_SETTINGS = ((10, 1), (4, 2.5), (1, 10), (2, 10))  # (batches, size / batch_size)


def accuracy(trainer: common.Trainer, state, batch_stats, data: common.SequenceData,
             batch_size: int) -> float:
  """Validation accuracy with these (population) statistics."""
  return trainer.evaluate(state, batch_stats, data.batches(batch_size))[1]


def batch_statistics_accuracy(model, state, data: common.SequenceData,
                              batch_size: int) -> float:
  """Accuracy in training mode: every validation batch normalised by its own moments."""
  @jax.jit
  def correct(x, y, key):
    logits, _ = model.apply({'params': state['params'], 'batch_stats': state['batch_stats']},
                            x, train=True, rngs={'noise': key}, mutable=['batch_stats'])
    return jnp.sum(jnp.argmax(logits, -1) == y)
  batches = data.batches(batch_size)
  total = sum(int(correct(x, y, jax.random.PRNGKey(i * batch_size)))
              for i, (x, y) in enumerate(batches))
  return total / (len(batches) * batch_size)


def estimate(trainer: common.Trainer, state, train: common.SequenceData,
             num_batches: int, size: int, rng: np.random.RandomState, key) -> dict:
  """The papers' estimate from `num_batches` random training batches of `size`."""
  index = rng.randint(0, train.x.shape[0], (num_batches, size))
  return trainer.estimate_population(state, [train.x[i] for i in index], rng=key)


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
  start = time.time()
  permutation_seed = seed if permute else None
  train = common.load_pixel_sequences(mnist_dir, 'train', image_size=image_size,
                                      permutation_seed=permutation_seed)
  valid = common.load_pixel_sequences(mnist_dir, 'valid', image_size=image_size,
                                      limit=valid_examples,
                                      permutation_seed=permutation_seed)
  length = train.length
  model = models.SequenceClassifier(
      num_classes=10, variant='bn_lstm', hidden_size=hidden_size,
      layer_options=dict(max_length=length, recurrent_init='identity',
                         initial_state='noise', initial_state_noise=0.1))
  trainer = common.Trainer(model, common.rmsprop(1e-3), common.classification_loss)
  rng = np.random.RandomState(seed)
  state = trainer.init(jax.random.PRNGKey(seed), train.x[:batch_size])
  batches = common.example_batches(train, batch_size, rng)
  for _ in range(num_steps):
    state, metrics = trainer.train_step(state, *next(batches))
  logging.info('Trained %d steps (last loss %.3f)', num_steps, float(metrics['loss']))

  result = {'batch_statistics': batch_statistics_accuracy(model, state, valid, batch_size),
            'estimates': {}, 'site_from_small': {}}
  key = jax.random.PRNGKey(seed + 1)
  largest = None
  for num_batches, multiple in settings:
    size = int(round(multiple * batch_size))
    label = f'{num_batches} x {size}'
    scores = []
    for draw in range(draws):
      stats = estimate(trainer, state, train, num_batches, size, rng,
                       jax.random.fold_in(key, len(result['estimates']) * 100 + draw))
      scores.append(accuracy(trainer, state, stats, valid, batch_size))
      if num_batches * size >= (largest[0] if largest else 0):
        largest = (num_batches * size, stats)
    result['estimates'][label] = scores
    logging.info('%s: %s', label, scores)

  small = estimate(trainer, state, train, 10, batch_size, rng, jax.random.fold_in(key, 999))
  layer = 'layer_0'
  for site in largest[1]['rnn'][layer]:
    mixed = jax.tree.map(lambda a: a, largest[1])
    mixed['rnn'][layer][site] = small['rnn'][layer][site]
    result['site_from_small'][site] = accuracy(trainer, state, mixed, valid, batch_size)

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
  result.update({'data': train.source + (' (permuted)' if permute else ''),
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
