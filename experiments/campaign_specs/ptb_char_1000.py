r"""Cooijmans et al. Table 2 and Fig. 3a at the paper's shape: character-level PTB with
1000 units, LSTM against BN-LSTM.

  python -m experiments.campaign run ptb_char_1000 --parallel=2 --runs_dir=DIR \
      --set=train.time_budget_s=7200         # in launches of 2 h; the same command resumes
  python -m experiments.campaign collect ptb_char_1000 --runs_dir=DIR
  python -m experiments.campaign report ptb_char_1000     # milestone table
  python -m experiments.campaign report ptb_char_1000 --figure=experiments/results/ptb_char_1000.png

Expected: on 2 CPU cores (two runs at a time, one core each) a training step takes
about 2.4 s (LSTM) and 2.6 s (BN-LSTM), the CPU time a step takes with XLA on both cores
(`ptb_char_1000_speed`), so 20,000 steps of both arms are about 14 hours of steps, plus
the validations. On one GPU both arms run side by side in minutes:
`experiments/accelerator_campaign.sh ptb_char_1000,ptb_char_1000_lengths OUT WHEELS` on a
machine that keeps nothing, then `collect --runs_dir` here on the records it packs. The
`launches` table gives every launch's steps, seconds per step, cores and machine.

Setup: `experiments/configs/ptb_char.py` (sec. 5.2: 1000 units, orthogonal W_x and W_h,
gamma 0.1, Adam 2e-3, batch 64, 100-character crops, clipping at 1.0) with the forget
gate bias at 1, as in the authors' released code (the paper gives none). Every 500 steps
the whole validation text is scored twice: with the papers' population estimate (50
training batches) and with batch statistics (each evaluation batch normalised with its
own per-step moments); the best checkpoint by the estimate's bpc is tested on the test
text at the end. The paper's Table 2: test bpc 1.38 (LSTM), 1.32 (BN-LSTM), early-stopped
on validation. Sequences longer than trained on (Fig. 3b): `ptb_char_1000_lengths`.
"""

from __future__ import annotations

from typing import Optional

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

VARIANTS = {'lstm': 'LSTM', 'bn_lstm': 'BN-LSTM'}
CHECKPOINTS = (2_000, 5_000, 10_000, 20_000)
#: The metrics of a validation record: the papers' estimate, and batch statistics.
STATISTICS = {'estimate': 'bpc', 'batch': 'bpc_batch'}
PAPER = {'table2_test_bpc': {'lstm': 1.38, 'bn_lstm': 1.32}}


def get_campaign() -> spec.Campaign:
  return spec.Campaign(
      name='ptb_char_1000',
      title='Cooijmans Table 2 / Fig. 3a: character-level PTB, 1000 units, LSTM vs BN-LSTM',
      config='experiments/configs/ptb_char.py',
      arms={v: spec.Arm(config_arg=v, label=label) for v, label in VARIANTS.items()},
      seeds=(0,), parallel=2,
      overrides={'model.forget_bias': 1.0, 'train.num_steps': 20_000, 'eval.every': 500,
                 'eval.compare': ('batch',), 'checkpoint.every': 500, 'checkpoint.keep': 1,
                 'eval.test_at_end': True},
      tables={'milestones': milestones, 'launches': columns.launches_table}, figure=figure,
      setup=setup, paper=PAPER,
      expected='about 14 h of steps on 2 CPU cores (two runs at a time, one core each), '
               'plus a validation every 500 steps; about 10 min on one H200',
      tiny={'train.num_steps': 2, 'model.hidden_size': 8, 'data.seq_length': 20,
            'model.max_length': 20, 'train.batch_size': 8, 'eval.batch_size': 8,
            'eval.every': 2, 'eval.max_batches': 2, 'eval.population_batches': 1,
            'checkpoint.every': 2})


def setup(config) -> str:
  c = config
  return (f'char-level PTB, {c.model.hidden_size} units, batch {c.train.batch_size}, '
          f'T={c.data.seq_length}, Adam {c.optimizer.learning_rate:g}, clip '
          f'{c.optimizer.clip_norm:g}, {c.model.recurrent_init} init, forget bias '
          f'{c.model.forget_bias:g}, gamma {c.model.gamma_init:g}, seed {c.seed}; '
          f'validation every {c.eval.every} steps on the whole validation text with the '
          f"papers' estimate ({c.eval.population_batches} training batches) and with batch "
          'statistics')


def _first_below(records, metric: str, threshold: float) -> Optional[int]:
  for record in columns.split(records, 'valid'):
    if metric in record and record[metric] < threshold:
      return record['step']
  return None


def milestones(result: dict) -> str:
  """Per arm and statistics: validation bpc at 2k/5k/10k/20k steps, the best and its
  step, the test bpc of the best checkpoint (on the estimate's row) beside Table 2, and
  the first step at which the BN-LSTM's validation bpc beats the LSTM's best."""
  runs = {arm: r[0]['records'] for arm, r in columns.runs_by_arm(result).items()}
  paper = result['spec']['paper']['table2_test_bpc']
  lstm_best = columns.best(runs.get('lstm', []), 'valid', 'bpc')
  header = (['run', 'statistics'] + [f'valid @{s // 1000}k' for s in CHECKPOINTS] +
            ['best valid (step)', 'last step', 'test (best)', 'paper test',
             "first step below the LSTM's best"])
  rows = []
  for arm, records in runs.items():
    for statistics, metric in STATISTICS.items():
      if arm == 'lstm' and statistics == 'batch':
        continue          # no statistics: the two coincide
      found = columns.best(records, 'valid', metric)
      last = columns.last(records, 'valid')
      test = columns.last(records, 'test') if statistics == 'estimate' else None
      beats = (_first_below(records, metric, lstm_best['bpc'])
               if lstm_best and arm != 'lstm' else None)
      rows.append(
          [VARIANTS.get(arm, arm), statistics if arm != 'lstm' else 'none'] +
          [columns.fmt(columns.at_step(records, 'valid', metric, s)) for s in CHECKPOINTS] +
          [f"{columns.fmt(found[metric])} ({found['step']})" if found else columns.DASH,
           last['step'] if last else columns.DASH,
           columns.fmt(test['bpc']) if test else columns.DASH,
           columns.fmt(paper[arm]) if statistics == 'estimate' else columns.DASH,
           beats if beats is not None else columns.DASH])
  return columns.markdown(header, rows)


def figure(result: dict, output: str) -> None:
  styles = {'estimate': '-', 'batch': ':'}
  colors = {'lstm': 'tab:orange', 'bn_lstm': 'tab:blue'}
  series = []
  for arm, runs in columns.runs_by_arm(result).items():
    for statistics, metric in STATISTICS.items():
      if arm == 'lstm' and statistics == 'batch':
        continue
      steps, values = columns.curve(runs[0]['records'], 'valid', metric)
      name = VARIANTS.get(arm, arm) + ('' if arm == 'lstm' else f', {statistics}')
      series.append((name, steps, values,
                     dict(linestyle=styles[statistics], color=colors.get(arm), marker='.')))
  plot.plot_curves(series, output, ylabel='validation bits per character',
                   xlabel='training step', title='Character-level PTB, 1000 units')
