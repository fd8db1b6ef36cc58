"""Population statistics made several ways, compared and mixed: the papers' estimate from
random training batches, minibatch moments pooled by the law of total variance (at once
or as a running average), the sites of a `batch_stats` tree, hybrids that take some
sites or rows from other statistics, and measures of how two kinds differ."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import batch_stats
from bn_rnn_jax import population
from experiments.analysis.lib import training

EPSILON = 1e-5


def random_estimate(trainer, variables, num_batches: int, size: int,
                    rng: np.random.RandomState) -> dict:
  """The papers' estimate (`population.estimate_population_stats`) from `num_batches`
  random training batches of `size` examples."""
  inputs = trainer.dataset.splits['train']['inputs']
  index = rng.randint(0, inputs.shape[0], (num_batches, size))
  return population.estimate_population_stats(
      training.unmapped_model(trainer), variables, [(inputs[i],) for i in index])


def records(trainer, variables, inputs, index, h0_noise: bool = True) -> list:
  """The minibatch moments of `inputs[i]` for each row `i` of `index` `[batches, size]`,
  with the run's h0 noise (batch j from `jax.random.key(j)`) or, without `h0_noise`,
  with h0 zeros."""
  model = training.unmapped_model(trainer)
  model = model if h0_noise else training.without_h0_noise(model)
  return [population.minibatch_moments(model, variables, (inputs[i],),
                                       rngs={'noise': jax.random.key(j)})
          for j, i in enumerate(index)]


def pooled_site(site: Mapping[str, Any]) -> dict:
  """One site's records stacked over N minibatches (`mean`/`var` `[N, R, F]`, `count`
  `[N, R]`) -> per row the moments of every sequence behind it (law of total variance)."""
  n = np.maximum(np.asarray(site['count'], np.float64), 0.0)[..., None]   # [N, R, 1]
  mean_i, var_i = (np.asarray(site[k], np.float64) for k in ('mean', 'var'))
  total = n.sum(axis=0)                                                  # [R, 1]
  seen = total > 0
  safe = np.where(seen, total, 1.0)
  mean = (n * mean_i).sum(axis=0) / safe
  var = (n * (var_i + (mean_i - mean) ** 2)).sum(axis=0) / safe
  return {'mean': np.where(seen, mean, 0.0), 'var': np.where(seen, var, 1.0),
          'count': total[:, 0]}


def stacked(minibatch_records: Sequence[Any]) -> Any:
  """Minibatch records stacked on a leading axis, as host arrays."""
  return jax.tree.map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]),
                      *minibatch_records)


def pooled(minibatch_records) -> Any:
  """The moments of every example behind each row of the records, pooled by the law of
  total variance (`pooled_site`), as JAX arrays."""
  return jax.tree.map(jnp.asarray, jax.tree.map(pooled_site, stacked(minibatch_records),
                                                is_leaf=batch_stats.is_site))


def pooled_running_update(tracked: Mapping[str, Any], record: Mapping[str, Any],
                          momentum: float) -> dict:
  """One site's running average by the law of total variance after one minibatch
  `record`: each minibatch weighted by momentum^age times its count (Chan et al.'s
  pairwise update with a decaying weight)."""
  n = record['count']
  seen = (n > 0)[:, None]
  w_old = momentum * tracked['count']
  w_new = (1.0 - momentum) * n
  total = w_old + w_new
  safe = jnp.where(total > 0, total, 1.0)
  delta = jnp.where(seen, record['mean'] - tracked['mean'], 0.0)
  record_var = jnp.where(seen, record['var'], 0.0)
  mean = tracked['mean'] + (w_new / safe)[:, None] * delta
  var = ((w_old[:, None] * tracked['var'] + w_new[:, None] * record_var) / safe[:, None]
         + delta ** 2 * (w_old * w_new / safe ** 2)[:, None])
  return {'mean': mean, 'var': var, 'count': total}


def pooled_running(momenta: Sequence[float]):
  """A training loop's `track` (`sign_task.train_arm`): `{momentum: the pooled running
  average of every site}`, kept from each step's minibatch moments."""
  def init(stats):
    zeros = jax.tree.map(lambda site: jax.tree.map(jnp.zeros_like, dict(site)), stats,
                         is_leaf=batch_stats.is_site)
    return {str(m): zeros for m in momenta}
  def update(tracked, moments):
    return {str(m): jax.tree.map(lambda t, r, m=m: pooled_running_update(t, r, m),
                                 tracked[str(m)], moments, is_leaf=batch_stats.is_site)
            for m in momenta}
  return init, update


def finished(site: Mapping[str, Any]) -> dict:
  """Tracked moments as population statistics: rows never reached get variance 1."""
  return {**site, 'var': jnp.where((site['count'] > 0)[:, None], site['var'], 1.0)}


def _name(path) -> str:
  """A site's path in its tree as `'rnn/layer_0/recurrent'`."""
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def sites(stats) -> dict[str, dict]:
  """`{'rnn/layer_0/recurrent': site}` of a `batch_stats` tree."""
  found = {}
  def visit(path, node):
    found[_name(path)] = node
    return node
  jax.tree_util.tree_map_with_path(visit, stats, is_leaf=batch_stats.is_site)
  return found


def replace_sites(stats, choose) -> Any:
  """`stats` with each site replaced by `choose(name, site)`."""
  return jax.tree_util.tree_map_with_path(lambda path, site: choose(_name(path), site),
                                          stats, is_leaf=batch_stats.is_site)


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


def discrepancy(running: Mapping[str, Any], estimate: Mapping[str, Any]) -> dict:
  """Per row: mean |mean_r - mean_e| / sqrt(var_e + eps), mean log(var_r / var_e)."""
  m_r, v_r, m_e, v_e = (np.asarray(a, np.float64) for a in (
      running['mean'], running['var'], estimate['mean'], estimate['var']))
  return {'mean_shift': np.mean(np.abs(m_r - m_e) / np.sqrt(v_e + EPSILON), axis=-1),
          'log_var_ratio': np.mean(np.log((v_r + EPSILON) / (v_e + EPSILON)), axis=-1)}


def variance_spread(draws: list[dict], together: dict) -> dict[str, dict]:
  """Per site of `together` (every draw's batches), per row: `var_min` and `var_mean`
  over features, and `var_spread`, the standard deviation of the draws' variances over
  their mean, averaged over features."""
  out = {}
  drawn = [sites(d) for d in draws]
  for name, site in sites(together).items():
    var = np.asarray(site['var'], np.float64)                                 # [R, F]
    each = np.stack([np.asarray(d[name]['var'], np.float64) for d in drawn])  # [D, R, F]
    spread = each.std(axis=0) / np.maximum(each.mean(axis=0), 1e-30)
    out[name] = {'var_min': var.min(axis=-1), 'var_mean': var.mean(axis=-1),
                 'var_spread': spread.mean(axis=-1)}
  return out


def largest_variance_change(noisy: dict, plain: dict) -> dict:
  """Per site: max over rows and units of |var_noisy - var_plain| / (var_plain + 1e-3)."""
  noisy_sites, out = sites(noisy), {}
  for name, site in sites(plain).items():
    var = np.asarray(site['var'])
    out[name] = float(np.max(np.abs(np.asarray(noisy_sites[name]['var']) - var) /
                             (var + 1e-3)))
  return out
