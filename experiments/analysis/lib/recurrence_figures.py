"""The statistics inside the recurrence, redrawn with the library's own pieces: a BN-LSTM
language model's population statistics per step, which settle within a few steps
(Cooijmans Fig. 5, appendix A), and batch norm of a tanh RNN's whole pre-activation
against its input term only (Laurent et al. appendix A). Each writes `<kind>.{json,png}`:
the plotted numbers and the figure."""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

import numpy as np

from bn_rnn_jax.training import loop
from bn_rnn_jax.training import parallel
from experiments.analysis.lib import outputs
from experiments.analysis.lib import training
from experiments.campaign.columns import smooth

# ---------------------------------------------------------------------- population statistics (5)
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


def population_stats(output_dir: str = outputs.FIGURES,
                     ptb_dir: Optional[str] = training.data_dir('ptb'),
                     hidden_size: int = 128, num_steps: int = 300, batch_size: int = 32,
                     length: int = 100, units_shown: int = 10, population_batches: int = 16,
                     learning_rate: float = 2e-3, seed: int = 0,
                     paper_scale: bool = False) -> dict:
  """`population_stats.{png,json}` of a BN-LSTM language model trained briefly:
  `population[site]` = `{'mean', 'var': [T, F_shown]}` of the papers' estimate for the
  units shown (`units[site]`), `running_average[site]` likewise, `convergence[site]` =
  `{'mean_shift', 'var_change': [T]}` over all units, `shared_row[site]` =
  `shared_row_variances`.

  Args:
    output_dir: where the JSON and PNG go.
    ptb_dir: the character-level PTB files.
    hidden_size: BN-LSTM units.
    num_steps: training steps.
    batch_size: training batch size.
    length: the training window (T_max).
    units_shown: random units drawn per panel.
    population_batches: training batches of the population estimate.
    learning_rate: Adam's learning rate.
    seed: the random seed.
    paper_scale: the paper's 1000 units, 20k steps, batch 64 (hours; use an accelerator).
  """
  if paper_scale:
    hidden_size, num_steps, batch_size = 1000, 20_000, 64
  plt = outputs.pyplot()
  start = time.time()
  config = training.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                               length=length, learning_rate=learning_rate, eval_batches=4,
                               population_batches=population_batches, seed=seed,
                               variant='bn_lstm')
  trainer = loop.Trainer(config)
  state, history = training.fit(trainer, trainer.to_devices(trainer.initial_state()),
                                num_steps, num_steps)
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
      'data': training.data_description(config, trainer.dataset),
      'hidden_size': hidden_size, 'steps': num_steps, 'batch_size': batch_size,
      'length': length, 'population_batches': population_batches,
      'valid_bits_per_char': history['eval'][-1]['metric'],
      'units': shown, 'population': pop_out, 'running_average': run_out,
      'convergence': conv,
      'shared_row': shared,
      'seconds': time.time() - start,
  }
  return outputs.save(output_dir, 'population_stats', 'population_stats', result, fig,
                      dpi=70)


def render_population_stats(p: dict, source: str) -> str:
  name = os.path.basename(source)
  lines = [f"{name}: valid bpc {p['valid_bits_per_char']:.3f} after {p['steps']} steps; RMS "
           'mean shift < 0.1 from step ' + ', '.join(
               f"{s} {next((i for i, v in enumerate(c['mean_shift']) if v < 0.1), None)}"
               for s, c in p['convergence'].items())]
  if 'shared_row' in p:
    lines.append(f'{name}: bn_lstm_shared row, pooled / averaged variance over units ' +
                 '; '.join(f"{s}: median {r['ratio_median']:.3f}, max {r['ratio_max']:.2f}, "
                           f"{100 * r['fraction_over_1.1']:.0f}% of units > 1.1"
                           for s, r in p['shared_row'].items()))
  return '\n'.join(lines)


# ---------------------------------------------------------------------- Laurent appendix A
def parse_variants(entries: Sequence[str]) -> list[tuple[str, float]]:
  """'name[:gamma]' -> (name, gamma); gamma defaults to 1 (standard batch norm)."""
  out = []
  for entry in entries:
    name, _, gamma = entry.partition(':')
    if name not in ('rnn', 'rnn_bn_input', 'rnn_bn_recurrence'):
      raise ValueError(f'Variant {name!r} is not a tanh-RNN variant of variants.VARIANTS '
                       "('rnn', 'rnn_bn_input', 'rnn_bn_recurrence').")
    out.append((name, float(gamma) if gamma else 1.0))
  if not out:
    raise ValueError('No variants given.')
  return out


def laurent_appendix(output_dir: str = outputs.FIGURES,
                     ptb_dir: Optional[str] = training.data_dir('ptb'),
                     variants: Sequence[str] = ('rnn', 'rnn_bn_input:1.0',
                                                'rnn_bn_recurrence:1.0',
                                                'rnn_bn_recurrence:0.1'),
                     num_steps: int = 400, hidden_size: int = 250, num_layers: int = 3,
                     embed_size: int = 250, batch_size: int = 32, length: int = 100,
                     learning_rate: float = 2e-3, num_evals: int = 8, eval_batches: int = 8,
                     seed: int = 0, paper_scale: bool = False) -> dict:
  """`laurent_appendix.{png,json}`: Laurent et al.'s character-PTB model (embedding ->
  tanh-RNN layers -> softmax) per variant, with the same batches and seed, and Adam for
  every model (theirs: a search over SGD settings per model): `curves[label]` = training
  history (`train_loss` in nats, `eval` metric in bits per character),
  `final_valid_bpc[label]`.

  Args:
    output_dir: where the JSON and PNG go.
    ptb_dir: the character-level PTB files.
    variants: tanh-RNN variants as variant[:initial gamma] (gamma 1 unless given).
    num_steps: training steps per model.
    hidden_size: units per layer (Laurent: 250).
    num_layers: layers (Laurent: 3).
    embed_size: lookup-table width (Laurent: 250).
    batch_size: batch size (Laurent: 32, 64 or 128).
    length: the training window.
    learning_rate: Adam's learning rate.
    num_evals: validation points per curve.
    eval_batches: validation batches per evaluation.
    seed: the random seed.
    paper_scale: 20 epochs (31k steps), 40 evaluations of 120 batches.
  """
  if paper_scale:
    num_steps, num_evals, eval_batches = 31_000, 40, 120
  plt = outputs.pyplot()
  start = time.time()
  curves, data = {}, None
  for name, gamma in parse_variants(variants):
    config = training.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                                 length=length, learning_rate=learning_rate,
                                 eval_batches=eval_batches, population_batches=4, seed=seed,
                                 variant=name, num_layers=num_layers, embed_size=embed_size,
                                 gamma_init=gamma)
    trainer = loop.Trainer(config)
    data = training.data_description(config, trainer.dataset)
    label = name if name == 'rnn' else f'{name} gamma={gamma:g}'
    curves[label] = training.fit(trainer, trainer.to_devices(trainer.initial_state()),
                                 num_steps, max(1, num_steps // num_evals))[1]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for index, (key, h) in enumerate(curves.items()):
    color = f'C{index}'
    axes[0].plot(h['step'], smooth(np.asarray(h['train_loss']) / np.log(2.0), 20),
                 color=color, label=key)
    axes[1].plot(h['eval_step'], [e['metric'] for e in h['eval']], 'o-', color=color,
                 label=key)
  for ax, ylabel in zip(axes, ('training bits/char (smoothed)', 'validation bits/char')):
    ax.set_xlabel('training step')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f'Laurent et al. appendix A: BN inside the tanh-RNN recurrence, char PTB; '
               f'embed {embed_size}, {num_layers}x{hidden_size} tanh RNN, batch '
               f'{batch_size}, T={length}, Adam {learning_rate:g}', fontsize=9)
  fig.tight_layout()
  result = {
      'figure': 'Laurent et al. 2016 appendix A (Fig. 3)',
      'data': data,
      'embed_size': embed_size, 'hidden_size': hidden_size, 'num_layers': num_layers,
      'batch_size': batch_size, 'length': length, 'steps': num_steps,
      'optimizer': f'Adam lr={learning_rate:g}, clip 1',
      'curves': curves,
      'final_valid_bpc': {k: h['eval'][-1]['metric'] for k, h in curves.items()},
      'seconds': time.time() - start,
  }
  return outputs.save(output_dir, 'laurent_appendix', 'laurent_appendix', result, fig)


def render_laurent_appendix(la: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f"{name} ({la['steps']} steps): final valid bpc " +
          ', '.join(f'{k} {v:.3f}' for k, v in la['final_valid_bpc'].items()))


RENDERERS = {'population_stats': render_population_stats,
             'laurent_appendix': render_laurent_appendix}
