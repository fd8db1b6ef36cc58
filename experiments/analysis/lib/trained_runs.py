"""Analyses of one finished run, read only (nothing in its folder is created, moved or
deleted): its population estimate against batch statistics by the estimate's size
(`estimate_trained`), which sites and steps carry the spread of the estimate's draws
(`estimate_spread`), where its running average loses against the estimate
(`running_average_gap`), and whether that running average lags the parameters
(`running_average_lag`). Each writes `<kind>_<run folder>.{json,png}`; the JSON names the
run by its campaign and run folder, never by its path."""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import population
from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import workdir as workdir_lib
from experiments.analysis.lib import moments
from experiments.analysis.lib import outputs
from experiments.analysis.lib import training

#: (number of batches, examples per batch): the papers' estimate (10 training batches of
#: 100), the seq-MNIST configs' (2 x 1,000), and larger ones.
ESTIMATE_SIZES = ((10, 100), (2, 1000), (10, 1000), (30, 1000))
#: What `running_average_lag` scores every `every` steps.
STATISTICS = ('batch', 'running', 'estimate')


def restore(run_dir: str, step: Optional[int] = None):
  """`(trainer, device state, step restored)` of the run in `run_dir`, built from its own
  config.json, reading only (the run may be training). The checkpoint of `step` (in
  checkpoints/ or best/), or by default the newest one of checkpoints/ that reads back,
  else the best one; a damaged checkpoint is skipped with a warning and left there."""
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
  logging.info('Restored step %d of %s', int(host_state.step), run_dir)
  return trainer, trainer.to_devices(host_state), int(host_state.step)


def _restore_read_only(ckpt: checkpoint.Checkpointer, template, step: Optional[int]):
  latest = workdir_lib.checkpoint_steps(ckpt.workdir)
  best = workdir_lib.checkpoint_steps(ckpt.workdir, 'best')
  if step is not None and step not in latest + best:
    raise ValueError(f'{ckpt.workdir} has no checkpoint of step {step} (--step): '
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


def _save(output_dir: str, kind: str, run_dir: str, trainer, step: int, start: float,
          result: dict, draw, name: Optional[str] = None) -> dict:
  """`result` with the run's facts (campaign/run folder, step, examples scored, data,
  seconds), written with its figure `draw(result)` as `<name>.{json,png}` (default
  `<kind>_<run folder>`)."""
  parent, run_name = os.path.split(os.path.normpath(os.path.abspath(run_dir)))
  result.update({'run': f'{os.path.basename(parent)}/{run_name}', 'step': step,
                 'valid_examples': trainer.evaluated_count,
                 'data': training.data_description(trainer.config, trainer.dataset),
                 'seconds': time.time() - start})
  return outputs.save(output_dir, name or f'{kind}_{run_name}', kind, result, draw(result),
                      dpi=70)


# ---------------------------------------------------------------------- estimate_trained
_ARGS = """
  Args:
    workdir: the workdir of a finished run.
    output_dir: where the JSON and PNG go.
    step: the checkpoint's step, in checkpoints/ or best/ (default: the newest of
      checkpoints/ that reads back, else the best).
"""


def estimate_trained(workdir: str, output_dir: str = outputs.FIGURES,
                     step: Optional[int] = None, draws: int = 3,
                     settings: Sequence[tuple[int, int]] = ESTIMATE_SIZES, seed: int = 0,
                     name: Optional[str] = None) -> dict:
  """The run's whole validation split scored with batch statistics, its running average
  and the estimate from `n` random training batches of `size`, each of `settings` drawn
  `draws` times: `{'batch_statistics', 'running_average', 'estimates': {'n x size':
  [accuracy per draw]}, ...}`.

  Args:
    workdir: the workdir of a finished run.
    output_dir: where the JSON and PNG go.
    step: the checkpoint's step, in checkpoints/ or best/ (default: the newest of
      checkpoints/ that reads back, else the best).
    draws: random draws of each estimate.
    seed: the random seed of the draws.
    name: the output's file name (default estimate_trained_<run folder>).
  """
  plt = outputs.pyplot()
  start = time.time()
  trainer, state, done = restore(workdir, step)
  result = {'batch_statistics': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
            'running_average': trainer.evaluate(state, 'valid', 'running')['accuracy'],
            'estimates': {}}
  variables = training.host_variables(trainer, state)
  rng = np.random.RandomState(seed)
  for num_batches, size in settings:
    result['estimates'][f'{num_batches} x {size}'] = [
        training.evaluate_with(trainer, state, moments.random_estimate(
            trainer, variables, num_batches, size, rng))['accuracy'] for _ in range(draws)]

  def draw(result):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    outputs.plot_draws(ax, result['estimates'], {
        'batch statistics': (result['batch_statistics'], dict(color='tab:red', ls='--')),
        'running average': (result['running_average'], dict(color='tab:gray', ls=':'))})
    ax.set_xlabel('estimate: batches x examples per batch')
    ax.set_title(f"{result['run']}, step {result['step']:,}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
  return _save(output_dir, 'estimate_trained', workdir, trainer, done, start, result, draw,
               name)


def render_estimate_trained(e: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f"{name} ({e['run']}, step {e['step']:,}, {e['valid_examples']} images): "
          f"batch statistics {e['batch_statistics']:.4f}; running average "
          f"{e['running_average']:.4f}; estimates " + '; '.join(
              f"{k}: {', '.join(f'{v:.4f}' for v in vs)}" for k, vs in e['estimates'].items()))


# ---------------------------------------------------------------------- estimate_spread
def estimate_spread(workdir: str, output_dir: str = outputs.FIGURES,
                    step: Optional[int] = None, draws: int = 3, num_batches: int = 2,
                    size: int = 1000, seed: int = 0) -> dict:
  """The estimate drawn `draws` times from `num_batches` training batches of `size`,
  scored against batch statistics: each draw with and without the h0 noise, every draw's
  batches together ('all draws'), each draw pooled by the law of total variance, and
  per draw the hybrids that locate its difference from 'all draws'
  (`moments.hybrids`); per site and row what the spread rests on
  (`moments.variance_spread`); per step the fraction of drawn inputs that are nonzero.

  Args:
    workdir: the workdir of a finished run.
    output_dir: where the JSON and PNG go.
    step: the checkpoint's step, in checkpoints/ or best/ (default: the newest of
      checkpoints/ that reads back, else the best).
    draws: draws of the estimate.
    num_batches: training batches per draw.
    size: examples per batch.
    seed: the random seed of the draws.
  """
  plt = outputs.pyplot()
  start = time.time()
  trainer, state, done = restore(workdir, step)
  variables = training.host_variables(trainer, state)
  inputs = trainer.dataset.splits['train']['inputs']
  index = np.random.RandomState(seed).randint(0, inputs.shape[0],
                                              (draws, num_batches, size))
  drawn = [moments.records(trainer, variables, inputs, i) for i in index]
  quiet_drawn = [moments.records(trainer, variables, inputs, i, h0_noise=False)
                 for i in index]
  estimates = [population.average_minibatch_moments(r) for r in drawn]
  quiet = [population.average_minibatch_moments(r) for r in quiet_drawn]
  together = population.average_minibatch_moments([r for d in drawn for r in d])
  quiet_together = population.average_minibatch_moments([r for d in quiet_drawn for r in d])
  accuracy = lambda stats: training.evaluate_with(trainer, state, stats)['accuracy']
  chosen = np.asarray(inputs)[np.unique(index.reshape(-1))]
  result: dict[str, Any] = {
      'batch': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
      'draws': [accuracy(e) for e in estimates],
      'noise-free draws': [accuracy(e) for e in quiet],
      'all draws': accuracy(together),
      'pooled': [accuracy(moments.pooled(r)) for r in drawn],
      'hybrids': [moments.hybrids(accuracy, together, e, (16, 64, 256)) for e in estimates],
      'per_row': moments.variance_spread(estimates, together),
      'per_row_noise_free': moments.variance_spread(quiet, quiet_together),
      'nonzero_inputs': (chosen != 0).any(axis=-1).mean(axis=0),
      'estimate_batches': f'{draws} draws of {num_batches} x {size}'}

  def draw(result):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for (site, row), color in zip(result['per_row'].items(), ('C0', 'C1', 'C2', 'C3')):
      label = site.split('/')[-1]
      axes[0].semilogy(np.maximum(row['var_min'], 1e-16), label=label, color=color)
      axes[0].semilogy(np.maximum(result['per_row_noise_free'][site]['var_min'], 1e-16),
                       color=color, ls=':', lw=0.8)
      axes[1].plot(row['var_spread'], label=label, color=color)
    twin = axes[1].twinx()
    twin.plot(result['nonzero_inputs'], color='gray', lw=0.8, ls=':')
    twin.set_ylabel('fraction of inputs nonzero', color='gray')
    axes[0].set_ylabel('smallest variance over features\n(dotted: without h0 noise)')
    axes[1].set_ylabel("draws' variance: sd / mean")
    _rows(axes)
    shown = lambda values: ', '.join(f'{a:.3f}' for a in values)
    fig.suptitle(f"{result['run']}, step {result['step']:,}: draws {shown(result['draws'])} "
                 f"(without h0 noise {shown(result['noise-free draws'])}); all draws "
                 f"{result['all draws']:.3f}; batch {result['batch']:.3f}", fontsize=10)
    fig.tight_layout()
    return fig
  return _save(output_dir, 'estimate_spread', workdir, trainer, done, start, result, draw)


def _rows(axes) -> None:
  for ax in axes:
    ax.set_xlabel('row (time step)')
    ax.legend(fontsize=8)


def _site(key: str) -> str:
  """A hybrid's name without its path: 'site rnn/layer_0/cell' -> 'cell'."""
  return key.replace('site ', '').split('/')[-1]


def render_estimate_spread(e: dict, source: str) -> str:
  name = os.path.basename(source)
  draws = lambda values: ', '.join(f'{v:.4f}' for v in values)
  return (f"{name} ({e['run']}, step {e['step']:,}, {e['valid_examples']} images, "
          f"{e['estimate_batches']}): batch {e['batch']:.4f}; draws {draws(e['draws'])}; "
          f"noise-free draws {draws(e['noise-free draws'])}; all draws "
          f"{e['all draws']:.4f}; pooled {draws(e['pooled'])}; all draws with each draw's "
          + ', '.join(f"{_site(k)} {draws(h[k] for h in e['hybrids'])}"
                      for k in e['hybrids'][0]))


# ---------------------------------------------------------------------- running_average_gap
def running_average_gap(workdir: str, output_dir: str = outputs.FIGURES,
                        step: Optional[int] = None, num_batches: int = 2, size: int = 1000,
                        seed: int = 0) -> dict:
  """The run scored with batch statistics, its running average, the estimate from
  `num_batches` training batches of `size`, the same without h0 noise ('noise-free') and
  pooled by the law of total variance; the hybrids of the estimate with sites or rows
  from the running average; per site and row the running average's distance from the
  estimate (`moments.discrepancy`), and the noise-free estimate's.

  Args:
    workdir: the workdir of a finished run.
    output_dir: where the JSON and PNG go.
    step: the checkpoint's step, in checkpoints/ or best/ (default: the newest of
      checkpoints/ that reads back, else the best).
    num_batches: training batches of the estimates.
    size: examples per estimate batch.
    seed: the random seed of the batches.
  """
  plt = outputs.pyplot()
  start = time.time()
  trainer, state, done = restore(workdir, step)
  variables = training.host_variables(trainer, state)
  inputs = trainer.dataset.splits['train']['inputs']
  index = np.random.RandomState(seed).randint(0, inputs.shape[0], (num_batches, size))
  drawn = moments.records(trainer, variables, inputs, index)
  made = {'running': variables['batch_stats'],
          'estimate': population.average_minibatch_moments(drawn),
          'noise-free': population.average_minibatch_moments(
              moments.records(trainer, variables, inputs, index, h0_noise=False)),
          'pooled': moments.pooled(drawn)}
  accuracy = lambda stats: training.evaluate_with(trainer, state, stats)['accuracy']
  result: dict[str, Any] = {
      'batch': trainer.evaluate(state, 'valid', 'batch')['accuracy'],
      **{kind: accuracy(stats) for kind, stats in made.items()}}
  estimate = moments.sites(made['estimate'])
  result['hybrids'] = moments.hybrids(accuracy, made['estimate'], made['running'])
  result['per_row'] = {site: moments.discrepancy(stats, estimate[site])
                       for site, stats in moments.sites(made['running']).items()}
  result['per_row_noise_free'] = {site: moments.discrepancy(stats, estimate[site])
                                  for site, stats in moments.sites(made['noise-free']).items()}
  result['estimate_batches'] = f'{num_batches} x {size}'

  def draw(result):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for site, row in result['per_row'].items():
      axes[0].plot(row['mean_shift'], label=site.split('/')[-1])
      axes[1].plot(row['log_var_ratio'], label=site.split('/')[-1])
    axes[0].set_ylabel('|mean difference| / estimate sd')
    axes[1].set_ylabel('log(running var / estimate var)')
    _rows(axes)
    fig.suptitle(f"{result['run']}, step {result['step']:,}: running average vs estimate",
                 fontsize=10)
    fig.tight_layout()
    return fig
  return _save(output_dir, 'running_average_gap', workdir, trainer, done, start, result,
               draw)


def render_running_average_gap(g: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f"{name} ({g['run']}, step {g['step']:,}, {g['valid_examples']} images, "
          f"estimate {g['estimate_batches']}): " + ', '.join(
              f'{k} {g[k]:.4f}' for k in ('batch', 'running', 'estimate', 'noise-free',
                                          'pooled')) +
          "; the estimate with the running average's " + ', '.join(
              f'{_site(k)} {v:.4f}' for k, v in g['hybrids'].items()))


# ---------------------------------------------------------------------- running_average_lag
def running_average_lag(workdir: str, output_dir: str = outputs.FIGURES,
                        step: Optional[int] = None, num_steps: int = 300, every: int = 100,
                        momenta: Sequence[float] = (0.99, 0.9, 0.5)) -> dict:
  """The run trained on `num_steps` more steps several ways from its checkpoint, on the
  same batches: 'frozen' (the parameters and optimizer state put back after each step,
  so the running average averages one set of parameters) and 'momentum m' for each of
  `momenta` (trained as the run was, the running average kept with m); every `every`
  steps the validation accuracy with each of `STATISTICS`.

  Args:
    workdir: the workdir of a finished run.
    output_dir: where the JSON and PNG go.
    step: the checkpoint's step, in checkpoints/ or best/ (default: the newest of
      checkpoints/ that reads back, else the best).
    num_steps: steps each arm trains on.
    every: validation every this many steps.
    momenta: the running-average momenta of the training arms.
  """
  if num_steps < every or every <= 0:
    raise ValueError(f'--num_steps ({num_steps}) must be at least --every ({every}) > 0.')
  plt = outputs.pyplot()
  start = time.time()
  trainer, state, done = restore(workdir, step)
  result: dict[str, Any] = {
      'restored': {kind: trainer.evaluate(state, 'valid', kind)['accuracy']
                   for kind in STATISTICS}, 'arms': {}}
  host_state = trainer.to_host(state)
  arms = {'frozen': (trainer.config.model.momentum, True),
          **{f'momentum {m:g}': (float(m), False) for m in momenta}}
  for arm, (momentum, frozen) in arms.items():
    config = trainer.config.copy_and_resolve_references()
    config.model.momentum = momentum
    result['arms'][arm] = _train_on(config, host_state, num_steps, every, frozen)

  def draw(result):
    names = list(result['arms'])
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), sharey=True)
    styles = {'batch': dict(color='tab:red', ls='--'), 'running': dict(color='tab:gray'),
              'estimate': dict(color='tab:blue', ls=':')}
    for ax, arm in zip(axes, names):
      records = [{'step': result['step'], **result['restored']}] + result['arms'][arm]
      for kind in STATISTICS:
        ax.plot([r['step'] for r in records], [r[kind] for r in records], marker='o',
                label=kind, **styles[kind])
      ax.set_title(arm, fontsize=9)
      ax.set_xlabel('step')
    axes[0].set_ylabel('validation accuracy')
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['run']}: training on from step {result['step']:,}", fontsize=10)
    fig.tight_layout()
    return fig
  return _save(output_dir, 'running_average_lag', workdir, trainer, done, start, result,
               draw)


def _train_on(config, host_state, num_steps: int, every: int, frozen: bool) -> list[dict]:
  """A `Trainer` of `config` trained on from `host_state` (its parameters and optimizer
  state put back after every step when `frozen`); every `every` steps, the validation
  accuracy with each of `STATISTICS`."""
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
  return records


def render_running_average_lag(g: dict, source: str) -> str:
  name = os.path.basename(source)
  scores = lambda r: '/'.join(f'{r[k]:.4f}' for k in STATISTICS)
  return (f"{name} ({g['run']}, training on from step {g['step']:,}, "
          f"{g['valid_examples']} images; batch/running/estimate): restored "
          f"{scores(g['restored'])}; " + '; '.join(
              f"{arm}: " + ', '.join(f"step {r['step']:,} {scores(r)}" for r in records)
              for arm, records in g['arms'].items()))


RENDERERS = {'estimate_trained': render_estimate_trained,
             'estimate_spread': render_estimate_spread,
             'running_average_gap': render_running_average_gap,
             'running_average_lag': render_running_average_lag}
