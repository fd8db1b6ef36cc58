"""Sequences longer than training, on the variable-length task (`sign_task`); each study
writes a JSON of its kind under experiments/results/ (the third, `variable_length_cause`,
is `length_cause`).

* `variable_length`: the BN-LSTM against the LSTM by what its statistics do (`ARMS`).
* `longer_sequences`: the BN-LSTM's population statistics made several ways from the same
  parameters and batches (the papers' estimate, pooled, running, pooled running, each
  with a steady tail), beside the LSTM, with Adam and with RMSProp.
"""

from __future__ import annotations

import itertools
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import batch_stats
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from experiments import machine_facts
from experiments.analysis.lib import moments
from experiments.analysis.lib import outputs
from experiments.analysis.lib import sign_task as task

LARGE_BATCH = 256
#: `{arm: (variant, layer fields, bucketed, batch size, the LSTM arm it pairs with)}`.
ARMS = {
    'lstm': ('lstm', {}, False, task.BATCH, 'lstm'),
    'bn_lstm': ('bn_lstm', {}, False, task.BATCH, 'lstm'),
    "bn_lstm, papers' rule": ('bn_lstm', {'min_row_support': 0.0}, False, task.BATCH, 'lstm'),
    'bn_lstm, min_step_count 4': ('bn_lstm', {'min_step_count': 4}, False, task.BATCH, 'lstm'),
    'bn_lstm_shared': ('bn_lstm_shared', {}, False, task.BATCH, 'lstm'),
    'bn_input_only_seq': ('bn_input_only_seq', {}, False, task.BATCH, 'lstm'),
    'lstm, bucketed': ('lstm', {}, True, task.BATCH, 'lstm, bucketed'),
    'bn_lstm, bucketed': ('bn_lstm', {}, True, task.BATCH, 'lstm, bucketed'),
    f'lstm, batch {LARGE_BATCH}': ('lstm', {}, False, LARGE_BATCH, f'lstm, batch {LARGE_BATCH}'),
    f'bn_lstm, batch {LARGE_BATCH}': ('bn_lstm', {}, False, LARGE_BATCH,
                                      f'lstm, batch {LARGE_BATCH}'),
}


def setup(**fields) -> dict:
  return {**fields, 'train_lengths': list(task.TRAIN_LENGTHS),
          'test_lengths': [list(r) for r in task.TEST_LENGTHS],
          'test_examples': task.TEST_EXAMPLES}


def result_of(what: str, setup: dict, command: str, start: float, **fields) -> dict:
  return {'what': what, 'setup': setup, 'command': command,
          'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
          **fields}


def _footer(result: dict, paired: str = '') -> str:
  n = result['setup']['test_examples']
  return (f"Mean ± standard deviation over {result['setup']['seeds']} seeds; each accuracy "
          f'is on {n} sequences (a binomial standard error of at most '
          f'{0.5 / np.sqrt(n):.3f}).{paired}')


# ---------------------------------------------------------------------- variable_length
def _score_vl_arm(name: str, seed: int, steps: int, estimate_batches: int) -> dict:
  """`{length range: accuracy}` of `ARMS[name]` trained with `seed`."""
  variant, fields, bucketed, batch_size, _ = ARMS[name]
  model, variables, rng = task.train_arm(variant, fields, seed, steps, task.HIDDEN,
                                         batch_size, bucketed=bucketed)
  if variables['batch_stats']:
    count = max(1, estimate_batches * task.BATCH // batch_size)   # the same examples
    data = [task.batch(rng, batch_size, task.TRAIN_LENGTHS, task.TRAIN_LENGTHS[1],
                       bucketed)[:2] for _ in range(count)]
    variables = {**variables,
                 'batch_stats': br.estimate_population_stats(model, variables, data)}
  return task.by_range(model, variables, seed)


def variable_length(steps: int = 1000, seeds: int = 5, estimate_batches: int = 50,
                    arms: Optional[Sequence[str]] = None,
                    output_dir: str = outputs.RESULTS) -> dict:
  """`variable_length.json`: every arm of `ARMS` trained and scored on 1,000 fresh
  sequences per length range with the estimate from training batches; each
  batch-normalised arm paired with the LSTM trained the same way, seed by seed (every arm
  of a seed sees the same test sequences).

  Args:
    steps: training steps per arm.
    seeds: seeds per arm.
    estimate_batches: batches of the estimate (of 64 examples' worth).
    arms: the arms to run (default: all of ARMS).
    output_dir: where the JSON goes.
  """
  arms = list(ARMS) if arms is None else list(arms)
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    raise ValueError(f'Unknown arm(s) {unknown}; choose from {list(ARMS)}.')
  start = time.time()
  results = {name: {str(seed): _score_vl_arm(name, seed, steps, estimate_batches)
                    for seed in range(seeds)} for name in arms}
  return outputs.save(output_dir, 'variable_length', 'variable_length', result_of(
      'accuracy on 1,000 sequences per length range, trained on lengths 5-50',
      setup(steps=steps, seeds=seeds, hidden=task.HIDDEN, batch=task.BATCH,
             large_batch=LARGE_BATCH, estimate_batches=estimate_batches,
             optimizer='adam 3e-3, clip 1'),
      'python -m experiments.analysis.variable_length', start, accuracy=results,
      summary=task.summary(results), against_lstm={
          arm: task.paired_difference(by_seed, results[ARMS[arm][4]])
          for arm, by_seed in results.items()
          if ARMS[arm][4] != arm and ARMS[arm][4] in results}), exact=True)


def variable_length_table(result: dict) -> str:
  """Mean ± sd accuracy per arm and test length range, and each BN arm's paired
  difference from its LSTM on the longest range."""
  ranges = task.ranges(result)
  longest = ranges[-1]
  lines = ['| arm | ' + ' | '.join(f'lengths {r}' for r in ranges) +
           f' | minus its LSTM, {longest} | seeds at or above it |',
           '|---|' + '---|' * (len(ranges) + 2)]
  for arm, by_range in result['summary'].items():
    paired = result['against_lstm'].get(arm, {}).get(longest)
    cells = [task.mean_sd(by_range[r]) for r in ranges] + (
        [f"{paired['mean']:+.3f} ± {paired['se']:.3f}", f"{paired['wins']} of "
         f"{paired['seeds']}"] if paired else ['–', '–'])
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines + ['', _footer(result, ' "minus its LSTM": the paired difference '
                                        'from the LSTM trained the same way (mean ± '
                                        'standard error over seeds).')])


# ---------------------------------------------------------------------- longer_sequences
#: `{name: (description, optax transformation)}` (clipped at global norm 1).
OPTIMIZERS = {
    'adam': ('Adam 3e-3', optax.adam(3e-3)),
    'rmsprop': ('RMSProp 1e-3, decay 0.9, momentum 0.9',
                optax.rmsprop(1e-3, decay=0.9, momentum=0.9)),
}


def _made_statistics(model, variables, tracked, batches, supports) -> dict:
  """`{kind: batch_stats}`: the estimate, pooled and running statistics, and the
  estimate and the pooled running averages with a steady tail at each of `supports`."""
  made = {
      'estimate': br.estimate_population_stats(model, variables, batches),
      'pooled': jax.tree.map(moments.pooled_site, moments.stacked(
          [population.minibatch_moments(model, variables, args) for args in batches]),
                             is_leaf=batch_stats.is_site),
      'running': variables['batch_stats'],
      **{f'running, pooled, momentum {m}': jax.tree.map(moments.finished, t,
                                                        is_leaf=batch_stats.is_site)
         for m, t in tracked.items()},
  }
  tails = {f'{kind}, steady tail {support}': jax.tree.map(
      lambda site, support=support: normalization.steady_tail(
          jax.tree.map(jnp.asarray, dict(site)), support), stats, is_leaf=batch_stats.is_site)
           for kind, stats in made.items() if kind == 'estimate' or 'pooled,' in kind
           for support in supports}
  return {kind: jax.tree.map(jnp.asarray, stats) for kind, stats in {**made, **tails}.items()}


def longer_sequences(steps: int = 1000, seeds: int = 5, estimate_batches: int = 50,
                     optimizers: Sequence[str] = ('adam', 'rmsprop'),
                     momenta: Sequence[float] = (0.99, 0.9),
                     supports: Sequence[float] = (0.5, 0.2, 0.05),
                     output_dir: str = outputs.RESULTS) -> dict:
  """`longer_sequences.json`: the LSTM and the BN-LSTM (every row read as made:
  `min_row_support=0`) trained per seed and optimizer; the BN-LSTM scored with each of
  `_made_statistics`, and with batch statistics on lengths 5-50.

  Args:
    steps: training steps per model.
    seeds: seeds.
    estimate_batches: training batches of the population statistics.
    optimizers: the optimizers to train with (OPTIMIZERS).
    momenta: momenta of the pooled running averages.
    supports: fractions of the sequences below which a row joins the steady tail.
    output_dir: where the JSON goes.
  """
  results: dict[str, dict] = {}
  start = time.time()
  for seed in range(seeds):
    for optimizer, variant in itertools.product(optimizers, ('lstm', 'bn_lstm')):
      track = moments.pooled_running(momenta) if variant == 'bn_lstm' else None
      model, variables, rng = task.train_arm(variant, {'min_row_support': 0.0}, seed, steps,
                                             task.HIDDEN, task.BATCH,
                                             OPTIMIZERS[optimizer][1], track)
      scored = {f'{variant}, {optimizer}': variables}
      if variant == 'bn_lstm':
        batches = [task.batch(rng, task.BATCH, task.TRAIN_LENGTHS, task.TRAIN_LENGTHS[1])[:2]
                   for _ in range(estimate_batches)]
        tracked = variables.pop('tracked')
        scored = {f'bn_lstm, {optimizer}, {kind}': {**variables, 'batch_stats': stats}
                  for kind, stats in _made_statistics(model, variables, tracked, batches,
                                                      supports).items()}
      for arm, arm_variables in scored.items():
        results.setdefault(arm, {})[str(seed)] = task.by_range(model, arm_variables, seed)
      if variant == 'bn_lstm':
        lo, hi = task.TEST_LENGTHS[0]
        results.setdefault(f'bn_lstm, {optimizer}, batch', {})[str(seed)] = {
            f'{lo}-{hi}': task.accuracy(model, variables, np.random.default_rng(1000 + seed),
                                        (lo, hi), batch_statistics=True)}
  return outputs.save(output_dir, 'longer_sequences', 'longer_sequences', result_of(
      'accuracy on 1,000 sequences per length range, trained on lengths 5-50, with '
      'population statistics made in different ways',
      setup(steps=steps, seeds=seeds, hidden=task.HIDDEN, batch=task.BATCH,
             estimate_batches=estimate_batches, clip=1.0,
             optimizers={k: OPTIMIZERS[k][0] for k in optimizers}, momenta=list(momenta),
             supports=list(supports)),
      'python -m experiments.analysis.longer_sequences', start, accuracy=results,
      summary=task.summary(results)), exact=True)


def longer_sequences_table(result: dict) -> str:
  """Mean accuracy ± the standard deviation over seeds, per arm and test length range."""
  ranges = task.ranges(result)
  lines = ['| arm | ' + ' | '.join(f'lengths {r}' for r in ranges) + ' |',
           '|---|' + '---|' * len(ranges)]
  for arm, by_range in result['summary'].items():
    lines.append(f'| {arm} | ' + ' | '.join(task.mean_sd(by_range.get(r)) for r in ranges)
                 + ' |')
  return '\n'.join(lines + ['', _footer(result)])


def with_machine(table):
  return lambda result, source: (f"Machine: {machine_facts.describe(result['machine'])}."
                                 f'\n\n{table(result)}')


RENDERERS = {'variable_length': with_machine(variable_length_table),
             'longer_sequences': with_machine(longer_sequences_table)}
