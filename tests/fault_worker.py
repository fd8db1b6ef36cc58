"""One training run in its own process, for the fault-injection tests (not a test module).

  python tests/fault_worker.py WORKDIR OVERRIDES_JSON [KILL_IN_SAVE_STEP]

Runs `loop.train_and_evaluate` on `training_fixtures`' tiny config (with the overrides,
a JSON object of dotted config keys) and synthetic dataset. With KILL_IN_SAVE_STEP the
process SIGKILLs itself in the middle of writing that step's checkpoint: after orbax
started writing the state into its temporary folder, before the checkpoint is complete.
It inherits the tests' persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`,
tests/conftest.py).
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import training_fixtures as fx  # pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.training import checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position


def _kill_inside_save(step: int) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  original = ocp.JsonCheckpointHandler.async_save

  def async_save(self, directory, *args, **kwargs):
    # The meta item is written after the state item was started, in the step's
    # temporary folder: dying here leaves a half-written checkpoint behind.
    if f'{os.sep}{step}.orbax-checkpoint-tmp' in str(directory):
      os.kill(os.getpid(), signal.SIGKILL)
    return original(self, directory, *args, **kwargs)
  ocp.JsonCheckpointHandler.async_save = async_save


def main(workdir: str, overrides: str, kill_in_save: int = 0) -> None:
  if kill_in_save:
    _kill_inside_save(kill_in_save)
  checkpoint.quiet_orbax_logs()
  config = fx.tiny_config(**json.loads(overrides))
  try:
    loop.train_and_evaluate(config, workdir, fx.synthetic_dataset(config))
  except (ValueError, FloatingPointError, checkpoint.WorkdirInUse) as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
