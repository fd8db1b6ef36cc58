r"""Laurent et al. (2016) Table 2 on word-level PTB: train, then compare with the paper.

Train one variant (resumable: run the same command again to continue):
  python experiments/ptb_word_reproduce.py --size=small --variant=lstm \
      --workdir=/tmp/runs/ptb_word_small/lstm
Summarise finished (or running) workdirs next to the paper's Table 2:
  python experiments/ptb_word_reproduce.py --size=small --report \
      --workdirs=/tmp/runs/ptb_word_small/lstm,/tmp/runs/ptb_word_small/bn_input_only \
      --output=experiments/results/ptb_word_small

Training is `loop.train_and_evaluate` with `experiments/configs/ptb_word.py` (the same as
`experiments/main.py --config=experiments/configs/ptb_word.py:small`), including Zaremba
et al.'s initialisation of every parameter from U(-s, s) (`config.model.uniform_init_scale`,
`train.uniform_init`; batch-norm scales keep their initial gamma).

The report gives, per run, the best training perplexity (exp of an epoch's mean training
loss) and the best validation perplexity (population statistics), with their epochs, in
`<output>.json`, and the curves in `<output>.png`.
"""

import json
import math
import os
import sys

from absl import app
from absl import flags
from absl import logging

from bn_rnn_jax import metric_writer
from bn_rnn_jax import loop

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs'))
import ptb_word  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_enum('size', 'small', sorted(ptb_word.SIZES), 'Model size (Laurent sec. 5.2).')
flags.DEFINE_enum('variant', 'lstm', ptb_word.VARIANTS, 'RNN variant.')
flags.DEFINE_string('workdir', None, 'Run directory (training).')
flags.DEFINE_string('data_path', None, 'PTB folder (default: the config\'s).')
flags.DEFINE_integer('num_epochs', 0, 'Override the number of epochs (0 = the paper\'s).')
flags.DEFINE_bool('report', False, 'Summarise --workdirs instead of training.')
flags.DEFINE_list('workdirs', [], 'Runs to summarise (--report).')
flags.DEFINE_string('output', None, 'Report path prefix: writes <output>.json, .png.')

# Laurent et al. 2016, Table 2: best perplexity (train, valid).
PAPER = {
    ('small', 'lstm'): (78.5, 119.2), ('small', 'bn_input_only'): (62.5, 120.9),
    ('medium', 'lstm'): (49.1, 89.0), ('medium', 'bn_input_only'): (41.0, 90.6),
    ('large', 'lstm'): (49.3, 81.8), ('large', 'bn_input_only'): (35.0, 97.4),
}
def make_config(size: str, variant: str, data_path=None, num_epochs: int = 0):
  config = ptb_word.get_config(size)
  config.model.variant = variant
  if data_path:
    config.data.path = data_path
  if num_epochs:
    config.train.num_steps = num_epochs * config.train.log_every
  return config


# ------------------------------------------------------------------ report
def summarise(workdir: str) -> dict:
  """Best train / valid perplexity (and epochs) of one run's metrics.jsonl."""
  records = metric_writer.read_metrics(workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  epoch = config['train']['log_every']
  train_ppl = [(r['step'] // epoch, math.exp(r['loss'])) for r in records
               if r['split'] == 'train']
  valid_ppl = [(r['step'] // epoch, r['perplexity']) for r in records
               if r['split'] == 'valid']
  # The run's last two path parts only: results carry no paths of this machine.
  out = {'run': '/'.join(os.path.normpath(workdir).split(os.sep)[-2:]), 'variant': config['model']['variant'],
         'epochs_done': max([e for e, _ in train_ppl], default=0),
         'epochs_planned': config['train']['num_steps'] // epoch,
         'train_perplexity': train_ppl, 'valid_perplexity': valid_ppl}
  if train_ppl:
    out['best_train'] = min(train_ppl, key=lambda x: x[1])
  if valid_ppl:
    out['best_valid'] = min(valid_ppl, key=lambda x: x[1])
    out['train_at_best_valid'] = dict(train_ppl).get(out['best_valid'][0])
  tests = [r for r in records if r['split'] == 'test']
  if tests:  # scored at the end on the best checkpoint
    out['test_perplexity'] = tests[-1]['perplexity']
    out['test_checkpoint_step'] = tests[-1].get('checkpoint_step')
  times = [r['time_s'] for r in records if 'time_s' in r]
  if times:
    out['wall_time_s'] = max(times)
  return out


def report(size: str, workdirs, output: str) -> dict:
  runs = [summarise(w) for w in workdirs]
  table = []
  for run in runs:
    paper = PAPER.get((size, run['variant']))
    table.append({
        'variant': run['variant'], 'epochs': f"{run['epochs_done']}/{run['epochs_planned']}",
        'best_train_ppl': run.get('best_train', (None, None))[1],
        'best_valid_ppl': run.get('best_valid', (None, None))[1],
        'best_valid_epoch': run.get('best_valid', (None, None))[0],
        'train_ppl_at_best_valid': run.get('train_at_best_valid'),
        'test_ppl_best_checkpoint': run.get('test_perplexity'),
        'paper_train_ppl': paper[0] if paper else None,
        'paper_valid_ppl': paper[1] if paper else None,
        'wall_time_s': run.get('wall_time_s')})
  result = {'size': size, 'table': table, 'runs': runs}
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output + '.json', 'w') as f:
    json.dump(result, f, indent=1)

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for run, color in zip(runs, ('tab:blue', 'tab:red', 'tab:green')):
    for key, style in (('train_perplexity', ':'), ('valid_perplexity', '-')):
      if run[key]:
        epochs, values = zip(*run[key])
        ax.plot(epochs, values, style, color=color, marker='.',
                label=f"{run['variant']} ({key.split('_')[0]})")
  ax.set_yscale('log')
  ax.set_xlabel('epoch')
  ax.set_ylabel('perplexity')
  ax.set_title(f'PTB words, {size} (Laurent et al. 2016 sec. 5.2)')
  ax.grid(True, which='both', alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(output + '.png', dpi=120)
  plt.close(fig)
  for row in table:
    print(json.dumps(row))
  return result


def main(argv):
  del argv
  if FLAGS.report:
    if not FLAGS.workdirs or not FLAGS.output:
      raise app.UsageError('--report needs --workdirs and --output.')
    report(FLAGS.size, FLAGS.workdirs, FLAGS.output)
    return
  if not FLAGS.workdir:
    raise app.UsageError('--workdir is required for training.')
  config = make_config(FLAGS.size, FLAGS.variant, FLAGS.data_path, FLAGS.num_epochs)
  logging.info('Config:\n%s', config)
  loop.train_and_evaluate(config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main)
