r"""Train and evaluate one configuration.

  python experiments/main.py --config experiments/configs/seq_mnist.py \
      --workdir /tmp/seq_mnist --config.model.variant=lstm
  python experiments/main.py --config experiments/configs/ptb_char.py:bn_lstm,tiny \
      --workdir /tmp/ptb_char_tiny          # the config's seconds-long preset
  python experiments/main.py --config experiments/configs/ptb_char.py --show_config

`--config` is an ml_collections config file, optionally with its argument after a colon
(a variant or size, and presets such as `tiny`: each file's docstring lists them). Any
field can be overridden with `--config.a.b=value`; `--show_config` prints the resolved
config (every field), checks it and exits. Data are
read under the data root: `--config.data.root=/path/to/datasets` or the environment
variable BN_RNN_JAX_DATA. `--workdir` receives config.json, checkpoints, metrics.jsonl and
TensorBoard events, and a run started again in the same workdir resumes from its latest
checkpoint. All the work happens in `bn_rnn_jax.training.loop.train_and_evaluate`; a mistake in
the arguments, the config or the data ends the run with one line `error: ...`, and Ctrl-C
with one line naming the checkpoint the same command resumes from (exit status 130).
"""

import _thread
import os
import re
import signal
import sys
import threading

STOPPED_BEFORE_THE_RUN = ('Stopped (Ctrl-C) before the run started; the same command '
                          'starts it.')


def _stop_before_the_run(signum, frame):
  """Ctrl-C before `main` (an import, the config file's, the flags' parse): one line."""
  del signum, frame
  sys.stderr.write(STOPPED_BEFORE_THE_RUN + '\n')
  raise SystemExit(130)


if __name__ == '__main__' and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
  signal.signal(signal.SIGINT, _stop_before_the_run)

# Config files import their siblings as `experiments.configs.<name>`; run as a script, the
# repository root must be importable as it is under `python -m`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax import extras

with extras.needed_by('experiments/main.py', exit=True):
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  from bn_rnn_jax.training import config as config_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. '
                                'experiments/configs/ptb_char.py:bn_lstm,tiny.',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory of the run (created if missing).')
flags.DEFINE_bool('show_config', False, 'Print the resolved config, check it and exit.')

FLAG_NAMES = ('--config=<file>[:<argument>]', '--workdir=<folder>', '--show_config',
              '--config.<field>=<value>')


QUOTES = '\'"'


def _one_line(text) -> str:
  return ' '.join(str(text).split())


def _innermost(error: BaseException) -> BaseException:
  while (error.__cause__ or error.__context__) is not None:
    error = error.__cause__ or error.__context__
  return error


def _config_overrides(argv) -> list[str]:
  return [a.split('=')[0] for a in argv[1:] if a.startswith('--config.')]


def _bad_value(error: flags.IllegalFlagValueError) -> str:
  """A config file's own error, or a field's value that does not parse, in one line."""
  match = re.match(r'flag --([^=]+)=(.*?): ', str(error), re.S)
  name, value = match.groups() if match else ('', '')
  inner = _innermost(error)
  if name.startswith('config.') and name in FLAGS:
    kind = FLAGS[name].parser.flag_type()
    article = 'an' if kind[:1] in 'aeiou' else 'a'
    return f'--{name}={value}: {name} takes {article} {kind}; got {value!r}.'
  # The config file raised (e.g. an unknown variant): ml_collections and absl wrap it with
  # the traceback as text; the innermost error is the file's own message.
  text = _one_line(inner)
  return text if isinstance(inner, ValueError) else f'--{name}={value}: {text}'


def _unknown_field(error: Exception, argv) -> str:
  """`--config.a.b=v` naming a field the config does not have, in one line (keeping
  ml_collections' "did you mean")."""
  key = _innermost(error).args[0] if _innermost(error).args else ''
  suggestion = re.search(r'Did you mean "([^"]+)"', str(error))
  overrides = _config_overrides(argv)
  culprit = next((n for n in overrides if key in n.split('.')[1:]), None)
  if culprit is None:
    # e.g. a field below a number; ml_collections' message names the path it looked up.
    culprit = next((n for n in overrides if n[len('--config.'):] in str(error)), 'a --config.')
    return f'{culprit}: {_one_line(error).strip(QUOTES)}.'
  path = culprit[2:].split('.')
  parent = '.'.join(path[:path.index(key)])
  hint = (f"; did you mean {suggestion.group(1)!r}?" if suggestion else
          '; --show_config prints every field.')
  return f'{culprit}: {parent} has no field {key!r}{hint}'


def _check_config_loaded() -> None:
  """ml_collections defers an unreadable config file's error to the first access."""
  try:
    FLAGS.config.get('seed')
  except OSError:
    given = FLAGS['config'].config_filename
    path = os.path.abspath(given.split(':', 1)[0])
    if not os.path.isfile(path):
      sys.exit(f'error: --config={given}: no config file at {path}.')
    sys.exit(f'error: --config={given}: cannot read {path}.')


def parse_flags(argv):
  """absl's parse, with every mistake in the arguments as one line `error: ...` naming
  the flag (instead of a traceback)."""
  try:
    rest = FLAGS(argv)
  except flags.IllegalFlagValueError as e:
    sys.exit(f'error: {_bad_value(e)}')
  except (AttributeError, KeyError) as e:
    sys.exit(f'error: {_unknown_field(e, argv)}')
  except flags.UnrecognizedFlagError as e:
    sys.exit(f'error: unknown flag --{e.flagname}; the flags are {", ".join(FLAG_NAMES)}.')
  except flags.Error as e:   # e.g. a flag without its value
    sys.exit(f'error: {_one_line(e)}.')
  if len(rest) > 1:
    sys.exit(f'error: unexpected arguments {rest[1:]}; the flags are '
             f'{", ".join(FLAG_NAMES)}.')
  if FLAGS.config is None:
    sys.exit('error: --config is required: an experiment config file, e.g. '
             '--config=experiments/configs/quickstart.py (one per paper experiment in '
             'experiments/configs/).')
  _check_config_loaded()
  if FLAGS.workdir is None and not FLAGS.show_config:
    sys.exit('error: --workdir is required: the folder of the run (config.json, '
             'checkpoints, metrics.jsonl); or --show_config to print the config.')
  return rest


def show_config(config) -> None:
  """Print `config` as the run would use it, then check it."""
  print(config.to_json_best_effort(indent=2))
  try:
    config_lib.validate_config(config)
  except ValueError as e:
    sys.exit(f'error: {e}')


def stopped(workdir: str) -> str:
  """The line a launch stopped by Ctrl-C ends with: where the same command resumes (the
  launch's saves are complete by then: the loop waits for them on its way out)."""
  from bn_rnn_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  workdir = os.path.abspath(workdir)
  steps = workdir_lib.checkpoint_steps(workdir)
  if not steps:
    return ('Stopped (Ctrl-C) before the first checkpoint; the same command starts the run '
            'from step 0.')
  return (f'Stopped (Ctrl-C); the same command resumes from the checkpoint of step '
          f'{steps[-1]}, {os.path.join(workdir, "checkpoints", str(steps[-1]))}.')


def main(argv):
  del argv  # parse_flags refused any positional argument
  if signal.getsignal(signal.SIGINT) is _stop_before_the_run:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  if FLAGS.show_config:
    show_config(FLAGS.config)
    return
  handle_ctrl_c()
  try:
    train(FLAGS.config, FLAGS.workdir)
  except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line
    sys.stdout.flush()
    sys.stderr.write(stopped(FLAGS.workdir) + '\n')
    sys.stderr.flush()
    # Out at once (the loop has closed its checkpoints, metrics and lock): after Ctrl-C
    # cut an XLA compilation, the interpreter's exit crashes with SIGSEGV.
    os._exit(130)  # pylint: disable=protected-access


def handle_ctrl_c() -> None:
  """From now on Ctrl-C raises KeyboardInterrupt in this process's main code, wherever it
  lands (`_deliver_again`)."""
  sys.unraisablehook = _deliver_again


def _deliver_again(unraisable, previous=sys.unraisablehook):
  """A KeyboardInterrupt raised where Python cannot pass it on (a garbage-collection
  callback such as JAX's, a `__del__`) would be printed and dropped: Ctrl-C is delivered
  to the main thread again a moment later, once it has left that place (raised from here,
  it would be dropped again)."""
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    threading.Timer(0.01, _thread.interrupt_main, (signal.SIGINT,)).start()
  else:
    previous(unraisable)


def train(config, workdir: str) -> None:
  """`loop.train_and_evaluate`, its errors as one line `error: ...`."""
  # Imported here: the checks of the arguments answer without loading JAX.
  with extras.needed_by('experiments/main.py', exit=True):
    # pylint: disable=g-import-not-at-top
    from bn_rnn_jax.training import checkpoint
    from bn_rnn_jax.training import loop
    from bn_rnn_jax.training import parallel
    # pylint: enable=g-import-not-at-top
  checkpoint.quiet_orbax_logs()
  try:
    loop.train_and_evaluate(config, workdir)
  except (ValueError, FileNotFoundError, FloatingPointError, checkpoint.WorkdirInUse,
          extras.MissingExtra) as e:
    # Configuration, data, NaN, workdir-lock and missing-package problems are one line,
    # not a traceback.
    sys.exit(f'error: {e}')
  except parallel.ProcessLost as e:
    # One line, then out at once: JAX's exit handshake with the lost peer would only
    # abort with the coordination service's dump.
    sys.stdout.flush()
    sys.stderr.write(f'error: {e}\n')
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
