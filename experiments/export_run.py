r"""Export a run's trained model with `jax.export`, and check the export in a fresh process.

  python -m experiments.export_run --workdir RUN --output model.jax

Reads `RUN/config.json` and the run's best checkpoint (`--checkpoint=latest` for the
newest), takes the population statistics the run evaluates with (the papers' estimate
over `config.eval.population_batches` training batches at that step, or the running
average when `config.eval.population_stats='running'`), and writes

  model.jax        the serialised inference function `inputs -> logits`, parameters and
                   statistics baked in, batch and lengths symbolic (`bn_rnn_jax.export`);
  model.jax.json   what the inputs and outputs are, and the check below.

The check: `--check_batches` held-out batches of `--split` (valid), plus the first one cut
to half its rows and two thirds of its length, run through the model's own code here and
through the file in a new Python process that imports only jax and numpy; the outputs
must agree within `RTOL`, `ATOL` (numpy `allclose`), or the command fails.

Loading it needs JAX (and flatbuffers) alone:

  from jax import export
  exported = export.deserialize(bytearray(open('model.jax', 'rb').read()))
  logits = exported.call(inputs, mask)     # shapes and dtypes as in model.jax.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable

import jax
import numpy as np

from bn_rnn_jax import extras

with extras.needed_by('experiments/export_run.py', exit=True):
  from absl import app
  from absl import flags
  import flatbuffers  # pylint: disable=unused-import  # jax.export's, found before the work
  import ml_collections

  from bn_rnn_jax import batch_stats
  from bn_rnn_jax import export as export_lib
  from bn_rnn_jax import models
  from bn_rnn_jax.training import checkpoint as checkpoint_lib
  from bn_rnn_jax.training import loop
  from bn_rnn_jax.training import parallel
  from bn_rnn_jax.training import workdir as workdir_lib

RTOL, ATOL = 1e-5, 1e-6

# The symbolic axes of each task's inputs (None: the size is fixed by the model).
_AXES = {
    'classification': {'inputs': ('batch', 'time', None), 'mask': ('batch', 'time')},
    'language_model': {'inputs': ('batch', 'time'), 'mask': ('batch', 'time')},
    'reading_comprehension': {'inputs': {
        'document': ('batch', 'document'), 'document_mask': ('batch', 'document'),
        'query': ('batch', 'query'), 'query_mask': ('batch', 'query'),
        'candidates': ('batch', None)}},
}
_AXES['tagging'] = _AXES['classification']   # frames [B, T, I]; token ids: see _axes


@dataclasses.dataclass
class Run:
  """A trained run, ready for inference on one device."""
  config: ml_collections.ConfigDict
  trainer: loop.Trainer
  step: int
  model: Any            # the task's model without the device axis
  variables: dict       # {'params', 'batch_stats': the statistics the run evaluates with}


def load_run(workdir: str, checkpoint: str = 'best') -> Run:
  """The model of `workdir` at its best (or latest) checkpoint, with the population
  statistics its evaluations use, on one device."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise ValueError(f'{os.path.abspath(path)} not found: --workdir must be a run folder of '
                     'experiments/main.py.')
  config = workdir_lib.load_config(workdir)  # with the changes recorded since its start
  config.train.num_devices = 1
  trainer = loop.Trainer(config, workdir)
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    best = checkpoint == 'best'
    if best and ckpt.best.latest_step() is None:
      raise ValueError(f'{os.path.abspath(workdir)} has no best checkpoint yet (none was '
                       'evaluated); pass --checkpoint=latest.')
    host, _ = ckpt.restore(trainer.initial_state(), best=best)
  finally:
    ckpt.close()
  state = trainer.to_devices(host)
  stats = parallel.unreplicate(trainer.population_stats(state))
  untrained = batch_stats.untrained_sites(stats)
  if untrained:
    raise ValueError(f'{os.path.abspath(workdir)}: the population statistics of '
                     f'{", ".join(untrained)} were never trained (count 0).')
  model = models.with_layer_fields(trainer.model, axis_name=None)
  return Run(config, trainer, int(host.step), model,
             {'params': host.params, 'batch_stats': stats})


def _axes(task: str, batch: dict) -> dict:
  axes = dict(_AXES[task])
  if task == 'tagging' and np.ndim(batch['inputs']) == 2:    # token ids [B, T]
    axes['inputs'] = ('batch', 'time')
  return {name: axes[name] for name in axes if batch.get(name) is not None}


def inference(run: Run) -> Callable[..., Any]:
  """`f(inputs[, mask]) -> logits`: the task's model in inference, variables baked in."""
  # A language model returns its carries too when asked; here, the logits alone.
  outputs = ({'return_carry': False} if run.trainer.dataset.task == 'language_model'
             else {})
  infer = export_lib.inference_function(run.model, run.variables, **outputs)

  def logits(inputs, mask=None):
    return infer(inputs, mask)
  return logits


def _shrunk(args: tuple, axes: list) -> tuple:
  """`args` cut to half the batch and two thirds of every symbolic length."""
  def cut(names, array):
    index = tuple(slice(None) if name is None else
                  slice(0, max(1, array.shape[k] // 2 if name == 'batch'
                               else 2 * array.shape[k] // 3))
                  for k, name in enumerate(names))
    return np.asarray(array)[index]
  return export_lib.map_axes(cut, axes, args)


def export_run(workdir: str, output: str, *, checkpoint: str = 'best', split: str = 'valid',
               check_batches: int = 2, platforms=None) -> dict:
  """Export, save, reload in a fresh process and compare; returns the description that
  goes to `<output>.json`. Raises ValueError when the outputs disagree."""
  run = load_run(workdir, checkpoint)
  task = run.trainer.dataset.task
  batches = []
  for batch in run.trainer.dataset.eval_batches(split):
    batches.append(batch)
    if len(batches) == check_batches:
      break
  if not batches:
    raise ValueError(f'Split {split!r} has no batches to check the export on.')
  axes = _axes(task, batches[0])
  names = tuple(axes)
  arg_sets = [tuple(batch[name] for name in names) for batch in batches]
  arg_sets.append(_shrunk(arg_sets[0], list(axes.values())))
  fn = inference(run)
  exported = export_lib.export(fn, export_lib.symbolic_specs(arg_sets[0], list(axes.values())),
                               platforms)
  export_lib.save(exported, output)

  original = jax.jit(fn)
  reloaded = export_lib.run_in_fresh_process(output, arg_sets)
  checks = []
  for args, outputs in zip(arg_sets, reloaded):
    want = np.asarray(original(*args))
    got, = outputs
    diff = float(np.max(np.abs(got - want))) if want.size else 0.0
    checks.append({'output_shape': list(want.shape), 'max_abs_diff': diff,
                   'max_abs_output': float(np.max(np.abs(want))),
                   'equal': bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))})
  description = {
      'run': os.path.basename(os.path.normpath(workdir)), 'checkpoint': checkpoint,
      'step': run.step, 'task': task, 'variant': run.config.model.variant,
      'population_stats': run.config.eval.population_stats,
      'inputs': {name: str(spec) for name, spec in zip(names, exported.in_avals)},
      'outputs': [str(aval) for aval in exported.out_avals],
      'platforms': list(exported.platforms), 'jax': jax.__version__,
      'check': {'split': split, 'tolerance': {'rtol': RTOL, 'atol': ATOL}, 'sets': checks},
  }
  with open(output + '.json', 'w') as f:
    json.dump(description, f, indent=1)
    f.write('\n')
  bad = [c for c in checks if not c['equal']]
  if bad:
    raise ValueError(f'The reloaded export differs from the model on {split}: {bad[0]}.')
  return description


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when it runs, so that importing `load_run` from
  another script defines none)."""
  flags.DEFINE_string('workdir', None, 'Run folder of experiments/main.py.')
  flags.DEFINE_string('output', None, 'Where the serialised model goes (and <output>.json).')
  flags.DEFINE_enum('checkpoint', 'best', ['best', 'latest'], 'Which checkpoint to export.')
  flags.DEFINE_string('split', 'valid', 'Held-out split the export is checked on.')
  flags.DEFINE_integer('check_batches', 2, 'Held-out batches to check (plus one cut down).')
  flags.DEFINE_list('platforms', None, 'Platforms to export for (e.g. cpu,cuda; default: '
                    'the current backend).')
  flags.mark_flags_as_required(['workdir', 'output'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  checkpoint_lib.quiet_orbax_logs()
  try:
    description = export_run(FLAGS.workdir, FLAGS.output, checkpoint=FLAGS.checkpoint,
                             split=FLAGS.split, check_batches=FLAGS.check_batches,
                             platforms=FLAGS.platforms)
  except (ValueError, FileNotFoundError, RuntimeError) as e:
    sys.exit(f'error: {e}')
  worst = max(c['max_abs_diff'] for c in description['check']['sets'])
  print(f'{FLAGS.output}: {description["task"]} {description["variant"]} step '
        f'{description["step"]}, inputs {description["inputs"]}; reloaded without the '
        f'model code: largest difference {worst:.3g} on {FLAGS.split} '
        f'(rtol {RTOL}, atol {ATOL}).')


if __name__ == '__main__':
  define_flags()
  app.run(main)
