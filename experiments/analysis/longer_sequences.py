r"""Population statistics for sequences longer than training, on variable-length data.

The task of `variable_length.py` (x_t ~ N(0, 1) for t < L, the label whether the valid
inputs sum to more than 0; trained on lengths 5-50, T_max = 50, batch 64, gradients
clipped at 1), scored on 1,000 fresh sequences of lengths 5-50, 51-100 and 101-200. The
LSTM and the BN-LSTM are trained once per seed and optimizer (Adam 3e-3, and RMSProp
1e-3 with decay 0.9 and momentum 0.9, the papers' MNIST rule); the BN-LSTM is then
scored with population statistics made in different ways from the same trained parameters and the same training batches:

  estimate   the papers' estimate (`br.estimate_population_stats`): per row, the
             count-weighted average of the minibatch means and variances; steps past the
             last row reached reuse it (Cooijmans et al. sec. 3).
  pooled     the law of total variance: per row, the mean and variance of every
             sequence that reached it, pooled over the minibatches
             (var = sum_i n_i (var_i + (mean_i - mean)^2) / sum_i n_i).
  batch      the test batch's own statistics (lengths 5-50 only: no rows past T_max).
  running    the running average kept during training (`RecurrentLayer`'s, momentum
             0.99).
  running, pooled
             a running average kept from the same training steps' minibatch moments
             by the law of total variance: per row, the weighted moments of the
             sequences behind it, each minibatch weighted by momentum^age * its count
             (Chan et al.'s pairwise update with a decaying weight; the first update
             takes the minibatch's moments, a row one sequence reached moves as far as
             a full one but carries its count as weight).

and the estimate and the pooled running averages with a steady tail
(`normalization.steady_tail`, the layers' `min_row_support` at each of `--ls_supports`):
every row after the last one that at least that fraction of the sequences reached takes
the moments of the rows from half its step to it, pooled by the law of total variance.

  python -m experiments.analysis.longer_sequences [--ls_output_dir=experiments/results]

Expected: about 40 minutes on 2 CPU cores (the machine and the time are in the JSON).

Writes `longer_sequences.json` (accuracy per arm, seed and length range; the machine).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from experiments import machine_facts
from experiments.analysis import variable_length as vl

_OUTPUT = flags.DEFINE_string('ls_output_dir', vl.DEFAULT_OUTPUT, 'Where the JSON goes.')
_STEPS = flags.DEFINE_integer('ls_steps', 1000, 'Training steps per model.')
_SEEDS = flags.DEFINE_integer('ls_seeds', 5, 'Seeds.')
_ESTIMATE = flags.DEFINE_integer('ls_estimate_batches', 50, 'Training batches of the '
                                 'population statistics.')
_OPTIMIZERS = flags.DEFINE_list('ls_optimizers', ['adam', 'rmsprop'], 'Optimizers to train '
                                'with (OPTIMIZERS).')
_MOMENTA = flags.DEFINE_list('ls_momenta', ['0.99', '0.9'], 'Momenta of the pooled '
                             'running averages.')
_SUPPORTS = flags.DEFINE_list('ls_supports', ['0.5', '0.2', '0.05'], 'Fractions of the '
                              'sequences below which a row joins the steady tail.')

HIDDEN = 32
BATCH = 64
#: `{name: (description, optax transformation)}` (clipped at global norm 1).
OPTIMIZERS = {
    'adam': ('Adam 3e-3', optax.adam(3e-3)),
    'rmsprop': ('RMSProp 1e-3, decay 0.9, momentum 0.9',
                optax.rmsprop(1e-3, decay=0.9, momentum=0.9)),
}


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


def pooled_running_update(tracked: Mapping[str, Any], record: Mapping[str, Any],
                          momentum: float) -> dict:
  """One site's `running, pooled` statistics after one minibatch `record`."""
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
  """`train_arm`'s `track`: `{momentum: the running, pooled statistics of every site}`."""
  def init(stats):
    zeros = jax.tree.map(lambda site: jax.tree.map(jnp.zeros_like, dict(site)), stats,
                         is_leaf=population.is_site)
    return {str(m): zeros for m in momenta}
  def update(tracked, moments):
    return {str(m): jax.tree.map(lambda t, r, m=m: pooled_running_update(t, r, m),
                                 tracked[str(m)], moments, is_leaf=population.is_site)
            for m in momenta}
  return init, update


def _finished(site: Mapping[str, Any]) -> dict:
  """Tracked moments as population statistics: rows never reached get variance 1."""
  return {**site, 'var': jnp.where((site['count'] > 0)[:, None], site['var'], 1.0)}


def stacked(records: Sequence[Any]) -> Any:
  """Minibatch records stacked on a leading axis, as host arrays."""
  return jax.tree.map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *records)


def statistics(model, variables, tracked, batches, supports) -> dict[str, Any]:
  """`{kind: batch_stats}`: the estimate, pooled and running statistics, and the
  estimate and the pooled running averages with a steady tail at each of `supports`."""
  records = [population.minibatch_moments(model, variables, args) for args in batches]
  to_jax = lambda tree: jax.tree.map(jnp.asarray, tree)
  made = {
      'estimate': br.estimate_population_stats(model, variables, batches),
      'pooled': jax.tree.map(pooled_site, stacked(records), is_leaf=population.is_site),
      'running': variables['batch_stats'],
      **{f'running, pooled, momentum {m}': jax.tree.map(_finished, t, is_leaf=population.is_site)
         for m, t in tracked.items()},
  }
  tails = {f'{kind}, steady tail {support}': jax.tree.map(
      lambda site, support=support: normalization.steady_tail(
          jax.tree.map(jnp.asarray, dict(site)), support), stats, is_leaf=population.is_site)
           for kind, stats in made.items() if kind == 'estimate' or 'pooled,' in kind
           for support in supports}
  return {kind: to_jax(stats) for kind, stats in {**made, **tails}.items()}


def batch_statistics_accuracy(model, variables, rng, lengths) -> float:
  """`vl.accuracy` with the test batch's own statistics (defined up to T_max only)."""
  x, mask, labels = vl.batch(rng, vl.TEST_EXAMPLES, lengths, lengths[1])
  logits, _ = model.apply(variables, x, mask, use_running_average=False,
                          deterministic=True, mutable=['batch_stats'])
  return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def run(steps: int, seeds: int, estimate_batches: int, optimizers: Sequence[str],
        momenta: Sequence[float], supports: Sequence[float]) -> dict:
  results: dict[str, dict] = {}
  start = time.time()
  for seed in range(seeds):
    for optimizer, variant in itertools.product(optimizers, ('lstm', 'bn_lstm')):
      tx = OPTIMIZERS[optimizer][1]
      track = pooled_running(momenta) if variant == 'bn_lstm' else None
      # Every kind of statistics as made (no steady tail at lookup but those made here).
      model, variables, rng = vl.train_arm(variant, {'min_row_support': 0.0}, seed, steps,
                                           HIDDEN, BATCH, tx, track)
      scored = {f'{variant}, {optimizer}': variables}
      if variant == 'bn_lstm':
        batches = [vl.batch(rng, BATCH, vl.TRAIN_LENGTHS, vl.TRAIN_LENGTHS[1])[:2]
                   for _ in range(estimate_batches)]
        tracked = variables.pop('tracked')
        scored = {f'bn_lstm, {optimizer}, {kind}': {**variables, 'batch_stats': stats}
                  for kind, stats in statistics(model, variables, tracked, batches,
                                                   supports).items()}
      for arm, arm_variables in scored.items():
        test_rng = np.random.default_rng(1000 + seed)   # the same test data for every arm
        results.setdefault(arm, {})[str(seed)] = {
            f'{lo}-{hi}': vl.accuracy(model, arm_variables, test_rng, (lo, hi))
            for lo, hi in vl.TEST_LENGTHS}
      if variant == 'bn_lstm':
        test_rng = np.random.default_rng(1000 + seed)
        lo, hi = vl.TEST_LENGTHS[0]
        results.setdefault(f'bn_lstm, {optimizer}, batch', {})[str(seed)] = {
            f'{lo}-{hi}': batch_statistics_accuracy(model, variables, test_rng, (lo, hi))}
  return {
      'what': 'accuracy on 1,000 sequences per length range, trained on lengths 5-50, '
              'with population statistics made in different ways',
      'setup': {'steps': steps, 'seeds': seeds, 'hidden': HIDDEN, 'batch': BATCH,
                'estimate_batches': estimate_batches, 'clip': 1.0,
                'optimizers': {k: OPTIMIZERS[k][0] for k in optimizers},
                'momenta': list(momenta),
                'supports': list(supports), 'train_lengths': list(vl.TRAIN_LENGTHS),
                'test_lengths': [list(r) for r in vl.TEST_LENGTHS],
                'test_examples': vl.TEST_EXAMPLES},
      'command': 'python -m experiments.analysis.longer_sequences',
      'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
      'accuracy': results, 'summary': vl.summary(results),
  }


def table(result: dict) -> str:
  """Mean accuracy ± the standard deviation over seeds, per arm and test length range."""
  ranges = [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]
  lines = ['| arm | ' + ' | '.join(f'lengths {r}' for r in ranges) + ' |',
           '|---|' + '---|' * len(ranges)]
  for arm, by_range in result['summary'].items():
    cells = [f"{by_range[r]['mean']:.3f} ± {by_range[r]['sd']:.3f}" if r in by_range
             else '–' for r in ranges]
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  n, seeds = result['setup']['test_examples'], result['setup']['seeds']
  lines.append('')
  lines.append(f'Mean ± standard deviation over {seeds} seeds; each accuracy is on {n} '
               f'sequences (a binomial standard error of at most {0.5 / np.sqrt(n):.3f}).')
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  result = run(_STEPS.value, _SEEDS.value, _ESTIMATE.value, _OPTIMIZERS.value,
               [float(m) for m in _MOMENTA.value], [float(x) for x in _SUPPORTS.value])
  os.makedirs(_OUTPUT.value, exist_ok=True)
  path = os.path.join(_OUTPUT.value, 'longer_sequences.json')
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(table(result))
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
