"""Figure-specific helpers of the scripts in this folder: configs, a recording loop, outputs.

The figure scripts train with the library's own stack: data from `bn_rnn_jax.input_pipeline`
(MNIST and the 8x8 digits in `mnist.py`, character PTB in `text.py`), the pmapped step of
`loop.Trainer` (optimizer from `optim.create_optimizer`, loss and metrics from the task in
`tasks.py`) on one device, and the papers' population estimate (`Trainer.population_stats`;
from arbitrary batches, `population.estimate_population_stats`). What stays here is what a
figure needs beyond one training run:

* `mnist_config`, `ptb_config`: a `config_lib.default_config()` for a short run from the
  scripts' arguments (the 8x8 digits when the MNIST files are absent);
* `initial_state`: a fresh state with a model field that only matters at initialisation
  (gamma_init) changed, so that many runs share one compiled step;
* `fit`: steps recording every training loss, with periodic validation;
* `evaluate_with`: validation metrics with any given population statistics;
* `save_outputs`: one PNG and one JSON (no paths of this machine) per figure.

Flags shared by every script are defined here once, so that the scripts can be imported
together (by the tests) without absl's duplicate-flag error.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from bn_rnn_jax import extras
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import models
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import train
# The one trailing moving average of the project's figures (the campaigns' tables use it).
from experiments.campaign import collect
from experiments.campaign.tables import smooth  # pylint: disable=unused-import

_HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))
# The data root of `bn_rnn_jax.input_pipeline` ($BN_RNN_JAX_DATA; '' when unset).
DEFAULT_DATA_ROOT = input_pipeline.data_root() or ''
DEFAULT_OUTPUT_DIR = os.path.join(REPO_ROOT, 'experiments', 'results', 'figures')

OUTPUT_DIR = flags.DEFINE_string('output_dir', DEFAULT_OUTPUT_DIR,
                                 'Where the PNG and JSON of the figure are written.')
MNIST_DIR = flags.DEFINE_string(
    'mnist_dir', os.path.join(DEFAULT_DATA_ROOT, 'mnist') if DEFAULT_DATA_ROOT else None,
    'Folder with train-images-idx3-ubyte.gz etc.; scikit-learn 8x8 digits when absent.')
PTB_DIR = flags.DEFINE_string('ptb_dir', os.path.join(DEFAULT_DATA_ROOT, 'ptb'),
                              'Folder with ptb.train.txt / ptb.valid.txt.')
PAPER_SCALE = flags.DEFINE_bool(
    'paper_scale', False, "The papers' model sizes and budgets (hours on CPU; use an "
    'accelerator) instead of the few-minute CPU defaults.')
SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
GAMMAS = flags.DEFINE_list('gammas', ['0.1', '0.3', '0.5', '0.7', '1.0'],
                           "Initial BN gammas (Cooijmans et al. appendix D's grid).")


# --------------------------------------------------------------------------------------
# Configs for the library's trainer.

def _short_run(config, *, batch_size: int, eval_batch_size: int, eval_batches: int,
               population_batches: int, seed: int):
  """Single-device run settings shared by every figure."""
  config.seed = seed
  config.train.batch_size = batch_size
  config.train.num_devices = 1
  config.eval.batch_size = eval_batch_size
  config.eval.max_batches = eval_batches
  config.eval.population_stats = 'estimate'
  config.eval.population_batches = population_batches
  return config


def mnist_config(mnist_dir: Optional[str], *, resolution: int = 14,
                 permutation_seed: Optional[int] = None, hidden_size: int = 100,
                 batch_size: int = 64, learning_rate: float = 1e-3,
                 eval_batch_size: Optional[int] = None, eval_examples: int = 512,
                 population_batches: int = 8, seed: int = 0, **model_fields):
  """Sequential (p)MNIST with Cooijmans et al.'s optimiser (RMSProp, momentum 0.9, clip 1).

  mnist_dir: folder of the IDX .gz files; when None or without them, scikit-learn's 8x8
    digits (64 steps) are read instead and `resolution` is ignored.
  resolution: 28 (784 steps) or 14 (2x2 mean-pooled, 196 steps).
  permutation_seed: pMNIST's fixed pixel order (a true permutation), or None.
  eval_examples: validation images per evaluation (the first ones, in batches of
    `eval_batch_size`, default `batch_size`).
  model_fields: `config.model` fields (variant, recurrent_init, initial_state, gamma_init...).
  """
  found = bool(mnist_dir) and all(
      os.path.exists(os.path.join(mnist_dir, f)) for f in mnist.IDX_FILES.values())
  config = config_lib.default_config()
  config.data = mnist.default_data_config('mnist' if found else 'digits')
  if found:
    config.data.mnist_dir = mnist_dir
    config.data.resolution = resolution
  config.data.permute = permutation_seed is not None
  config.data.permutation_seed = permutation_seed or 0
  config.model.hidden_size = hidden_size
  config.model.update(model_fields)
  config.optimizer.learning_rate = learning_rate
  eval_batch_size = eval_batch_size or batch_size
  return _short_run(config, batch_size=batch_size, eval_batch_size=eval_batch_size,
                    eval_batches=-(-eval_examples // eval_batch_size),
                    population_batches=population_batches, seed=seed)


def ptb_config(ptb_dir: str, *, hidden_size: int = 128, batch_size: int = 32,
               length: int = 100, learning_rate: float = 2e-3, eval_batches: int = 8,
               population_batches: int = 4, seed: int = 0, **model_fields):
  """Character-level PTB (`input_pipeline.text`): windows of `length`, one-hot inputs
  unless `embed_size` is given, Adam with clipping at 1; validation reads the first
  `eval_batches` batches of `batch_size` windows of the validation text."""
  config = config_lib.default_config()
  config.data = text.default_data_config('ptb_char')
  config.data.path = ptb_dir
  config.data.seq_length = length
  config.model.hidden_size = hidden_size
  config.model.max_length = length
  config.model.update(model_fields)
  config.optimizer.name = 'adam'
  config.optimizer.learning_rate = learning_rate
  return _short_run(config, batch_size=batch_size, eval_batch_size=batch_size,
                    eval_batches=eval_batches, population_batches=population_batches,
                    seed=seed)


def data_description(config, dataset) -> str:
  """What was read, without the paths of this machine."""
  name = config.data.name
  if name == 'digits':
    text_ = 'scikit-learn 8x8 digits (MNIST IDX files not found)'
  elif name == 'mnist':
    r = config.data.resolution
    text_ = f'MNIST {r}x{r} ({r * r} steps; IDX files)'
  else:
    return f'character-level PTB ({dataset.vocab_size} symbols)'
  return text_ + (f', pixels permuted (seed {config.data.permutation_seed})'
                  if config.data.permute else '')


# --------------------------------------------------------------------------------------
# Training and evaluation with the library's Trainer.

def metric_name(trainer: loop.Trainer) -> str:
  """The validation metric a figure plots: bits per character or accuracy."""
  return 'bpc' if trainer.dataset.task == 'language_model' else 'accuracy'


def initial_state(trainer: loop.Trainer, **model_fields) -> train.TrainState:
  """A fresh device state of `trainer`'s run, initialised with `config.model` fields
  changed (e.g. gamma_init). The fields must only matter at initialisation: the state is
  then trained with `trainer`'s compiled step, whatever the fields' values."""
  config = trainer.config.copy_and_resolve_references()
  config.model.update(model_fields)
  model = train.create_model(config, trainer.dataset)
  host = train.create_train_state(config, model, trainer.task, trainer.tx, trainer.dataset,
                                  trainer.num_devices)
  return trainer.to_devices(host)


def fit(trainer: loop.Trainer, state: train.TrainState, num_steps: int,
        eval_every: int = 0) -> tuple[train.TrainState, dict]:
  """`num_steps` steps of `trainer` from `state`; validation (population estimate, the
  config's `eval.max_batches`) every `eval_every` steps and at the end (none when 0).

  Returns `(state, history)`, history = `{'step', 'train_loss', 'train_accuracy',
  'eval_step', 'eval': [{'loss', 'metric'}], 'seconds'}`; the metric is accuracy or bits
  per character. Non-finite losses are recorded (as the papers' unstable runs would be).
  The step donates `state` (`config.train.donate_state`): use the state returned.
  """
  if num_steps <= 0 or eval_every < 0:
    raise ValueError(f'num_steps ({num_steps}) must be > 0 and eval_every ({eval_every}) '
                     '>= 0.')
  start = time.time()
  history = {'step': [], 'train_loss': [], 'train_accuracy': [], 'eval_step': [],
             'eval': []}
  pending = []
  first = int(state.step[0])
  for step in range(first + 1, first + num_steps + 1):
    state, metrics = trainer.p_train_step(state, trainer.train_batch(step - 1))
    pending.append((step, metrics))
    if eval_every and (step % eval_every == 0 or step == first + num_steps):
      for s, m in jax.device_get(pending):
        history['step'].append(s)
        history['train_loss'].append(float(m['loss'][0]))
        history['train_accuracy'].append(float(m['accuracy'][0]))
      pending = []
      metrics = trainer.evaluate(state, 'valid')
      history['eval_step'].append(step)
      history['eval'].append({'loss': metrics['loss'],
                              'metric': metrics[metric_name(trainer)]})
  for s, m in jax.device_get(pending):
    history['step'].append(s)
    history['train_loss'].append(float(m['loss'][0]))
    history['train_accuracy'].append(float(m['accuracy'][0]))
  history['seconds'] = time.time() - start
  return state, history


def run_on_a_run(argv, workdir: flags.FlagHolder, call):
  """The `main` of a script that reads one finished run: stray arguments and a missing
  `--<workdir flag>` are usage errors; `call()` runs, and a `ValueError` or
  `FileNotFoundError` from it (no run, no such checkpoint) ends the script with one line
  `error: ...`. Returns what `call()` returns."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not workdir.value:
    raise app.UsageError(f'--{workdir.name} (the workdir of a finished run) is required.')
  try:
    return call()
  except (ValueError, FileNotFoundError) as error:
    sys.exit(f'error: {error}')


def evaluate_with(trainer: loop.Trainer, state: train.TrainState, batch_stats,
                  split: str = 'valid') -> dict:
  """`split`'s metrics with these host population statistics instead of the estimate.

  `Trainer.evaluate(kind='running')` evaluates with the state's own `batch_stats`, so the
  given statistics are swapped in there."""
  replicated = parallel.replicate(batch_stats, trainer.devices)
  return trainer.evaluate(state.replace(batch_stats=replicated), split, 'running')


def unmapped_model(trainer: loop.Trainer):
  """`trainer`'s model without the pmap axis name, to apply it outside `pmap`."""
  return models.with_layer_fields(trainer.model, axis_name=None)


def without_h0_noise(model):
  """`model` with `initial_state='zeros'`: the same parameters, whose estimate's pass
  draws no h0 noise (the estimate as inference alone would run it)."""
  return models.with_layer_fields(model, initial_state='zeros')


def host_variables(trainer: loop.Trainer, state: train.TrainState) -> dict:
  """`{'params', 'batch_stats'}` of a device state, as host arrays."""
  host = trainer.to_host(state)
  return {'params': host.params, 'batch_stats': host.batch_stats}


# --------------------------------------------------------------------------------------
# Outputs.

def _to_json(value):
  if isinstance(value, dict):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_to_json(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    return _to_json(np.asarray(value).tolist())
  if isinstance(value, (np.floating, float)):
    # Five significant digits keep the JSON files small; inf/nan become strings.
    value = float(value)
    return float(f'{value:.5g}') if np.isfinite(value) else str(value)
  if isinstance(value, np.integer):
    return int(value)
  return value


def save_outputs(output_dir: str, name: str, figure, data: dict[str, Any],
                 dpi: int = 100) -> dict[str, str]:
  """Write `name.png` and `name.json` and close `figure`; returns their paths. Keep the
  PNGs < 300 KB (they are committed under experiments/results/figures/): lower `dpi` for
  busy figures. Titles and `data` must not name paths of this machine. The JSON records
  the machine (`collect.machine()`) unless `data` does."""
  os.makedirs(output_dir, exist_ok=True)
  data = {**data, 'machine': data.get('machine') or collect.machine()}
  png = os.path.join(output_dir, f'{name}.png')
  path_json = os.path.join(output_dir, f'{name}.json')
  figure.savefig(png, dpi=dpi, bbox_inches='tight')
  matplotlib_pyplot().close(figure)
  with open(path_json, 'w') as f:
    json.dump(_to_json(data), f, indent=1)
    f.write('\n')
  return {'png': png, 'json': path_json}


def save_run_outputs(output_dir: str, script: str, run_dir: str, trainer: loop.Trainer,
                     step: int, start: float, result: dict[str, Any], figure,
                     name: Optional[str] = None) -> dict[str, Any]:
  """`result` of a script that read one finished run, with the run's facts added (the
  run as its campaign and run folder, never its path; the step read; the validation
  examples; the data; the seconds since `start`; the machine), written with
  `figure(result)` as `<name>.{png,json}` (default name `<script>_<run folder>`)."""
  parent, run_name = os.path.split(os.path.normpath(os.path.abspath(run_dir)))
  result.update({'run': f'{os.path.basename(parent)}/{run_name}', 'step': step,
                 'valid_examples': trainer.evaluated_count,
                 'data': data_description(trainer.config, trainer.dataset),
                 'seconds': time.time() - start, 'machine': collect.machine()})
  save_outputs(output_dir, name or f'{script}_{run_name}', figure(result), result, dpi=70)
  return result


def parse_gammas(values: Sequence[str]) -> list[float]:
  gammas = [float(v) for v in values]
  if not gammas or any(g <= 0 for g in gammas):
    raise ValueError(f'gammas must be positive numbers; got {list(values)}.')
  return gammas


def matplotlib_pyplot():
  """pyplot on the non-interactive Agg backend (scripts and tests run headless)."""
  with extras.needed_by('Drawing a figure'):
    import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  return plt

