"""The estimate's variances averaged (the papers') or pooled (the law of total variance),
where minibatch rows are thin and where they are not.

Per row r, over the estimate's minibatches i (n_ir sequences at r),

  averaged  var_r = sum_i n_ir var_ir / sum_i n_ir
  pooled    var_r = sum_i n_ir (var_ir + (mean_ir - mean_r)^2) / sum_i n_ir

(`population.average_minibatch_moments`' `variance`). A row one sequence reached in every
minibatch has averaged variance 0; pooled, it keeps the spread between the minibatches.
Two more ways of making the estimate from the same batches: the rows resting on one
sequence left out of each minibatch's record (what `min_step_count=2` does), and the
batches joined into one (every row then rests on the sequences of all of them).

On the variable-length task (`sign_task`), a BN-LSTM `SequenceClassifier` of 32 units
with the library's defaults, trained `steps` steps per seed with Adam 3e-3 (clipped at 1)
on batches of 64 sequences of lengths 5-50, then:

  thin batches    estimated from `estimate_batches` batches of 4 sequences of
                  lengths 6, 2, 2 and 2 (rows 2-5 rest on one sequence per batch, a
                  quarter of the best row's count: read as recorded by the default
                  `min_row_support`) in each of the four ways, against a full-length
                  estimate (as many batches of 64 sequences of length 6): per step, the
                  distance of the layer's outputs from the full-length estimate's,
                  relative to their size, on 1,000 sequences of length 6, and the
                  accuracy there;
  training lengths
                  estimated from `estimate_batches` training batches (averaged,
                  pooled, single-sequence rows left out) and scored on 1,000 fresh
                  sequences per length range (5-50, 51-100, 101-200), with the default
                  steady tail (`min_row_support` 0.05) and with the papers' rule (0): the
                  setting of `variable_length.json`.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import bn_rnn_jax as br
from bn_rnn_jax import batch_stats
from bn_rnn_jax import population
from experiments.analysis.lib import length_studies
from experiments.analysis.lib import outputs
from experiments.analysis.lib import sign_task as task

THIN_LENGTHS = (6, 2, 2, 2)
SUPPORTS = {'steady tail 0.05': 0.05, "papers' rule": 0.0}


def fixed_batch(rng: np.random.Generator, lengths, width: int):
  """`(x [len(lengths), width, 1], mask)` of the task with the given lengths."""
  lengths = np.asarray(lengths)
  mask = (np.arange(width)[None] < lengths[:, None]).astype(np.float32)
  x = rng.normal(size=(len(lengths), width, 1)).astype(np.float32) * mask[..., None]
  return x, mask


def layer_outputs(variables, stats, x, mask) -> np.ndarray:
  """The classifier's recurrent layer's outputs `[batch, time, 32]` with `stats`."""
  layer = br.make_layer('bn_lstm', task.HIDDEN, max_length=task.TRAIN_LENGTHS[1])
  part = lambda tree: tree['rnn']['layer_0']
  return np.asarray(layer.apply({'params': part(variables['params']),
                                 'batch_stats': part(stats)}, x, mask,
                                use_running_average=True, deterministic=True))


def single_rows_left_out(record):
  """A `minibatch_moments` record whose rows resting on one sequence (variance 0 by
  construction) carry no weight, as thin rows do."""
  def site(node):
    count = np.asarray(node['count'])
    return {**node, 'count': np.where(count == 1, -1.0, count)}
  return jax.tree.map(site, record, is_leaf=batch_stats.is_site)


def estimates(model, variables, batches, joined: bool) -> dict:
  """`{kind: batch_stats}` of `batches`: averaged, pooled, averaged with the rows resting on
  one sequence left out, and (`joined`) averaged over the batches joined into one."""
  records = [population.minibatch_moments(model, variables, b) for b in batches]
  out = {
      'averaged': population.average_minibatch_moments(records, 'averaged'),
      'pooled': population.average_minibatch_moments(records, 'pooled'),
      'single-sequence rows left out': population.average_minibatch_moments(
          [single_rows_left_out(r) for r in records], 'averaged'),
  }
  if joined:
    out['batches joined'] = br.estimate_population_stats(
        model, variables, [tuple(np.concatenate(parts) for parts in zip(*batches))],
        variance='averaged')
  return out


def thin_batches(model, variables, seed: int, batches: int) -> dict:
  """`{kind: {'relative_distance': [per step], 'accuracy'}}` of the thin-batch estimates
  and the full-length one (the module docstring)."""
  rng = np.random.default_rng(2000 + seed)
  width = task.TRAIN_LENGTHS[1]
  steps = THIN_LENGTHS[0]
  thin = [fixed_batch(rng, THIN_LENGTHS, width) for _ in range(batches)]
  full = [fixed_batch(rng, (steps,) * task.BATCH, width) for _ in range(batches)]
  made = {f'thin, {kind}': stats for kind, stats in estimates(model, variables, thin, True).items()}
  made['full length'] = br.estimate_population_stats(model, variables, full,
                                                     variance='averaged')
  x, mask = fixed_batch(np.random.default_rng(3000 + seed), (steps,) * task.TEST_EXAMPLES,
                        width)
  labels = (x.sum(axis=(1, 2)) > 0).astype(np.int32)
  want = layer_outputs(variables, made['full length'], x, mask)[:, :steps]
  out = {}
  for kind, stats in made.items():
    got = layer_outputs(variables, stats, x, mask)[:, :steps]
    distance = np.linalg.norm(got - want, axis=(0, 2)) / np.linalg.norm(want, axis=(0, 2))
    logits = model.apply({**variables, 'batch_stats': stats}, x, mask,
                         use_running_average=True, deterministic=True)
    out[kind] = {'relative_distance': [float(d) for d in distance],
                 'accuracy': float(np.mean(np.argmax(np.asarray(logits), -1) == labels))}
  return out


def training_lengths(model, variables, rng, seed: int, batches: int) -> dict:
  """`{'<kind>, <support>': {length range: accuracy}}` (the module docstring)."""
  width = task.TRAIN_LENGTHS[1]
  data = [task.batch(rng, task.BATCH, task.TRAIN_LENGTHS, width)[:2] for _ in range(batches)]
  out = {}
  for kind, stats in estimates(model, variables, data, False).items():
    for support_name, support in SUPPORTS.items():
      scored = task.classifier('bn_lstm', task.HIDDEN, width, {'min_row_support': support})
      test_rng = np.random.default_rng(1000 + seed)   # the same test data for every arm
      out[f'{kind}, {support_name}'] = {
          f'{lo}-{hi}': task.accuracy(scored, {**variables, 'batch_stats': stats}, test_rng,
                                    (lo, hi)) for lo, hi in task.TEST_LENGTHS}
  return out


def pooled_variance(steps: int = 1000, seeds: int = 5, estimate_batches: int = 50,
                    output_dir: str = outputs.RESULTS) -> dict:
  """`pooled_variance.json`: the default BN-LSTM trained per seed, its estimate made in
  each of `estimates`' ways from thin batches (against a full-length estimate, per step)
  and from training batches (per test length range; the module docstring).

  Args:
    steps: training steps per seed.
    seeds: seeds.
    estimate_batches: batches of each estimate.
    output_dir: where the JSON goes.
  """
  start = time.time()
  thin, lengths = {}, {}
  for seed in range(seeds):
    model, variables, rng = task.train_arm('bn_lstm', {}, seed, steps, task.HIDDEN,
                                           task.BATCH)
    thin[str(seed)] = thin_batches(model, variables, seed, estimate_batches)
    lengths[str(seed)] = training_lengths(model, variables, rng, seed, estimate_batches)
  result = length_studies.result_of(
      'the estimate with averaged and pooled variances: from thin batches against a '
      'full-length estimate, and from training batches by test length range',
      length_studies.setup(steps=steps, seeds=seeds, hidden=task.HIDDEN, batch=task.BATCH,
                           estimate_batches=estimate_batches,
                           thin_lengths=list(THIN_LENGTHS), optimizer='adam 3e-3, clip 1'),
      'python -m experiments.analysis.pooled_variance', start, thin_batches=thin,
      training_lengths=lengths)
  return outputs.save(output_dir, 'pooled_variance', 'pooled_variance', result, exact=True)


def _mean_sd(values) -> str:
  values = np.asarray(values)
  sd = values.std(ddof=1) if values.size > 1 else 0.0
  return f'{values.mean():.3f} ± {sd:.3f}'


def table(result: dict) -> str:
  """Three tables: the thin-batch estimates' distance from the full-length one per step
  and their accuracy on length 6; accuracy per test length range of the estimates from
  training batches (mean ± standard deviation over seeds); and those estimates' paired
  differences from the averaged one."""
  seeds = list(result['thin_batches'])
  kinds = list(result['thin_batches'][seeds[0]])
  steps = len(result['thin_batches'][seeds[0]][kinds[0]]['relative_distance'])
  lines = ['| estimate | ' + ' | '.join(f'step {t}' for t in range(steps)) +
           ' | accuracy, length 6 |', '|---|' + '---|' * (steps + 1)]
  for kind in kinds:
    per_step = np.array([result['thin_batches'][s][kind]['relative_distance']
                         for s in seeds])
    cells = [_mean_sd(per_step[:, t]) for t in range(steps)]
    cells.append(_mean_sd([result['thin_batches'][s][kind]['accuracy'] for s in seeds]))
    lines.append(f'| {kind} | ' + ' | '.join(cells) + ' |')
  ranges = [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]
  lines += ['', '| estimate from training batches | ' +
            ' | '.join(f'lengths {r}' for r in ranges) + ' |',
            '|---|' + '---|' * len(ranges)]
  arms = list(result['training_lengths'][seeds[0]])
  for arm in arms:
    cells = [_mean_sd([result['training_lengths'][s][arm][r] for s in seeds])
             for r in ranges]
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  lines += ['', '| minus averaged, paired by seed | ' +
            ' | '.join(f'lengths {r}' for r in ranges) + ' |', '|---|' + '---|' * len(ranges)]
  for arm in arms:
    kind, support = arm.split(', ', 1)
    if kind == 'averaged':
      continue
    cells = []
    for r in ranges:
      d = np.array([result['training_lengths'][s][arm][r] -
                    result['training_lengths'][s][f'averaged, {support}'][r] for s in seeds])
      se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else 0.0
      cells.append(f'{d.mean():+.4f} ± {se:.4f} ({np.sum(d < 0)} lower)')
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  n = result['setup']['test_examples']
  lines += ['', f'Mean ± standard deviation over {len(seeds)} seeds; "minus averaged": the '
            'difference from the averaged estimate with the same steady tail or rule, mean '
            '± standard error over seeds, and the seeds where it is lower. Step t: the '
            "distance of the layer's outputs at step t from the full-length estimate's, "
            f"relative to their size, on {n} sequences of length 6. Each accuracy is on {n} "
            f'sequences (a binomial standard error of at most {0.5 / np.sqrt(n):.3f}).']
  return '\n'.join(lines)


RENDERERS = {'pooled_variance': length_studies.with_machine(table)}
