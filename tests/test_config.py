"""`bn_rnn_jax.training.config`: the default config and its checks (one-line errors naming the
field). The files of `experiments/configs/` are tested in `test_experiment_configs.py`."""

import pytest

from bn_rnn_jax import policy
from bn_rnn_jax import variants
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import train
import training_fixtures as fx


def test_default_config_validates():
  config_lib.validate_config(config_lib.default_config())


@pytest.mark.parametrize('field,value,message', [
    ('model.max_length', -3, 'config.model.max_length must be None'),
    ('eval.max_batches', 0, 'config.eval.max_batches must be None'),
    ('optimizer.clip_norm', 0.0, 'config.optimizer.clip_norm must be None'),
    ('optimizer.clip_norm', -1.0, 'config.optimizer.clip_norm must be None'),
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


def test_layer_fields_are_recurrent_layer_or_execution_fields():
  """Every field the config passes to the layers (`train.layer_fields`, the initialisers'
  names made callables) is one `RecurrentLayer` has, or a setting of `policy.Execution`
  (every one of which the config has)."""
  config = config_lib.default_config()
  variants.check_fields(dict(train.layer_fields(config, 10)))
  assert set(policy.EXECUTION_FIELDS) <= set(config_lib.LAYER_FIELDS)
  fields = config_lib.layer_fields(config)
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
