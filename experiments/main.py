r"""Train and evaluate one configuration.

  python experiments/main.py --config experiments/configs/seq_mnist.py \
      --workdir /tmp/seq_mnist --config.model.variant=lstm
  python experiments/main.py --config experiments/configs/ptb_char.py:bn_lstm,tiny \
      --workdir /tmp/ptb_char_tiny          # the config's seconds-long preset
  python experiments/main.py --config experiments/configs/ptb_char.py --show_config

`--config` is an ml_collections config file, optionally with its argument after a colon
(a variant or size, and presets such as `tiny`: each file's docstring lists them). Any
field can be overridden with `--config.a.b=value`; `--show_config` prints the resolved
config (every field), checks it and exits. Data are read under the data root:
`--config.data.root=/path/to/datasets` or the environment variable BN_RNN_JAX_DATA.
`--workdir` receives config.json, checkpoints, metrics.jsonl and TensorBoard events, and
a run started again in the same workdir resumes from its latest checkpoint. All the work
happens in `bn_rnn_jax.training.loop.train_and_evaluate`; a mistake in the arguments, the
config or the data ends the run with one line `error: ...`, and Ctrl-C with one line
(`experiments/stopping.py`).
"""

import os
import sys

# Config files import their siblings as `experiments.configs.<name>`; run as a script, the
# repository root must be importable as it is under `python -m`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import stopping

if __name__ == '__main__':
  stopping.before_the_run()
from bn_rnn_jax import extras

with extras.needed_by('experiments/main.py', exit=True):
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  from bn_rnn_jax.training import config as config_lib
  from experiments import config_files
# pylint: enable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. '
                                'experiments/configs/ptb_char.py:bn_lstm,tiny.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory of the run (created if missing).')
flags.DEFINE_bool('show_config', False, 'Print the resolved config, check it and exit.')
USAGE = ('the flags are --config=<file>[:<argument>], --workdir=<folder>, --show_config, '
         '--config.<field>=<value>.')


def parse_flags(argv):
  """absl's parse, after the config file and each `--config.<field>=<value>` are checked
  by the config itself (`config_files.check_arguments`): a mistake is one line."""
  try:
    config_files.check_arguments(argv[1:])
    rest = FLAGS(argv)
  except flags.UnrecognizedFlagError as e:
    sys.exit(f'error: unknown flag --{e.flagname}; {USAGE}')
  except (ValueError, flags.Error) as e:
    sys.exit(f'error: {" ".join(str(e).split())}')
  if len(rest) > 1:
    sys.exit(f'error: unexpected arguments {rest[1:]}; {USAGE}')
  if FLAGS.workdir is None and not FLAGS.show_config:
    sys.exit('error: --workdir is required: the folder of the run (config.json, '
             'checkpoints, metrics.jsonl); or --show_config to print the config.')
  return rest


def main(argv):
  del argv  # parse_flags refused any positional argument
  if FLAGS.show_config:
    print(FLAGS.config.to_json_best_effort(indent=2))
  with stopping.one_line(FLAGS.workdir):
    config_lib.validate_config(FLAGS.config)
    if not FLAGS.show_config:
      # pylint: disable=g-import-not-at-top
      from bn_rnn_jax.training import checkpoint
      from bn_rnn_jax.training import loop
      # pylint: enable=g-import-not-at-top
      checkpoint.quiet_orbax_logs()
      loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
