"""The papers' population estimate early in training, on 784-step MNIST (beyond the
papers): how it depends on the size of its batches and on which site they set
(`estimate_batch_size`), and whether it needs training's h0 noise (`estimate_noise`).
Each trains the BN-LSTM of Cooijmans et al. sec. 5.1 briefly (the 8x8 digits where the
MNIST files are absent) and scores one set of parameters many ways."""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

import jax
import numpy as np

from bn_rnn_jax import population
from bn_rnn_jax.training import loop
from experiments.analysis.lib import moments
from experiments.analysis.lib import outputs
from experiments.analysis.lib import training

#: (number of batches, batch size as a multiple of the training batch) per estimate.
BATCH_SIZES = ((10, 1), (4, 2.5), (1, 10), (2, 10))
#: Batches of `estimate_noise`'s estimates.
NOISE_BATCHES = 2


def _trained(config, num_steps: int):
  """`(trainer, device state, host variables)` after `num_steps` steps of `config`."""
  trainer = loop.Trainer(config)
  state, _ = training.fit(trainer, trainer.to_devices(trainer.initial_state()), num_steps)
  return trainer, state, training.host_variables(trainer, state)


def _accuracy(trainer, state, stats) -> float:
  return training.evaluate_with(trainer, state, stats)['accuracy']


def estimate_batch_size(output_dir: str = outputs.FIGURES,
                        mnist_dir: Optional[str] = training.data_dir('mnist'),
                        num_steps: int = 300, batch_size: int = 100, hidden_size: int = 100,
                        valid_examples: int = 2000, draws: int = 3, image_size: int = 28,
                        settings: Sequence[tuple[int, float]] = BATCH_SIZES, seed: int = 0,
                        permute: bool = False) -> dict:
  """`estimate_batch_size[_pmnist].{png,json}`: accuracy with batch statistics
  (`batch_statistics`), with the estimate of each setting `(batches, size / batch_size)`
  drawn `draws` times (`estimates`), and with the largest estimate's sites one at a time
  from the average over training-size batches (`site_from_small`).

  Args:
    output_dir: where the JSON and PNG go.
    mnist_dir: the MNIST IDX files (scikit-learn's 8x8 digits where they are absent).
    num_steps: training steps before the evaluation.
    batch_size: training batch size.
    hidden_size: BN-LSTM units.
    valid_examples: validation examples scored.
    draws: random draws of each estimate.
    image_size: MNIST image side (28: 784 steps, or 14).
    seed: the random seed (and pMNIST's pixel order).
    permute: permuted MNIST; writes estimate_batch_size_pmnist.{png,json}.
  """
  plt = outputs.pyplot()
  start = time.time()
  config = training.mnist_config(
      mnist_dir, resolution=image_size, permutation_seed=seed if permute else None,
      hidden_size=hidden_size, batch_size=batch_size, eval_examples=valid_examples,
      seed=seed, variant='bn_lstm', recurrent_init='identity', initial_state='noise',
      initial_state_noise=0.1)
  trainer, state, variables = _trained(config, num_steps)
  result = {'batch_statistics': training.batch_statistics_accuracy(trainer, state),
            'estimates': {}, 'site_from_small': {}}
  rng = np.random.RandomState(seed)
  largest = None
  for num_batches, multiple in settings:
    size = int(round(multiple * batch_size))
    scores = []
    for _ in range(draws):
      stats = moments.random_estimate(trainer, variables, num_batches, size, rng)
      scores.append(_accuracy(trainer, state, stats))
      if num_batches * size >= (largest[0] if largest else 0):
        largest = (num_batches * size, stats)
    result['estimates'][f'{num_batches} x {size}'] = scores
  small = moments.random_estimate(trainer, variables, 10, batch_size, rng)
  for site in largest[1]['rnn']['layer_0']:
    mixed = jax.tree.map(lambda a: a, largest[1])
    mixed['rnn']['layer_0'][site] = small['rnn']['layer_0'][site]
    result['site_from_small'][site] = _accuracy(trainer, state, mixed)

  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  labels = list(result['estimates'])
  outputs.plot_draws(axes[0], result['estimates'], {'batch statistics': (
      result['batch_statistics'], dict(color='tab:red', ls='--'))})
  axes[0].set_xlabel('estimate: batches x examples per batch')
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
  length = trainer.dataset.train_length
  fig.suptitle(f"BN-LSTM {hidden_size} units, {length}-step "
               f"{'permuted MNIST' if permute else 'MNIST'}, after {num_steps} steps (batch "
               f'{batch_size})', fontsize=10)
  fig.tight_layout()
  result.update({'data': training.data_description(config, trainer.dataset),
                 'steps': num_steps, 'batch_size': batch_size, 'hidden_size': hidden_size,
                 'length': length, 'valid_examples': valid_examples,
                 'seconds': time.time() - start})
  return outputs.save(output_dir, 'estimate_batch_size_pmnist' if permute else
                      'estimate_batch_size', 'estimate_batch_size', result, fig, dpi=70)


def render_estimate_batch_size(e: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f"{name} ({e['steps']} steps): batch statistics {e['batch_statistics']:.3f}; "
          'estimates ' + '; '.join(f"{k}: {', '.join(f'{v:.3f}' for v in vs)}"
                                   for k, vs in e['estimates'].items()) +
          '; one site from 10 x batch: ' + ', '.join(
              f'{k} {v:.3f}' for k, v in e['site_from_small'].items()))


def estimate_noise(output_dir: str = outputs.FIGURES,
                   mnist_dir: Optional[str] = training.data_dir('mnist'),
                   num_steps: int = 300, batch_size: int = 100, hidden_size: int = 100,
                   valid_examples: int = 2000, draws: int = 3, estimate_batch: int = 1000,
                   seed: int = 0) -> dict:
  """`estimate_noise.{png,json}`: one set of parameters scored with batch statistics
  (no noise), and with the estimate from `NOISE_BATCHES` random training batches of
  `estimate_batch` with h0 = 0 and with training's h0 noise, from the same batches,
  `draws` times; the paired differences, and the largest change the noise makes to each
  site's variances.

  Args:
    output_dir: where the JSON and PNG go.
    mnist_dir: the MNIST IDX files (scikit-learn's 8x8 digits where they are absent).
    num_steps: training steps before the evaluation.
    batch_size: training batch size.
    hidden_size: BN-LSTM units.
    valid_examples: validation examples scored.
    draws: draws of each estimate.
    estimate_batch: examples per estimate batch.
    seed: the random seed.
  """
  plt = outputs.pyplot()
  start = time.time()
  config = training.mnist_config(
      mnist_dir, resolution=28, hidden_size=hidden_size, batch_size=batch_size,
      eval_examples=valid_examples, seed=seed, variant='bn_lstm',
      recurrent_init='identity_candidate', forget_bias=1.0, initial_state='noise',
      initial_state_noise=0.1)
  config.optimizer.decay = 0.9
  config.optimizer.momentum = 0.0
  trainer, state, variables = _trained(config, num_steps)
  model = training.unmapped_model(trainer)
  inputs = trainer.dataset.splits['train']['inputs']
  rng, key = np.random.RandomState(seed), jax.random.key(seed)
  arms = {'estimate without noise': [], 'estimate with h0 noise': []}
  changes = []
  for draw in range(draws):
    index = rng.randint(0, inputs.shape[0], (NOISE_BATCHES, estimate_batch))
    batches = [(inputs[i],) for i in index]
    plain = population.estimate_population_stats(training.without_h0_noise(model),
                                                 variables, batches)
    noisy = population.estimate_population_stats(model, variables, batches,
                                                 rng=jax.random.fold_in(key, draw))
    changes.append(moments.largest_variance_change(noisy, plain))
    arms['estimate without noise'].append(_accuracy(trainer, state, plain))
    arms['estimate with h0 noise'].append(_accuracy(trainer, state, noisy))
  gaps = np.subtract(arms['estimate without noise'], arms['estimate with h0 noise'])
  batch = trainer.evaluate(state, 'valid', 'batch')['accuracy']
  result = {'accuracy': arms,
            'summary': {name: {'mean': float(np.mean(v)), 'sd': float(np.std(v, ddof=1))
                               if len(v) > 1 else 0.0} for name, v in arms.items()},
            'batch_statistics': batch,
            'paired_difference': {'values': gaps.tolist(), 'mean': float(np.mean(gaps))},
            'largest_relative_variance_change': {
                site: max(c[site] for c in changes) for site in changes[0]},
            'data': training.data_description(config, trainer.dataset), 'steps': num_steps,
            'batch_size': config.train.batch_size, 'hidden_size': config.model.hidden_size,
            'length': trainer.dataset.train_length, 'valid_examples': valid_examples,
            'estimate': f'{NOISE_BATCHES} x {estimate_batch}', 'draws': draws,
            'seconds': time.time() - start}
  fig, ax = plt.subplots(figsize=(6, 4))
  outputs.plot_draws(ax, arms, {'batch statistics (no noise)': (
      batch, dict(color='tab:red', ls='--'))})
  ax.legend(fontsize=8)
  ax.set_xticks(range(len(arms)), list(arms), fontsize=8)
  ax.set_title(f'BN-LSTM, {result["length"]}-step MNIST, after {num_steps} steps: '
               'the estimate with and without h0 noise', fontsize=9)
  fig.tight_layout()
  return outputs.save(output_dir, 'estimate_noise', 'estimate_noise', result, fig, dpi=70)


def render_estimate_noise(n: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f"{name} ({n['steps']} steps, {n['estimate']}, {n['valid_examples']} images): "
          f"batch statistics {n['batch_statistics']:.4f}; " + '; '.join(
              f"{k} {', '.join(f'{v:.4f}' for v in vs)} (mean {n['summary'][k]['mean']:.4f} "
              f"± {n['summary'][k]['sd']:.4f})" for k, vs in n['accuracy'].items()) +
          f"; paired difference (without - with) {n['paired_difference']['mean']:+.4f}; "
          'largest relative variance change ' + ', '.join(
              f'{site.split("/")[-1]} {v:.3g}'
              for site, v in n['largest_relative_variance_change'].items()))


RENDERERS = {'estimate_batch_size': render_estimate_batch_size,
             'estimate_noise': render_estimate_noise}
