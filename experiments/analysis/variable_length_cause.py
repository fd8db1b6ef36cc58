r"""Why the BN-LSTM trained on lengths 5-50 trails the LSTM past T_max: how long it trains,
whether the statistics of the longer steps are what it lacks, and whether normalising with
batch statistics at all is.

The task and models are `variable_length`'s (the sign of a variable-length Gaussian sum,
32 units, Adam 3e-3, batches of 64 of lengths 5-50). For each of `--vc_steps` training
lengths and `--vc_seeds` seeds it trains every arm of `ARMS` and scores it on the same
1,000 test sequences per length range:

  lstm                      the baseline
  bn_lstm                   Cooijmans' BN-LSTM, the library's defaults
  bn_lstm, cell layer norm  the BN-LSTM with c_t layer-normalised (`cell_norm='layer'`):
                            batch statistics on W_h h and W_x x only
  ln_lstm                   layer norm on all three sites: no statistics at all

Every batch-normalised arm is scored with two statistics:

  steady tail     the library's default: the estimate from 50 training batches; the
                  rows past the last well-supported one read as the steady state
  test lengths    the estimate of a copy with T_max = 200 from 50 unlabelled batches of
                  lengths 5-200, so every step it is scored at has its own row, the
                  moments of the activations its trained weights produce there (what
                  batch statistics of the test sequences would give)

and the BN-LSTM also with

  test lengths, SITE only
                  the steady tail, but one site's rows (cell, input or recurrent) from the
                  test-length estimate

If the statistics past T_max were the cause of the gap, the second would close it, and
the third names the site that carries it. The JSON also keeps each batch-normalised
arm's population variance by row (median over units) of each site from both estimates,
and, from the test-length one, the largest growth over units of a row's variance from
row 40's.

  python -m experiments.analysis.variable_length_cause --vc_workers=2 \
      --vc_steps=1000,3000,10000,30000

Expected: about 50 minutes on 2 CPU cores with 2 workers (the machine and the time are
in the JSON). Writes `variable_length_cause.json` and `variable_length_cause.png`.

`--vc_arms` picks another set of arms (`ARM_SETS`), each beside the same LSTM, into a
JSON of its own:

  gamma    the LN-LSTM starts with γ = 1 and the batch-normalised arms with γ = 0.1
           (Cooijmans sec. 4); these swap them: the BN-LSTM with a layer-normalised
           cell at γ = 1, the LN-LSTM at γ = 0.1 (`variable_length_gamma.json`)
  shared   the papers' batch-normalised LSTMs whose statistics are not per step:
           `bn_lstm_shared` (one population row per site, Cooijmans' ablation) and
           `bn_input_only_seq` (the input term only, sequence-wise: Laurent eq. 20-21)
           (`variable_length_shared.json`)
  input    which site's batch norm costs past T_max: the BN-LSTM with batch statistics
           on W_h h only (the cell layer-normalised, the input term layer-normalised
           or unnormalised) and the LN-LSTM with its input term unnormalised
           (`variable_length_input.json`)
  rate     the LSTM, the BN-LSTM and the BN-LSTM with batch statistics on W_h h only,
           each at Adam's learning rates 1e-3, 3e-3, 1e-2 and 3e-2
           (`variable_length_rate.json`)
  rate_long
           the LSTM and the BN-LSTM with batch statistics on W_h h only at 1e-2, the
           best of `rate` past T_max, to train longer (`variable_length_rate_long.json`)

  python -m experiments.analysis.variable_length_cause --vc_workers=2 \
      --vc_steps=10000,30000 --vc_arms=gamma
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from typing import NamedTuple, Sequence

from absl import app
from absl import flags
import jax
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import extras
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from experiments import machine_facts
from experiments.analysis import variable_length

_OUTPUT = flags.DEFINE_string('vc_output_dir', variable_length.DEFAULT_OUTPUT,
                              'Where the JSON and the figure go.')
_STEPS = flags.DEFINE_list('vc_steps', ['1000', '3000', '10000', '30000'],
                          'Training lengths.')
_SEEDS = flags.DEFINE_integer('vc_seeds', 5, 'Seeds per model and training length.')
_ESTIMATE = flags.DEFINE_integer('vc_estimate_batches', 50,
                                 'Batches of 64 per estimate.')
_WORKERS = flags.DEFINE_integer('vc_workers', 1, 'Processes training in parallel.')

#: T_max of the copy whose statistics are estimated at the test lengths, and its lengths.
LONG_MAX = variable_length.TEST_LENGTHS[-1][1]
LONG_LENGTHS = (variable_length.TRAIN_LENGTHS[0], LONG_MAX)
SITES = ('cell', 'input', 'recurrent')
#: A row every training batch supports well (T_max = 50), against which growth is measured.
REFERENCE_ROW = 39
STATISTICS = ('steady tail', 'test lengths') + tuple(f'test lengths, {s} only' for s in SITES)


class Arm(NamedTuple):
  """One model of an arm set: `variant` with layer `fields`, trained with Adam at
  `learning_rate`; `by_site`: also scored with one site's rows at a time."""
  variant: str
  fields: dict = {}
  by_site: bool = False
  learning_rate: float = variable_length.LEARNING_RATE


#: `{arm: Arm}`: the LSTM, the BN-LSTM, its cell layer-normalised, and the LN-LSTM.
ARMS = {
    'lstm': Arm('lstm'),
    'bn_lstm': Arm('bn_lstm', by_site=True),
    'bn_lstm, cell layer norm': Arm('bn_lstm', {'cell_norm': 'layer'}),
    'ln_lstm': Arm('ln_lstm'),
}
#: The LN-LSTM's γ init is 1 and the BN-LSTM's 0.1: these arms swap them.
GAMMA_ARMS = {
    'lstm': ARMS['lstm'],
    'bn_lstm, cell layer norm, γ 1': Arm('bn_lstm', {'cell_norm': 'layer',
                                                     'scale_init': initializers.Constant(1.0)}),
    'ln_lstm, γ 0.1': Arm('ln_lstm', {'scale_init': initializers.Constant(0.1)}),
}
#: Batch-normalised LSTMs whose statistics are not kept per step, from the papers.
SHARED_ARMS = {
    'lstm': ARMS['lstm'],
    'bn_lstm_shared': Arm('bn_lstm_shared'),
    'bn_input_only_seq': Arm('bn_input_only_seq'),
}
#: Batch statistics on W_h h only: the cell layer-normalised, the input term unnormalised.
RECURRENT_ONLY = {'input_norm': None, 'cell_norm': 'layer'}
#: With one input feature, layer norm of W_x x keeps only the sign of x (the W_x x of
#: every step is x times one vector): these arms swap the input term's normalisation.
INPUT_ARMS = {
    'lstm': ARMS['lstm'],
    'ln_lstm, input unnormalised': Arm('ln_lstm', {'input_norm': None}),
    'bn_lstm, input and cell layer norm': Arm('bn_lstm', {'input_norm': 'layer',
                                                          'cell_norm': 'layer'}),
    'bn_lstm, input unnormalised, cell layer norm': Arm('bn_lstm', RECURRENT_ONLY),
}
#: Adam's learning rates, `variable_length.LEARNING_RATE` among them, by name.
RATES = {'1e-3': 1e-3, '3e-3': 3e-3, '1e-2': 1e-2, '3e-2': 3e-2}
#: The LSTM, the BN-LSTM and the BN-LSTM with batch statistics on W_h h only at each of
#: `RATES`; `'lstm'`, the LSTM every arm is paired with, is the one at 3e-3.
RATE_MODELS = {'lstm': Arm('lstm'), 'bn_lstm': Arm('bn_lstm'),
               'bn_lstm, input unnormalised, cell layer norm': Arm('bn_lstm',
                                                                   RECURRENT_ONLY)}


def rate_arm(model: str, rate: str) -> str:
  """The name of `RATE_MODELS[model]` at `RATES[rate]` in `RATE_ARMS`."""
  return 'lstm' if (model, rate) == ('lstm', '3e-3') else f'{model}, adam {rate}'


RATE_ARMS = {rate_arm(model, rate): arm._replace(learning_rate=RATES[rate])
             for model, arm in RATE_MODELS.items() for rate in RATES}
#: The best of `RATE_ARMS` past T_max, for training lengths longer than theirs.
RATE_LONG_ARMS = {name: RATE_ARMS[name] for name in (
    'lstm', rate_arm('bn_lstm, input unnormalised, cell layer norm', '1e-2'))}

#: `{--vc_arms: (arms, what they are, the JSON's name)}`.
ARM_SETS = {
    'cause': (ARMS, 'the LSTM, the BN-LSTM, the BN-LSTM with a layer-normalised cell and '
              'the LN-LSTM', 'variable_length_cause'),
    'gamma': (GAMMA_ARMS, 'the LSTM, the BN-LSTM with a layer-normalised cell and gamma '
              'init 1, and the LN-LSTM with gamma init 0.1', 'variable_length_gamma'),
    'shared': (SHARED_ARMS, "the LSTM, the BN-LSTM with statistics shared over time "
               "(Cooijmans' ablation) and the LSTM with sequence-wise batch norm on the "
               "input term (Laurent's)", 'variable_length_shared'),
    'input': (INPUT_ARMS, 'the LSTM, the LN-LSTM with the input term unnormalised, and the '
              'BN-LSTM with batch statistics on the recurrent term only: the cell '
              'layer-normalised, the input term layer-normalised or unnormalised',
              'variable_length_input'),
    'rate': (RATE_ARMS, "the LSTM, the BN-LSTM and the BN-LSTM with batch statistics on the "
             "recurrent term only, each at Adam's learning rates 1e-3, 3e-3, 1e-2 and 3e-2",
             'variable_length_rate'),
    'rate_long': (RATE_LONG_ARMS, 'the LSTM and the BN-LSTM with batch statistics on the '
                  "recurrent term only at Adam's learning rate 1e-2",
                  'variable_length_rate_long'),
}
_ARM_SET = flags.DEFINE_enum('vc_arms', 'cause', list(ARM_SETS),
                             'Which arms to train (ARM_SETS): the JSON is named after it.')


def _median_var_by_row(stats) -> dict[str, list[float]]:
  """`{site: [median over units of the variance, per row]}` of a layer's statistics."""
  layer = stats['rnn']['layer_0']
  return {site: np.round(np.median(np.asarray(layer[site]['var']), axis=1), 6).tolist()
          for site in sorted(layer)}


def _largest_growth_by_row(stats) -> dict[str, list[float]]:
  """`{site: [max over units of var_t / var_REFERENCE_ROW, per row]}`: how far the
  fastest-growing unit's variance moves from its value at a well-supported row (a median
  over units hides the few units that integrate)."""
  layer = stats['rnn']['layer_0']
  out = {}
  for site in sorted(layer):
    var = np.asarray(layer[site]['var'])
    if var.shape[0] <= REFERENCE_ROW:   # one row shared by every step
      continue
    ratio = var / np.maximum(var[REFERENCE_ROW], np.finfo(np.float32).tiny)
    out[site] = np.round(np.max(ratio, axis=1), 4).tolist()
  return out


def _steady_tail_rows(site: dict, min_support: float, rows: int) -> dict:
  """A site's statistics as the default lookup reads them, `rows` rows long: the steady
  tail applied, the last row repeated past its end, every row counted as the
  best-supported one (so that no lookup replaces any of them again)."""
  tail = jax.tree.map(np.asarray, normalization.steady_tail(site, min_support))
  pad = rows - tail['mean'].shape[0]
  return {'mean': np.concatenate([tail['mean'], np.repeat(tail['mean'][-1:], pad, 0)]),
          'var': np.concatenate([tail['var'], np.repeat(tail['var'][-1:], pad, 0)]),
          'count': np.full((rows,), np.max(site['count']), np.float32)}


def _hybrids(stats, long_stats, min_support: float) -> dict[str, dict]:
  """`{statistics name: batch_stats of the T_max = LONG_MAX copy}`: the steady tail with
  one site's rows from `long_stats`, for each site."""
  layer, long_layer = stats['rnn']['layer_0'], long_stats['rnn']['layer_0']
  tails = {s: _steady_tail_rows(layer[s], min_support, LONG_MAX) for s in layer}
  return {f'test lengths, {site} only':
          {'rnn': {'layer_0': {**tails, site: long_layer[site]}}} for site in SITES}


def score(job: tuple[Arm, int, int, int]) -> dict:
  """One trained model, `job = (arm, steps, seed, estimate_batches)`, an arm of one of
  `ARM_SETS`:
  `{'accuracy': {statistics: {length range: accuracy}}}` (statistics `'none'` for an arm
  that keeps none), with `'var_by_row'` and the test-length variances and growth for a
  batch-normalised arm."""
  (variant, fields, by_site, learning_rate), steps, seed, estimate_batches = job
  width = variable_length.TRAIN_LENGTHS[1]
  model, variables, rng = variable_length.train_arm(
      variant, fields, seed, steps, variable_length.HIDDEN, variable_length.BATCH,
      optimizer=optax.adam(learning_rate))
  models = {'none': (model, variables)}
  out = {}
  if variables.get('batch_stats'):
    train = [variable_length.batch(rng, variable_length.BATCH,
                                   variable_length.TRAIN_LENGTHS, width)[:2]
             for _ in range(estimate_batches)]
    stats = br.estimate_population_stats(model, variables, train)
    long_model = variable_length.classifier(variant, variable_length.HIDDEN, LONG_MAX,
                                            fields)
    long_vars = long_model.init(
        jax.random.key(0), np.zeros((2, LONG_MAX, 1), np.float32),
        np.ones((2, LONG_MAX), np.float32), use_running_average=True, deterministic=True)
    long_vars = {'params': variables['params'], 'batch_stats': long_vars['batch_stats']}
    unlabelled = [variable_length.batch(rng, variable_length.BATCH, LONG_LENGTHS,
                                        LONG_MAX)[:2] for _ in range(estimate_batches)]
    long_stats = br.estimate_population_stats(long_model, long_vars, unlabelled)
    models = {'steady tail': (model, {**variables, 'batch_stats': stats}),
              'test lengths': (long_model, {**long_vars, 'batch_stats': long_stats})}
    if by_site:
      for name, hybrid in _hybrids(stats, long_stats,
                                   normalization.DEFAULT_MIN_ROW_SUPPORT).items():
        models[name] = (long_model, {**long_vars, 'batch_stats': hybrid})
    out['var_by_row'] = _median_var_by_row(stats)
    out['var_by_row_test_lengths'] = _median_var_by_row(long_stats)
    out['growth_by_row_test_lengths'] = _largest_growth_by_row(long_stats)
  accuracy = {}
  for name, (m, v) in models.items():
    test_rng = np.random.default_rng(1000 + seed)   # variable_length's test sequences
    accuracy[name] = {f'{lo}-{hi}': variable_length.accuracy(m, v, test_rng, (lo, hi))
                      for lo, hi in variable_length.TEST_LENGTHS}
  return {'accuracy': accuracy, **out}


def run(steps: Sequence[int], seeds: int, estimate_batches: int, workers: int = 1,
        arm_set: str = 'cause') -> dict:
  """The result of training and scoring the arms of `ARM_SETS[arm_set]`."""
  arms, what, _ = ARM_SETS[arm_set]
  default_rate = {arm.learning_rate for arm in arms.values()} == {
      variable_length.LEARNING_RATE}
  # The longest first, so that the pool's last jobs are short ones.
  names = [(arm, n, seed) for n in sorted(steps, reverse=True) for arm in arms
           for seed in range(seeds)]
  jobs = [(arms[arm], n, seed, estimate_batches) for arm, n, seed in names]
  start = time.time()
  if workers > 1:
    with multiprocessing.get_context('spawn').Pool(workers) as pool:
      scored = pool.map(score, jobs, chunksize=1)
  else:
    scored = [score(job) for job in jobs]
  runs: dict = {str(n): {} for n in steps}
  for (arm, n, seed), result in zip(names, scored):
    runs[str(n)].setdefault(arm, {})[str(seed)] = result
  return {
      'what': what + ' trained on lengths 5-50 for several training lengths; each '
              'batch-normalised arm scored with the steady-tail statistics and with '
              'statistics estimated at the test lengths',
      'setup': {'steps': list(steps), 'seeds': seeds, 'hidden': variable_length.HIDDEN,
                'batch': variable_length.BATCH, 'estimate_batches': estimate_batches,
                'optimizer': ('adam 3e-3, clip 1' if default_rate else
                              "adam at each arm's learning rate, clip 1"),
                'train_lengths': list(variable_length.TRAIN_LENGTHS),
                'long_lengths': list(LONG_LENGTHS),
                'test_lengths': [list(r) for r in variable_length.TEST_LENGTHS],
                'test_examples': variable_length.TEST_EXAMPLES},
      'command': 'python -m experiments.analysis.variable_length_cause --vc_workers=2 '
                 f"--vc_steps={','.join(str(n) for n in steps)}"
                 + ('' if arm_set == 'cause' else f' --vc_arms={arm_set}'),
      'machine': machine_facts.machine(), 'seconds': round(time.time() - start, 1),
      'runs': runs, 'summary': summary(runs),
  }


def _arms(runs_at_steps: dict) -> dict[str, dict[str, dict[str, float]]]:
  """`{arm: {seed: {length range: accuracy}}}` at one training length; an arm scored with
  several statistics is one arm per statistics, named `'<arm>, <statistics>'`."""
  arms = {}
  for arm, by_seed in runs_at_steps.items():
    for statistics in next(iter(by_seed.values()))['accuracy']:
      name = arm if statistics == 'none' else f'{arm}, {statistics}'
      arms[name] = {s: r['accuracy'][statistics] for s, r in by_seed.items()}
  return arms


def summary(runs: dict) -> dict:
  """`{steps: {'accuracy': {arm: {length range: {mean, min, max, sd}}}, 'against_lstm':
  {BN arm: {length range: {mean, se, wins, seeds}}}}}`: each arm over its seeds
  (`variable_length.summary`), and each BN-LSTM arm minus the LSTM of the same seed and
  training length (`variable_length.paired_difference`)."""
  out = {}
  for steps, at_steps in runs.items():
    arms = _arms(at_steps)
    out[steps] = {
        'accuracy': variable_length.summary(arms),
        'against_lstm': {arm: variable_length.paired_difference(by_seed, arms['lstm'])
                         for arm, by_seed in arms.items() if arm != 'lstm'}}
  return out


def table(result: dict) -> str:
  """Mean ± sd accuracy per training length, arm and length range, and the paired
  difference from the LSTM on each range."""
  ranges = [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]
  lines = ['| training steps | arm | ' + ' | '.join(f'lengths {r}' for r in ranges) + ' | '
           + ' | '.join(f'minus the LSTM, {r}' for r in ranges) + ' |',
           '|---|---|' + '---|' * (2 * len(ranges))]
  for steps, at_steps in result['summary'].items():
    for arm, by_range in at_steps['accuracy'].items():
      cells = [f"{by_range[r]['mean']:.3f} ± {by_range[r]['sd']:.3f}" for r in ranges]
      paired = at_steps['against_lstm'].get(arm)
      cells += ([f"{paired[r]['mean']:+.3f} ± {paired[r]['se']:.3f} "
                 f"({paired[r]['wins']} of {paired[r]['seeds']})" for r in ranges]
                if paired else ['–'] * len(ranges))
      lines.append(f'| {int(steps):,} | {arm} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  lines.append(f"Mean ± standard deviation over {result['setup']['seeds']} seeds, each on "
               f"{result['setup']['test_examples']} sequences per range; \"minus the "
               'LSTM\": the paired difference from the LSTM of the same seed and training '
               'length (mean ± standard error; seeds at or above it).')
  return '\n'.join(lines)


def plot(result: dict, path: str) -> None:
  """Left: accuracy on the longest range by training length, per arm and statistics
  (all but the single-site ones). Right: the
  largest growth over the BN-LSTM's cell units of the variance from row 40 (test-length
  estimate, mean over seeds) per training length."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  longest = '{}-{}'.format(*result['setup']['test_lengths'][-1])
  steps = list(result['summary'])
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for arm in result['summary'][steps[0]]['accuracy']:
    if arm.endswith(' only'):   # the single-site rows are in the table
      continue
    means = [result['summary'][s]['accuracy'][arm][longest]['mean'] for s in steps]
    sds = [result['summary'][s]['accuracy'][arm][longest]['sd'] for s in steps]
    left.errorbar([int(s) for s in steps], means, yerr=sds, marker='o', capsize=3,
                  label=arm)
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


def plot_rates(result: dict, path: str) -> None:
  """Accuracy on the longest range against Adam's learning rate, per model of
  `RATE_MODELS` (batch-normalised ones with the default statistics), one panel per
  training length."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  longest = '{}-{}'.format(*result['setup']['test_lengths'][-1])
  steps = list(result['summary'])
  fig, panels = plt.subplots(1, len(steps), figsize=(4 * len(steps), 3.6), sharey=True,
                             squeeze=False)
  for panel, at_steps in zip(panels[0], steps):
    accuracy = result['summary'][at_steps]['accuracy']
    for model in RATE_MODELS:
      names = [rate_arm(model, rate) for rate in RATES]
      names = [name if name in accuracy else f'{name}, steady tail' for name in names]
      panel.errorbar(list(RATES.values()), [accuracy[n][longest]['mean'] for n in names],
                     yerr=[accuracy[n][longest]['sd'] for n in names], marker='o',
                     capsize=3, label=model)
    panel.set(xscale='log', xlabel="Adam's learning rate",
              title=f'{int(at_steps):,} training steps')
  panels[0][0].set(ylabel=f'accuracy, lengths {longest}')
  fig.legend(*panels[0][0].get_legend_handles_labels(), loc='lower center',
             ncol=len(RATE_MODELS), fontsize='small')
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


#: `{--vc_arms: the figure drawn from its result}`: the sets without one draw none.
FIGURES = {'cause': plot, 'rate': plot_rates}


def main(argv) -> None:
  del argv
  if _ARM_SET.value in FIGURES:   # a missing matplotlib refuses before the work
    with extras.needed_by('Drawing a figure'):
      import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  result = run([int(s) for s in _STEPS.value], _SEEDS.value, _ESTIMATE.value,
               _WORKERS.value, _ARM_SET.value)
  _, _, name = ARM_SETS[_ARM_SET.value]
  os.makedirs(_OUTPUT.value, exist_ok=True)
  path = os.path.join(_OUTPUT.value, f'{name}.json')
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  if _ARM_SET.value in FIGURES:
    FIGURES[_ARM_SET.value](result, os.path.join(_OUTPUT.value, f'{name}.png'))
  print(table(result))
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
