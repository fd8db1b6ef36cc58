r"""Where a trained run's running average loses accuracy against the papers' estimate:
site by site and step by step.

It restores one checkpoint of a finished run (read only, as `estimate_trained.py`) and
scores its whole validation split with population statistics made in several ways from
the same parameters:

  batch         each evaluation batch's own statistics (the reference);
  running       the running average the run kept in training;
  estimate      the papers' estimate: `--rg_batches` training batches of `--rg_size`,
                batch statistics with training's h0 noise and no dropout (the library's);
  noise-free    the same batches without the h0 noise (h0 zeros, as inference starts);
  pooled        the estimate's batches pooled by the law of total variance (the variance
                of every example behind a row, not the average of minibatch variances);

and hybrids that locate the gap: the estimate with one site's statistics taken from the
running average (`site <name>`), and with the rows of steps below a bound from the
running average (`rows < k`). Per site and row it also records how far the running
average sits from the estimate: |mean difference| in the estimate's standard deviations
and the log ratio of the variances, each averaged over features.

  python -m experiments.analysis.running_average_gap --rg_workdir=RUNS/pmnist_fig2/pmnist_bn_lstm_s0

It writes `running_average_gap_<run folder>.{png,json}` in `--output_dir`; the JSON names
the run by its campaign and run folder, never by its path.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import population
from experiments.analysis import common
from experiments.analysis import estimate_trained
from experiments.analysis import longer_sequences

_WORKDIR = flags.DEFINE_string('rg_workdir', None, 'Workdir of a finished run.')
_STEP = flags.DEFINE_integer('rg_step', None, 'Checkpoint step (default: the latest).')
_BATCHES = flags.DEFINE_integer('rg_batches', 2, 'Training batches of the estimates.')
_SIZE = flags.DEFINE_integer('rg_size', 1000, 'Examples per estimate batch.')

EPSILON = 1e-5


def _name(path) -> str:
  """A site's path in its tree as `'rnn/layer_0/recurrent'`."""
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def sites(stats) -> dict[str, dict]:
  """`{'rnn/layer_0/recurrent': site}` of a `batch_stats` tree."""
  found = {}
  def visit(path, node):
    found[_name(path)] = node
    return node
  jax.tree_util.tree_map_with_path(visit, stats, is_leaf=population.is_site)
  return found


def replace_sites(stats, choose) -> Any:
  """`stats` with each site replaced by `choose(name, site)`."""
  return jax.tree_util.tree_map_with_path(lambda path, site: choose(_name(path), site),
                                          stats, is_leaf=population.is_site)


def discrepancy(running: Mapping[str, Any], estimate: Mapping[str, Any]) -> dict:
  """Per row: mean |mean_r - mean_e| / sqrt(var_e + eps), mean log(var_r / var_e)."""
  m_r, v_r, m_e, v_e = (np.asarray(a, np.float64) for a in (
      running['mean'], running['var'], estimate['mean'], estimate['var']))
  return {'mean_shift': np.mean(np.abs(m_r - m_e) / np.sqrt(v_e + EPSILON), axis=-1),
          'log_var_ratio': np.mean(np.log((v_r + EPSILON) / (v_e + EPSILON)), axis=-1)}


def records(trainer, variables, inputs, index, h0_noise: bool = True) -> list:
  """The minibatch moments of `inputs[i]` for each row `i` of `index` `[batches, size]`,
  with the run's h0 noise (batch j from `jax.random.key(j)`) or, without `h0_noise`,
  with h0 zeros."""
  model = common.unmapped_model(trainer)
  model = model if h0_noise else common.without_h0_noise(model)
  return [population.minibatch_moments(model, variables, (inputs[i],),
                                       rngs={'noise': jax.random.key(j)})
          for j, i in enumerate(index)]


def pooled(minibatch_records) -> Any:
  """The moments of every example behind each row of the records, pooled by the law of
  total variance (`longer_sequences.pooled_site`)."""
  return jax.tree.map(jnp.asarray, jax.tree.map(
      longer_sequences.pooled_site, longer_sequences.stacked(minibatch_records),
      is_leaf=population.is_site))


def hybrids(accuracy, base, other, bounds=(1, 4, 16, 64, 256)) -> dict[str, float]:
  """`accuracy` of the `base` statistics with one site taken from `other` (`'site
  <name>'`), and with every per-step site's rows below k taken from `other` (`'rows <
  k'`, for the `bounds` below the number of rows, and for all rows). A row's mean and
  variance are taken, not its count: the counts of two kinds of statistics differ in
  scale (a running average sums every training batch's), and mixed they would set the
  rows' support (`min_row_support`) by where they came from."""
  other_sites = sites(other)
  out = {}
  for name in other_sites:
    out[f'site {name}'] = accuracy(replace_sites(
        base, lambda n, s, name=name: other_sites[n] if n == name else s))
  rows = next(iter(other_sites.values()))['count'].shape[0]
  for k in [k for k in bounds if k < rows] + [rows]:
    def rows_below(name, site, k=k):
      r = other_sites[name]
      if r['count'].shape[0] == 1:
        return site
      return {**site, **{key: jnp.concatenate([jnp.asarray(r[key])[:k],
                                                jnp.asarray(site[key])[k:]])
                         for key in ('mean', 'var')}}
    out[f'rows < {k}'] = accuracy(replace_sites(base, rows_below))
  return out


def run(run_dir: str, output_dir: str, step: Optional[int] = None, num_batches: int = 2,
        size: int = 1000, seed: int = 0) -> dict:
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  trainer, state, done = estimate_trained.restore(run_dir, step)
  logging.info('Restored step %d of %s', done, run_dir)
  variables = common.host_variables(trainer, state)
  inputs = trainer.dataset.splits['train']['inputs']
  index = np.random.RandomState(seed).randint(0, inputs.shape[0], (num_batches, size))
  drawn = records(trainer, variables, inputs, index)
  quiet = records(trainer, variables, inputs, index, h0_noise=False)
  made = {
      'running': variables['batch_stats'],
      'estimate': population.average_minibatch_moments(drawn),
      'noise-free': population.average_minibatch_moments(quiet),
      'pooled': pooled(drawn),
  }
  accuracy = lambda stats: common.evaluate_with(trainer, state, stats)['accuracy']
  result: dict[str, Any] = {
      'batch': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
      **{kind: accuracy(stats) for kind, stats in made.items()}}
  running, estimate = sites(made['running']), sites(made['estimate'])
  result['hybrids'] = hybrids(accuracy, made['estimate'], made['running'])
  result['per_row'] = {name: discrepancy(running[name], estimate[name]) for name in running}
  quiet_sites = sites(made['noise-free'])
  result['per_row_noise_free'] = {name: discrepancy(quiet_sites[name], estimate[name])
                                  for name in running}
  result['estimate_batches'] = f'{num_batches} x {size}'
  return common.save_run_outputs(output_dir, 'running_average_gap', run_dir, trainer, done,
                                 start, result, _figure)


def _figure(result: dict):
  """Per site: the running average's distance from the estimate by row."""
  plt = common.matplotlib_pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  for name, row in result['per_row'].items():
    label = name.split('/')[-1]
    axes[0].plot(row['mean_shift'], label=label)
    axes[1].plot(row['log_var_ratio'], label=label)
  axes[0].set_ylabel('|mean difference| / estimate sd')
  axes[1].set_ylabel('log(running var / estimate var)')
  for ax in axes:
    ax.set_xlabel('row (time step)')
    ax.legend(fontsize=8)
  fig.suptitle(f"{result['run']}, step {result['step']:,}: running average vs estimate",
               fontsize=10)
  fig.tight_layout()
  return fig


def main(argv):
  result = common.run_on_a_run(argv, _WORKDIR, lambda: run(
      _WORKDIR.value, common.OUTPUT_DIR.value, step=_STEP.value,
      num_batches=_BATCHES.value, size=_SIZE.value, seed=common.SEED.value))
  print({k: v for k, v in result.items() if k in ('batch', 'running', 'estimate',
                                                   'noise-free', 'pooled', 'hybrids')})


if __name__ == '__main__':
  app.run(main)
