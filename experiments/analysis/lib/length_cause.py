"""Why the BN-LSTM trained on lengths 5-50 trails the LSTM past T_max, one question at a
time (`Question`; a spec per question in experiments/question_specs/, each a JSON of
kind `variable_length_cause` named after it): each arm trained for several training
lengths; every batch-normalised arm scored with the steady tail (the estimate from
training batches, the library's default) and with statistics estimated at the test
lengths (a copy with T_max = 200 from unlabelled batches of lengths 5-200: the moments
its trained weights produce there), the BN-LSTM also with one site's rows at a time from
the latter. If the statistics past T_max were the cause, the second would close the gap,
and the third names the site that carries it."""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import pkgutil
import time
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import normalization
from experiments.analysis.lib import length_studies as studies
from experiments.analysis.lib import outputs
from experiments import question_specs
from experiments.analysis.lib import sign_task as task

class Arm(NamedTuple):
  """One model of a question: `variant` with layer `fields`, trained with Adam at
  `learning_rate`; `by_site`: also scored with one site's rows at a time."""
  variant: str
  fields: dict = {}
  by_site: bool = False
  learning_rate: float = task.LEARNING_RATE


#: Batch statistics on W_h h only: the cell layer-normalised, the input term unnormalised.
RECURRENT_ONLY = {'input_norm': None, 'cell_norm': 'layer'}


@dataclasses.dataclass(frozen=True)
class Question:
  """A question of the `variable_length_cause` study: its arms (`'lstm'`, the LSTM every
  arm is paired with, among them), what they are, and its figure, if any
  (`function(result, png path)`)."""
  what: str
  arms: Mapping[str, Arm]
  figure: Optional[Callable[[dict, str], None]] = None


#: T_max of the copy whose statistics are estimated at the test lengths, and its lengths.
LONG_MAX = task.TEST_LENGTHS[-1][1]
LONG_LENGTHS = (task.TRAIN_LENGTHS[0], LONG_MAX)
SITES = ('cell', 'input', 'recurrent')
#: A row every training batch supports well (T_max = 50), against which growth is measured.
REFERENCE_ROW = 39
STATISTICS = ('steady tail', 'test lengths') + tuple(f'test lengths, {s} only' for s in SITES)


def _median_var_by_row(stats) -> dict[str, list[float]]:
  """`{site: [median over units of the variance, per row]}` of a layer's statistics."""
  layer = stats['rnn']['layer_0']
  return {site: np.round(np.median(np.asarray(layer[site]['var']), axis=1), 6).tolist()
          for site in sorted(layer)}


def _largest_growth_by_row(stats) -> dict[str, list[float]]:
  """`{site: [max over units of var_t / var_REFERENCE_ROW, per row]}`: how far the
  fastest-growing unit's variance moves from a well-supported row's (a median over units
  hides the few units that integrate); none for a site of one row shared by every step."""
  out = {}
  for site, values in sorted(stats['rnn']['layer_0'].items()):
    var = np.asarray(values['var'])
    if var.shape[0] > REFERENCE_ROW:
      ratio = var / np.maximum(var[REFERENCE_ROW], np.finfo(np.float32).tiny)
      out[site] = np.round(np.max(ratio, axis=1), 4).tolist()
  return out


def steady_tail_rows(site: dict, min_support: float, rows: int) -> dict:
  """A site's statistics as the default lookup reads them, `rows` rows long: the steady
  tail applied, the last row repeated past its end, every row counted as the
  best-supported one (so that no lookup replaces any of them again)."""
  tail = jax.tree.map(np.asarray, normalization.steady_tail(site, min_support))
  pad = rows - tail['mean'].shape[0]
  return {'mean': np.concatenate([tail['mean'], np.repeat(tail['mean'][-1:], pad, 0)]),
          'var': np.concatenate([tail['var'], np.repeat(tail['var'][-1:], pad, 0)]),
          'count': np.full((rows,), np.max(site['count']), np.float32)}


def site_hybrids(stats, long_stats, min_support: float) -> dict[str, dict]:
  """`{statistics name: batch_stats of the T_max = LONG_MAX copy}`: the steady tail with
  one site's rows from `long_stats`, for each site."""
  layer, long_layer = stats['rnn']['layer_0'], long_stats['rnn']['layer_0']
  tails = {s: steady_tail_rows(layer[s], min_support, LONG_MAX) for s in layer}
  return {f'test lengths, {site} only':
          {'rnn': {'layer_0': {**tails, site: long_layer[site]}}} for site in SITES}


def score_cause_arm(job: tuple[Arm, int, int, int]) -> dict:
  """One trained model, `job = (arm, steps, seed, estimate_batches)`:
  `{'accuracy': {statistics: {length range: accuracy}}}` (statistics `'none'` for an arm
  that keeps none), with `'var_by_row'` and the test-length variances and growth for a
  batch-normalised arm."""
  (variant, fields, by_site, learning_rate), steps, seed, estimate_batches = job
  model, variables, rng = task.train_arm(variant, fields, seed, steps, task.HIDDEN,
                                         task.BATCH, optimizer=optax.adam(learning_rate))
  models = {'none': (model, variables)}
  out = {}
  if variables.get('batch_stats'):
    train = [task.batch(rng, task.BATCH, task.TRAIN_LENGTHS, task.TRAIN_LENGTHS[1])[:2]
             for _ in range(estimate_batches)]
    stats = br.estimate_population_stats(model, variables, train)
    long_model = task.classifier(variant, task.HIDDEN, LONG_MAX, fields)
    long_vars = long_model.init(
        jax.random.key(0), np.zeros((2, LONG_MAX, 1), np.float32),
        np.ones((2, LONG_MAX), np.float32), use_running_average=True, deterministic=True)
    long_vars = {'params': variables['params'], 'batch_stats': long_vars['batch_stats']}
    unlabelled = [task.batch(rng, task.BATCH, LONG_LENGTHS, LONG_MAX)[:2]
                  for _ in range(estimate_batches)]
    long_stats = br.estimate_population_stats(long_model, long_vars, unlabelled)
    models = {'steady tail': (model, {**variables, 'batch_stats': stats}),
              'test lengths': (long_model, {**long_vars, 'batch_stats': long_stats})}
    if by_site:
      for name, hybrid in site_hybrids(stats, long_stats,
                                       normalization.DEFAULT_MIN_ROW_SUPPORT).items():
        models[name] = (long_model, {**long_vars, 'batch_stats': hybrid})
    out = {'var_by_row': _median_var_by_row(stats),
           'var_by_row_test_lengths': _median_var_by_row(long_stats),
           'growth_by_row_test_lengths': _largest_growth_by_row(long_stats)}
  return {'accuracy': {name: task.by_range(m, v, seed) for name, (m, v) in models.items()},
          **out}


def questions() -> list[str]:
  """The questions: the modules of experiments/question_specs/."""
  return sorted(info.name for info in pkgutil.iter_modules(question_specs.__path__)
                if not info.name.startswith('_'))


def get(name: str) -> Question:
  """The question of `experiments/question_specs/<name>.py`."""
  if name not in questions():
    raise ValueError(f'Unknown question {name!r}; the questions are '
                     f'{", ".join(questions())}.')
  return importlib.import_module(f'experiments.question_specs.{name}').get_question()


def answer(question: str = 'variable_length_cause',
           steps: Sequence[int] = (1000, 3000, 10000, 30000), seeds: int = 5,
           estimate_batches: int = 50, workers: int = 1,
           output_dir: str = outputs.RESULTS) -> dict:
  """`<question>.json` (and its figure, `<question>.png`, where the question has one):
  every arm of the question trained for each training length and seed, and scored.

  Args:
    question: the question (a module of experiments/question_specs/): its arms and JSON.
    steps: the training lengths.
    seeds: seeds per arm and training length.
    estimate_batches: batches of 64 per estimate.
    workers: processes training in parallel.
    output_dir: where the JSON and the figure go.
  """
  spec = get(question)
  if spec.figure:
    outputs.pyplot()
  result = outputs.save(output_dir, question, 'variable_length_cause',
                        run(question, spec, steps, seeds, estimate_batches, workers),
                        exact=True)
  if spec.figure:
    spec.figure(result, os.path.join(output_dir, f'{question}.png'))
  return result


def run(name: str, question: Question, steps: Sequence[int], seeds: int,
        estimate_batches: int, workers: int = 1) -> dict:
  """Every arm of `question` (named `name`) trained for each of `steps` with each of
  `seeds` seeds, on `workers` processes, and scored (`score_cause_arm`)."""
  default_rate = {arm.learning_rate for arm in question.arms.values()} == {
      task.LEARNING_RATE}
  # The longest first, so that the pool's last jobs are short ones.
  names = [(arm, n, seed) for n in sorted(steps, reverse=True) for arm in question.arms
           for seed in range(seeds)]
  jobs = [(question.arms[arm], n, seed, estimate_batches) for arm, n, seed in names]
  start = time.time()
  if workers > 1:
    with multiprocessing.get_context('spawn').Pool(workers) as pool:
      scored = pool.map(score_cause_arm, jobs, chunksize=1)
  else:
    scored = [score_cause_arm(job) for job in jobs]
  runs: dict = {str(n): {} for n in steps}
  for (arm, n, seed), result in zip(names, scored):
    runs[str(n)].setdefault(arm, {})[str(seed)] = result
  return studies.result_of(
      question.what + ' trained on lengths 5-50 for several training lengths; each '
      'batch-normalised arm scored with the steady-tail statistics and with statistics '
      'estimated at the test lengths',
      studies.setup(steps=list(steps), seeds=seeds, hidden=task.HIDDEN, batch=task.BATCH,
             estimate_batches=estimate_batches,
             optimizer=('adam 3e-3, clip 1' if default_rate else
                        "adam at each arm's learning rate, clip 1"),
             long_lengths=list(LONG_LENGTHS)),
      'python -m experiments.analysis.variable_length_cause --workers=2 '
      f"--steps={','.join(str(n) for n in steps)}"
      + ('' if name == 'variable_length_cause' else f' --question={name}'),
      start, runs=runs, summary=summary(runs))


def summary(runs: dict) -> dict:
  """`{steps: {'accuracy': {arm: {length range: {mean, min, max, sd}}}, 'against_lstm':
  {arm: {length range: {mean, se, wins, seeds}}}}}`: each arm over its seeds, an arm
  scored with several statistics as one arm per statistics (`'<arm>, <statistics>'`),
  each minus the LSTM of the same seed and training length."""
  out = {}
  for steps, at_steps in runs.items():
    arms = {}
    for arm, by_seed in at_steps.items():
      for statistics in next(iter(by_seed.values()))['accuracy']:
        name = arm if statistics == 'none' else f'{arm}, {statistics}'
        arms[name] = {s: r['accuracy'][statistics] for s, r in by_seed.items()}
    out[steps] = {
        'accuracy': task.summary(arms),
        'against_lstm': {arm: task.paired_difference(by_seed, arms['lstm'])
                         for arm, by_seed in arms.items() if arm != 'lstm'}}
  return out


def table(result: dict) -> str:
  """Mean ± sd accuracy per training length, arm and length range, and the paired
  difference from the LSTM on each range."""
  ranges = task.ranges(result)
  lines = ['| training steps | arm | ' + ' | '.join(f'lengths {r}' for r in ranges) + ' | '
           + ' | '.join(f'minus the LSTM, {r}' for r in ranges) + ' |',
           '|---|---|' + '---|' * (2 * len(ranges))]
  for steps, at_steps in result['summary'].items():
    for arm, by_range in at_steps['accuracy'].items():
      paired = at_steps['against_lstm'].get(arm)
      cells = [task.mean_sd(by_range[r]) for r in ranges] + (
          [f"{paired[r]['mean']:+.3f} ± {paired[r]['se']:.3f} "
           f"({paired[r]['wins']} of {paired[r]['seeds']})" for r in ranges]
          if paired else ['–'] * len(ranges))
      lines.append(f'| {int(steps):,} | {arm} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  lines.append(f"Mean ± standard deviation over {result['setup']['seeds']} seeds, each on "
               f"{result['setup']['test_examples']} sequences per range; \"minus the "
               'LSTM\": the paired difference from the LSTM of the same seed and training '
               'length (mean ± standard error; seeds at or above it).')
  return '\n'.join(lines)


def by_steps_figure(result: dict, path: str) -> None:
  """Left: accuracy on the longest range by training length, per arm and statistics (the
  single-site ones are in the table). Right: the largest growth over the BN-LSTM's cell
  units of the variance from row 40 (test-length estimate, mean over seeds) per training
  length."""
  plt = outputs.pyplot()
  longest = task.ranges(result)[-1]
  steps = list(result['summary'])
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for arm in result['summary'][steps[0]]['accuracy']:
    if not arm.endswith(' only'):
      found = [result['summary'][s]['accuracy'][arm][longest] for s in steps]
      left.errorbar([int(s) for s in steps], [f['mean'] for f in found],
                    yerr=[f['sd'] for f in found], marker='o', capsize=3, label=arm)
  left.set(xscale='log', xlabel='training steps', ylabel=f'accuracy, lengths {longest}',
           title='past T_max = 50')
  left.legend()
  for s in steps:
    growth = np.mean([r['growth_by_row_test_lengths']['cell']
                      for r in result['runs'][s]['bn_lstm'].values()], axis=0)
    right.plot(np.arange(1, len(growth) + 1), growth, label=f'{int(s):,} steps')
  right.axvline(result['setup']['train_lengths'][1], color='grey', lw=0.5)
  right.set(xlabel='step (row)', ylim=(0, None),
            ylabel=f'max over units of var_t / var_{REFERENCE_ROW + 1}',
            title='BN-LSTM cell, test-length estimate (mean over seeds)')
  right.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def by_rate_figure(models: Sequence[str], rates: Mapping[str, float],
                   arm_name: Callable[[str, str], str]):
  """The figure of a question of `models` each at Adam's `rates` (`{name: rate}`; the arm
  of a model at a rate is `arm_name(model, rate name)`): accuracy on the longest range
  against the learning rate, per model (batch-normalised ones with the steady tail),
  one panel per training length."""
  def draw(result: dict, path: str) -> None:
    plt = outputs.pyplot()
    longest = task.ranges(result)[-1]
    steps = list(result['summary'])
    fig, panels = plt.subplots(1, len(steps), figsize=(4 * len(steps), 3.6), sharey=True,
                               squeeze=False)
    for panel, at_steps in zip(panels[0], steps):
      accuracy = result['summary'][at_steps]['accuracy']
      for model in models:
        names = [arm_name(model, rate) for rate in rates]
        found = [accuracy[n if n in accuracy else f'{n}, steady tail'][longest]
                 for n in names]
        panel.errorbar(list(rates.values()), [f['mean'] for f in found],
                       yerr=[f['sd'] for f in found], marker='o', capsize=3, label=model)
      panel.set(xscale='log', xlabel="Adam's learning rate",
                title=f'{int(at_steps):,} training steps')
    panels[0][0].set(ylabel=f'accuracy, lengths {longest}')
    fig.legend(*panels[0][0].get_legend_handles_labels(), loc='lower center',
               ncol=len(models), fontsize='small')
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
  return draw


RENDERERS = {'variable_length_cause': studies.with_machine(table)}
