r"""Does the population estimate need training's h0 noise? On 784-step MNIST, where the
noise matters in training, early in training.

The BN-LSTM of Cooijmans et al. draws h_0 ~ N(0, 0.1^2) in training: over the black rows
that open an MNIST sequence every example's recurrent term would otherwise be the same,
with batch variance 0. Inference uses h_0 = 0. The library's population estimate draws
training's noise (`population.minibatch_moments`). This script trains the BN-LSTM of
sec. 5.1 briefly (the seq-MNIST config's choices) and evaluates one set of parameters
with:

  * batch statistics of each validation batch, no noise (for reference,
    `Trainer.evaluate(kind='batch')`);
  * the estimate without noise (h_0 = 0), from 2 random training batches of 1,000;
  * the estimate with training's h_0 noise (the library's), from the same batches, each
    draw with its own noise keys;

`--en_draws` times each, on the same validation images. JSON: the accuracies of each
draw per arm, their means and standard deviations, and the largest difference between
the two estimates' statistics per site (relative to the noise-free variance).

  python -m experiments.analysis.estimate_noise [--mnist_dir=...] [--output_dir=...]
"""

from __future__ import annotations

import time
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from bn_rnn_jax import population
from bn_rnn_jax.training import loop
from experiments.analysis import common
from experiments.analysis import estimate_batch_size

_STEPS = flags.DEFINE_integer('en_steps', 300, 'Training steps before the evaluation.')
_VALID = flags.DEFINE_integer('en_valid_examples', 2000, 'Validation examples scored.')
_DRAWS = flags.DEFINE_integer('en_draws', 3, 'Draws of each estimate.')
_SIZE = flags.DEFINE_integer('en_estimate_batch', 1000, 'Examples per estimate batch.')

ESTIMATE_BATCHES = 2


def largest_variance_change(noisy: dict, plain: dict) -> dict:
  """Per site: max over rows and units of |var_noisy - var_plain| / (var_plain + 1e-3)."""
  out = {}
  for (path, plain_leaf), noisy_leaf in zip(jax.tree_util.tree_leaves_with_path(plain),
                                            jax.tree.leaves(noisy)):
    if path[-1].key == 'var':
      change = np.abs(np.asarray(noisy_leaf) - plain_leaf) / (np.asarray(plain_leaf) + 1e-3)
      out['/'.join(str(entry.key) for entry in path[:-1])] = float(np.max(change))
  return out


def run(output_dir: str, mnist_dir: Optional[str], num_steps: int = 300,
        batch_size: int = 100, hidden_size: int = 100, valid_examples: int = 2000,
        draws: int = 3, estimate_batch: int = 1000, seed: int = 0) -> dict:
  """Writes `estimate_noise.{png,json}`; returns the JSON dict."""
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  config = common.mnist_config(
      mnist_dir, resolution=28, hidden_size=hidden_size, batch_size=batch_size,
      eval_examples=valid_examples, seed=seed, variant='bn_lstm',
      recurrent_init='identity_candidate', forget_bias=1.0, initial_state='noise',
      initial_state_noise=0.1)
  config.optimizer.decay = 0.9
  config.optimizer.momentum = 0.0
  trainer = loop.Trainer(config)
  state, history = common.fit(trainer, trainer.to_devices(trainer.initial_state()),
                              num_steps)
  logging.info('Trained %d steps (last loss %.3f)', num_steps, history['train_loss'][-1])
  model = common.unmapped_model(trainer)
  variables = common.host_variables(trainer, state)
  inputs = trainer.dataset.splits['train']['inputs']
  rng = np.random.RandomState(seed)
  key = jax.random.key(seed)
  arms = {'estimate without noise': [], 'estimate with h0 noise': []}
  changes = []
  for draw in range(draws):
    index = rng.randint(0, inputs.shape[0], (ESTIMATE_BATCHES, estimate_batch))
    batches = [(inputs[i],) for i in index]
    plain = population.estimate_population_stats(common.without_h0_noise(model), variables,
                                                 batches)
    noisy = population.estimate_population_stats(model, variables, batches,
                                                 rng=jax.random.fold_in(key, draw))
    changes.append(largest_variance_change(noisy, plain))
    arms['estimate without noise'].append(
        estimate_batch_size.accuracy(trainer, state, plain))
    arms['estimate with h0 noise'].append(
        estimate_batch_size.accuracy(trainer, state, noisy))
    logging.info('draw %d: %s', draw, {k: v[-1] for k, v in arms.items()})
  summary = {name: {'mean': float(np.mean(v)), 'sd': float(np.std(v, ddof=1))
                    if len(v) > 1 else 0.0} for name, v in arms.items()}
  gaps = np.subtract(arms['estimate without noise'], arms['estimate with h0 noise'])
  batch = trainer.evaluate(state, 'valid', 'batch')['accuracy']
  result = {'accuracy': arms, 'summary': summary, 'batch_statistics': batch,
            'paired_difference': {'values': gaps.tolist(), 'mean': float(np.mean(gaps))},
            'largest_relative_variance_change': {
                site: max(c[site] for c in changes) for site in changes[0]},
            'data': common.data_description(config, trainer.dataset), 'steps': num_steps,
            'batch_size': config.train.batch_size, 'hidden_size': config.model.hidden_size,
            'length': trainer.dataset.train_length, 'valid_examples': valid_examples,
            'estimate': f'{ESTIMATE_BATCHES} x {estimate_batch}', 'draws': draws,
            'seconds': time.time() - start}

  plt = common.matplotlib_pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (name, scores) in enumerate(arms.items()):
    ax.scatter([i] * len(scores), scores, color='tab:blue')
    ax.plot([i - 0.2, i + 0.2], [np.mean(scores)] * 2, color='tab:blue')
  ax.axhline(batch, color='tab:red', ls='--', label='batch statistics (no noise)')
  ax.legend(fontsize=8)
  ax.set_xticks(range(len(arms)), list(arms), fontsize=8)
  ax.set_ylabel('validation accuracy')
  ax.set_title(f'BN-LSTM, {result["length"]}-step MNIST, after {num_steps} steps: '
               'the estimate with and without h0 noise', fontsize=9)
  fig.tight_layout()
  common.save_outputs(output_dir, 'estimate_noise', fig, result, dpi=70)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  run(common.OUTPUT_DIR.value, common.MNIST_DIR.value, num_steps=_STEPS.value,
      valid_examples=_VALID.value, draws=_DRAWS.value, estimate_batch=_SIZE.value,
      seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
