r"""Whether a trained run's running average trails batch statistics because it lags the
parameters.

The running average folds each training batch's moments in with `momentum`, so at a
given step it holds the statistics of the parameters of the last ~1 / (1 - momentum)
steps. This script restores one checkpoint of a finished run (read only, as
`estimate_trained.py`) and continues its training `--lag_steps` steps several ways from
that state, on the same batches:

  frozen        the training steps run, but the parameters are put back after each
                (optimizer state and all): the running average then averages the
                statistics of one set of parameters;
  momentum m    training on as the run trained, the running average kept with momentum
                m (each of `--lag_momenta`; the parameters move as in the run, whatever m).

It scores the whole validation split every `--lag_every` steps with batch statistics,
the running average and the papers' estimate. If the running average reaches batch
statistics once the parameters stop moving, and comes nearer the shorter its window,
its gap is lag.

  python -m experiments.analysis.running_average_lag --lag_workdir=RUNS/pmnist_fig2/pmnist_bn_lstm_s0

It writes `running_average_lag_<run folder>.{png,json}` in `--output_dir`; the JSON
names the run by its campaign and run folder, never by its path.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp

from bn_rnn_jax.training import loop
from experiments.analysis import common
from experiments.analysis import estimate_trained

_WORKDIR = flags.DEFINE_string('lag_workdir', None, 'Workdir of a finished run.')
_STEP = flags.DEFINE_integer('lag_step', None, 'Checkpoint step (default: the latest).')
_STEPS = flags.DEFINE_integer('lag_steps', 300, 'Steps each arm trains on.')
_EVERY = flags.DEFINE_integer('lag_every', 100, 'Validation every this many steps.')
_MOMENTA = flags.DEFINE_list('lag_momenta', ['0.99', '0.9', '0.5'],
                             'Running-average momenta of the training arms.')

STATISTICS = ('batch', 'running', 'estimate')


def arms(run_momentum: float, momenta: Sequence[float]) -> dict[str, tuple[float, bool]]:
  """`{arm: (momentum, frozen)}`: the frozen arm (the run's momentum) and one per
  momentum."""
  return {'frozen': (run_momentum, True),
          **{f'momentum {m:g}': (float(m), False) for m in momenta}}


def continue_arm(config, host_state, num_steps: int, every: int, frozen: bool
                 ) -> list[dict]:
  """Train a `Trainer` of `config` on from `host_state` for `num_steps` (with the
  parameters and optimizer state put back after every step when `frozen`); every
  `every` steps, the validation accuracy with each of `STATISTICS`."""
  trainer = loop.Trainer(config)
  state = trainer.to_devices(host_state)
  held = trainer.to_devices(host_state)
  records = []
  first = int(host_state.step)
  for step in range(first + 1, first + num_steps + 1):
    state, _ = trainer.p_train_step(state, trainer.train_batch(step - 1))
    if frozen:   # fresh buffers each time: the step donates its state
      state = state.replace(params=jax.tree.map(jnp.array, held.params),
                            opt_state=jax.tree.map(jnp.array, held.opt_state))
    if (step - first) % every == 0:
      records.append({'step': step, **{kind: trainer.evaluate(state, 'valid', kind)[
          'accuracy'] for kind in STATISTICS}})
      logging.info('%s', records[-1])
  return records


def run(run_dir: str, output_dir: str, step: Optional[int] = None, num_steps: int = 300,
        every: int = 100, momenta: Sequence[float] = (0.99, 0.9, 0.5)) -> dict:
  """Writes `running_average_lag_<run folder>.{png,json}` in `output_dir`; returns the
  JSON's dict: per arm its records, and the restored step's accuracies."""
  if num_steps < every or every <= 0:
    raise ValueError(f'--lag_steps ({num_steps}) must be at least --lag_every ({every}) '
                     '> 0.')
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  trainer, state, done = estimate_trained.restore(run_dir, step)
  logging.info('Restored step %d of %s', done, run_dir)
  result: dict[str, Any] = {
      'restored': {kind: trainer.evaluate(state, 'valid', kind)['accuracy']
                   for kind in STATISTICS},
      'arms': {}}
  host_state = trainer.to_host(state)
  for name, (momentum, frozen) in arms(trainer.config.model.momentum, momenta).items():
    config = trainer.config.copy_and_resolve_references()
    config.model.momentum = momentum
    result['arms'][name] = continue_arm(config, host_state, num_steps, every, frozen)
  return common.save_run_outputs(output_dir, 'running_average_lag', run_dir, trainer, done,
                                 start, result, _figure)


def _figure(result: dict):
  """Per arm: the running average against batch statistics and the estimate, by step."""
  plt = common.matplotlib_pyplot()
  names = list(result['arms'])
  fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), sharey=True)
  styles = {'batch': dict(color='tab:red', ls='--'), 'running': dict(color='tab:gray'),
            'estimate': dict(color='tab:blue', ls=':')}
  for ax, name in zip(axes, names):
    records = [{'step': result['step'], **result['restored']}] + result['arms'][name]
    for kind in STATISTICS:
      ax.plot([r['step'] for r in records], [r[kind] for r in records], marker='o',
              label=kind, **styles[kind])
    ax.set_title(name, fontsize=9)
    ax.set_xlabel('step')
  axes[0].set_ylabel('validation accuracy')
  axes[0].legend(fontsize=8)
  fig.suptitle(f"{result['run']}: training on from step {result['step']:,}", fontsize=10)
  fig.tight_layout()
  return fig


def main(argv):
  result = common.run_on_a_run(argv, _WORKDIR, lambda: run(
      _WORKDIR.value, common.OUTPUT_DIR.value, step=_STEP.value, num_steps=_STEPS.value,
      every=_EVERY.value, momenta=[float(m) for m in _MOMENTA.value]))
  print({'restored': result['restored'], 'arms': result['arms']})


if __name__ == '__main__':
  app.run(main)
