"""What the Attentive Reader campaigns share: arms, baselines, table, figure, speed.

Not a campaign itself (`NAMES` leaves it out): `attentive_reader_long.py`,
`attentive_reader_1200.py` and `attentive_reader_200.py` differ in budget, arms and seeds.

Every run is `experiments/configs/attentive_reader.py:<variant>,cpu` on brown_cloze_large
(the reduced CPU size: 64 units, 10,000 symbols, batches inside 8 document-length
groups). The controls train the LSTM and BN-LSTM with BN-e*'s learning rate and batch
(8e-4, 40), separating their effect from that of batch norm.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from experiments.campaign import spec
from experiments.campaign import columns

CONFIG = 'experiments/configs/attentive_reader.py'
VARIANTS = ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star', 'bn_e_star_star',
            'lstm_bidirectional')
LABELS = {'lstm': 'LSTM', 'bn_lstm': 'BN-LSTM', 'bn_everywhere': 'BN-everywhere',
          'bn_e_star': 'BN-e*', 'bn_e_star_star': 'BN-e**',
          'lstm_bidirectional': 'LSTM bidirectional',
          'lstm_lr8e-4_b40': 'LSTM, lr 8e-4, batch 40 (control)',
          'bn_lstm_lr8e-4_b40': 'BN-LSTM, lr 8e-4, batch 40 (control)'}
CONTROL = {'optimizer.learning_rate': 8e-4, 'train.batch_size': 40}
ARMS = {**{v: spec.Arm(f'{v},cpu', label=LABELS[v]) for v in VARIANTS},
        'lstm_lr8e-4_b40': spec.Arm('lstm,cpu', CONTROL, LABELS['lstm_lr8e-4_b40']),
        'bn_lstm_lr8e-4_b40': spec.Arm('bn_lstm,cpu', CONTROL,
                                       LABELS['bn_lstm_lr8e-4_b40'])}
# Cooijmans et al. 2016: Fig. 4a validation-error minima (CNN, 4-sentence contexts), and
# Table 4 test errors on the full CNN task.
PAPER = {'fig4a_min_valid_error': {'lstm': 0.503, 'bn_lstm': 0.495, 'bn_everywhere': 0.500,
                                   'bn_e_star': 0.471, 'bn_e_star_star': 0.439},
         'table4_test_error': {'lstm': 0.450, 'bn_e_star_star': 0.363},
         'note': 'CNN corpus, 240 units (120 for BN-e** in Table 4); not comparable in '
                 'level with brown_cloze_large'}
SMOOTH = 5         # training accuracy: running mean over this many logged windows
PLOT_SMOOTH = 20   # training-cost curves of the figure: the same over more windows
TINY = {'train.num_steps': 2, 'model.hidden_size': 4, 'model.embed_size': 3,
        'train.batch_size': 8, 'eval.batch_size': 8, 'eval.population_batches': 1,
        'data.vocab_size': 0, 'data.length_multiple': 32, 'data.length_groups': 1}


def campaign(name: str, title: str, arms: Sequence[str], seeds: Sequence[int],
             overrides: Mapping[str, Any], expected: str, **kwargs) -> spec.Campaign:
  return spec.Campaign(
      name=name, title=title, config=CONFIG, arms={a: ARMS[a] for a in arms}, seeds=seeds,
      overrides=overrides, parallel=2, tables={'table': table}, figure=figure,
      baselines=baselines, paper=PAPER, expected=expected, tiny=TINY, **kwargs)


def baselines(config) -> dict:
  """Error rates of the data's frequency baselines (`reading.frequency_baselines`) per
  split: most frequent entity, exclusive frequency, random candidate."""
  from bn_rnn_jax import input_pipeline  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.input_pipeline import reading  # pylint: disable=g-import-not-at-top
  data = config.data
  arrays = reading.load(input_pipeline.resolve_path(data, 'path'), data.vocab_size,
                        data.top_k_sentences, data.get('cache_dir') or None)
  return {split: {k: 1.0 - v for k, v in reading.frequency_baselines(arrays, split).items()}
          for split in ('train', 'valid', 'test')}


# ---------------------------------------------------------------------- table
def summarize(records: Sequence[dict], baseline_errors: dict) -> dict:
  """One run's columns: best validation error, test error of the best checkpoint,
  steps/s, gradient norms, and where it leaves the most-frequent-entity plateau."""
  train = columns.split(records, 'train')
  valid = columns.split(records, 'valid')
  test = columns.last(records, 'test')
  steps = [r['step'] for r in train]
  out = {'complete': test is not None, 'last_train_step': steps[-1] if steps else 0,
         'best_valid_error': None, 'test_error': test and test['error'],
         'steps_per_second': columns.train_steps_per_second(records)}
  if valid:
    best = int(np.argmin([r['error'] for r in valid]))
    out['best_valid_error'] = valid[best]['error']
  norms = [r['grad_norm'] for r in train]
  out['grad_norm'] = (float(np.median(norms)), float(np.max(norms))) if norms else None
  out['train_passes'] = columns.first_past(
      steps, columns.smooth([r['accuracy'] for r in train], SMOOTH),
      1.0 - baseline_errors['train']['most_frequent'])
  out['valid_below'] = columns.first_past(
      [r['step'] for r in valid], [r['error'] for r in valid],
      baseline_errors['valid']['most_frequent'], above=False)
  return out


def table(result: dict) -> str:
  """Per arm: seeds, best valid and test errors per seed, steps/s, where training leaves
  the plateau, gradient norms, the paper's numbers; then the data's baselines."""
  pct = lambda v: columns.DASH if v is None else f'{100 * v:.1f}'
  base = result['baselines']
  paper = result['spec']['paper']
  rows = []
  for arm, runs in columns.runs_by_arm(result).items():
    s = [summarize(r['records'], base) for r in runs]
    stopped = [f"seed {r['seed']} stopped; last log at step {x['last_train_step']}"
               for r, x in zip(runs, s) if not x['complete']]
    rates = [x['steps_per_second'] for x in s if x['steps_per_second']]
    rows.append([
        columns.label(result, arm),
        f"{len(runs)}{' (' + '; '.join(stopped) + ')' if stopped else ''}",
        ' / '.join(pct(x['best_valid_error']) for x in s if x['best_valid_error'] is not None),
        ' / '.join(pct(x['test_error']) for x in s if x['test_error'] is not None),
        f'{float(np.mean(rates)):.2f}' if rates else columns.DASH,
        ', '.join(str(x['train_passes'] or 'never') for x in s),
        ', '.join(str(x['valid_below'] or 'never') for x in s),
        ', '.join(f"{x['grad_norm'][0]:.2g} / {x['grad_norm'][1]:.2g}" if x['grad_norm']
                  else columns.DASH for x in s),
        pct(paper['fig4a_min_valid_error'].get(arm)),
        pct(paper['table4_test_error'].get(arm))])
  for name, what in (('most_frequent', 'most frequent entity'),
                     ('exclusive_frequency', 'exclusive frequency'),
                     ('random_candidate', 'random candidate (expected)')):
    rows.append([f'*{what}*', columns.DASH, pct(base['valid'][name]), pct(base['test'][name])]
                + [columns.DASH] * 6)
  return columns.markdown(
      ['variant', 'seeds', 'best valid error % (per seed)',
       'test error % of the best-valid checkpoint', 'steps/s',
       'train acc. passes most-frequent (step, per seed)',
       'valid error below most-frequent (step, per seed)',
       'gradient norm before clipping (median / max of the 10-step means)',
       'paper Fig. 4a min valid %', 'paper Table 4 test %'], rows)


# ---------------------------------------------------------------------- figure
def figure(result: dict, output: str) -> None:
  """Training cost and validation error against steps, every arm and seed (Fig. 4a's
  manner), with the data's baselines."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax_cost, ax_valid) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = dict(zip(ARMS, plt.rcParams['axes.prop_cycle'].by_key()['color']))
  for arm, runs in columns.runs_by_arm(result).items():
    for i, run in enumerate(runs):
      style = dict(color=colors.get(arm), alpha=0.9 if i == 0 else 0.5,
                   linestyle='-' if i == 0 else '--',
                   label=columns.label(result, arm) if i == 0 else None)
      steps, loss = columns.curve(run['records'], 'train', 'loss')
      ax_cost.plot(steps, columns.smooth(loss, PLOT_SMOOTH), **style)
      ax_valid.plot(*columns.curve(run['records'], 'valid', 'error'), marker='.', **style)
  for name, what, style in (('most_frequent', 'most frequent entity', ':'),
                            ('exclusive_frequency', 'exclusive frequency', '-.'),
                            ('random_candidate', 'random candidate', '--')):
    ax_valid.axhline(result['baselines']['valid'][name], color='gray', linestyle=style,
                     linewidth=1, label=f'{what} (valid)')
  ax_cost.set(xlabel='training step',
              ylabel=f'training cost (nats; mean of the last {PLOT_SMOOTH} logs of 10 steps)',
              title='Training cost (seed 0 solid, seed 1 dashed)')
  ax_valid.set(xlabel='training step', ylabel='validation error',
               title='Validation error (population statistics)')
  ax_cost.legend(fontsize=8)
  ax_valid.legend(fontsize=7)
  fig.suptitle('Attentive Reader on brown_cloze_large (reduced size, CPU): manner of '
               'Cooijmans et al. Fig. 4a', fontsize=10)
  fig.tight_layout()
  fig.savefig(output, dpi=110)
  plt.close(fig)


# ---------------------------------------------------------------------- speed
def speed_batches(dataset, steps: int) -> list:
  """The same batch every step: the first training batch whose documents are 128 long."""
  for step in range(1000):
    batch = dataset.train_batch(step)
    if batch['inputs']['document'].shape[1] == 128:
      return [batch] * steps
  batch = dataset.train_batch(0)   # data without such documents (the tests' fixtures)
  return [batch] * steps


def speed_table(speed: dict) -> str:
  arms = speed['arms']
  lstm = arms['lstm']['cpu_s_per_step']
  rows = [[LABELS[arm], f"{1.0 / r['cpu_s_per_step']:.1f}",
           f"{r['cpu_s_per_step'] / lstm:.2f}", f"{1.0 / r['wall_s_per_step']:.1f}"]
          for arm, r in arms.items()]
  return columns.markdown(['variant', 'steps per CPU second', 'CPU time per step vs LSTM',
                          'steps/s wall'], rows)
