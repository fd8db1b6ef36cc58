r"""Laurent et al. (2016) Table 2, small row: word-level PTB, LSTM vs input-only BN.

  python -m experiments.campaign run ptb_word_small --parallel=2
  python -m experiments.campaign collect ptb_word_small
  python -m experiments.campaign report ptb_word_small   # the table and per-epoch lists

Expected: about 2.5 hours on 2 CPU cores (AMD EPYC VM, one XLA thread per run, the two
runs side by side; 2.3 h and 2.5 h of their own clocks). Best validation perplexity 122.6
(LSTM, epoch 7) and 123.7 (BN, epoch 4) against Laurent's 119.2 and 120.9; the BN model
trains faster and overfits sooner.

`experiments/configs/ptb_word.py:small` (Zaremba et al.'s small model: 2 x 200 units, SGD
lr 1, batch 32, 20 steps, U(-0.1, 0.1) init, clip 10, 15 epochs, halved after the 6th),
the variant per arm. One training record and one validation per epoch; training perplexity
is exp of an epoch's mean training loss, validation uses population statistics, the test is
that of the best-validation checkpoint.
"""

import math

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

# Laurent et al. 2016, Table 2: best perplexity (train, valid), small models.
PAPER = {'lstm': {'train': 78.5, 'valid': 119.2}, 'bn_input_only': {'train': 62.5,
                                                                    'valid': 120.9}}


def get_campaign() -> spec.Campaign:
  return spec.Campaign(
      name='ptb_word_small',
      title="Word-level PTB, Zaremba's small model: LSTM vs input-only BN (Laurent Table 2)",
      config='experiments/configs/ptb_word.py',
      arms={'lstm': spec.Arm('small', {'model.variant': 'lstm'}, label='LSTM'),
            'bn_input_only': spec.Arm('small', {'model.variant': 'bn_input_only'},
                                      label='BN')},
      seeds=(0,), parallel=2,
      tables={'table2': table2, 'valid_per_epoch': valid_per_epoch,
              'train_per_epoch': train_per_epoch},
      figure=figure, paper={'table2_small': PAPER},
      expected='about 2.5 h on 2 CPU cores (AMD EPYC VM; one XLA thread per run, 2 at a '
               'time)',
      tiny={'train.num_steps': 2, 'train.log_every': 1, 'eval.every': 1,
            'checkpoint.every': 1, 'model.hidden_size': 8, 'model.embed_size': 8,
            'data.seq_length': 5, 'model.max_length': 5, 'train.batch_size': 8,
            'eval.batch_size': 8, 'eval.population_batches': 1})


def epochs(records) -> dict:
  """`{'train': [(epoch, perplexity)], 'valid': [...], 'test': perplexity or None}`.

  One training record per epoch (`train.log_every` = an epoch), so the first one's step
  is the epoch's length.
  """
  train = columns.split(records, 'train')
  length = train[0]['step'] if train else 1
  test = columns.last(records, 'test')
  return {'train': [(r['step'] // length, math.exp(r['loss'])) for r in train],
          'valid': [(r['step'] // length, r['perplexity'])
                    for r in columns.split(records, 'valid')],
          'test': test['perplexity'] if test else None}


def table2(result: dict) -> str:
  """Best validation perplexity and its epoch, the training perplexity then and at its
  lowest, the test of the best checkpoint; Laurent's numbers in brackets."""
  rows = []
  for arm, runs in columns.runs_by_arm(result).items():
    e = epochs(runs[0]['records'])
    paper = result['spec']['paper']['table2_small'].get(arm, {})
    best_valid = min(e['valid'], key=lambda x: x[1])
    best_train = min(p for _, p in e['train'])
    rows.append([arm, f"{best_valid[1]:.1f}, epoch {best_valid[0]} ({paper.get('valid')})",
                 f"{dict(e['train'])[best_valid[0]]:.1f}",
                 f"{best_train:.1f} ({paper.get('train')})", columns.fmt(e['test'], 1)])
  return columns.markdown(['variant', 'best valid ppl, epoch (Laurent)',
                          'train ppl at that epoch', 'lowest train ppl (Laurent)',
                          'test ppl, best checkpoint'], rows)


def _per_epoch(result: dict, split: str, mark_best: bool) -> str:
  lines = []
  for arm, runs in columns.runs_by_arm(result).items():
    values = [p for _, p in epochs(runs[0]['records'])[split]]
    best = values.index(min(values)) if mark_best else -1
    lines.append(f'* {columns.label(result, arm):<4} ' + ', '.join(
        f'**{v:.0f}**' if i == best else f'{v:.0f}' for i, v in enumerate(values)))
  return '\n'.join(lines)


def valid_per_epoch(result: dict) -> str:
  """Validation perplexity per epoch, the best in bold."""
  return _per_epoch(result, 'valid', mark_best=True)


def train_per_epoch(result: dict) -> str:
  return _per_epoch(result, 'train', mark_best=False)


def figure(result: dict, output: str) -> None:
  series = []
  for (arm, runs), color in zip(columns.runs_by_arm(result).items(),
                                ('tab:blue', 'tab:red', 'tab:green')):
    e = epochs(runs[0]['records'])
    for split, style in (('train', ':'), ('valid', '-')):
      series.append((f'{arm} ({split})', [x for x, _ in e[split]], [y for _, y in e[split]],
                     dict(linestyle=style, color=color, marker='.')))
  plot.plot_curves(series, output, xlabel='epoch', ylabel='perplexity', logy=True,
                   title='PTB words, small (Laurent et al. 2016 sec. 5.2)')
