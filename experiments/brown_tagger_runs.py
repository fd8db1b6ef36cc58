r"""Laurent et al. sec. 5.1 (Fig. 1, Table 1) on Brown POS tagging: BL vs BN vs frame-wise BN.

Train one variant (resumable: the same command continues a stopped run):
  XLA_FLAGS='--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1' \
  python experiments/brown_tagger_runs.py --variant=lstm --workdir=/tmp/brown/lstm
(likewise `bn_input_only_seq`, `bn_input_only`; `--num_steps` overrides the budget).
Measure the variants' training speed in one process (interleaved rounds):
  python experiments/brown_tagger_runs.py --speed --output=experiments/results/brown_tagger
Summarise the runs (reads `<output>_speed.json` if it is there):
  python experiments/brown_tagger_runs.py --report \
      --workdirs=/tmp/brown/lstm,/tmp/brown/bn_input_only_seq,/tmp/brown/bn_input_only \
      --output=experiments/results/brown_tagger

Training is `loop.train_and_evaluate` with `experiments/configs/brown_tagger.py`. The
report writes `<output>.json` (curves, a Table-1-like summary, baselines, speed) and
`<output>.png` (FCE against steps in the manner of Laurent Fig. 1: dotted = training,
solid = validation). Training FCE is measured like validation, with population statistics,
on a fixed subset of 2,000 training sentences (split 'train_eval'); the running
training loss (batch statistics) is in the JSON too.

Baselines from the data: the majority tag, and the per-word most frequent training tag
(unknown words: the majority tag), as frame error rates.
"""

import collections
import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax import checkpoint
from bn_rnn_jax import metric_writer
from bn_rnn_jax import loop
from bn_rnn_jax.input_pipeline import tagging

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs'))
import brown_tagger  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_enum('variant', 'lstm', brown_tagger.VARIANTS, 'RNN variant.')
flags.DEFINE_string('workdir', None, 'Run directory (training).')
flags.DEFINE_string('data_path', None, 'Brown folder (default: the config\'s).')
flags.DEFINE_integer('num_steps', 0, 'Override the training steps (0 = the config\'s).')
flags.DEFINE_bool('speed', False, 'Measure steps/s of the variants in one process.')
flags.DEFINE_integer('speed_rounds', 5, 'Interleaved rounds of --speed.')
flags.DEFINE_integer('speed_steps', 20, 'Training steps per variant and round.')
flags.DEFINE_bool('report', False, 'Summarise --workdirs instead of training.')
flags.DEFINE_list('workdirs', [], 'Runs to summarise (--report).')
flags.DEFINE_string('output', None, 'Path prefix: writes <output>.json/.png (report), '
                    '<output>_speed.json (speed).')

LABELS = {'lstm': 'BL (LSTM)', 'bn_input_only_seq': 'BN (sequence-wise)',
          'bn_input_only': 'BN (frame-wise)'}
COLORS = {'lstm': 'tab:blue', 'bn_input_only_seq': 'tab:red', 'bn_input_only': 'tab:green'}
MACHINE = '2-core shared CPU VM, one XLA thread per process'


def make_config(variant: str, data_path=None, num_steps: int = 0):
  config = brown_tagger.get_config()
  config.model.variant = variant
  if data_path:
    config.data.path = data_path
  if num_steps:
    config.train.num_steps = num_steps
  return config


# ---------------------------------------------------------------------- baselines
def baselines(dataset) -> dict:
  """Frame error rates of the majority tag and of each word's most frequent tag."""
  inputs, labels, _ = dataset.splits['train']
  counts = np.bincount(np.concatenate(labels), minlength=dataset.num_classes)
  majority = int(counts.argmax())
  per_word = collections.defaultdict(collections.Counter)
  for ids, tags in zip(inputs, labels):
    for w, t in zip(ids.tolist(), tags.tolist()):
      per_word[w][t] += 1
  best = {w: c.most_common(1)[0][0] for w, c in per_word.items() if w != 0}
  out = {'majority_tag': dataset.tags[majority]}
  for split in ('valid', 'test'):
    ids = np.concatenate(dataset.splits[split][0])
    gold = np.concatenate(dataset.splits[split][1])
    guess = np.array([best.get(w, majority) for w in ids.tolist()])
    out[split] = {'majority_fer': float(np.mean(gold != majority)),
                  'word_tag_fer': float(np.mean(guess != gold))}
  return out


# ---------------------------------------------------------------------- speed
def measure_speed(data_path=None, rounds: int = 5, steps: int = 20) -> dict:
  """Training steps/s and process CPU s/step of each variant, in one process, on the
  same batches, interleaved in rounds (the machine's load drifts; medians over rounds)."""
  import jax  # pylint: disable=g-import-not-at-top
  dataset = tagging.get_dataset(make_config('lstm', data_path))
  trainers, states = {}, {}
  first = {}
  for variant in brown_tagger.VARIANTS:
    config = make_config(variant, data_path)
    config.train.num_devices = 1
    trainers[variant] = trainer = loop.Trainer(config, None, dataset)
    states[variant] = trainer.to_devices(trainer.initial_state())
  # The same `steps` batches for every variant, every round; compile their shapes first.
  batches = [trainers['lstm'].train_batch(s) for s in range(steps)]
  for variant, trainer in trainers.items():
    t0 = time.time()
    for batch in batches:
      states[variant], m = trainer.p_train_step(states[variant], batch)
    jax.block_until_ready(m)
    first[variant] = time.time() - t0
  wall = {v: [] for v in trainers}
  cpu = {v: [] for v in trainers}
  for _ in range(rounds):
    for variant, trainer in trainers.items():
      t0, c0 = time.time(), time.process_time()
      for batch in batches:
        states[variant], m = trainer.p_train_step(states[variant], batch)
      jax.block_until_ready(m)
      wall[variant].append((time.time() - t0) / steps)
      cpu[variant].append((time.process_time() - c0) / steps)
  lengths = collections.Counter(int(b['inputs'].shape[-1]) for b in batches)
  result = {'machine': MACHINE, 'rounds': rounds, 'steps_per_round': steps,
            'batch_lengths': {str(k): v for k, v in sorted(lengths.items())},
            'variants': {}}
  for variant in trainers:
    s = float(np.median(wall[variant]))
    result['variants'][variant] = {
        'steps_per_s': 1.0 / s, 'cpu_s_per_step': float(np.median(cpu[variant])),
        'steps_per_s_rounds': [1.0 / w for w in wall[variant]],
        'first_pass_s_incl_compile': first[variant],
        'relative_to_lstm': float(np.median(wall['lstm'])) / s}
  return result


# ---------------------------------------------------------------------- report
def summarise(workdir: str) -> dict:
  with open(os.path.join(workdir, 'config.json')) as f:
    variant = json.load(f)['model']['variant']
  records = metric_writer.read_metrics(workdir)
  curves = collections.defaultdict(list)
  for r in records:
    curves[r['split']].append({k: r[k] for k in ('step', 'loss', 'fer') if k in r})
  def best(split, name):
    values = [r[name] for r in curves[split]]
    return min(values) if values else None
  valid = curves['valid']
  best_valid = min(valid, key=lambda r: r['loss']) if valid else None
  test = [r for r in records if r['split'] == 'test']
  return {
      'variant': variant, 'label': LABELS.get(variant, variant),
      'steps': max((r['step'] for r in records), default=0),
      'best': {'train_fce': best('train_eval', 'loss'), 'train_fer': best('train_eval', 'fer'),
               'valid_fce': best('valid', 'loss'), 'valid_fer': best('valid', 'fer'),
               'running_train_fce': best('train', 'loss')},
      'early_stopped_step': best_valid and best_valid['step'],
      'test_fer': test[-1]['fer'] if test else None,
      'test_fce': test[-1]['loss'] if test else None,
      'test_checkpoint_step': test[-1].get('checkpoint_step') if test else None,
      'wall_s': max((r.get('time_s', 0.0) for r in records), default=0.0),
      'curves': {split: curves[split] for split in ('train', 'train_eval', 'valid')},
  }


def plot(runs: list, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for run in runs:
    color = COLORS.get(run['variant'])
    for split, style, what in (('train_eval', ':', 'train'), ('valid', '-', 'valid')):
      points = run['curves'][split]
      ax.plot([p['step'] for p in points], [p['loss'] for p in points], style, color=color,
              label=f"{run['label']} {what}")
  ax.set_xlabel('training step (batch 32)')
  ax.set_ylabel('frame cross-entropy (nats)')
  ax.set_title('Brown POS tagging, 2 x 64 bidirectional LSTM\n'
               '(dotted: training subset, solid: validation; population statistics)')
  ax.set_ylim(0, None)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def report(workdirs, output: str, data_path=None) -> dict:
  runs = [summarise(w) for w in workdirs]
  dataset = tagging.get_dataset(make_config('lstm', data_path))
  result = {
      'task': 'Brown POS tagging (Laurent et al. 2016 sec. 5.1 transposed)',
      'config': 'experiments/configs/brown_tagger.py',
      'data': {'sentences': {s: dataset.num_sequences(s) for s in dataset.splits},
               'dropped_train_sentences': dataset.num_dropped,
               'vocab': len(dataset.vocab), 'tags': len(dataset.tags)},
      'baselines': baselines(dataset),
      'machine': MACHINE,
      'runs': runs,
  }
  speed_path = f'{output}_speed.json'
  if os.path.exists(speed_path):
    with open(speed_path) as f:
      result['speed'] = json.load(f)
  with open(f'{output}.json', 'w') as f:
    json.dump(result, f, indent=1)
  plot(runs, f'{output}.png')
  print(table(result))
  return result


def table(result) -> str:
  speed = result.get('speed', {}).get('variants', {})
  lines = ['| model | train FCE | train FER | valid FCE | valid FER | test FER (early-stopped '
           'at step) | steps/s |', '|---|---|---|---|---|---|---|']
  for run in result['runs']:
    b = run['best']
    rate = speed.get(run['variant'], {}).get('steps_per_s')
    rate = f'{rate:.2f}' if rate else 'n/a'
    lines.append(
        f"| {run['label']} | {b['train_fce']:.3f} | {b['train_fer']:.3f} | "
        f"{b['valid_fce']:.3f} | {b['valid_fer']:.3f} | {run['test_fer']:.3f} "
        f"({run['test_checkpoint_step']}) | {rate} |")
  base = result['baselines']
  lines.append(f"| most frequent tag per word | | | | {base['valid']['word_tag_fer']:.3f} | "
               f"{base['test']['word_tag_fer']:.3f} | |")
  lines.append(f"| majority tag ({base['majority_tag']}) | | | | "
               f"{base['valid']['majority_fer']:.3f} | {base['test']['majority_fer']:.3f} | |")
  return '\n'.join(lines)


def main(argv):
  del argv
  checkpoint.quiet_orbax_logs()
  if FLAGS.report or FLAGS.speed:
    if not FLAGS.output:
      raise app.UsageError('--report and --speed need --output.')
    if FLAGS.speed:
      result = measure_speed(FLAGS.data_path, FLAGS.speed_rounds, FLAGS.speed_steps)
      with open(f'{FLAGS.output}_speed.json', 'w') as f:
        json.dump(result, f, indent=1)
      print(json.dumps(result['variants'], indent=1))
    if FLAGS.report:
      report(FLAGS.workdirs, FLAGS.output, FLAGS.data_path)
    return
  if not FLAGS.workdir:
    raise app.UsageError('--workdir is required for training.')
  config = make_config(FLAGS.variant, FLAGS.data_path, FLAGS.num_steps)
  logging.info('Training %s for %d steps in %s', FLAGS.variant, config.train.num_steps,
               FLAGS.workdir)
  loop.train_and_evaluate(config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main)
