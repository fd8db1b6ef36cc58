r"""Cooijmans et al. 2016, Fig. 6 (appendix B): sensitivity of the BN-LSTM to initial gamma.

The paper trains BN-LSTMs with initial gamma in {0.1, 0.3, 0.5, 0.7, 1.0} on permuted
sequential MNIST (784 steps, 100 units, RMSProp 1e-3, momentum 0.9, clipping at 1) and on
character-level Penn Treebank, and finds that a large gamma hurts on pMNIST, where the only
learning signal comes at the end of the sequence, and does not matter on PTB, where a
prediction at every step gives a fresh gradient.

Here the budget is minutes on a 2-core CPU, so both tasks shrink (flags restore the
paper's sizes):
  * MNIST: real MNIST average-pooled to 14x14 (196 steps), pixels in a fixed random
    order (pMNIST), 64 units, batch 64, a few hundred steps; W_h = I and noisy h_0 as in
    the paper's sec. 5.1. Accuracy on the 5,000-image validation split (first 512 by
    default) with the papers' population estimate.
  * PTB: characters (`bn_rnn_jax.input_pipeline.text`), windows of 100, 128 units,
    Adam 2e-3, a few hundred steps; validation bits per character (first 8 batches).
Every gamma sees the same batches in the same order and the same parameter seed, through
one `loop.Trainer` (one compiled step; gamma only changes the initial parameters).

  python -m experiments.analysis.gamma_sensitivity [--gs_tasks=mnist,ptb] [--paper_scale]
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax.training import loop
from experiments.analysis import common

_TASKS = flags.DEFINE_list('gs_tasks', ['mnist', 'ptb'], 'Tasks: mnist and/or ptb.')
_MNIST_STEPS = flags.DEFINE_integer('gs_mnist_steps', 300, 'Training steps on MNIST.')
_PTB_STEPS = flags.DEFINE_integer('gs_ptb_steps', 200, 'Training steps on PTB.')
_IMAGE = flags.DEFINE_integer('gs_image_size', 14, 'MNIST image side (28 or 14).')
_PERMUTE = flags.DEFINE_bool('gs_permute', True, 'Permuted pixel order (pMNIST).')
_MNIST_HIDDEN = flags.DEFINE_integer('gs_mnist_hidden', 64, 'BN-LSTM units on MNIST.')
_PTB_HIDDEN = flags.DEFINE_integer('gs_ptb_hidden', 128, 'BN-LSTM units on PTB.')
_EVALS = flags.DEFINE_integer('gs_num_evals', 5, 'Validation points per curve.')
_REPLOT = flags.DEFINE_bool('gs_replot', False,
                            'Only redraw the PNG from the JSON in --output_dir.')
_EVAL_EXAMPLES = flags.DEFINE_integer('gs_eval_examples', 512,
                                      'MNIST validation images per evaluation.')


def _curves(trainer, gammas: Sequence[float], num_steps: int, num_evals: int,
            task: str) -> dict:
  """Training history per gamma, every gamma from the same seed and data order."""
  # gamma_init only matters at initialisation: one trainer (one compiled step) for all.
  curves = {}
  for gamma in gammas:
    state = common.initial_state(trainer, gamma_init=gamma)
    _, history = common.fit(trainer, state, num_steps, max(1, num_steps // num_evals))
    curves[f'{gamma:g}'] = history
    logging.info('%s gamma=%g: valid %s %s (%.0fs)', task, gamma,
                 common.metric_name(trainer),
                 [round(e['metric'], 3) for e in history['eval']], history['seconds'])
  return curves


def mnist_curves(mnist_dir: Optional[str], gammas: Sequence[float], *, image_size: int,
                 permute: bool, hidden_size: int, batch_size: int, num_steps: int,
                 num_evals: int, eval_examples: int, learning_rate: float = 1e-3,
                 seed: int = 0) -> dict:
  """Training loss and validation accuracy per gamma on sequential (p)MNIST."""
  config = common.mnist_config(
      mnist_dir, resolution=image_size, permutation_seed=92916 if permute else None,
      hidden_size=hidden_size, batch_size=batch_size, learning_rate=learning_rate,
      eval_examples=eval_examples, population_batches=8, seed=seed, variant='bn_lstm',
      recurrent_init='identity', initial_state='noise', gamma_init=gammas[0])
  trainer = loop.Trainer(config)
  return {'data': common.data_description(config, trainer.dataset), 'permuted': permute,
          'length': trainer.dataset.train_length, 'hidden_size': hidden_size,
          'batch_size': batch_size, 'steps': num_steps,
          'optimizer': f'RMSProp lr={learning_rate:g} momentum 0.9, clip 1',
          'curves': _curves(trainer, gammas, num_steps, num_evals, 'MNIST')}


def ptb_curves(ptb_dir: str, gammas: Sequence[float], *, hidden_size: int, batch_size: int,
               length: int, num_steps: int, num_evals: int, eval_batches: int,
               learning_rate: float = 2e-3, seed: int = 0) -> dict:
  """Training loss and validation bits per character per gamma on character-level PTB."""
  config = common.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                             length=length, learning_rate=learning_rate,
                             eval_batches=eval_batches, population_batches=4, seed=seed,
                             variant='bn_lstm', gamma_init=gammas[0])
  trainer = loop.Trainer(config)
  return {'data': common.data_description(config, trainer.dataset), 'length': length,
          'hidden_size': hidden_size, 'batch_size': batch_size, 'steps': num_steps,
          'optimizer': f'Adam lr={learning_rate:g}, clip 1',
          'curves': _curves(trainer, gammas, num_steps, num_evals, 'PTB')}


def run(output_dir: str, mnist_dir: Optional[str], ptb_dir: str, gammas: Sequence[float],
        tasks: Sequence[str] = ('mnist', 'ptb'), mnist_kwargs: Optional[dict] = None,
        ptb_kwargs: Optional[dict] = None, seed: int = 0) -> dict:
  """Writes `gamma_sensitivity.{png,json}`; returns the JSON dict.

  JSON: `tasks[task]['curves'][gamma]` = training history (`step`, `train_loss`,
  `train_accuracy`, `eval_step`, `eval` = [{'loss', 'metric'}]); the metric is accuracy on
  MNIST and bits per character on PTB.
  """
  unknown = set(tasks) - {'mnist', 'ptb'}
  if unknown or not tasks:
    raise ValueError(f"tasks must be among 'mnist', 'ptb'; got {list(tasks)}.")
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  results = {}
  if 'mnist' in tasks:
    results['mnist'] = mnist_curves(mnist_dir, gammas, seed=seed, **(mnist_kwargs or {}))
  if 'ptb' in tasks:
    results['ptb'] = ptb_curves(ptb_dir, gammas, seed=seed, **(ptb_kwargs or {}))

  result = {'figure': 'Cooijmans et al. 2016 Fig. 6', 'gammas': list(gammas),
            'tasks': results, 'seconds': time.time() - start}
  plot(output_dir, result)
  return result


def plot(output_dir: str, result: dict) -> None:
  """Draws `result` (the JSON dict of `run`) and saves the PNG and JSON."""
  gammas = result['gammas']
  plt = common.matplotlib_pyplot()
  tasks = result['tasks']
  fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.6 * len(tasks)), squeeze=False)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(gammas)))
  labels = {'mnist': ('training cross-entropy', 'validation accuracy'),
            'ptb': ('training bits/char', 'validation bits/char')}
  for row, (task, res) in zip(axes, tasks.items()):
    for color, gamma in zip(colors, gammas):
      h = res['curves'][f'{gamma:g}']
      train = np.asarray(h['train_loss'])
      if task == 'ptb':
        train = train / np.log(2.0)
      row[0].plot(h['step'], common.smooth(train, 20), color=color, label=f'gamma={gamma:g}')
      row[1].plot(h['eval_step'], [e['metric'] for e in h['eval']], 'o-', color=color,
                  label=f'gamma={gamma:g}')
    for ax, label in zip(row, labels[task]):
      ax.set_xlabel('training step')
      ax.set_ylabel(label)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
    name = 'pMNIST (pixels permuted)' if res.get('permuted') else task.upper()
    row[0].set_title(f"{name}: {res['data']}", fontsize=8)
    row[1].set_title(f"BN-LSTM {res['hidden_size']} units, T={res['length']}, "
                     f"{res['optimizer']}", fontsize=8)
  fig.suptitle('Sensitivity to the initial gamma (Cooijmans Fig. 6)', fontsize=10)
  fig.tight_layout()
  common.save_outputs(output_dir, 'gamma_sensitivity', fig, result)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _REPLOT.value:
    with open(os.path.join(common.OUTPUT_DIR.value, 'gamma_sensitivity.json')) as f:
      plot(common.OUTPUT_DIR.value, json.load(f))
    return
  if common.PAPER_SCALE.value:
    # The paper: pMNIST 784 steps, 100 units, batch 64 (appendix D grid), 50k+ steps;
    # PTB 1000 units, windows of 100, batch 64.
    mnist_kwargs = dict(image_size=28, permute=_PERMUTE.value, hidden_size=100,
                        batch_size=64, num_steps=50_000, num_evals=50, eval_examples=5000)
    ptb_kwargs = dict(hidden_size=1000, batch_size=64, length=100, num_steps=50_000,
                      num_evals=50, eval_batches=60)
  else:
    mnist_kwargs = dict(image_size=_IMAGE.value, permute=_PERMUTE.value,
                        hidden_size=_MNIST_HIDDEN.value, batch_size=64,
                        num_steps=_MNIST_STEPS.value, num_evals=_EVALS.value,
                        eval_examples=_EVAL_EXAMPLES.value)
    ptb_kwargs = dict(hidden_size=_PTB_HIDDEN.value, batch_size=32, length=100,
                      num_steps=_PTB_STEPS.value, num_evals=_EVALS.value, eval_batches=8)
  run(common.OUTPUT_DIR.value, common.MNIST_DIR.value, common.PTB_DIR.value,
      common.parse_gammas(common.GAMMAS.value), tasks=_TASKS.value,
      mnist_kwargs=mnist_kwargs, ptb_kwargs=ptb_kwargs, seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
