r"""Quickstart: LSTM vs BN-LSTM on 8x8 digits read pixel by pixel, five seeds.

  python -m experiments.campaign run quickstart --parallel=2
  python -m experiments.campaign collect quickstart
  python -m experiments.campaign report quickstart     # the README's table
  python experiments/quickstart.py     # the same in the user's own folder, for a new user

Expected: about 3.5 minutes on 2 CPU cores (one XLA thread per run, two runs at a time;
3 min 21 s on an AMD EPYC VM, 3 min 12 s on an Intel Xeon VM); in every seed the BN-LSTM
is ahead of the LSTM at step 75 (a quarter of the budget), by about two binomial
standard errors of a gap on the 250 validation digits or more. The exact accuracies move
between processor families (XLA's CPU kernels differ), which is why the claim is made
over seeds.

`experiments/configs/quickstart.py` (100 units, batch 64, RMSProp 1e-3, 300 steps,
validation every 25 steps on the 250 validation images with the papers' population
estimate), the
variant set per arm; scikit-learn's bundled digits, so it runs offline.
"""

import os
import textwrap

import numpy as np

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

ARMS = {'lstm': spec.Arm(overrides={'model.variant': 'lstm'}, label='LSTM'),
        'bn_lstm': spec.Arm(overrides={'model.variant': 'bn_lstm'}, label='BN-LSTM')}
FRACTIONS = (0.25, 0.5)   # the table's early columns: a quarter and half of the budget


def get_campaign() -> spec.Campaign:
  return spec.Campaign(
      name='quickstart',
      title='LSTM vs BN-LSTM on 8x8 digits (64-step sequences), 300 steps, five seeds',
      config='experiments/configs/quickstart.py',
      arms=ARMS, seeds=(0, 1, 2, 3, 4), parallel=2,
      tables={'quickstart': table},
      figure=figure, setup=setup,
      expected='about 3.5 min on 2 CPU cores (one XLA thread per run, 2 at a time; '
               '3 min 12 s on an Intel Xeon VM)',
      tiny={'train.num_steps': 2, 'model.hidden_size': 8, 'eval.population_batches': 1,
            'eval.max_batches': 1})


def default_workdir() -> str:
  """Where `experiments/quickstart.py` puts its runs, table and plot unless told: the
  user's own `bn_rnn_jax/quickstart` in the cache folder (`$XDG_CACHE_HOME`, or
  `~/.cache` where that is not set), so users of one machine do not share runs."""
  cache = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(cache, 'bn_rnn_jax', 'quickstart')


def data_text(config) -> str:
  if config.data.name == 'mnist':
    r = config.data.resolution
    return f'{r}x{r} MNIST as {r * r}-step sequences'
  return '8x8 digits as 64-step sequences'


def setup(config) -> str:
  return (f'{data_text(config)}, {config.train.num_steps} steps, batch '
          f'{config.train.batch_size}, {config.model.hidden_size} units; validation accuracy '
          f'with the papers\' population estimate ({config.eval.population_batches} '
          'training batches)')


def images_scored(result: dict) -> int:
  """How many validation images each evaluation scored (the count its records carry)."""
  counts = {r['count'] for runs in columns.runs_by_arm(result).values() for run in runs
            for r in columns.split(run['records'], 'valid') if 'count' in r}
  if len(counts) != 1:
    raise ValueError(f'The quickstart runs scored {sorted(counts) or "no recorded"} '
                     'validation images; the table needs one count.')
  return counts.pop()


def _row(run):
  """`{'at': [(step, accuracy) at each fraction], 'end', 'best', 'time_s', 'cpu_s'}` of
  one run: its training clock, and the CPU seconds of its processes (start-up and
  compilation included)."""
  records = run['records']
  valid = columns.split(records, 'valid')
  last = valid[-1]['step']
  at = [min(valid, key=lambda r, f=f: abs(r['step'] - f * last)) for f in FRACTIONS]
  return {'at': [(r['step'], r['accuracy']) for r in at],
          'end': (last, valid[-1]['accuracy']),
          'best': max(r['accuracy'] for r in valid), 'time_s': columns.wall_time(records),
          'cpu_s': columns.cpu_time(run)}


def table(result: dict) -> str:
  """Every seed's accuracies, then what holds in every seed (BN-LSTM minus LSTM)."""
  runs = columns.runs_by_arm(result)
  rows = {arm: {r['seed']: _row(r) for r in arm_runs}
          for arm, arm_runs in runs.items()}
  any_row = next(iter(next(iter(rows.values())).values()))
  steps = [s for s, _ in any_row['at']] + [any_row['end'][0]]
  names = [f'acc@{s}' for s in steps[:-1]] + ['acc@end']
  head = (f"{'seed':>4}  {'variant':<8}" + ''.join(f'{n:>9}' for n in names)
          + f"{'best':>7}{'train time':>12}{'CPU':>7}")
  images = images_scored(result)
  text = f"{result.get('setup', '')}, on the {images} validation images"
  lines = [textwrap.fill(text, len(head) + 20), '', head, '-' * len(head)]
  for seed in sorted({s for r in rows.values() for s in r}):
    for arm, by_seed in rows.items():
      if seed in by_seed:
        row = by_seed[seed]
        values = [a for _, a in row['at']] + [row['end'][1]]
        cpu = columns.DASH if row['cpu_s'] is None else f"{row['cpu_s']:.0f}s"
        lines.append(f'{seed:>4}  {arm:<8}' + ''.join(f'{v:>9.3f}' for v in values) +
                     f"{row['best']:>7.3f}{row['time_s']:>11.1f}s{cpu:>7}")
  if set(rows) == {'lstm', 'bn_lstm'}:
    seeds = sorted(set(rows['lstm']) & set(rows['bn_lstm']))
    lines += ['', 'BN-LSTM minus LSTM, seed by seed:' if len(seeds) > 1 else
              f'BN-LSTM minus LSTM (seed {seeds[0]}):']
    gap_columns = [(f'at step {s}', lambda r, i=i: ([a for _, a in r['at']] + [r['end'][1]])[i])
                   for i, s in enumerate(steps)] + [('best', lambda r: r['best'])]
    errors = []
    for name, value in gap_columns:
      pairs = [(value(rows['bn_lstm'][s]), value(rows['lstm'][s])) for s in seeds]
      gaps = [bn - plain for bn, plain in pairs]
      lines.append(f'  {name + ":":<14}' + ' '.join(f'{g:+.3f}' for g in gaps) +
                   f'  {_verdict(gaps)}')
      errors += [gap_standard_error(bn, plain, images) for bn, plain in pairs]
    spread = (f'; "± x over seeds" is the sample standard deviation of the {len(seeds)} '
              'gaps' if len(seeds) > 1 else '')
    lines += ['', f'One gap on {images} images has a binomial standard error of '
              f'{min(errors):.3f} to {max(errors):.3f}{spread}.']
  return '\n'.join(lines)


def _verdict(gaps: list[float]) -> str:
  """Where the BN-LSTM stands over the seeds' gaps (one seed: ahead, behind or level)."""
  if len(gaps) == 1:
    return 'ahead' if gaps[0] > 0 else 'behind' if gaps[0] < 0 else 'level'
  ahead = sum(g > 0 for g in gaps)
  verdict = ('ahead in every seed' if ahead == len(gaps) else
             f'ahead in {ahead} of {len(gaps)} seeds')
  return (f'{verdict} (mean {np.mean(gaps):+.3f} ± {np.std(gaps, ddof=1):.3f} over seeds, '
          f'min {min(gaps):+.3f})')


def gap_standard_error(a: float, b: float, images: int) -> float:
  """The binomial standard error of the difference of two accuracies, each measured on
  `images` images (treated as independent)."""
  return float(np.sqrt((a * (1 - a) + b * (1 - b)) / images))


def figure(result: dict, output: str) -> None:
  colors = {'lstm': 'tab:blue', 'bn_lstm': 'tab:red'}
  series = []
  for arm, arm_runs in columns.runs_by_arm(result).items():
    for i, run in enumerate(arm_runs):
      steps, values = columns.curve(run['records'], 'valid', 'accuracy')
      series.append((columns.label(result, arm) if i == 0 else None, steps, values,
                     dict(color=colors.get(arm), alpha=0.8, marker='.')))
  plot.plot_curves(series, output, ylabel='validation accuracy (population statistics)',
                   title=f"{result.get('setup', '').split(',')[0]}: every seed")
