r"""Batch statistics on variable-length data: trained on lengths 5-50, tested on 5-50,
51-100 and 101-200.

A synthetic task: x_t ~ N(0, 1) for t < L, L uniform in the length range; the label is
whether the valid inputs sum to more than 0. Each arm is a `SequenceClassifier` trained
`--vl_steps` steps with Adam on batches of lengths 5-50 (the last training steps hold one
or two sequences per batch), then scored on 1,000 fresh sequences per length range with
the papers' population estimate (`--vl_estimate_batches` training batches). The BN-LSTM
arms keep the papers' rule (every row recorded and read; `min_row_support=0`) or add
`min_step_count` (a training step with fewer sequences is normalised with the
population rows, and its row is not recorded: inference there, as at every longer step,
uses the nearest supported row); one arm computes the estimate as earlier releases did,
every minibatch row that some sequence reached counted once whatever its number of
sequences (both counts 1, unweighted).

  python -m experiments.analysis.variable_length [--output_dir=experiments/results]

Writes `variable_length.json` (accuracy per arm, seed and length range; the machine).
"""

from __future__ import annotations

import json
import os
import time
from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import population
from experiments import machine_facts

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(os.path.dirname(_HERE), 'results')

_OUTPUT = flags.DEFINE_string('vl_output_dir', DEFAULT_OUTPUT, 'Where the JSON goes.')
_STEPS = flags.DEFINE_integer('vl_steps', 200, 'Training steps per arm.')
_SEEDS = flags.DEFINE_integer('vl_seeds', 3, 'Seeds per arm.')
_HIDDEN = flags.DEFINE_integer('vl_hidden', 32, 'Units.')
_BATCH = flags.DEFINE_integer('vl_batch', 64, 'Training batch.')
_ESTIMATE = flags.DEFINE_integer('vl_estimate_batches', 10, 'Estimate batches.')
_GUARDS = flags.DEFINE_list('vl_guards', ['4', '8'],
                            'min_step_count values of the guarded BN-LSTM arms.')

TRAIN_LENGTHS = (5, 50)
TEST_LENGTHS = ((5, 50), (51, 100), (101, 200))
TEST_EXAMPLES = 1000
PAPERS = 'bn_lstm'
OLD = 'bn_lstm, old estimate'


def batch(rng: np.random.Generator, size: int, lengths: tuple[int, int], width: int):
  """`(x [size, width, 1], mask [size, width], labels [size])`."""
  length = rng.integers(lengths[0], lengths[1] + 1, size)
  mask = (np.arange(width)[None] < length[:, None]).astype(np.float32)
  x = rng.normal(size=(size, width, 1)).astype(np.float32) * mask[..., None]
  return x, mask, (x.sum(axis=(1, 2)) > 0).astype(np.int32)


def arms(guards) -> dict[str, tuple[str, dict]]:
  """`{arm: (variant, layer fields)}`."""
  out = {'lstm': ('lstm', {}), 'ln_lstm': ('ln_lstm', {}),
         'bn_input_only_seq': ('bn_input_only_seq', {})}
  # Each rule on its own: no steady tail (`longer_sequences.py` measures that).
  out[PAPERS] = ('bn_lstm', {'min_row_support': 0.0})
  for k in guards:
    out[f'bn_lstm, min_step_count {k}'] = ('bn_lstm', {'min_step_count': int(k),
                                                       'min_row_support': 0.0})
  return out


def old_estimate(model, variables, batches):
  """The estimate of earlier releases: every reached row of every minibatch weighted 1."""
  records = [population.minibatch_moments(model, variables, args) for args in batches]
  def unweight(path, leaf):
    return (leaf != 0).astype(jnp.float32) if path[-1].key == 'count' else leaf
  return population.average_minibatch_moments(
      [jax.tree_util.tree_map_with_path(unweight, r) for r in records])


def train_arm(variant: str, fields: dict, seed: int, steps: int, hidden: int,
              batch_size: int, optimizer=None, track=None):
  """A trained `(model, variables, rng)`; `optimizer` an optax transformation (default
  Adam 3e-3), clipped at global norm 1. `track`: `(init(batch_stats) -> tracked,
  update(tracked, minibatch moments) -> tracked)`, statistics of one's own kept from
  every training step's minibatch moments, returned as `variables['tracked']`."""
  width = TRAIN_LENGTHS[1]
  model = br.SequenceClassifier(num_classes=2, variant=variant, hidden_size=hidden,
                                layer_options={'max_length': width, **fields})
  rng = np.random.default_rng(seed)
  x, mask, _ = batch(rng, batch_size, TRAIN_LENGTHS, width)
  variables = model.init(jax.random.key(seed), x, mask, use_running_average=True,
                         deterministic=True)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer or optax.adam(3e-3))
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
    x, mask, labels = batch(rng, batch_size, TRAIN_LENGTHS, width)
    params, stats, tracked, opt_state = step(params, stats, tracked, opt_state, x, mask,
                                             labels)
  variables = {'params': params, 'batch_stats': stats}
  return model, {**variables, 'tracked': tracked} if track else variables, rng


def accuracy(model, variables, rng, lengths) -> float:
  x, mask, labels = batch(rng, TEST_EXAMPLES, lengths, lengths[1])
  logits = model.apply(variables, x, mask, use_running_average=True, deterministic=True)
  return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def run(steps: int, seeds: int, hidden: int, batch_size: int, estimate_batches: int,
        guards) -> dict:
  results = {}
  start = time.time()
  for name, (variant, fields) in arms(guards).items():
    for seed in range(seeds):
      model, variables, rng = train_arm(variant, fields, seed, steps, hidden, batch_size)
      estimate_data = [batch(rng, batch_size, TRAIN_LENGTHS, TRAIN_LENGTHS[1])[:2]
                       for _ in range(estimate_batches)]
      scored = {name: variables}
      if variant != 'lstm':
        scored[name] = {**variables, 'batch_stats': br.estimate_population_stats(
            model, variables, estimate_data)}
      if name == PAPERS:
        scored[OLD] = {**variables, 'batch_stats': old_estimate(model, variables,
                                                                estimate_data)}
      for arm_name, arm_variables in scored.items():
        test_rng = np.random.default_rng(1000 + seed)   # the same test data for every arm
        scores = {f'{lo}-{hi}': accuracy(model, arm_variables, test_rng, (lo, hi))
                  for lo, hi in TEST_LENGTHS}
        results.setdefault(arm_name, {})[str(seed)] = scores
  return {
      'what': 'accuracy on 1,000 sequences per length range, trained on lengths 5-50',
      'setup': {'steps': steps, 'seeds': seeds, 'hidden': hidden, 'batch': batch_size,
                'estimate_batches': estimate_batches, 'optimizer': 'adam 3e-3, clip 1',
                'train_lengths': list(TRAIN_LENGTHS),
                'test_lengths': [list(r) for r in TEST_LENGTHS],
                'test_examples': TEST_EXAMPLES},
      'command': 'python -m experiments.analysis.variable_length',
      'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
      'accuracy': results, 'summary': summary(results),
  }


def summary(results: dict) -> dict:
  """`{arm: {length range: {mean, min, max, sd}}}` over the seeds of `results`
  (`{arm: {seed: {length range: accuracy}}}`); sd with ddof 1."""
  out = {}
  for arm, by_seed in results.items():
    out[arm] = {}
    for length_range in next(iter(by_seed.values())):
      values = [scores[length_range] for scores in by_seed.values()]
      out[arm][length_range] = {
          'mean': float(np.mean(values)), 'min': float(np.min(values)),
          'max': float(np.max(values)), 'sd': float(np.std(values, ddof=1))}
  return out


def table(result: dict) -> str:
  """Mean accuracy (min-max over seeds) per arm and test length range."""
  ranges = [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]
  lines = ['| arm | ' + ' | '.join(f'lengths {r}' for r in ranges) + ' |',
           '|---|' + '---|' * len(ranges)]
  for arm, by_range in result['summary'].items():
    cells = [f"{v['mean']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
             for v in (by_range[r] for r in ranges)]
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  n = result['setup']['test_examples']
  lines.append('')
  lines.append(f"Mean over {result['setup']['seeds']} seeds (min-max); each accuracy is on "
               f'{n} sequences, a binomial standard error of at most '
               f'{0.5 / np.sqrt(n):.3f}.')
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  result = run(_STEPS.value, _SEEDS.value, _HIDDEN.value, _BATCH.value, _ESTIMATE.value,
               [int(k) for k in _GUARDS.value])
  os.makedirs(_OUTPUT.value, exist_ok=True)
  path = os.path.join(_OUTPUT.value, 'variable_length.json')
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(table(result))
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
