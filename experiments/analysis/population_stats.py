r"""Cooijmans et al. 2016, Fig. 5 (appendix A): convergence of the population statistics.

A BN-LSTM language model is trained briefly on character-level Penn Treebank (the
paper's figure is from that task), then its per-step population statistics are read out:
the mean and variance, at every time step t, of the recurrent term W_h h_{t-1}, the input
term W_x x_t and the cell c_t, for a random subset of units. The paper's point: the
statistics differ during an initial transient and then settle to a stationary
distribution within a few tens of steps, which is why statistics are kept per step but
those of step T_max can be reused past the training length.

The statistics plotted are the papers' population estimate (average of the minibatch
moments over a pass of training batches with the final parameters); the running average
in the `batch_stats` collection is saved next to it in the JSON. Convergence is measured
against the average of the second half of the steps, s_inf:
  mean: RMS over units of (m_t - m_inf) / sqrt(v_inf)   (shift in stationary std units)
  var:  RMS over units of (v_t - v_inf) / v_inf          (relative change)

  python -m experiments.analysis.population_stats [--ptb_dir=...] [--output_dir=...]
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import loop
from experiments.analysis import common

_HIDDEN = flags.DEFINE_integer('ps_hidden_size', 128, 'BN-LSTM units.')
_STEPS = flags.DEFINE_integer('ps_steps', 300, 'Training steps.')
_BATCH = flags.DEFINE_integer('ps_batch_size', 32, 'Batch size.')
_LENGTH = flags.DEFINE_integer('ps_length', 100, 'Training window length (T_max).')
_UNITS = flags.DEFINE_integer('ps_units_shown', 10, 'Random units drawn per panel.')
_POP = flags.DEFINE_integer('ps_population_batches', 16,
                            'Training batches averaged for the population estimate.')

SITES = ('recurrent', 'input', 'cell')
SITE_LABELS = {'recurrent': 'recurrent term W_h h_{t-1}', 'input': 'input term W_x x_t',
               'cell': 'cell c_t'}


def convergence(mean: np.ndarray, var: np.ndarray) -> dict[str, np.ndarray]:
  """Distance of each step's statistics from the stationary ones: `[T, F]` -> `[T]`."""
  half = mean.shape[0] // 2
  mean_inf = mean[half:].mean(0)
  var_inf = var[half:].mean(0)
  scale = np.sqrt(np.maximum(var_inf, 1e-12))
  return {
      'mean_shift': np.sqrt(np.mean(((mean - mean_inf) / scale) ** 2, axis=1)),
      'var_change': np.sqrt(np.mean(((var - var_inf) / np.maximum(var_inf, 1e-12)) ** 2,
                                    axis=1)),
  }


def shared_row_variances(mean: np.ndarray, var: np.ndarray) -> dict:
  """The one population row of `bn_lstm_shared` against a pooled variance, from per-step
  statistics `mean, var [T, F]` (every step with the same count).

  `bn_lstm_shared` keeps the average of the per-step variances, mean_t v_t (the paper's
  "averaging statistics over time"). The pooled variance of all steps' activations adds
  the spread of the per-step means: mean_t v_t + var_t m_t. Returns, over the units, the
  median and largest ratio pooled / averaged and the fraction of units where the pooled
  variance is more than 10 % larger.
  """
  averaged = var.mean(0)
  pooled = averaged + mean.var(0)
  ratio = pooled / np.maximum(averaged, 1e-12)
  return {'ratio_median': float(np.median(ratio)), 'ratio_max': float(ratio.max()),
          'fraction_over_1.1': float(np.mean(ratio > 1.1))}


def run(output_dir: str, ptb_dir: str, hidden_size: int = 128, num_steps: int = 300,
        batch_size: int = 32, length: int = 100, units_shown: int = 10,
        population_batches: int = 16, learning_rate: float = 2e-3, seed: int = 0) -> dict:
  """Writes `population_stats.{png,json}`; returns the JSON dict.

  JSON: `population[site]` = `{'mean', 'var': [T, F_shown]}` for the units shown,
  `shared_row[site]` = `shared_row_variances` over all units (every step of the window),
  `running_average[site]` likewise, `convergence[site]` = `{'mean_shift', 'var_change':
  [T]}` over all units, `units[site]` = the feature indices shown.
  """
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  config = common.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                             length=length, learning_rate=learning_rate, eval_batches=4,
                             population_batches=population_batches, seed=seed,
                             variant='bn_lstm')
  trainer = loop.Trainer(config)
  state, history = common.fit(trainer, trainer.to_devices(trainer.initial_state()),
                              num_steps, num_steps)
  logging.info('Trained %d steps: valid bpc %.3f', num_steps, history['eval'][-1]['metric'])
  population = parallel.unreplicate(trainer.population_stats(state))
  running = parallel.unreplicate(state.batch_stats)
  pop_layer = population['rnn']['layer_0']
  run_layer = running['rnn']['layer_0']

  rng = np.random.RandomState(seed)
  shown, conv, pop_out, run_out, shared = {}, {}, {}, {}, {}
  for site in SITES:
    mean, var = np.asarray(pop_layer[site]['mean']), np.asarray(pop_layer[site]['var'])
    shared[site] = shared_row_variances(mean, var)
    shown[site] = np.sort(rng.choice(mean.shape[1], min(units_shown, mean.shape[1]),
                                     replace=False))
    conv[site] = convergence(mean, var)
    pop_out[site] = {'mean': mean[:, shown[site]], 'var': var[:, shown[site]]}
    run_out[site] = {'mean': np.asarray(run_layer[site]['mean'])[:, shown[site]],
                     'var': np.asarray(run_layer[site]['var'])[:, shown[site]]}

  plt = common.matplotlib_pyplot()
  fig, axes = plt.subplots(2, len(SITES) + 1, figsize=(15, 6))
  steps = np.arange(length)
  for col, site in enumerate(SITES):
    axes[0, col].plot(steps, pop_out[site]['mean'], lw=0.8)
    axes[1, col].plot(steps, pop_out[site]['var'], lw=0.8)
    axes[0, col].set_title(f'mean of {SITE_LABELS[site]}', fontsize=9)
    axes[1, col].set_title(f'variance of {SITE_LABELS[site]}', fontsize=9)
    axes[1, col].set_xlabel('time step t')
    for row in range(2):
      axes[row, col].grid(alpha=0.3)
  for site in SITES:
    axes[0, -1].semilogy(steps, np.maximum(conv[site]['mean_shift'], 1e-6), label=site)
    axes[1, -1].semilogy(steps, np.maximum(conv[site]['var_change'], 1e-6), label=site)
  axes[0, -1].set_title('RMS (m_t - m_inf) / sqrt(v_inf), all units', fontsize=9)
  axes[1, -1].set_title('RMS (v_t - v_inf) / v_inf, all units', fontsize=9)
  axes[1, -1].set_xlabel('time step t')
  for row in range(2):
    axes[row, -1].legend(fontsize=8)
    axes[row, -1].grid(alpha=0.3)
  fig.suptitle(f'Population statistics per time step (Cooijmans Fig. 5): BN-LSTM '
               f'{hidden_size} units after {num_steps} steps on character-level PTB '
               f"(valid {history['eval'][-1]['metric']:.2f} bits/char); "
               f'{units_shown} random units per panel', fontsize=10)
  fig.tight_layout()
  result = {
      'figure': 'Cooijmans et al. 2016 Fig. 5',
      'data': common.data_description(config, trainer.dataset),
      'hidden_size': hidden_size, 'steps': num_steps, 'batch_size': batch_size,
      'length': length, 'population_batches': population_batches,
      'valid_bits_per_char': history['eval'][-1]['metric'],
      'units': shown, 'population': pop_out, 'running_average': run_out,
      'convergence': conv,
      'shared_row': shared,
      'seconds': time.time() - start,
  }
  common.save_outputs(output_dir, 'population_stats', fig, result, dpi=70)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  paper = common.PAPER_SCALE.value
  run(common.OUTPUT_DIR.value, common.PTB_DIR.value,
      hidden_size=1000 if paper else _HIDDEN.value,
      num_steps=20_000 if paper else _STEPS.value,
      batch_size=64 if paper else _BATCH.value, length=_LENGTH.value,
      units_shown=_UNITS.value, population_batches=_POP.value, seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
