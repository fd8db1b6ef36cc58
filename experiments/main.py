r"""Train and evaluate one configuration.

  python experiments/main.py --config experiments/configs/seq_mnist.py \
      --workdir /tmp/seq_mnist --config.model.variant=lstm \
      --config.data.mnist_dir=/path/to/mnist

`--config` is an ml_collections config file (any field can be overridden with
`--config.a.b=value`); `--workdir` receives config.json, checkpoints, metrics.jsonl and
TensorBoard events, and a run started again in the same workdir resumes from its latest
checkpoint. All the work happens in `bn_rnn_jax.loop.train_and_evaluate`.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bn_rnn_jax import checkpoint
from bn_rnn_jax import loop

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Path to an experiment config file.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory of the run (created if missing).')
flags.mark_flags_as_required(['config', 'workdir'])


def parse_flags(argv):
  """absl's parse, with an unknown `--config.x.y` field as one line (keeping
  ml_collections' "did you mean") instead of a traceback."""
  try:
    return FLAGS(argv)
  except flags.IllegalFlagValueError as e:
    # A config file's own error (e.g. an unknown variant in `file.py:arg`) comes wrapped in
    # ml_collections' and absl's messages with the traceback as text: keep the innermost.
    while (e.__cause__ or e.__context__) is not None:
      e = e.__cause__ or e.__context__
    sys.exit(f'error: {" ".join(str(e).split())}')
  except (AttributeError, KeyError) as e:
    detail = ' '.join(str(e).replace('\\n', ' ').strip('\'"').split())
    detail = detail.replace("\\'", "'")
    names = [a.split('=')[0] for a in argv[1:] if a.startswith('--config.')]
    culprit = next((n for n in names if n.split('.')[-1] in detail), None)
    where = f' in {culprit}' if culprit else ''
    sys.exit(f'error: unknown config field{where}: {detail}')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  checkpoint.quiet_orbax_logs()
  try:
    loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ValueError, FileNotFoundError, FloatingPointError,
          checkpoint.WorkdirInUse) as e:
    # Configuration, data, NaN and workdir-lock problems are one line, not a traceback.
    logging.error('%s', e)
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
