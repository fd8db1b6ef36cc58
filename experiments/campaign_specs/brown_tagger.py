r"""Laurent et al. sec. 5.1 (Fig. 1, Table 1) on Brown POS tagging: BL vs BN vs frame-wise BN.

  python -m experiments.campaign run brown_tagger --parallel=2
  python -m experiments.campaign speed brown_tagger     # the table's steps/s column
  python -m experiments.campaign collect brown_tagger
  python -m experiments.campaign report brown_tagger    # the README's table
  python -m experiments.campaign report brown_tagger --figure=experiments/results/brown_tagger.png

Expected: about 25 minutes on 2 CPU cores (AMD EPYC VM, one XLA thread per run, two at a
time; the three runs' own clocks sum to 50 min); the speed table about 3 minutes. BN (sequence-wise) reaches in
300 steps what the baseline reaches in ~1,250, and ends at valid FER 0.097 against 0.187;
only BN beats the most-frequent-tag baseline (0.108).

Laurent's speech setup transposed (`experiments/configs/brown_tagger.py`): token
embeddings play the frames, 2 x 64 bidirectional LSTMs, Glorot weights, zero biases, SGD
momentum 0.9, no clipping, BN on W_x x only; lr 0.1, batch 32, 1,500 steps for every
variant. "Train" FCE/FER are measured like validation (population statistics) on a fixed
subset of 2,000 training sentences; the test FER is that of the checkpoint with the best
validation FCE. Baselines from the data: the majority tag, and each word's most frequent
training tag (unknown words: the majority tag). Laurent's Table 1 (WSJ, 5 x 250 units)
is recorded beside them; it is not comparable in level.
"""

import collections

import numpy as np

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

VARIANTS = ('lstm', 'bn_input_only_seq', 'bn_input_only')
LABELS = {'lstm': 'BL (LSTM)', 'bn_input_only_seq': 'BN (sequence-wise)',
          'bn_input_only': 'BN (frame-wise)'}
COLORS = {'lstm': 'tab:blue', 'bn_input_only_seq': 'tab:red', 'bn_input_only': 'tab:green'}
# Laurent et al. 2016, Table 1 (WSJ): best FCE and FER on training and development sets.
PAPER = {'lstm': {'train_fce': 0.95, 'train_fer': 0.28, 'dev_fce': 1.11, 'dev_fer': 0.33},
         'bn_input_only_seq': {'train_fce': 0.73, 'train_fer': 0.22, 'dev_fce': 1.19,
                               'dev_fer': 0.34}}


def get_campaign() -> spec.Campaign:
  return spec.Campaign(
      name='brown_tagger',
      title='Brown POS tagging, 2 x 64 BiLSTM: BL vs sequence-wise vs frame-wise BN',
      config='experiments/configs/brown_tagger.py',
      arms={v: spec.Arm(config_arg=v, label=LABELS[v]) for v in VARIANTS},
      seeds=(0,), parallel=2,
      tables={'table1': table1}, figure=figure, baselines=baselines,
      paper={'table1_wsj': PAPER},
      expected='about 25 min on 2 CPU cores (AMD EPYC VM; one XLA thread per run, 2 at a '
               'time; the runs\' clocks sum to 50 min)',
      tiny={'train.num_steps': 2, 'model.hidden_size': 4, 'model.embed_size': 4,
            'model.num_layers': 1, 'train.batch_size': 2, 'eval.batch_size': 2,
            'eval.population_batches': 1, 'data.buckets': (8,), 'data.train_eval_size': 2,
            'data.min_count': 1},
      speed=spec.Speed(
          name='brown_tagger_speed', arms=VARIANTS, steps=20, rounds=5,
          what='one training step of brown_tagger.py (batch 32, the first 20 batches)',
          tables={'speed': speed_table},
          expected='about 3 min on 2 CPU cores (AMD EPYC VM, one XLA thread; 2.5 min of '
                   'it compiling)'))


def baselines(config) -> dict:
  """Frame error rates of the majority tag and of each word's most frequent tag, and the
  data's sizes."""
  from bn_rnn_jax.input_pipeline import tagging  # pylint: disable=g-import-not-at-top
  dataset = tagging.get_dataset(config)
  inputs, labels, _ = dataset.splits['train']
  counts = np.bincount(np.concatenate(labels), minlength=dataset.num_classes)
  majority = int(counts.argmax())
  per_word = collections.defaultdict(collections.Counter)
  for ids, tags in zip(inputs, labels):
    for w, t in zip(ids.tolist(), tags.tolist()):
      per_word[w][t] += 1
  best = {w: c.most_common(1)[0][0] for w, c in per_word.items() if w != 0}
  out = {'majority_tag': dataset.tags[majority],
         'data': {'sentences': {s: dataset.num_sequences(s) for s in dataset.splits},
                  'dropped_train_sentences': dataset.num_dropped,
                  'vocab': len(dataset.vocab), 'tags': len(dataset.tags)}}
  for split in ('valid', 'test'):
    ids = np.concatenate(dataset.splits[split][0])
    gold = np.concatenate(dataset.splits[split][1])
    guess = np.array([best.get(w, majority) for w in ids.tolist()])
    out[split] = {'majority_fer': float(np.mean(gold != majority)),
                  'word_tag_fer': float(np.mean(guess != gold))}
  return out


def _lowest(records, split, key):
  found = columns.best(records, split, key, 'min')
  return found and found[key]


def table1(result: dict) -> str:
  """Best values over the run (Table 1's manner), the test FER of the best-validation-FCE
  checkpoint, steps/s from the speed JSON, and the data's baselines."""
  speed = result.get('speed', {}).get('arms', {})
  rows = []
  for arm, runs in columns.runs_by_arm(result).items():
    records = runs[0]['records']
    test = columns.last(records, 'test')
    rate = speed.get(arm, {}).get('wall_s_per_step')
    rows.append([columns.label(result, arm)] + [
        columns.fmt(_lowest(records, split, key)) for split, key in (
            ('train_eval', 'loss'), ('train_eval', 'fer'), ('valid', 'loss'), ('valid', 'fer'))
    ] + [f"{test['fer']:.3f} ({test['checkpoint_step']})",
         f'{1.0 / rate:.1f}' if rate else 'n/a'])
  base = result['baselines']
  rows.append(['most frequent tag of each word', '', '', '',
               f"{base['valid']['word_tag_fer']:.3f}", f"{base['test']['word_tag_fer']:.3f}",
               ''])
  rows.append([f"majority tag (`{base['majority_tag']}`)", '', '', '',
               f"{base['valid']['majority_fer']:.3f}", f"{base['test']['majority_fer']:.3f}",
               ''])
  return columns.markdown(['model', 'train FCE', 'train FER', 'valid FCE', 'valid FER',
                          'test FER (step)', 'steps/s'], rows)


def figure(result: dict, output: str) -> None:
  series = []
  for arm, runs in columns.runs_by_arm(result).items():
    for split, style, what in (('train_eval', ':', 'train'), ('valid', '-', 'valid')):
      steps, values = columns.curve(runs[0]['records'], split, 'loss')
      series.append((f'{columns.label(result, arm)} {what}', steps, values,
                     dict(linestyle=style, color=COLORS.get(arm))))
  plot.plot_curves(series, output, xlabel='training step (batch 32)',
                   ylabel='frame cross-entropy (nats)', size=(7, 4.5), legend_size=8,
                   ylim=(0, None), dpi=100,
                   title='Brown POS tagging, 2 x 64 bidirectional LSTM\n'
                         '(dotted: training subset, solid: validation; population '
                         'statistics)')


def speed_table(speed: dict) -> str:
  """Steps/s and CPU time per step, and each variant's CPU time over the baseline's."""
  arms = speed['arms']
  first = next(iter(arms.values()))
  rows = [[LABELS.get(arm, arm), f"{1.0 / r['wall_s_per_step']:.1f}",
           f"{1000 * r['cpu_s_per_step']:.1f}",
           f"{r['cpu_s_per_step'] / first['cpu_s_per_step']:.2f}"] for arm, r in arms.items()]
  return columns.markdown(['model', 'steps/s', 'CPU ms per step', '× BL (CPU)'], rows)
