"""`bn_rnn_jax.config`: the default config, its checks (one-line errors naming the field),
and the old spellings it upgrades. The files of `experiments/configs/` are tested in
`test_experiment_configs.py`."""

import warnings

import pytest

from bn_rnn_jax import config as config_lib
from bn_rnn_jax import variants
import training_fixtures as fx


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


def test_nan_learning_rate_is_a_config_error():
  config = fx.tiny_config(**{'optimizer.learning_rate': float('nan')})
  with pytest.raises(ValueError, match='learning_rate must be a positive finite number; got nan'):
    config_lib.validate_config(config)


def test_unknown_backend_is_one_clear_error():
  config = fx.tiny_config('lstm', **{'parallel.backend': 'pjit'})
  with pytest.raises(ValueError, match=r"config.parallel.backend must be one of .*'pjit'"):
    config_lib.validate_config(config)


@pytest.mark.parametrize('size', [-16, 24])
def test_population_batch_size_must_be_a_multiple_of_the_batch(size):
  config = fx.tiny_config(**{'eval.population_batch_size': size})
  with pytest.raises(ValueError, match='population_batch_size must be None'):
    config_lib.validate_config(config)
