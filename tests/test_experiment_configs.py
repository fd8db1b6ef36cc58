"""The files of `experiments/configs/`: every one loads (without JAX) and validates, each
paper config holds the paper's values, and the paper configs build the paper's models.

`PAPER` is the table: one row per (config, hyperparameter), with the value the paper
states and where it says so. A changed hyperparameter fails here loudly; change the table
only with a reason (a quote from the paper, or a row marked as our choice). To add a
config, append its rows; the loader test below picks up every
file in experiments/configs/ by itself.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import math
import os
import subprocess
import sys
from typing import Any, Callable, Optional, Union

import pytest

from bn_rnn_jax import initializers
from bn_rnn_jax import models
from bn_rnn_jax import variants
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import tasks
from bn_rnn_jax.training import train
import helpers

CONFIG_DIR = helpers.EXPERIMENT_CONFIGS
COOIJMANS = 'Cooijmans et al. 2016'
LAURENT = 'Laurent et al. 2016'
OURS = 'not in the paper: our choice, stated in the config docstring'


@dataclasses.dataclass(frozen=True)
class Derived:
  """A value computed from several fields (e.g. the SGD rate under the loss scaling)."""
  name: str
  fn: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Row:
  config: str                      # file in experiments/configs/
  arg: Optional[str]               # get_config argument (e.g. 'small'), None = default
  field: Union[str, Derived]       # dotted config path, or a Derived value
  value: Any                       # the paper's value
  source: str                      # where the paper says it

  def __str__(self):
    name = self.field if isinstance(self.field, str) else self.field.name
    return f"{self.config}{':' + self.arg if self.arg else ''} {name}"


def _seq_mnist_rows(config: str, task: str) -> list[Row]:
  s = f'{COOIJMANS} sec. 5.1'
  return [
      Row(config, None, 'data.resolution', 28, f'{s}: one pixel per step, 784 steps'),
      Row(config, None, 'data.permute', task == 'pmnist', f'{s}: {task}'),
      Row(config, None, 'data.num_valid', 5000, f"{s}; the authors' code: last 5,000 "
          'of the training images (their code: 50,000 / 10,000; see seq_mnist.py)'),
      Row(config, None, 'model.hidden_size', 100, f'{s}: "an LSTM with 100 hidden units"'),
      Row(config, None, 'model.num_layers', 1, s),
      Row(config, None, 'model.recurrent_init', 'identity_candidate',
          f'{s}: "hidden-to-hidden weight matrix ... the identity"; the authors\' code: '
          'on the candidate block, f, i, o orthogonal'),
      Row(config, None, 'model.forget_bias', 1.0, "the authors' code (the paper gives "
          'none; experiments/results/init_options.json)'),
      Row(config, None, 'model.initial_state', 'noise',
          f'{s}: "adding Gaussian noise to the initial hidden states"'),
      Row(config, None, 'model.gamma_init', 0.1, f'{COOIJMANS} sec. 4: gamma 0.1'),
      Row(config, None, 'optimizer.name', 'rmsprop', f'{s}: RMSProp'),
      Row(config, None, 'optimizer.learning_rate', 1e-3, f'{s}: learning rate 1e-3'),
      Row(config, None, 'optimizer.decay', 0.9, f'{s}: "momentum 0.9", the decay rate of '
          "the authors' RMSProp rule"),
      Row(config, None, 'optimizer.momentum', 0.0, "the authors' code: no momentum rule"),
      Row(config, None, 'optimizer.clip_norm', 1.0, f'{s}: "gradient clipping at 1"'),
      Row(config, None, 'train.batch_size', 100, f"{COOIJMANS} appendix D grid; the "
          "authors' code: batch_size = 100"),
  ]


def _char_rows(config: str, section: str, units: int, batch: int, lr: float,
               length: int) -> list[Row]:
  s = f'{COOIJMANS} sec. {section}'
  return [
      Row(config, None, 'model.hidden_size', units, f'{s}: LSTM with {units} units'),
      Row(config, None, 'model.num_layers', 1, s),
      Row(config, None, 'model.embed_size', None, f'{s}: one-hot characters'),
      Row(config, None, 'model.recurrent_init', 'orthogonal',
          f'{s}: orthogonal initialisation of all weight matrices'),
      Row(config, None, 'model.forget_bias', 0.0, OURS),
      Row(config, None, 'model.gamma_init', 0.1, f'{COOIJMANS} sec. 4 (also applied to '
          "bn_input_only: Cooijmans' choice on Laurent's method)"),
      Row(config, None, 'optimizer.name', 'adam', f'{s}: Adam'),
      Row(config, None, 'optimizer.learning_rate', lr, f'{s}: learning rate {lr:g}'),
      Row(config, None, 'optimizer.clip_norm', 1.0, f'{s}: gradient clipping at 1.0'),
      Row(config, None, 'train.batch_size', batch, f'{s}: minibatches of {batch}'),
      Row(config, None, 'data.seq_length', length, f'{s}: examples of length {length}'),
  ]


def _ptb_word_rows(size: str, units: int, scale: float, dropout: float, steps: int,
                   clip: float, epochs: int, decay: float, after: int) -> list[Row]:
  s = f'{LAURENT} sec. 5.2'
  return [
      Row('ptb_word.py', size, 'model.num_layers', 2, f'{s}: "two stacked LSTM layers"'),
      Row('ptb_word.py', size, 'model.hidden_size', units, f'{s}: {units} units'),
      Row('ptb_word.py', size, 'model.embed_size', units, 'Zaremba et al. 2014 (which '
          f'{LAURENT} follow): embeddings as wide as the LSTM'),
      Row('ptb_word.py', size, 'model.uniform_init_scale', scale,
          f'{s}: uniform in [-{scale:g}, {scale:g}]'),
      Row('ptb_word.py', size, 'model.dropout_rate', dropout,
          f'{s}' + (': dropout 50%' if dropout == 0.5 else ' (large: Zaremba 0.65)'
                    if dropout else ': no dropout')),
      Row('ptb_word.py', size, 'data.seq_length', steps, f'{s}: back-propagate across '
          f'{steps} time steps'),
      Row('ptb_word.py', size, 'optimizer.name', 'sgd', f'{s}: SGD'),
      Row('ptb_word.py', size, Derived('learning rate x T (per-token mean loss)',
                                       lambda c: c.optimizer.learning_rate
                                       / c.data.seq_length), 1.0,
          f'{s}: learning rate 1 (on the sum over T; config docstring "Loss scale")'),
      Row('ptb_word.py', size, Derived('clip x T (per-token mean loss)',
                                       lambda c: c.optimizer.clip_norm * c.data.seq_length),
          clip, f'{s}: max gradient norm {clip:g}'),
      Row('ptb_word.py', size, 'train.batch_size', 32, f'{s}: mini-batch size of 32'),
      # log_every is one epoch in this config.
      Row('ptb_word.py', size, Derived('epochs', lambda c: c.train.num_steps
                                       / c.train.log_every), epochs,
          f'{s}: {epochs} epochs'),
      Row('ptb_word.py', size, 'optimizer.decay_rate', decay, f'{s}: learning-rate decay'),
      Row('ptb_word.py', size, 'optimizer.decay_after_epochs', after,
          f'{s}: decay every epoch after the {after}th'),
      Row('ptb_word.py', size, 'model.forget_bias', 0.0, OURS),
  ]


def _laurent_speech_rows() -> list[Row]:
  s = f'{LAURENT} sec. 5.1'
  c = 'laurent_speech.py'
  return [
      Row(c, None, 'model.num_layers', 5, f'{s}: "5 bidirectional LSTM layers"'),
      Row(c, None, 'model.hidden_size', 250, f'{s}: 250 units per layer'),
      Row(c, None, 'model.bidirectional', True, f'{s}: bidirectional'),
      Row(c, None, 'model.variant', 'bn_input_only_seq',
          f'{s} and eq. 20-21: sequence-wise BN of the input term'),
      Row(c, None, 'model.kernel_init', 'glorot_uniform', f'{s}: "the Glorot scheme"'),
      Row(c, None, 'model.recurrent_init', 'glorot_uniform', f'{s}: "the Glorot scheme"'),
      Row(c, None, 'model.input_init', 'glorot_uniform',
          f'{s}: "the Glorot scheme"'),
      Row(c, None, 'model.forget_bias', 0.0, f'{s}: "all the biases were set to zero"'),
      Row(c, None, 'optimizer.name', 'sgd', f'{s}: SGD'),
      Row(c, None, 'optimizer.learning_rate', 1e-4, f'{s}: learning rate 1e-4'),
      Row(c, None, 'optimizer.momentum', 0.9, f'{s}: momentum 0.9'),
      Row(c, None, 'train.batch_size', 24, f'{s}: minibatches of 24'),
      Row(c, None, 'data.max_frames', 1300, f'{s}: utterances longer than 1,300 frames '
          'removed'),
  ]


def _brown_tagger_rows() -> list[Row]:
  s = f'{LAURENT} sec. 5.1 (the architecture, transposed to Brown tagging)'
  c = 'brown_tagger.py'
  return [
      Row(c, None, 'model.bidirectional', True, f'{s}: bidirectional'),
      Row(c, None, 'model.variant', 'bn_input_only_seq', f'{s}: sequence-wise BN'),
      Row(c, None, 'model.recurrent_init', 'glorot_uniform', f'{s}: "the Glorot scheme"'),
      Row(c, None, 'model.forget_bias', 0.0, f'{s}: "all the biases were set to zero"'),
      Row(c, None, 'optimizer.name', 'sgd', f'{s}: SGD'),
      Row(c, None, 'optimizer.momentum', 0.9, f'{s}: momentum 0.9'),
      Row(c, None, 'model.num_layers', 2, f'{OURS} (paper 5: CPU budget)'),
      Row(c, None, 'model.hidden_size', 64, f'{OURS} (paper 250: CPU budget)'),
  ]


def _attentive_reader_rows() -> list[Row]:
  s = f'{COOIJMANS} sec. 5.4 and App. C'
  c = 'attentive_reader.py'
  rows = []
  for variant in ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star', 'bn_e_star_star'):
    fast = variant in ('bn_e_star', 'bn_e_star_star')
    rows += [
        Row(c, variant, 'model.variant', variant, f'{s}: the variant'),
        Row(c, variant, 'model.hidden_size', 240, f'{s}: 240 hidden units'),
        Row(c, variant, 'model.gamma_init', 0.1, f'{COOIJMANS} sec. 4: gamma 0.1'),
        Row(c, variant, 'optimizer.name', 'adam', f'{s}: Adam'),
        Row(c, variant, 'optimizer.clip_norm', 10.0, f'{s}: gradient clipping at 10'),
        Row(c, variant, 'optimizer.learning_rate', 8e-4 if fast else 8e-5,
            f'{s} (arXiv version): 8e-4 for BN-e* and BN-e**, else 8e-5'),
        Row(c, variant, 'train.batch_size', 40 if fast else 64,
            f'{s}: minibatches of 40 for BN-e* and BN-e**, else 64'),
    ]
  return rows


PAPER: list[Row] = [
    *_seq_mnist_rows('seq_mnist.py', 'MNIST'),
    *_seq_mnist_rows('pmnist.py', 'pmnist'),
    *_char_rows('ptb_char.py', '5.2', units=1000, batch=64, lr=2e-3, length=100),
    *_char_rows('text8.py', '5.3', units=2000, batch=128, lr=1e-3, length=180),
    *_ptb_word_rows('small', 200, 0.1, 0.0, 20, 10.0, 15, 0.5, 6),
    *_ptb_word_rows('medium', 650, 0.05, 0.5, 35, 5.0, 40, 1 / 1.2, 6),
    *_ptb_word_rows('large', 1500, 0.04, 0.65, 35, 5.0, 55, 1 / 1.15, 15),
    *_laurent_speech_rows(),
    *_brown_tagger_rows(),
    *_attentive_reader_rows(),
    # Append rows of new paper configs here, each citing its section.
]


def _get(config, field):
  if isinstance(field, Derived):
    return field.fn(config)
  value = config
  for part in field.split('.'):
    value = value[part]
  return value


_CACHE: dict = {}


def _config(name: str, arg: Optional[str]):
  if (name, arg) not in _CACHE:
    module = helpers.load_experiment_config(name)
    _CACHE[name, arg] = module.get_config(arg) if arg else module.get_config()
  return _CACHE[name, arg]


@pytest.mark.parametrize('row', PAPER, ids=str)
def test_config_holds_the_papers_value(row):
  value = _get(_config(row.config, row.arg), row.field)
  if isinstance(row.value, float) and value is not None:
    assert math.isclose(value, row.value, rel_tol=1e-9), (
        f'{row}: config has {value!r}, the paper ({row.source}) {row.value!r}')
  else:
    assert value == row.value, (
        f'{row}: config has {value!r}, the paper ({row.source}) {row.value!r}')


def _config_files() -> list[str]:
  return sorted(os.path.basename(p) for p in glob.glob(os.path.join(CONFIG_DIR, '*.py'))
                if not p.endswith('__init__.py'))


def _arguments(module) -> list[Optional[str]]:
  """The get_config arguments to try: every variant or size the file offers."""
  if not inspect.signature(module.get_config).parameters:
    return [None]
  for name in ('SIZES', 'VARIANTS'):
    if hasattr(module, name):
      return list(getattr(module, name))
  return [None]


@pytest.mark.parametrize('name', _config_files())
def test_every_config_file_loads_and_validates(name):
  """Each file's get_config (for each variant or size it offers) builds a config that
  `train.validate_config` accepts, starts from `config_lib.default_config()`, and names a
  known variant and recurrent initialiser."""
  module = helpers.load_experiment_config(name)
  fields = set(config_lib.default_config().model.keys())
  for arg in _arguments(module):
    config = module.get_config(arg) if arg is not None else module.get_config()
    config_lib.validate_config(config)
    assert fields <= set(config.model.keys()), f'{name}: not from config_lib.default_config()'
    assert (config.model.variant in variants.VARIANTS
            or config.model.variant in models.READER_VARIANTS), f'{name}:{arg}'
    assert config.model.recurrent_init in ('orthogonal', 'identity', 'identity_candidate',
                                           'glorot_uniform')


def test_table_names_existing_configs():
  """Every row names a config file that exists (a renamed file fails here, not silently)."""
  assert {row.config for row in PAPER} <= set(_config_files())


@pytest.mark.parametrize('name', _config_files())
def test_experiment_config_loads_without_importing_jax(name):
  """A config file is data: loading it must not pay for (or need) JAX."""
  path = os.path.join(CONFIG_DIR, name)
  code = ('import importlib.util, sys\n'
          f'spec = importlib.util.spec_from_file_location("c", {path!r})\n'
          'module = importlib.util.module_from_spec(spec)\n'
          'spec.loader.exec_module(module)\n'
          'module.get_config()\n'
          'heavy = sorted(m for m in ("jax", "flax", "optax", "orbax") if m in sys.modules)\n'
          'print(heavy)\n')
  out = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO, capture_output=True,
                       text=True, env=helpers.subprocess_env(), check=True)
  assert out.stdout.strip() == '[]', out.stdout


def test_attentive_reader_config_names_every_reader_variant():
  module = helpers.load_experiment_config('attentive_reader')
  assert module.VARIANTS == tuple(models.READER_VARIANTS)


def test_config_file_builds_every_variant_and_the_cpu_preset():
  module = helpers.load_experiment_config('attentive_reader')
  for variant in models.READER_VARIANTS:
    for arg in (variant, f'{variant},cpu'):
      config = module.get_config(arg)
      config_lib.validate_config(config)
      fast = variant in ('bn_e_star', 'bn_e_star_star')
      assert (config.train.batch_size, config.optimizer.learning_rate) == (
          (40, 8e-4) if fast else (64, 8e-5))
      assert config.model.hidden_size == (64 if arg.endswith(',cpu') else 240)
      # The guard on few-row per-step statistics reaches the layers of the masked variants.
      assert train.layer_fields(config, 100)['min_step_count'] == (8 if fast else 1)
  with pytest.raises(ValueError, match='variant must be one of'):
    module.get_config('gru')
  with pytest.raises(ValueError, match=r"'gpu' is no variant and no preset; .* presets are "
                                       r"\('cpu', 'tiny'\)"):
    module.get_config('lstm,gpu')


def test_laurent_and_brown_configs_build_the_papers_model():
  loaded = {}
  for name in ('laurent_speech', 'brown_tagger'):
    loaded[name] = helpers.load_experiment_config(name).get_config()
    config_lib.validate_config(loaded[name])
  config = loaded['laurent_speech']
  options = train.layer_fields(config, config.data.max_frames)
  assert options['kernel_init'] is options['recurrent_kernel_init'] is (
      initializers.GLOROT_UNIFORM)
  model = tasks.get('tagging').build_model(config, {'num_classes': 3546}, options)
  assert (model.num_layers, model.layer.features, model.bidirectional) == (5, 250, True)
  assert (model.layer.input_norm, model.layer.statistics) == ('batch', 'sequence')
  assert model.kernel_init == 'glorot_uniform' and model.vocab_size is None
  assert (config.optimizer.name, config.optimizer.learning_rate, config.optimizer.momentum,
          config.train.batch_size) == ('sgd', 1e-4, 0.9, 24)
  brown = tasks.get('tagging').build_model(loaded['brown_tagger'],
                                           {'num_classes': 104, 'vocab_size': 50}, options)
  assert brown.bidirectional and brown.vocab_size == 50
