r"""Which sites and steps carry the spread of the papers' estimate over its draws.

The estimate averages the minibatch moments of a few random training batches, so a
trained run's accuracy with it depends on which batches were drawn; on the in-order
784-step MNIST that spread is wide. This script restores one checkpoint of a finished
run (read only, as `estimate_trained.py`), draws the estimate `--es_draws` times from
`--es_batches` training batches of `--es_size` examples each, and scores the whole
validation split with:

  batch          each evaluation batch's own statistics (the reference);
  draws          each draw's estimate (the library's: with training's h0 noise);
  noise-free draws  each draw without the h0 noise (h0 zeros, as inference starts);
  all draws      every drawn batch together (the estimate of the largest sample);
  pooled         each draw pooled by the law of total variance (the variance of every
                 example behind a row, not the average of minibatch variances);

and, per draw, the hybrids that locate its difference from "all draws" (one site from
the draw, `site <name>`; the rows below k from the draw, `rows < k`;
`running_average_gap.hybrids`). Per site and row it records what the spread rests on:
the smallest and the mean variance over features that "all draws" gives the row, and
how much the draws' variances differ (standard deviation over mean, averaged over
features); per step, the fraction of the drawn examples whose input is nonzero there (how
often a pixel is inked).

  python -m experiments.analysis.estimate_spread --es_workdir=RUNS/mnist_fig2/seq_bn_lstm_s0

It writes `estimate_spread_<run folder>.{png,json}` in `--output_dir`; the JSON names
the run by its campaign and run folder, never by its path.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax import population
from experiments.analysis import common
from experiments.analysis import estimate_trained
from experiments.analysis import running_average_gap as gap

_WORKDIR = flags.DEFINE_string('es_workdir', None, 'Workdir of a finished run.')
_STEP = flags.DEFINE_integer('es_step', None, 'Checkpoint step (default: the latest).')
_DRAWS = flags.DEFINE_integer('es_draws', 3, 'Draws of the estimate.')
_BATCHES = flags.DEFINE_integer('es_batches', 2, 'Training batches per draw.')
_SIZE = flags.DEFINE_integer('es_size', 1000, 'Examples per batch.')

#: The row bounds of the `rows < k` hybrids (and all rows).
BOUNDS = (16, 64, 256)


def variance_spread(draws: list[dict], together: dict) -> dict[str, dict]:
  """Per site of `together` (every draw's batches), per row: `var_min` and `var_mean`
  over features, and `var_spread`, the standard deviation of the draws' variances over
  their mean, averaged over features."""
  out = {}
  drawn = [gap.sites(d) for d in draws]
  for name, site in gap.sites(together).items():
    var = np.asarray(site['var'], np.float64)                           # [R, F]
    each = np.stack([np.asarray(d[name]['var'], np.float64) for d in drawn])  # [D, R, F]
    spread = each.std(axis=0) / np.maximum(each.mean(axis=0), 1e-30)
    out[name] = {'var_min': var.min(axis=-1), 'var_mean': var.mean(axis=-1),
                 'var_spread': spread.mean(axis=-1)}
  return out


def nonzero_fraction(inputs: np.ndarray, index: np.ndarray) -> np.ndarray:
  """`[T]`: the fraction of the examples `inputs[index]` (`[N, T, F]`) whose input at step
  t has a nonzero feature."""
  chosen = np.asarray(inputs)[np.unique(index.reshape(-1))]
  return (chosen != 0).any(axis=-1).mean(axis=0)


def run(run_dir: str, output_dir: str, step: Optional[int] = None, draws: int = 3,
        num_batches: int = 2, size: int = 1000, seed: int = 0) -> dict:
  """Writes `estimate_spread_<run folder>.{png,json}` in `output_dir`; returns the
  JSON's dict (the accuracies above, `per_row`, `nonzero_inputs`, the run, its step)."""
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  trainer, state, done = estimate_trained.restore(run_dir, step)
  logging.info('Restored step %d of %s', done, run_dir)
  variables = common.host_variables(trainer, state)
  inputs = trainer.dataset.splits['train']['inputs']
  index = np.random.RandomState(seed).randint(0, inputs.shape[0],
                                              (draws, num_batches, size))
  drawn = [gap.records(trainer, variables, inputs, i) for i in index]
  estimates = [population.average_minibatch_moments(r) for r in drawn]
  quiet_drawn = [gap.records(trainer, variables, inputs, i, h0_noise=False) for i in index]
  quiet = [population.average_minibatch_moments(r) for r in quiet_drawn]
  together = population.average_minibatch_moments([r for d in drawn for r in d])
  quiet_together = population.average_minibatch_moments([r for d in quiet_drawn for r in d])
  accuracy = lambda stats: common.evaluate_with(trainer, state, stats)['accuracy']
  result: dict[str, Any] = {
      'batch': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
      'draws': [accuracy(e) for e in estimates],
      'noise-free draws': [accuracy(e) for e in quiet],
      'all draws': accuracy(together),
      'pooled': [accuracy(gap.pooled(r)) for r in drawn],
      'hybrids': [gap.hybrids(accuracy, together, e, BOUNDS) for e in estimates],
      'per_row': variance_spread(estimates, together),
      'per_row_noise_free': variance_spread(quiet, quiet_together),
      'nonzero_inputs': nonzero_fraction(inputs, index),
  }
  result['estimate_batches'] = f'{draws} draws of {num_batches} x {size}'
  return common.save_run_outputs(output_dir, 'estimate_spread', run_dir, trainer, done, start,
                                 result, _figure)


def _figure(result: dict):
  """Per site and row: the smallest variance and the draws' spread; per step, how often
  the input is nonzero."""
  plt = common.matplotlib_pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  for (name, row), color in zip(result['per_row'].items(), ('C0', 'C1', 'C2', 'C3')):
    label = name.split('/')[-1]
    axes[0].semilogy(np.maximum(row['var_min'], 1e-16), label=label, color=color)
    axes[0].semilogy(np.maximum(result['per_row_noise_free'][name]['var_min'], 1e-16),
                     color=color, ls=':', lw=0.8)
    axes[1].plot(row['var_spread'], label=label, color=color)
  twin = axes[1].twinx()
  twin.plot(result['nonzero_inputs'], color='gray', lw=0.8, ls=':')
  twin.set_ylabel('fraction of inputs nonzero', color='gray')
  axes[0].set_ylabel('smallest variance over features\n(dotted: without h0 noise)')
  axes[1].set_ylabel("draws' variance: sd / mean")
  for ax in axes:
    ax.set_xlabel('row (time step)')
    ax.legend(fontsize=8)
  draws = ', '.join(f'{a:.3f}' for a in result['draws'])
  quiet = ', '.join(f'{a:.3f}' for a in result['noise-free draws'])
  fig.suptitle(f"{result['run']}, step {result['step']:,}: draws {draws} (without h0 noise "
               f"{quiet}); all draws "
               f"{result['all draws']:.3f}; batch {result['batch']:.3f}", fontsize=10)
  fig.tight_layout()
  return fig


def main(argv):
  result = common.run_on_a_run(argv, _WORKDIR, lambda: run(
      _WORKDIR.value, common.OUTPUT_DIR.value, step=_STEP.value, draws=_DRAWS.value,
      num_batches=_BATCHES.value, size=_SIZE.value, seed=common.SEED.value))
  print({k: result[k] for k in ('batch', 'draws', 'noise-free draws', 'all draws', 'pooled',
                                'hybrids')})


if __name__ == '__main__':
  app.run(main)
