r"""Learning curves of one or several runs in one PNG.

  python experiments/plot.py --workdirs=/tmp/qs/lstm_s0,/tmp/qs/bn_lstm_s0 \
      --metric=accuracy --splits=valid,train --output=/tmp/qs/curves.png

Reads each workdir's records with `bn_rnn_jax.metric_writer.read_metrics`; one line per
(run, split), x = training step. `plot_curves` is also what the campaigns' figures draw
with (`experiments/campaigns/`).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from absl import app
from absl import flags

from bn_rnn_jax import metric_writer


def curve(records: Sequence[dict], split: str, metric: str) -> tuple[list, list]:
  """`(steps, values)` of `metric` on `split`."""
  points = [(r['step'], r[metric]) for r in records if r['split'] == split and metric in r]
  return [s for s, _ in points], [v for _, v in points]


def plot_curves(series: Sequence[tuple], output: str, xlabel: str = 'training step',
                ylabel: str = '', title: Optional[str] = None, logx: bool = False,
                logy: bool = False, size=(6.4, 4.2), legend_size: Optional[int] = None,
                ylim: Optional[tuple] = None, dpi: int = 120) -> str:
  """Draw `(label, xs, ys, style)` series (style: matplotlib keyword arguments) in one
  axes; returns the PNG path."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # no display needed
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=size)
  drawn = 0
  for label, xs, ys, style in series:
    if len(xs):
      ax.plot(xs, ys, label=label, **style)
      drawn += 1
  if not drawn:
    plt.close(fig)
    raise ValueError(f'Nothing to draw in {output}: every series is empty.')
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logx:
    ax.set_xscale('log')
  if logy:
    ax.set_yscale('log')
  if ylim:
    ax.set_ylim(*ylim)
  ax.grid(True, which='both' if logx or logy else 'major', alpha=0.3)
  ax.legend(fontsize=legend_size)
  if title:
    ax.set_title(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=dpi)
  plt.close(fig)
  return output


def plot_runs(workdirs: Sequence[str], output: str, metric: str = 'accuracy',
              splits: Sequence[str] = ('valid',), labels: Optional[Sequence[str]] = None,
              title: Optional[str] = None) -> str:
  """Draw `metric` against step for every (workdir, split); returns the PNG path."""
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(labels) != len(workdirs):
    raise ValueError(f'{len(labels)} labels for {len(workdirs)} workdirs.')
  series = []
  for workdir, label in zip(workdirs, labels):
    if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
      raise FileNotFoundError(f'No metrics.jsonl in {workdir!r}.')
    records = metric_writer.read_metrics(workdir)
    for split in splits:
      steps, values = curve(records, split, metric)
      series.append((f'{label} ({split})', steps, values,
                     dict(marker='.' if len(steps) < 40 else None,
                          linestyle='-' if split != 'train' else ':')))
  if not any(s[1] for s in series):
    raise ValueError(f'No {metric!r} records for splits {list(splits)} in {list(workdirs)}.')
  return plot_curves(series, output, ylabel=metric, title=title)


def main(argv):
  del argv
  values = flags.FLAGS
  if not values.workdirs:
    raise app.UsageError('--workdirs is required.')
  print(plot_runs(values.workdirs, values.output, values.metric, values.splits,
                  values.labels))


if __name__ == '__main__':
  # Defined here, not at import: the campaigns import this module beside their own flags.
  flags.DEFINE_list('workdirs', None, 'Run directories (comma-separated).')
  flags.DEFINE_list('labels', None, 'Legend labels (default: the workdir names).')
  flags.DEFINE_string('metric', 'accuracy', 'Metric to plot (accuracy, loss, bpc, ...).')
  flags.DEFINE_list('splits', ['valid'], 'Splits to plot: train, valid, test.')
  flags.DEFINE_string('output', 'curves.png', 'PNG file to write.')
  app.run(main)
