r"""Sequences longer than training, trained on variable lengths: the BN-LSTM against the
LSTM, by what its statistics do.

A synthetic task: x_t ~ N(0, 1) for t < L, L uniform in the length range; the label is
whether the valid inputs sum to more than 0. Each arm is a `SequenceClassifier` (32
units) trained `--vl_steps` steps with Adam 3e-3 (gradients clipped at 1) on batches of
lengths 5-50 (T_max = 50), then scored on 1,000 fresh sequences per length range (5-50,
51-100, 101-200) with the papers' population estimate from `--vl_estimate_batches`
training batches. The arms:

  lstm                      the baseline
  bn_lstm                   Cooijmans' BN-LSTM, the library's defaults: per-step
                            statistics, rows fewer than 5 % of the sequences reached
                            replaced by the steady state (`min_row_support`)
  bn_lstm, papers' rule     every row read as recorded (`min_row_support=0`): the last row
                            reached serves every later step (Cooijmans sec. 3)
  bn_lstm, min_step_count 4 training steps with fewer than 4 sequences normalised with
                            the population rows instead of their own
  bn_lstm_shared            one set of statistics for every step (Cooijmans' ablation):
                            nothing depends on the step, so nothing is extrapolated
  bn_input_only_seq         Laurent's: batch norm on the input term only, sequence-wise
  ..., bucketed             every training batch one length (L drawn per batch), so every
                            step's statistics rest on the whole batch
  ..., batch 256            training batches 4 times larger: the batch-moment noise of
                            the per-step statistics 4 times smaller in variance

The LSTM's own arms (bucketed, batch 256) pair with the BN-LSTM's. Every arm of one seed
sees the same test sequences; the summary pairs each arm with the LSTM trained the same
way, seed by seed.

  python -m experiments.analysis.variable_length [--vl_output_dir=experiments/results]

Expected: about 12 minutes on 2 CPU cores (the machine and the time are in the JSON).
Writes `variable_length.json` (accuracy per arm, seed and length range; the summary and
the paired differences; the machine).
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

from absl import app
from absl import flags
import jax
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import population
from experiments import machine_facts

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(os.path.dirname(_HERE), 'results')

_OUTPUT = flags.DEFINE_string('vl_output_dir', DEFAULT_OUTPUT, 'Where the JSON goes.')
_STEPS = flags.DEFINE_integer('vl_steps', 1000, 'Training steps per arm.')
_SEEDS = flags.DEFINE_integer('vl_seeds', 5, 'Seeds per arm.')
_ESTIMATE = flags.DEFINE_integer('vl_estimate_batches', 50,
                                 'Estimate batches (of the training batch size).')
_ARMS = flags.DEFINE_list('vl_arms', None, 'Arms to run (default: all of ARMS).')

TRAIN_LENGTHS = (5, 50)
TEST_LENGTHS = ((5, 50), (51, 100), (101, 200))
TEST_EXAMPLES = 1000
HIDDEN = 32
BATCH = 64
LARGE_BATCH = 256
#: Adam's learning rate for every arm.
LEARNING_RATE = 3e-3

#: `{arm: (variant, layer fields, bucketed, batch size, the LSTM arm it pairs with)}`.
ARMS = {
    'lstm': ('lstm', {}, False, BATCH, 'lstm'),
    'bn_lstm': ('bn_lstm', {}, False, BATCH, 'lstm'),
    "bn_lstm, papers' rule": ('bn_lstm', {'min_row_support': 0.0}, False, BATCH, 'lstm'),
    'bn_lstm, min_step_count 4': ('bn_lstm', {'min_step_count': 4}, False, BATCH, 'lstm'),
    'bn_lstm_shared': ('bn_lstm_shared', {}, False, BATCH, 'lstm'),
    'bn_input_only_seq': ('bn_input_only_seq', {}, False, BATCH, 'lstm'),
    'lstm, bucketed': ('lstm', {}, True, BATCH, 'lstm, bucketed'),
    'bn_lstm, bucketed': ('bn_lstm', {}, True, BATCH, 'lstm, bucketed'),
    f'lstm, batch {LARGE_BATCH}': ('lstm', {}, False, LARGE_BATCH, f'lstm, batch {LARGE_BATCH}'),
    f'bn_lstm, batch {LARGE_BATCH}': ('bn_lstm', {}, False, LARGE_BATCH,
                                      f'lstm, batch {LARGE_BATCH}'),
}


def batch(rng: np.random.Generator, size: int, lengths: tuple[int, int], width: int,
          bucketed: bool = False):
  """`(x [size, width, 1], mask [size, width], labels [size])`: lengths uniform in
  `lengths`, one per sequence, or one for the whole batch when `bucketed`."""
  length = rng.integers(lengths[0], lengths[1] + 1, 1 if bucketed else size)
  mask = (np.arange(width)[None] < np.broadcast_to(length, (size,))[:, None]).astype(
      np.float32)
  x = rng.normal(size=(size, width, 1)).astype(np.float32) * mask[..., None]
  return x, mask, (x.sum(axis=(1, 2)) > 0).astype(np.int32)


def classifier(variant: str, hidden: int, max_length: int,
               fields: Optional[dict] = None) -> br.SequenceClassifier:
  """The task's model: a two-class `SequenceClassifier` of `variant` with `max_length`
  rows of per-step statistics and any other layer `fields`."""
  return br.SequenceClassifier(2, br.make_layer(variant, hidden, max_length=max_length,
                                               **(fields or {})))


def train_arm(variant: str, fields: dict, seed: int, steps: int, hidden: int,
              batch_size: int, optimizer=None, track=None, bucketed: bool = False):
  """A trained `(model, variables, rng)`; `optimizer` an optax transformation (default
  Adam 3e-3), clipped at global norm 1; `bucketed`: one length per training batch
  (`batch`); `rng` continues the training draws. `track`: `(init(batch_stats) -> tracked,
  update(tracked, minibatch moments) -> tracked)`, statistics of one's own kept from
  every training step's minibatch moments, returned as `variables['tracked']`."""
  width = TRAIN_LENGTHS[1]
  model = classifier(variant, hidden, width, fields)
  rng = np.random.default_rng(seed)
  x, mask, _ = batch(rng, batch_size, TRAIN_LENGTHS, width, bucketed)
  variables = model.init(jax.random.key(seed), x, mask, use_running_average=True,
                         deterministic=True)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer or optax.adam(LEARNING_RATE))
  params, stats = variables['params'], variables.get('batch_stats', {})
  opt_state = tx.init(params)
  init, update = track or (lambda stats: {}, lambda tracked, moments: tracked)
  tracked = init(stats)

  @jax.jit
  def step(params, stats, tracked, opt_state, x, mask, labels):
    def loss_fn(p):
      logits, mutated = model.apply({'params': p, 'batch_stats': stats}, x, mask,
                                    use_running_average=False, deterministic=False,
                                    mutable=['batch_stats', population.MOMENTS])
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      return loss, mutated
    (_, mutated), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    tracked = update(tracked, mutated.get(population.MOMENTS, {}))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), mutated.get('batch_stats', stats),
            tracked, opt_state)

  for _ in range(steps):
    x, mask, labels = batch(rng, batch_size, TRAIN_LENGTHS, width, bucketed)
    params, stats, tracked, opt_state = step(params, stats, tracked, opt_state, x, mask,
                                             labels)
  variables = {'params': params, 'batch_stats': stats}
  return model, {**variables, 'tracked': tracked} if track else variables, rng


def accuracy(model, variables, rng, lengths) -> float:
  """Accuracy with population statistics on `TEST_EXAMPLES` fresh sequences."""
  x, mask, labels = batch(rng, TEST_EXAMPLES, lengths, lengths[1])
  logits = model.apply(variables, x, mask, use_running_average=True, deterministic=True)
  return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def score_arm(name: str, seed: int, steps: int, estimate_batches: int) -> dict[str, float]:
  """`{length range: accuracy}` of arm `name` trained with `seed`."""
  variant, fields, bucketed, batch_size, _ = ARMS[name]
  model, variables, rng = train_arm(variant, fields, seed, steps, HIDDEN, batch_size,
                                    bucketed=bucketed)
  if variables['batch_stats']:
    count = max(1, estimate_batches * BATCH // batch_size)   # the same number of examples
    data = [batch(rng, batch_size, TRAIN_LENGTHS, TRAIN_LENGTHS[1], bucketed)[:2]
            for _ in range(count)]
    variables = {**variables,
                 'batch_stats': br.estimate_population_stats(model, variables, data)}
  test_rng = np.random.default_rng(1000 + seed)   # the same test data for every arm
  return {f'{lo}-{hi}': accuracy(model, variables, test_rng, (lo, hi))
          for lo, hi in TEST_LENGTHS}


def run(steps: int, seeds: int, estimate_batches: int,
        arms: Optional[Sequence[str]] = None) -> dict:
  arms = list(ARMS) if arms is None else list(arms)
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    raise ValueError(f'Unknown arm(s) {unknown}; choose from {list(ARMS)}.')
  start = time.time()
  results = {name: {str(seed): score_arm(name, seed, steps, estimate_batches)
                    for seed in range(seeds)} for name in arms}
  return {
      'what': 'accuracy on 1,000 sequences per length range, trained on lengths 5-50',
      'setup': {'steps': steps, 'seeds': seeds, 'hidden': HIDDEN, 'batch': BATCH,
                'large_batch': LARGE_BATCH, 'estimate_batches': estimate_batches,
                'optimizer': 'adam 3e-3, clip 1', 'train_lengths': list(TRAIN_LENGTHS),
                'test_lengths': [list(r) for r in TEST_LENGTHS],
                'test_examples': TEST_EXAMPLES},
      'command': 'python -m experiments.analysis.variable_length',
      'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
      'accuracy': results, 'summary': summary(results),
      'against_lstm': against_lstm(results),
  }


def summary(results: dict) -> dict:
  """`{arm: {length range: {mean, min, max, sd}}}` over the seeds of `results`
  (`{arm: {seed: {length range: accuracy}}}`); sd with ddof 1 (0 for one seed)."""
  out = {}
  for arm, by_seed in results.items():
    out[arm] = {}
    for length_range in next(iter(by_seed.values())):
      values = [scores[length_range] for scores in by_seed.values()]
      out[arm][length_range] = {
          'mean': float(np.mean(values)), 'min': float(np.min(values)),
          'max': float(np.max(values)),
          'sd': float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
  return out


def paired_difference(by_seed: dict, partner: dict) -> dict:
  """`{length range: {mean, se, wins, seeds}}`: `by_seed` minus `partner` (each `{seed:
  {length range: accuracy}}`), seed by seed over the seeds both have: the mean difference,
  its standard error (sd / sqrt(seeds), 0 for one seed) and the seeds where `by_seed`
  scores at least `partner`'s."""
  seeds = [s for s in by_seed if s in partner]
  out = {}
  for length_range in by_seed[seeds[0]]:
    d = np.array([by_seed[s][length_range] - partner[s][length_range] for s in seeds])
    out[length_range] = {
        'mean': float(d.mean()),
        'se': float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0,
        'wins': int(np.sum(d >= 0)), 'seeds': len(d)}
  return out


def against_lstm(results: dict) -> dict:
  """`{arm: {length range: {mean, se, wins, seeds}}}`: each batch-normalised arm minus
  the LSTM arm it pairs with (`ARMS`), seed by seed (`paired_difference`)."""
  return {arm: paired_difference(by_seed, results[ARMS[arm][4]])
          for arm, by_seed in results.items()
          if ARMS[arm][4] != arm and ARMS[arm][4] in results}


def table(result: dict) -> str:
  """Mean ± sd accuracy per arm and test length range, and each BN arm's paired
  difference from its LSTM on the longest range."""
  ranges = [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]
  longest = ranges[-1]
  lines = ['| arm | ' + ' | '.join(f'lengths {r}' for r in ranges) +
           f' | minus its LSTM, {longest} | seeds at or above it |',
           '|---|' + '---|' * (len(ranges) + 2)]
  for arm, by_range in result['summary'].items():
    cells = [f"{by_range[r]['mean']:.3f} ± {by_range[r]['sd']:.3f}" for r in ranges]
    paired = result['against_lstm'].get(arm, {}).get(longest)
    cells += ([f"{paired['mean']:+.3f} ± {paired['se']:.3f}",
               f"{paired['wins']} of {paired['seeds']}"] if paired else ['–', '–'])
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  n = result['setup']['test_examples']
  lines.append('')
  lines.append(f"Mean ± standard deviation over {result['setup']['seeds']} seeds; each "
               f'accuracy is on {n} sequences (a binomial standard error of at most '
               f'{0.5 / np.sqrt(n):.3f}). "minus its LSTM": the paired difference from the '
               'LSTM trained the same way (mean ± standard error over seeds).')
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  result = run(_STEPS.value, _SEEDS.value, _ESTIMATE.value, _ARMS.value)
  os.makedirs(_OUTPUT.value, exist_ok=True)
  path = os.path.join(_OUTPUT.value, 'variable_length.json')
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(table(result))
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
