r"""Learning curves of one or several runs in one PNG.

  python experiments/quickstart.py --workdir runs/qs     # writes the runs below
  python experiments/plot.py \
      --workdirs=runs/qs/quickstart/lstm_s0,runs/qs/quickstart/bn_lstm_s0 \
      --metric=accuracy --splits=valid,train --output=runs/qs/curves.png

Reads each workdir's records with `bn_rnn_jax.training.metric_writer.read_metrics`; one line per
(run, split), x = training step. Training records carry the metrics evaluations derive
(`bpc`, `perplexity`, `fer`, ...), so `--splits=valid,train` draws both. A metric no
record has is a one-line error listing the metrics there are; a (run, split) without it
is left out with a warning. `plot_curves` is also what the campaigns' figures draw with
(`experiments/campaign_specs/`).
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from absl import app
from absl import flags

from bn_rnn_jax import extras
from bn_rnn_jax.training import metric_writer


# Record fields that are not metrics (`metric_writer.MetricWriter.write`).
NOT_METRICS = ('step', 'split', 'time_s', 'checkpoint_step')


def metric_names(records: Sequence[dict], splits: Sequence[str]) -> list[str]:
  """The metrics the records of `splits` hold."""
  return sorted({k for r in records if r['split'] in splits for k in r} - set(NOT_METRICS))


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
  with extras.needed_by('Drawing a figure'):
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
  _fit_single_values(ax, series, logx, logy, ylim)
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


def _fit_single_values(ax, series, logx: bool, logy: bool, ylim) -> None:
  """Axes for curves of one point (or one value): matplotlib would span x +- 0.2 around a
  single step and y +- 0.4 %; steps run from 0 here, on whole numbers."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  xs = [x for _, xs_, _, _ in series for x in xs_]
  ys = [y for _, _, ys_, _ in series for y in ys_]
  if not logx and all(float(x).is_integer() for x in xs):
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  if not logx and len(set(xs)) == 1:
    ax.set_xlim(min(0, xs[0]), max(xs[0], 0) * 1.05 or 1)
  if not logy and not ylim and len(set(ys)) == 1:
    pad = abs(ys[0]) * 0.1 or 1.0
    ax.set_ylim(ys[0] - pad, ys[0] + pad)


def plot_runs(workdirs: Sequence[str], output: str, metric: str = 'accuracy',
              splits: Sequence[str] = ('valid',), labels: Optional[Sequence[str]] = None,
              title: Optional[str] = None) -> str:
  """Draw `metric` against step for every (workdir, split); returns the PNG path."""
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(labels) != len(workdirs):
    raise ValueError(f'{len(labels)} labels for {len(workdirs)} workdirs.')
  series, names, missing = [], set(), []
  for workdir, label in zip(workdirs, labels):
    path = os.path.join(os.path.abspath(workdir), 'metrics.jsonl')
    if not os.path.exists(path):
      raise FileNotFoundError(f'No metrics.jsonl in {os.path.abspath(workdir)} (not a run\'s '
                              'workdir, or the run has written nothing yet).')
    records = metric_writer.read_metrics(workdir)
    names.update(metric_names(records, splits))
    for split in splits:
      steps, values = curve(records, split, metric)
      if not steps:
        missing.append((split, path))
      series.append((f'{label} ({split})', steps, values,
                     dict(marker='.' if len(steps) < 40 else None,
                          linestyle='-' if split != 'train' else ':')))
  if not any(s[1] for s in series):
    raise ValueError(f'--metric={metric}: no {", ".join(splits)} record of '
                     f'{", ".join(os.path.abspath(w) for w in workdirs)} has it; they have '
                     f'{", ".join(sorted(names)) or "no records"}.')
  for split, path in missing:
    print(f'warning: no {metric!r} in the {split} records of {path}; that curve is left out.',
          file=sys.stderr)
  return plot_curves(series, output, ylabel=metric, title=title)


def main(argv):
  del argv
  values = flags.FLAGS
  if not values.workdirs:
    sys.exit('error: --workdirs is required: the run folders to plot, comma-separated.')
  try:
    print(plot_runs(values.workdirs, values.output, values.metric, values.splits,
                    values.labels))
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  # Defined here, not at import: the campaigns import this module beside their own flags.
  flags.DEFINE_list('workdirs', None, 'Run directories (comma-separated).')
  flags.DEFINE_list('labels', None, 'Legend labels (default: the workdir names).')
  flags.DEFINE_string('metric', 'accuracy', 'Metric to plot (accuracy, loss, bpc, ...).')
  flags.DEFINE_list('splits', ['valid'], 'Splits to plot: train, valid, test.')
  flags.DEFINE_string('output', 'curves.png', 'PNG file to write.')
  app.run(main)
