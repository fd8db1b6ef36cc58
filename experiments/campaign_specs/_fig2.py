r"""What the two Cooijmans et al. Fig. 2 campaigns share: 784-step MNIST, LSTM against
BN-LSTM, to the iterations where the figure's claim is decided.

Not a campaign itself (`NAMES` leaves it out): `mnist_fig2.py` (sequential MNIST, 10k
steps) and `pmnist_fig2.py` (permuted MNIST, 12k steps) are one panel of the figure each.

Setup: `experiments/configs/seq_mnist.py` (the authors' code where the paper is silent:
100 units, RMSProp 1e-3 with decay 0.9 and no momentum, clipping at 1, W_h identity on the
candidate block, forget bias 1, gamma 0.1, h0 noise 0.1, batch 100; the config says where
each comes from). One seed per arm. Every 500 steps the 5,000 held-out images are scored
twice, deterministically (no h0 noise): with batch statistics (each evaluation batch of
1,000 normalised with its own moments: the curves the authors plotted) and with the
papers' population estimate (2 training batches of 1,000); the best checkpoint by the
estimate is tested on the 10,000 test images at the end.

The paper's milestones are read off the authors' plotted validation curves (one point per
500 iterations): sequential MNIST, BN-LSTM 90 % at about 3.5k iterations and 95 % at about
8.5k, LSTM 90 % at about 40k; permuted MNIST, BN-LSTM 90 % at about 11k, LSTM at about
35.5k, neither 95 %.
"""

from __future__ import annotations

import math
from typing import Optional

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

TASKS = {'seq': ('sequential MNIST', False, 10_000), 'pmnist': ('permuted MNIST', True, 12_000)}
NAMES = {'seq': 'mnist_fig2', 'pmnist': 'pmnist_fig2'}
VARIANTS = {'lstm': 'LSTM', 'bn_lstm': 'BN-LSTM'}
THRESHOLDS = (0.5, 0.8, 0.9, 0.95)
CHECKPOINTS = (2_000, 5_000, 10_000)
#: Iterations at which the authors' validation curves first pass 90 % and 95 % (None:
#: not within their 100k iterations).
PAPER = {'milestones': {
    'seq_bn_lstm': {'0.9': 3_500, '0.95': 8_500},
    'seq_lstm': {'0.9': 40_000},
    'pmnist_bn_lstm': {'0.9': 11_000, '0.95': None},
    'pmnist_lstm': {'0.9': 35_500, '0.95': None},
}}
#: Cooijmans et al. Table 1: test accuracy of the early-stopped models with population
#: statistics, after their full training (the curves of Fig. 2 run to 100k iterations).
TABLE1 = {'seq_lstm': 0.989, 'seq_bn_lstm': 0.990, 'pmnist_lstm': 0.902,
          'pmnist_bn_lstm': 0.954}
#: Test images, for the standard error.
TEST_IMAGES = 10_000
#: The metrics of a validation record: batch statistics, and the papers' estimate.
STATISTICS = {'batch': 'accuracy_batch', 'estimate': 'accuracy'}


def campaign(task: str, expected: str) -> spec.Campaign:
  """The campaign of one panel: `task` 'seq' (sequential) or 'pmnist' (permuted)."""
  title, permute, steps = TASKS[task]
  arms = {f'{task}_{variant}': spec.Arm(
      overrides={'model.variant': variant, 'data.permute': permute,
                 'train.num_steps': steps},
      label=f'{name}, {title}', tags={'task': task, 'variant': variant})
          for variant, name in VARIANTS.items()}
  paper = {'milestones': {arm: PAPER['milestones'][arm] for arm in arms}}
  return spec.Campaign(
      name=NAMES[task],
      title=f"Cooijmans Fig. 2: 784-step {title}, LSTM vs BN-LSTM",
      config='experiments/configs/seq_mnist.py',
      arms=arms, seeds=(0,), parallel=2,
      overrides={'eval.every': 500, 'eval.compare': ('batch',), 'checkpoint.every': 500,
                 'checkpoint.keep': 1},
      tables={'milestones': milestones, 'table1': table1}, figure=figure, setup=setup, paper=paper,
      expected=expected,
      tiny={'data.resolution': 14, 'data.num_valid': 200, 'train.num_steps': 2,
            'train.batch_size': 16, 'model.hidden_size': 8, 'eval.every': 2,
            'eval.batch_size': 100, 'eval.max_batches': 1, 'eval.population_batches': 1,
            'eval.population_batch_size': 16, 'eval.test_at_end': False,
            'checkpoint.every': 2})


def setup(config) -> str:
  c = config
  images = (c.eval.max_batches * c.eval.batch_size if c.eval.max_batches
            else c.data.num_valid)
  return (f'{c.data.resolution ** 2}-step MNIST, {c.model.hidden_size} units, batch '
          f'{c.train.batch_size}, {c.optimizer.name} lr {c.optimizer.learning_rate:g} '
          f'decay {c.optimizer.decay:g} momentum {c.optimizer.momentum:g}, clip '
          f'{c.optimizer.clip_norm:g}, W_h {c.model.recurrent_init}, forget bias '
          f'{c.model.forget_bias:g}, gamma {c.model.gamma_init:g}, h0 noise '
          f'{c.model.initial_state_noise:g}, seed {c.seed}; validation every '
          f'{c.eval.every} steps on {images} images with batch statistics and with the '
          f"papers' estimate ({c.eval.population_batches} batches of "
          f'{c.eval.population_batch_size or c.train.batch_size})')


def validation_curve(records, metric: str) -> tuple[list[int], list[float]]:
  """`(steps, values)` of `metric` in a run's validation records."""
  found = [r for r in columns.split(records, 'valid') if metric in r]
  return [r['step'] for r in found], [r[metric] for r in found]


def standard_error(accuracy: Optional[float], images: int) -> Optional[float]:
  """The binomial standard error of an accuracy measured on `images` images."""
  if accuracy is None or not images:
    return None
  return math.sqrt(accuracy * (1.0 - accuracy) / images)


def _images(result: dict) -> int:
  """How many images each validation scored (from the setup line `collect` stored)."""
  words = result.get('setup', '').split(' images with')[0].split()
  return int(words[-1]) if words and words[-1].isdigit() else 0


def milestones(result: dict) -> str:
  """Per run and statistics: the first validation step past 50/80/90/95 %, the
  accuracy at 2k/5k/10k steps and the test accuracy of the best checkpoint by the
  estimate (on the estimate's row), the paper's milestones beside."""
  paper = result['spec']['paper'].get('milestones', {})
  images = _images(result)
  header = (['run', 'statistics'] + [f'{t:.0%} at' for t in THRESHOLDS] +
            [f'acc@{s // 1000}k' for s in CHECKPOINTS] +
            ['last step', 'test', 'paper 90 % / 95 %'])
  rows = []
  for arm, runs in columns.runs_by_arm(result).items():
    for run in runs:
      tests = columns.split(run['records'], 'test')
      tested = columns.fmt(tests[-1]['accuracy']) if tests else columns.DASH
      for statistics, metric in STATISTICS.items():
        steps, values = validation_curve(run['records'], metric)
        row = [columns.label(result, arm), statistics]
        row += [_step(columns.first_past(steps, values, t, above=True)) for t in THRESHOLDS]
        row += [columns.fmt(dict(zip(steps, values)).get(s)) for s in CHECKPOINTS]
        row.append(_step(steps[-1] if steps else None))
        row.append(tested if statistics == 'estimate' else columns.DASH)
        theirs = paper.get(arm, {})
        row.append(' / '.join(_paper_step(theirs, k) for k in ('0.9', '0.95')))
        rows.append(row)
  error = standard_error(0.9, images)
  every = result['spec']['overrides'].get('eval.every')
  note = (f'\n\nA step is the first validation (every {every} steps) past the threshold; '
          f'"–" = not reached; "?" = not read off the paper\'s curve. Each accuracy is on '
          f'{images} images: its binomial standard error is ±{error:.4f} at 90 %. "test": '
          f'the best checkpoint by the estimate on the 10,000 test images.'
          if error is not None else '')
  return columns.markdown(header, rows) + note + f"\n\n{result['setup']}."


def _step(step: Optional[int]) -> str:
  return columns.DASH if step is None else f'{step:,}'


def _paper_step(theirs: dict, key: str) -> str:
  if key not in theirs:
    return '?'
  return 'not in 100k' if theirs[key] is None else f'~{theirs[key]:,}'


def table1(result: dict) -> str:
  """Per run: the test accuracy with population statistics (the papers' estimate) of the
  checkpoint the estimate's validation picked, its binomial standard error and step,
  beside Cooijmans et al. Table 1."""
  rows = []
  for arm, runs in columns.runs_by_arm(result).items():
    for run in runs:
      tests = columns.split(run['records'], 'test')
      test = tests[-1] if tests else None
      accuracy = test['accuracy'] if test else None
      error = standard_error(accuracy, TEST_IMAGES)
      rows.append([columns.label(result, arm), columns.fmt(accuracy),
                   columns.DASH if error is None else f'±{error:.4f}',
                   _step(test.get('checkpoint_step')) if test else columns.DASH,
                   _step(columns.last(run['records'], 'valid')['step']),
                   columns.fmt(TABLE1.get(arm))])
  return columns.markdown(['run', 'test accuracy (estimate)', 'standard error',
                          'checkpoint step', 'steps trained', 'paper, Table 1'], rows)


def figure(result: dict, output: str) -> None:
  """The panel's validation curves (batch statistics solid, the estimate dashed), with the
  paper's 90 % / 95 % milestones within the plotted range as crosses."""
  colors = {'seq_lstm': 'tab:blue', 'seq_bn_lstm': 'tab:red',
            'pmnist_lstm': 'tab:cyan', 'pmnist_bn_lstm': 'tab:orange'}
  paper = result['spec']['paper'].get('milestones', {})
  series, markers = [], []
  for arm, runs in columns.runs_by_arm(result).items():
    for run in runs:
      for statistics, metric in STATISTICS.items():
        steps, values = validation_curve(run['records'], metric)
        series.append((f'{columns.label(result, arm)} ({statistics})', steps, values,
                       dict(color=colors.get(arm), linestyle='-' if statistics == 'batch'
                            else '--', alpha=0.9)))
      for key in ('0.9', '0.95'):
        step = paper.get(arm, {}).get(key)
        if step is not None:
          markers.append((None, [step], [float(key)],
                          dict(color=colors.get(arm), marker='x', markersize=9,
                               linestyle='none')))
  # Milestones far past our last step (the LSTM's, at 35-40k) are in the table only.
  last = max((max(xs) for _, xs, _, _ in series if len(xs)), default=0)
  series += [m for m in markers if m[1][0] <= 1.2 * last]
  plot.plot_curves(series, output, ylabel='validation accuracy', ylim=(0.0, 1.0),
                   title=f"{result['title'].split(': ')[-1]}\n(x: the paper's 90 % / "
                         '95 % milestones)',
                   legend_size=7)
