r"""Quickstart: LSTM vs BN-LSTM, same budget, real data, offline, CPU-friendly.

  python experiments/quickstart.py --workdir /tmp/quickstart

Trains each variant of `config.variants` (default: lstm, bn_lstm) on scikit-learn's 8x8
digits read pixel by pixel (64 steps), prints a table (steps, validation accuracy with
population statistics, wall time) and writes `<workdir>/learning_curves.png`. About a
minute on 2 CPU cores. Sequential MNIST at 14x14 (196 steps) instead:

  python experiments/quickstart.py --workdir /tmp/quickstart_mnist \
      --config.data.name=mnist --config.data.mnist_dir=/path/to/mnist \
      --config.train.num_steps=600

Each variant runs in `<workdir>/<variant>`; a second invocation resumes (or just
re-reads finished runs). `--results=experiments/results/quickstart_digits.json` also writes
the table's numbers (no paths), which `python experiments/report.py quickstart_digits`
prints as the README's table.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bn_rnn_jax import checkpoint
from bn_rnn_jax import metric_writer
from bn_rnn_jax import loop

# plot.py sits beside this file (importable however this script is started).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot  # pylint: disable=g-import-not-at-top,wrong-import-position
import report  # pylint: disable=g-import-not-at-top,wrong-import-position

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs',
                               'quickstart.py')
FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', _DEFAULT_CONFIG, 'Quickstart config file.')
flags.DEFINE_string('workdir', '/tmp/quickstart', 'Directory for the runs and the plot.')
flags.DEFINE_string('results', None, 'Also write the table as JSON here (e.g. under '
                    'experiments/results/).')


def run_variant(config, variant: str, workdir: str) -> float:
  """Train one variant in `workdir`; returns the wall time of this call in seconds."""
  config = config.copy_and_resolve_references()
  config.model.variant = variant
  start = time.time()
  loop.train_and_evaluate(config, workdir)
  return time.time() - start


def summarize(workdir: str) -> dict:
  """Validation accuracy (population statistics) at a quarter, half and end of training."""
  valid = [r for r in metric_writer.read_metrics(workdir) if r['split'] == 'valid']
  if not valid:
    raise ValueError(f'No validation records in {workdir}/metrics.jsonl.')
  last = valid[-1]['step']
  def at(fraction):
    target = fraction * last
    return min(valid, key=lambda r: abs(r['step'] - target))
  return {'steps': last, 'quarter': at(0.25), 'half': at(0.5), 'end': valid[-1],
          'best': max(r['accuracy'] for r in valid), 'time_s': valid[-1].get('time_s')}


def main(argv):
  del argv
  checkpoint.quiet_orbax_logs()
  config = FLAGS.config
  variants = tuple(config.get('variants', ('lstm', 'bn_lstm')))
  data = config.data.name + (f' {config.data.resolution}x{config.data.resolution}'
                             if config.data.name == 'mnist' else ' 8x8')
  workdirs = [os.path.join(FLAGS.workdir, v) for v in variants]
  try:
    for variant, workdir in zip(variants, workdirs):
      logging.info('Training %s on %s in %s', variant, data, workdir)
      run_variant(config, variant, workdir)
    rows = {v: summarize(w) for v, w in zip(variants, workdirs)}
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'error: {e}')
  png = plot.plot_runs(workdirs, os.path.join(FLAGS.workdir, 'learning_curves.png'),
                       metric='accuracy', splits=('valid',), labels=list(variants),
                       title=f'Sequential {data}: validation accuracy (population stats)')
  print(f'\nSequential {data}, batch {config.train.batch_size}, '
        f'{config.model.hidden_size} units; validation accuracy with population '
        f'statistics ({config.eval.population_stats}):\n')
  print(report.quickstart_table(rows))
  print(f'\nLearning curves: {png}')
  if FLAGS.results:
    setup = (f'sequential {data}, batch {config.train.batch_size}, '
             f'{config.model.hidden_size} units, {config.train.num_steps} steps; validation '
             f'accuracy with population statistics ({config.eval.population_stats})')
    with open(FLAGS.results, 'w') as f:
      command = report.command_line('experiments/quickstart.py', sys.argv[1:])
      json.dump({'setup': setup, 'command': command, 'rows': rows}, f, indent=1)
      f.write('\n')
    print(f'Table numbers: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
