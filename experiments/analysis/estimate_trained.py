r"""The population estimate of a trained run against batch statistics, by the estimate's
size.

Where a run's validation accuracy with the papers' estimate differs from the same
parameters with batch statistics (the Fig. 2 campaigns record both), this script asks
whether the difference is the estimate's sampling error (more batches close it) or
systematic (it stays). It restores one checkpoint of a finished run (its workdir, read
only: nothing in it is created, moved or deleted) and scores the run's whole validation
split with:

  * batch statistics of each evaluation batch (`Trainer.evaluate(kind='batch')`, the
    run's `accuracy_batch`);
  * the running average the run kept (`kind='running'`);
  * the estimate from `n` random training batches of `size` examples, for several
    (n, size), each drawn `draws` times (`population.estimate_population_stats`).

  python -m experiments.analysis.estimate_trained --et_workdir=RUNS/mnist_fig2/seq_bn_lstm_s0

It writes `estimate_trained_<run folder>.{png,json}` in `--output_dir` (or `--et_name`);
the JSON names the run by its campaign and run folder, never by its path.
"""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import workdir as workdir_lib
from experiments.analysis import common
from experiments.analysis import estimate_batch_size

_WORKDIR = flags.DEFINE_string('et_workdir', None, 'Workdir of a finished run.')
_STEP = flags.DEFINE_integer('et_step', None, 'Checkpoint step, in checkpoints/ or best/ '
                             '(default: the latest that reads back, else the best).')
_DRAWS = flags.DEFINE_integer('et_draws', 3, 'Random draws of each estimate.')
_NAME = flags.DEFINE_string('et_name', None, 'Output file name (default: '
                             'estimate_trained_<run folder>).')

#: (number of batches, examples per batch): the papers' estimate (10 training batches of
#: 100), the seq-MNIST configs' (2 x 1,000), and larger ones.
DEFAULT_SETTINGS = ((10, 100), (2, 1000), (10, 1000), (30, 1000))


def restore(run_dir: str, step: Optional[int] = None):
  """`(trainer, device state, step restored)` of the run in `run_dir`, built from the
  run's own config.json, reading only (the run may be training).

  The checkpoint of `step` (in checkpoints/ or best/), or by default the newest one of
  checkpoints/ that reads back, else the best one. A damaged checkpoint is skipped with a
  warning and left where it is.
  """
  run_dir = os.path.abspath(run_dir)
  config = workdir_lib.load_config(run_dir)
  if config is None:
    raise ValueError(f'{run_dir} holds no run (no config.json).')
  config.train.num_devices = 1
  config.eval.max_batches = None     # every evaluation reads the whole split
  trainer = loop.Trainer(config)
  ckpt = checkpoint.Checkpointer(run_dir, read_only=True)
  try:
    host_state = _restore_read_only(ckpt, trainer.initial_state(), step)
  finally:
    ckpt.close()
  return trainer, trainer.to_devices(host_state), int(host_state.step)


def _restore_read_only(ckpt: checkpoint.Checkpointer, template, step: Optional[int]):
  latest = workdir_lib.checkpoint_steps(ckpt.workdir)
  best = workdir_lib.checkpoint_steps(ckpt.workdir, 'best')
  if step is not None and step not in latest + best:
    raise ValueError(f'{ckpt.workdir} has no checkpoint of step {step} (--et_step): '
                     f'checkpoints/ holds steps {latest}, best/ holds {best}.')
  if step is not None:
    return ckpt.restore(template, step=step, best=step not in latest)[0]
  if not latest and not best:
    raise ValueError(f'{ckpt.workdir} holds no checkpoint (neither checkpoints/ nor best/ '
                     'holds a step).')
  if latest:
    try:
      return ckpt.restore(template)[0]
    except ValueError as error:   # none reads back, or shapes unlike the config's
      if not best:
        raise
      logging.warning('%s Trying the best checkpoint.', error)
  return ckpt.restore(template, best=True)[0]


def run(run_dir: str, output_dir: str, step: Optional[int] = None, draws: int = 3,
        settings: Sequence[tuple[int, int]] = DEFAULT_SETTINGS, seed: int = 0,
        name: Optional[str] = None) -> dict:
  """Writes `<name>.{png,json}` in `output_dir` (default name:
  `estimate_trained_<run folder>`); returns the JSON's dict.

  JSON: `batch_statistics` and `running_average` accuracies; `estimates[label]` = the
  accuracies of the draws of each setting ('n x size'); `valid_examples`, `step`, `run`
  (campaign/run folder), `data`, `seconds`, `machine`.
  """
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  trainer, state, done = restore(run_dir, step)
  logging.info('Restored step %d of %s', done, run_dir)
  result = {'batch_statistics': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
            'running_average': trainer.evaluate(state, 'valid', 'running')['accuracy'],
            'estimates': {}}
  variables = common.host_variables(trainer, state)
  rng = np.random.RandomState(seed)
  for num_batches, size in settings:
    label = f'{num_batches} x {size}'
    result['estimates'][label] = [
        common.evaluate_with(trainer, state, estimate_batch_size.estimate(
            trainer, variables, num_batches, size, rng))['accuracy']
        for _ in range(draws)]
    logging.info('%s: %s', label, result['estimates'][label])
  return common.save_run_outputs(output_dir, 'estimate_trained', run_dir, trainer, done,
                                 start, result, _figure, name)


def _figure(result: dict):
  """The draws of each estimate beside batch statistics and the running average."""
  plt = common.matplotlib_pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.5))
  labels = list(result['estimates'])
  for i, label in enumerate(labels):
    scores = result['estimates'][label]
    ax.scatter([i] * len(scores), scores, color='tab:blue')
    ax.plot([i - 0.2, i + 0.2], [np.mean(scores)] * 2, color='tab:blue')
  ax.axhline(result['batch_statistics'], color='tab:red', ls='--',
             label='batch statistics')
  ax.axhline(result['running_average'], color='tab:gray', ls=':', label='running average')
  ax.set_xticks(range(len(labels)), labels)
  ax.set_xlabel('estimate: batches x examples per batch')
  ax.set_ylabel('validation accuracy')
  ax.set_title(f"{result['run']}, step {result['step']:,}", fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def main(argv):
  common.run_on_a_run(argv, _WORKDIR, lambda: run(
      _WORKDIR.value, common.OUTPUT_DIR.value, step=_STEP.value, draws=_DRAWS.value,
      seed=common.SEED.value, name=_NAME.value))


if __name__ == '__main__':
  app.run(main)
