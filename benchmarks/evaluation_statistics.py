r"""What `use_running_average=True` reads after training, against the papers' estimate and
batch statistics, and ways of keeping a running average that might close the gap.

  python benchmarks/evaluation_statistics.py [--tasks digits,ptb_char,variable_length]
      [--seeds 2] [--out benchmarks/results/evaluation_statistics.json]
  python benchmarks/evaluation_statistics.py --report benchmarks/results/evaluation_statistics.json

Three small tasks, each a BN-LSTM trained once per seed with the library's public API in
a plain optax loop (the loop a Flax user writes: `model.apply(..., use_running_average=
False, mutable=['batch_stats'])`):

  digits           scikit-learn's 8x8 digits as 64-step pixel sequences, the quickstart's
                   model and optimizer (100 units, identity W_h, h0 noise, gamma 0.1,
                   RMSProp 1e-3 with momentum 0.9, batch 64), 400 steps; accuracy on the
                   500 held-out digits (valid and test splits).
  ptb_char         character-level PTB (`$BN_RNN_JAX_DATA/ptb`), one-hot input, 128 units,
                   Adam 2e-3, batch 32 of 100 characters, 600 steps; bits per character
                   on 100-character segments of the first 50,000 validation characters,
                   each from a zero state.
  variable_length  the variable-length toy (`experiments/analysis/lib/sign_task.py`:
                   lengths 5-50, the sign of the sum of N(0, 1) inputs), 32 units, Adam
                   3e-3, 150 steps; accuracy on 2,000 fresh sequences of lengths 5-50.

Gradients are clipped at global norm 1. Every model is then evaluated with the same
parameters and each of these statistics:

  running                the running average the layer kept (momentum 0.99; a row's first
                         update takes the batch value): what use_running_average=True reads
  running, momentum 0.9  the same rule at momentum 0.9 (and 0.5)
  running, debiased      the running average debiased by its counts: a row moves by
                         max((1 - momentum) n / n_full, n / count), a cumulative average
                         until 1 / (1 - momentum) full batches, then the usual average
  ..., momentum 0.9      the same at momentum 0.9
  last K steps           the count-weighted average of the last K training steps'
                         minibatch moments (K = `--window`, about an epoch of the digits)
  refresh                statistics reset, then K training batches through the layer's
                         own update with the final parameters (`mutable=['batch_stats']`)
  refresh, debiased      the same with the debiased rule
  estimate               the papers' estimate (`estimate_population_stats`) from K
                         training batches with the final parameters, its variances
                         averaged (the papers') and pooled
  batch                  each evaluation batch's own statistics (the reference)

The running-average variants are replayed in the training step from each step's
minibatch moments (the `minibatch_moments` collection), by the rule of
`normalization.update_running_stats`; the replay of the layer's own rule is checked
against the layer's `batch_stats`. A binomial standard error (accuracies) or the standard
error of the mean over evaluation segments (bits per character) is that of batch
statistics' score on what was scored.

Expected: about 4 minutes on 2 CPU cores (the machine and the time are in the JSON).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
from bn_rnn_jax import batch_stats
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from bn_rnn_jax import population
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.input_pipeline import paths
from bn_rnn_jax.input_pipeline import text
from experiments import machine_facts
from experiments.analysis.lib import sign_task as toy
# pylint: enable=wrong-import-position

TASKS = ('digits', 'ptb_char', 'variable_length')
#: The running-average rules replayed in training: `{name: (momentum, debiased)}`.
RULES = {
    'running': (0.99, False),
    'running, momentum 0.9': (0.9, False),
    'running, momentum 0.5': (0.5, False),
    'running, debiased': (0.99, True),
    'running, debiased, momentum 0.9': (0.9, True),
}
REFERENCE = 'batch'


@dataclasses.dataclass(frozen=True)
class Task:
  """One task: its model, `train_batch(rng) -> (args, labels)` (`args` the model's
  positional arguments: inputs, and a mask where lengths differ), the evaluation batches
  `[(args, labels)]`, `loss(logits, labels, args)` and `score(logits, labels, args) ->
  [examples]` per-example scores (correct 0/1, or a segment's bits and predictions), the
  metric's name and settings."""
  name: str
  model: Any
  train_batch: Callable
  eval_batches: list
  loss: Callable
  score: Callable
  metric: str
  steps: int
  optimizer: Any
  setup: dict


# ---------------------------------------------------------------------------- tasks
def _classification_loss(logits, labels, args):
  del args
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _correct(logits, labels, args):
  del args
  return np.asarray(np.argmax(np.asarray(logits), -1) == labels, np.float64)


def digits_task(steps: int = 400) -> Task:
  splits = mnist.load_digits()
  train_x, train_y = mnist.to_sequences(splits['train'][0]), splits['train'][1]
  held_x = mnist.to_sequences(np.concatenate([splits['valid'][0], splits['test'][0]]))
  held_y = np.concatenate([splits['valid'][1], splits['test'][1]])
  layer = br.make_layer('bn_lstm', 100, max_length=64,
                        recurrent_kernel_init=initializers.IDENTITY_BLOCKS,
                        forget_bias=0.0, initial_state='noise')
  def train_batch(rng):
    index = rng.choice(len(train_y), 64, replace=False)
    return (train_x[index],), train_y[index]
  return Task('digits', br.SequenceClassifier(10, layer), train_batch,
              [((held_x,), held_y)], _classification_loss, _correct, 'accuracy', steps,
              optax.chain(optax.clip_by_global_norm(1.0),
                          optax.rmsprop(1e-3, decay=0.9, momentum=0.9)),
              {'units': 100, 'batch': 64, 'steps': steps, 'optimizer': 'rmsprop 1e-3, '
               'momentum 0.9, clip 1', 'scored': f'{len(held_y)} held-out digits'})


def _lm_loss(logits, labels, args):
  mask = args[1]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _segment_bits(logits, labels, args):
  """`[segments, 2]`: each segment's total bits and predictions (all-padding rows out)."""
  mask = np.asarray(args[1], np.float64)
  nll = np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
  bits = (nll * mask).sum(-1) / math.log(2)
  keep = mask.sum(-1) > 0
  return np.stack([bits[keep], mask.sum(-1)[keep]], -1)


def ptb_char_task(steps: int = 600, valid_chars: int = 50_000) -> Task:
  root = paths.data_root()
  if root is None:
    raise SystemExit('ptb_char reads $BN_RNN_JAX_DATA/ptb; set BN_RNN_JAX_DATA.')
  vocab, ids = text.load_ptb(os.path.join(root, 'ptb'), 'char')
  length, batch = 100, 32
  stream = ids['train']
  def train_batch(rng):
    starts = rng.integers(0, stream.size - length - 1, batch)
    b = text.gather_segments(stream, starts, length)
    return (b['inputs'], b['mask']), b['targets']
  evals = [((b['inputs'], b['mask']), b['targets'])
           for b in text.padded_segments(ids['valid'][:valid_chars + 1], length, 250)]
  layer = br.make_layer('bn_lstm', 128, max_length=length)
  return Task('ptb_char', br.LanguageModel(len(vocab), layer), train_batch, evals, _lm_loss,
              _segment_bits, 'bpc', steps,
              optax.chain(optax.clip_by_global_norm(1.0), optax.adam(2e-3)),
              {'units': 128, 'batch': batch, 'length': length, 'steps': steps,
               'optimizer': 'adam 2e-3, clip 1',
               'scored': f'the first {valid_chars:,} validation characters'})


def variable_length_task(steps: int = 150, examples: int = 2000) -> Task:
  width = toy.TRAIN_LENGTHS[1]
  def train_batch(rng):
    x, mask, labels = toy.batch(rng, toy.BATCH, toy.TRAIN_LENGTHS, width)
    return (x, mask), labels
  x, mask, labels = toy.batch(np.random.default_rng(12345), examples, toy.TRAIN_LENGTHS,
                              width)
  return Task('variable_length', toy.classifier('bn_lstm', toy.HIDDEN, width), train_batch,
              [((x, mask), labels)], _classification_loss, _correct, 'accuracy', steps,
              optax.chain(optax.clip_by_global_norm(1.0), optax.adam(toy.LEARNING_RATE)),
              {'units': toy.HIDDEN, 'batch': toy.BATCH, 'steps': steps,
               'lengths': list(toy.TRAIN_LENGTHS), 'optimizer': 'adam 3e-3, clip 1',
               'scored': f'{examples} fresh sequences of lengths 5-50'})


BUILDERS = {'digits': digits_task, 'ptb_char': ptb_char_task,
            'variable_length': variable_length_task}


# ---------------------------------------------------------------------------- rules
def debiased_update(stats, record, momentum: float):
  """`normalization.update_running_stats` with the rate of each row at least its share
  of every count it has seen, `n / (count + n)`: a cumulative average until the usual
  rate `(1 - momentum) n / n_full` is the larger."""
  weights = normalization.record_weights(record)
  full = jnp.maximum(jnp.max(weights), 1e-12)
  total = stats['count'] + weights
  rate = jnp.maximum((1.0 - momentum) * weights / full,
                     weights / jnp.maximum(total, 1e-12))[:, None]
  seen = weights[:, None] > 0
  blend = lambda old, new: jnp.where(seen, old + rate * (new - old), old)
  return {'mean': blend(stats['mean'], record['mean']),
          'var': blend(stats['var'], record['var']), 'count': total}


def update(stats, record, momentum: float, debiased: bool):
  """One site's statistics after one minibatch `record` under a rule of `RULES`."""
  if debiased:
    return debiased_update(stats, record, momentum)
  return normalization.update_running_stats(stats, record, momentum)


def _over_sites(fn, *trees):
  return jax.tree.map(fn, *trees, is_leaf=batch_stats.is_site)


# ---------------------------------------------------------------------------- training
@dataclasses.dataclass(frozen=True)
class Programs:
  """A task's compiled functions (compiled once, shared by its seeds)."""
  train_step: Callable
  moments: Callable
  logits: Callable
  own_logits: Callable


_PROGRAMS: dict[str, Programs] = {}


def programs(task: Task) -> Programs:
  """`train_step(params, stats, replayed, opt_state, args, labels, key) -> (params, stats,
  replayed, opt_state, minibatch record)`, `moments(params, stats, args, key)` (a training
  pass's minibatch record, no update), `logits(params, stats, args)` with population
  statistics and `own_logits(params, stats, args)` with the batch's own."""
  if task.name in _PROGRAMS:
    return _PROGRAMS[task.name]
  model = task.model

  def train_pass(params, stats, args, key, mutable):
    return model.apply({'params': params, 'batch_stats': stats}, *args,
                       use_running_average=False, deterministic=False, mutable=mutable,
                       rngs={'noise': key})

  def train_step(params, stats, replayed, opt_state, args, labels, key):
    def loss_fn(p):
      logits, mutated = train_pass(p, stats, args, key, ['batch_stats', population.MOMENTS])
      return task.loss(logits, labels, args), mutated
    (_, mutated), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    record = mutated[population.MOMENTS]
    replayed = {name: _over_sites(lambda s, r, m=m, d=d: update(s, r, m, d), replayed[name],
                                  record) for name, (m, d) in RULES.items()}
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), mutated['batch_stats'], replayed,
            opt_state, record)

  def moments(params, stats, args, key):
    return train_pass(params, stats, args, key, [population.MOMENTS])[1][population.MOMENTS]

  def logits(params, stats, args):
    return model.apply({'params': params, 'batch_stats': stats}, *args,
                       use_running_average=True, deterministic=True)

  def own_logits(params, stats, args):
    return model.apply({'params': params, 'batch_stats': stats}, *args,
                       use_running_average=False, deterministic=True,
                       mutable=['batch_stats'])[0]

  made = Programs(*(jax.jit(f) for f in (train_step, moments, logits, own_logits)))
  _PROGRAMS[task.name] = made
  return made


def train(task: Task, seed: int, window: int):
  """Trained `(params, batch_stats, {rule: replayed statistics}, [the last `window`
  minibatch records], rng)`; `rng` continues the training draws."""
  rng = np.random.default_rng(seed)
  args, _ = task.train_batch(rng)
  variables = task.model.init(jax.random.key(seed), *args, use_running_average=True,
                              deterministic=True)
  params, stats = variables['params'], variables['batch_stats']
  opt_state = task.optimizer.init(params)
  replayed = {name: stats for name in RULES}
  train_step = programs(task).train_step
  last = collections.deque(maxlen=window)
  for i in range(task.steps):
    args, labels = task.train_batch(rng)
    params, stats, replayed, opt_state, record = train_step(
        params, stats, replayed, opt_state, args, labels,
        jax.random.fold_in(jax.random.key(seed), i))
    last.append(record)
  for got, want in zip(jax.tree.leaves(replayed['running']), jax.tree.leaves(stats)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  return params, stats, replayed, list(last), rng


def refreshed(task: Task, params, fresh, batches, momentum: float, debiased: bool):
  """Statistics reset to `fresh`, then `batches` of training data through the training
  pass with `params` under a rule of `RULES` (no parameter update)."""
  stats = fresh
  for i, args in enumerate(batches):
    record = programs(task).moments(params, fresh, args, jax.random.key(10_000 + i))
    stats = _over_sites(lambda s, r: update(s, r, momentum, debiased), stats, record)
  return stats


def statistics(task: Task, params, stats, replayed, last, rng, window: int) -> dict:
  """`{candidate: batch_stats}` (the module docstring), `batch` excepted."""
  batches = [task.train_batch(rng)[0] for _ in range(window)]
  fresh = _over_sites(lambda s: normalization.init_population_stats(*s['mean'].shape), stats)
  out = {name: replayed[name] for name in RULES}
  out[f'last {window} steps'] = population.average_minibatch_moments(last)
  out['refresh'] = refreshed(task, params, fresh, batches, 0.99, False)
  out['refresh, debiased'] = refreshed(task, params, fresh, batches, 0.99, True)
  for variance in population.VARIANCES:
    out[f'estimate, {variance}'] = br.estimate_population_stats(
        task.model, {'params': params, 'batch_stats': stats}, batches, variance=variance)
  return out


# ---------------------------------------------------------------------------- scoring
def score(task: Task, params, stats, own_statistics: bool = False) -> np.ndarray:
  """Per-example scores of every evaluation batch (`task.score`) with population
  statistics `stats`, or with each batch's own statistics (`own_statistics`)."""
  made = programs(task)
  logits = made.own_logits if own_statistics else made.logits
  return np.concatenate([task.score(logits(params, stats, args), labels, args)
                         for args, labels in task.eval_batches])


def metric(task: Task, scores: np.ndarray) -> tuple[float, float]:
  """`(value, standard error)`: accuracy and its binomial standard error, or bits per
  character and the standard error of the mean over segments (a ratio estimate)."""
  if task.metric == 'accuracy':
    value = float(scores.mean())
    return value, math.sqrt(value * (1.0 - value) / len(scores))
  bits, count = scores[:, 0], scores[:, 1]
  value = float(bits.sum() / count.sum())
  per = bits / count
  return value, float(per.std(ddof=1) / math.sqrt(len(per)))


def run_task(name: str, seeds: int, window: int) -> dict:
  task = BUILDERS[name]()
  out = {'metric': task.metric, 'setup': {**task.setup, 'window': window}, 'seeds': {}}
  for seed in range(seeds):
    start = time.time()
    params, stats, replayed, last, rng = train(task, seed, window)
    made = statistics(task, params, stats, replayed, last, rng, window)
    scores = {kind: metric(task, score(task, params, s)) for kind, s in made.items()}
    scores[REFERENCE] = metric(task, score(task, params, stats, own_statistics=True))
    out['seeds'][str(seed)] = {
        'scores': {k: {'value': v, 'se': se} for k, (v, se) in scores.items()},
        'seconds': round(time.time() - start, 1)}
    print(f'{name} seed {seed}: ' + ', '.join(f'{k} {v:.4f}' for k, (v, _) in scores.items()),
          flush=True)
  return out


# ---------------------------------------------------------------------------- report
def candidates(saved: dict) -> list[str]:
  """The statistics of a saved run: the replayed rules in `RULES`' order, then the rest in
  the order they were scored."""
  first = next(iter(saved['tasks'].values()))
  scored = list(next(iter(first['seeds'].values()))['scores'])
  return [k for k in RULES if k in scored] + [k for k in scored if k not in RULES]


def _lower_is_better(task: dict) -> bool:
  return task['metric'] == 'bpc'


def against_batch(saved: dict, kind: str) -> tuple[int, int, int]:
  """`(within, worse, scored)`: of every task and seed, how many score `kind` within one
  standard error of batch statistics, and how many worse than them by more than one."""
  within = worse = scored = 0
  for task in saved['tasks'].values():
    sign = -1.0 if _lower_is_better(task) else 1.0
    for by_seed in task['seeds'].values():
      got, ref = by_seed['scores'][kind], by_seed['scores'][REFERENCE]
      gap = sign * (got['value'] - ref['value'])    # > 0: better than batch statistics
      within += abs(gap) <= ref['se']
      worse += gap < -ref['se']
      scored += 1
  return within, worse, scored


def format_table(saved: dict) -> str:
  """One row per way of making the statistics, a column per task (each seed's score, `/`
  between seeds), and in how many tasks and seeds it lies within one standard error of
  batch statistics, and below them by more than one."""
  names = list(saved['tasks'])
  header = ['statistics'] + [
      f"{name} ({saved['tasks'][name]['metric']})" for name in names] + [
      'within one SE of batch', 'worse than batch by more than one SE']
  rows = []
  for kind in candidates(saved):
    cells = [kind]
    for name in names:
      values = [s['scores'][kind]['value'] for s in saved['tasks'][name]['seeds'].values()]
      cells.append(' / '.join(f'{v:.3f}' for v in values))
    if kind == REFERENCE:
      cells += ['–', '–']
    else:
      within, worse, scored = against_batch(saved, kind)
      cells += [f'{within} of {scored}', f'{worse} of {scored}']
    rows.append(cells)
  errors = []
  for name in names:
    ses = [s['scores'][REFERENCE]['se'] for s in saved['tasks'][name]['seeds'].values()]
    errors.append(f'{name} ' + ' / '.join(f'{e:.3f}' for e in ses))
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows]
  seeds = len(next(iter(saved['tasks'].values()))['seeds'])
  lines += ['', f'Seeds 0 to {seeds - 1}, separated by `/`; the last two columns count '
            'tasks and seeds. Standard error of batch statistics\' score (binomial for an '
            'accuracy; over the evaluation segments for bits per character, where lower '
            'is better), per seed: ' + '; '.join(errors) + '.']
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tasks', default=','.join(TASKS))
  parser.add_argument('--seeds', type=int, default=2)
  parser.add_argument('--window', type=int, default=20,
                      help='Training steps of `last K steps`, batches of the refreshes '
                           'and of the estimate.')
  parser.add_argument('--out', default=os.path.join(os.path.dirname(os.path.abspath(
      __file__)), 'results', 'evaluation_statistics.json'))
  parser.add_argument('--report', help='Print the table of this results JSON and exit.')
  args = parser.parse_args()
  if args.report:
    with open(args.report) as f:
      print(format_table(json.load(f)))
    return
  start = time.time()
  tasks = {name: run_task(name, args.seeds, args.window) for name in args.tasks.split(',')}
  command = ' '.join(['python benchmarks/evaluation_statistics.py', *sys.argv[1:]])
  saved = {'kind': 'evaluation_statistics', 'command': command,
           'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
           'tasks': tasks}
  print(format_table(saved))
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(saved, f, indent=1)
    f.write('\n')
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
