"""How `experiments/main.py` ends when it does not end well: one line. An error of the
arguments, the config, the data, a missing package, a NaN or a busy workdir is one line
`error: ...` (exit status 1); Ctrl-C is one line naming the checkpoint the same command
resumes from (exit status 130), wherever it lands: an import, the config file's import
by absl, a compilation, a wait for a save, a garbage-collection callback.
"""

import _thread
import contextlib
import os
import signal
import sys
import threading

BEFORE_THE_RUN = 'Stopped (Ctrl-C) before the run started; the same command starts it.'


def before_the_run() -> None:
  """Until `one_line` begins, Ctrl-C (where it is not ignored) ends the process with the
  line `BEFORE_THE_RUN`."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stop_before_the_run)


def _stop_before_the_run(signum, frame):
  del signum, frame
  sys.stderr.write(BEFORE_THE_RUN + '\n')
  raise SystemExit(130)


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


@contextlib.contextmanager
def one_line(workdir):
  """The run inside ends, when it fails or Ctrl-C stops it, with one line (above)."""
  if signal.getsignal(signal.SIGINT) is _stop_before_the_run:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  handle_ctrl_c()
  from bn_rnn_jax import extras  # pylint: disable=g-import-not-at-top
  try:
    yield
  except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line
    _exit_now(stopped(workdir) if workdir else BEFORE_THE_RUN, 130)
  except (ValueError, FileNotFoundError, FloatingPointError, extras.MissingExtra) as e:
    sys.exit(f'error: {e}')
  except RuntimeError as e:
    # pylint: disable=g-import-not-at-top
    from bn_rnn_jax.training import checkpoint
    from bn_rnn_jax.training import parallel
    # pylint: enable=g-import-not-at-top
    if isinstance(e, checkpoint.WorkdirInUse):
      sys.exit(f'error: {e}')
    if isinstance(e, parallel.ProcessLost):
      # Out at once: JAX's exit handshake with the lost peer would only abort with the
      # coordination service's dump.
      _exit_now(f'error: {e}', 1)
    raise


def _exit_now(line: str, code: int) -> None:
  """`line` on stderr, then out at once (the loop has closed its checkpoints, metrics
  and lock): after Ctrl-C cut an XLA compilation, the interpreter's exit crashes."""
  sys.stdout.flush()
  sys.stderr.write(line + '\n')
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


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
