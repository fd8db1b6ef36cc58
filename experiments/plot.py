r"""Learning curves of one or several runs in one PNG.

  python experiments/plot.py --workdirs=/tmp/qs/lstm,/tmp/qs/bn_lstm \
      --metric=accuracy --splits=valid,train --output=/tmp/qs/curves.png

Reads each workdir's `metrics.jsonl`; one line per (run, split), x = training step.
"""

import json
import os
from typing import Optional, Sequence

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_list('workdirs', None, 'Run directories (comma-separated).')
flags.DEFINE_list('labels', None, 'Legend labels (default: the workdir names).')
flags.DEFINE_string('metric', 'accuracy', 'Metric to plot (accuracy, loss, bpc, ...).')
flags.DEFINE_list('splits', ['valid'], 'Splits to plot: train, valid, test.')
flags.DEFINE_string('output', 'curves.png', 'PNG file to write.')


def read_curve(workdir: str, split: str, metric: str) -> tuple[list, list]:
  """`(steps, values)` of `metric` on `split` from `workdir/metrics.jsonl`."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    raise FileNotFoundError(f'No metrics.jsonl in {workdir!r} (expected {path}).')
  steps, values = [], []
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      if record.get('split') == split and metric in record:
        steps.append(record['step'])
        values.append(record[metric])
  return steps, values


def plot_runs(workdirs: Sequence[str], output: str, metric: str = 'accuracy',
              splits: Sequence[str] = ('valid',), labels: Optional[Sequence[str]] = None,
              title: Optional[str] = None) -> str:
  """Draw `metric` against step for every (workdir, split); returns the PNG path."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # no display needed
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(labels) != len(workdirs):
    raise ValueError(f'{len(labels)} labels for {len(workdirs)} workdirs.')
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  drawn = 0
  for workdir, label in zip(workdirs, labels):
    for split in splits:
      steps, values = read_curve(workdir, split, metric)
      if steps:
        ax.plot(steps, values, marker='.' if len(steps) < 40 else None,
                linestyle='-' if split != 'train' else ':', label=f'{label} ({split})')
        drawn += 1
  if not drawn:
    raise ValueError(f'No {metric!r} records for splits {list(splits)} in {list(workdirs)}.')
  ax.set_xlabel('training step')
  ax.set_ylabel(metric)
  ax.grid(alpha=0.3)
  ax.legend()
  if title:
    ax.set_title(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=120)
  plt.close(fig)
  return output


def main(argv):
  del argv
  if not FLAGS.workdirs:
    raise app.UsageError('--workdirs is required.')
  print(plot_runs(FLAGS.workdirs, FLAGS.output, FLAGS.metric, FLAGS.splits, FLAGS.labels))


if __name__ == '__main__':
  app.run(main)
