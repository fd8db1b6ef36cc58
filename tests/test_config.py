"""`bn_rnn_jax.config`: the default config, its checks, the old spellings it upgrades, and
configs that load without JAX; `variants.LayerOptions`' upgrades of old layer fields."""

import glob
import os
import subprocess
import sys
import warnings

import pytest

from bn_rnn_jax import config as config_lib
from bn_rnn_jax import variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(glob.glob(os.path.join(ROOT, 'experiments', 'configs', '[!_]*.py')))


@pytest.mark.parametrize('path', CONFIG_FILES, ids=os.path.basename)
def test_experiment_config_loads_without_importing_jax(path):
  """A config file is data: loading it must not pay for (or need) JAX."""
  code = ('import importlib.util, sys\n'
          f'spec = importlib.util.spec_from_file_location("c", {path!r})\n'
          'module = importlib.util.module_from_spec(spec)\n'
          'spec.loader.exec_module(module)\n'
          'module.get_config()\n'
          'heavy = sorted(m for m in ("jax", "flax", "optax", "orbax") if m in sys.modules)\n'
          'print(heavy)\n')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, 'PYTHONPATH': ROOT}, check=True)
  assert out.stdout.strip() == '[]', out.stdout


def test_default_config_passes_upgrade_unchanged_and_validates():
  config = config_lib.default_config()
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # today's spellings warn about nothing
    upgraded = config_lib.upgrade(config)
  assert upgraded.to_dict() == config.to_dict()
  config_lib.validate_config(upgraded)


@pytest.mark.parametrize('section,name', [('model', 'max_length'), ('train', 'num_devices'),
                                          ('eval', 'max_batches'),
                                          ('eval', 'population_batch_size')])
def test_zero_for_default_is_upgraded_to_none_with_a_warning(section, name):
  config = config_lib.default_config()
  config[section][name] = 0
  with pytest.warns(DeprecationWarning, match=f'config.{section}.{name}=0'):
    upgraded = config_lib.upgrade(config)
  assert upgraded[section][name] is None
  assert config[section][name] == 0  # the caller's config is left as it was


def test_clip_norm_off_is_none():
  config = config_lib.default_config()
  config.optimizer.clip_norm = 0.0
  with pytest.warns(DeprecationWarning, match='clip_norm'):
    assert config_lib.upgrade(config).optimizer.clip_norm is None
  config.optimizer.clip_norm = -1.0
  with pytest.raises(ValueError, match='clip_norm must be None'):
    config_lib.validate_config(config)


def test_layer_options_sub_dict_moves_to_model_fields():
  config = config_lib.default_config()
  config.model.layer_options = {'input_init': 'glorot_uniform', 'padded_statistics': True}
  with pytest.warns(DeprecationWarning, match='config.model.input_init'):
    upgraded = config_lib.upgrade(config)
  assert 'layer_options' not in upgraded.model
  assert upgraded.model.input_init == 'glorot_uniform'
  fields = config_lib.layer_fields(upgraded)
  assert fields['padded_statistics'] is True and fields['input_init'] == 'glorot_uniform'


@pytest.mark.parametrize('field,value,message', [
    ('model.max_length', -3, 'config.model.max_length must be None'),
    ('train.num_devices', -2, 'config.train.num_devices must be None'),
    ('eval.population_batch_size', 150, 'multiple of config.train.batch_size=100'),
    ('parallel.backend', 'mesh', "config.parallel.backend must be one of"),
    ('train.batch_size', True, 'config.train.batch_size must be a positive integer'),
])
def test_bad_values_are_one_line_errors(field, value, message):
  config = config_lib.default_config()
  section, name = field.split('.')
  config[section][name] = value
  with pytest.raises(ValueError, match=message) as info:
    config_lib.validate_config(config)
  assert '\n' not in str(info.value)


def test_layer_fields_are_recurrent_layer_fields():
  """Every field `layer_fields` passes on is one `RecurrentLayer` has."""
  fields = config_lib.layer_fields(config_lib.default_config())
  variants.check_fields(fields)
  assert set(config_lib.LAYER_FIELDS) - {'max_length'} >= set(fields) - {'dtype'}


@pytest.mark.parametrize('old,new', [
    (dict(stats_per_step=True, input_statistics='frame'), 'per_step'),
    (dict(input_statistics='sequence'), 'sequence'),
    (dict(stats_per_step=False, input_statistics='sequence'), 'shared'),
])
def test_old_statistics_fields_are_translated_with_a_warning(old, new):
  with pytest.warns(DeprecationWarning, match=f"statistics='{new}'"):
    options = variants.LayerOptions(**old)
  assert dict(options) == {'statistics': new}
  with pytest.warns(DeprecationWarning):
    assert variants.make_layer('bn_lstm', 4, **old).statistics == new


def test_old_statistics_without_an_equivalent_is_a_one_line_error():
  with pytest.raises(ValueError, match="statistics='per_step', 'sequence' or 'shared'"):
    variants.LayerOptions(stats_per_step=False, input_statistics='frame')


def test_unknown_layer_field_names_a_close_match():
  with pytest.raises(ValueError, match="did you mean 'max_length'"):
    variants.LayerOptions(max_lenght=3)


def test_layer_options_are_hashable_mappings():
  a = variants.LayerOptions({'max_length': 7}, remat='full')
  b = variants.LayerOptions(remat='full', max_length=7)
  assert a == b and hash(a) == hash(b) and dict(a) == {'max_length': 7, 'remat': 'full'}
  assert a.replace(remat='none')['remat'] == 'none' and a['remat'] == 'full'


def test_boolean_remat_is_upgraded_with_a_warning():
  layer = variants.make_layer('bn_lstm', 8, remat=True)
  with pytest.warns(DeprecationWarning, match="remat='full'"):
    assert layer.execution_policy(4).remat == 'full'


def test_attentive_reader_config_names_every_reader_variant():
  import importlib.util  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax import models  # pylint: disable=g-import-not-at-top
  path = os.path.join(ROOT, 'experiments', 'configs', 'attentive_reader.py')
  spec = importlib.util.spec_from_file_location('attentive_reader_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.VARIANTS == tuple(models.READER_VARIANTS)
