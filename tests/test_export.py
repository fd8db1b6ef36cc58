"""Export (`bn_rnn_jax/export.py`, `experiments/export_run.py`) on tiny trained runs.

A run is trained with `loop.train_and_evaluate`, exported with the command's function,
and reloaded in a fresh Python process that imports only jax and numpy; its outputs must
equal the model's own on held-out batches, including a batch of another size and length
(the batch and length axes are symbolic), within the command's RTOL, ATOL. A saved file
carries its SHA-256: any damage is one line naming it, and JAX alone still reads it.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

from bn_rnn_jax import export
from bn_rnn_jax import variants
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import loop
from experiments import export_run as export_command
import helpers
import training_fixtures as fx


def _tiny_classifier_run(workdir):
  """A BN-LSTM on the offline 8x8 digits (64 steps), two evaluations."""
  config = fx.tiny_config('bn_lstm')
  config.data = mnist.default_data_config('digits')
  config.train.num_devices = 1
  config.checkpoint.best_metric = 'valid/accuracy'
  config.eval.max_batches = 2
  loop.train_and_evaluate(config, workdir)


@pytest.fixture(scope='module')
def language_model_run(tmp_path_factory):
  """A tiny character BN-LSTM on fixture text (`experiments/configs/ptb_char.py`)."""
  tmp_path = tmp_path_factory.mktemp('char')
  config = fx.tiny_text_config(fx.load_config('ptb_char', 'bn_lstm'),
                               fx.write_ptb_fixture(tmp_path, lines=(60, 10, 10)), 8, 12,
                               hidden=8)
  config.train.num_steps = 4
  config.train.log_every = 2
  config.eval.every = 2
  config.eval.max_batches = 2
  config.checkpoint.every = 2
  config.checkpoint.best_metric = 'valid/bpc'
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  return workdir


def _command(module, *args):
  return helpers.run_python(['-m', module, *args], timeout=900)


def _check(description, symbolic):
  sets = description['check']['sets']
  assert len(sets) == 3 and all(s['equal'] for s in sets), sets
  # The cut-down set has another batch size and length than the others.
  assert sets[-1]['output_shape'][:2] != sets[0]['output_shape'][:2]
  for name, spec in description['inputs'].items():
    assert all(axis in spec for axis in symbolic[name]), (name, spec)


@pytest.mark.slow
def test_classifier_run_exports_and_reloads_without_the_model_code(tmp_path):
  workdir = str(tmp_path / 'run')
  _tiny_classifier_run(workdir)
  output = str(tmp_path / 'model.jax')
  description = export_command.export_run(workdir, output)
  _check(description, {'inputs': ('batch', 'time')})
  assert description['task'] == 'classification'
  assert description['population_stats'] == 'estimate'
  saved = json.loads(open(output + '.json').read())
  assert saved['check'] == description['check'] and tmp_path.name not in json.dumps(saved)


@pytest.mark.exhaustive  # the export itself: the classifier's test above
def test_language_model_run_exports_from_the_command_line(tmp_path, language_model_run):
  output = str(tmp_path / 'model.jax')
  done = _command('experiments.export_run', f'--workdir={language_model_run}', f'--output={output}')
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'reloaded without the model code' in done.stdout
  description = json.loads(open(output + '.json').read())
  _check(description, {'inputs': ('batch', 'time'), 'mask': ('batch', 'time')})
  assert description['outputs'][0].startswith('float32[batch,time,')


@pytest.mark.exhaustive
def test_sampler_prints_reproducible_text_past_the_training_length(language_model_run):
  """40 symbols after the prompt (the model trained on 12): the same seed, the same text;
  another seed, another text."""
  args = (f'--workdir={language_model_run}', '--length=40', '--temperature=0.8',
          '--num_samples=2', '--prompt=the ')
  runs = [_command('experiments.sample', *args, f'--seed={seed}') for seed in (0, 0, 1)]
  for done in runs:
    assert done.returncode == 0, done.stderr[-2000:]
  texts = [done.stdout.splitlines() for done in runs]
  assert texts[0] == texts[1] and texts[0] != texts[2]
  letters = set(''.join(fx.WORDS)) | {' '}
  drawn = ''.join(texts[0])
  assert drawn.startswith('the ') and set(drawn) <= letters, drawn


@pytest.mark.slow
def test_sampler_refuses_a_bad_prompt_in_one_line(language_model_run):
  done = _command('experiments.sample', f'--workdir={language_model_run}', '--prompt=QZ')
  assert done.returncode != 0
  assert done.stderr.strip().splitlines()[-1].startswith("error: --prompt has symbols")


def test_reloaded_model_runs_any_batch_and_length(tmp_path):
  """The library functions alone: a per-step BN-LSTM trained on length 4 runs at other
  batch sizes and at length 9 (rows past the last trained one reuse it)."""
  layer = variants.make_layer('bn_lstm', 6, max_length=4)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 4, 3)).astype(np.float32)
  variables = layer.init(jax.random.key(0), x, use_running_average=True, deterministic=True)
  _, updated = layer.apply(variables, x, use_running_average=False, deterministic=False,
                           mutable=['batch_stats'])
  infer = export.inference_function(layer, {**variables, **updated})
  exported = export.export(infer,
                           export.symbolic_specs((x,), [('batch', 'time', None)]))
  path = str(tmp_path / 'layer.jax')
  export.save(exported, path)
  inputs = [(rng.normal(size=shape).astype(np.float32),) for shape in ((5, 4, 3), (2, 9, 3))]
  for (got,), (x_k,) in zip(export.run_in_fresh_process(path, inputs), inputs):
    np.testing.assert_allclose(got, infer(x_k), rtol=export_command.RTOL,
                               atol=export_command.ATOL)
  assert export.load(path).in_avals[0].shape[2] == 3


def _damaged(data: bytes, how: str) -> bytes:
  third = len(data) // 3
  return {'cut_short': data[:len(data) // 2],
          'emptied': b'',
          'header_flipped': bytes([data[0] ^ 0xFF]) + data[1:],
          'bytes_flipped': data[:third] + bytes(b ^ 0xFF for b in data[third:third + 8])
                           + data[third + 8:],
          'checksum_flipped': data[:-2] + bytes([data[-2] ^ 0x01]) + data[-1:]}[how]


_DAMAGE = {
    'cut_short': 'it does not end with the SHA-256 line bn_rnn_jax.export.save writes (cut '
                 'short, or not saved by it)',
    'emptied': 'it is empty',
    'header_flipped': 'its content does not match the SHA-256 saved with it',
    'bytes_flipped': 'its content does not match the SHA-256 saved with it',
    'checksum_flipped': 'its content does not match the SHA-256 saved with it',
}


def test_a_saved_export_is_checked_and_any_damage_is_one_line_naming_it(tmp_path):
  """`save` appends the program's SHA-256; `load` checks it, so no damaged file is
  deserialized (whose errors were tracebacks) or run (whose constants could be NaN or
  slightly off). JAX's own reader ignores the line."""
  exported = export.export(lambda x: 2 * x, [jax.ShapeDtypeStruct((2,), jnp.float32)])
  path = str(tmp_path / 'model.jax')
  export.save(exported, path)
  with open(path, 'rb') as f:
    data = f.read()
  assert data.endswith(b'\n') and export.CHECKSUM_PREFIX in data[-100:]
  np.testing.assert_array_equal(export.load(path).call(jnp.ones(2)), [2.0, 2.0])
  np.testing.assert_array_equal(jax_export.deserialize(bytearray(data)).call(jnp.ones(2)),
                                [2.0, 2.0])
  for how, problem in _DAMAGE.items():
    damaged = str(tmp_path / f'{how}.jax')
    with open(damaged, 'wb') as f:
      f.write(_damaged(data, how))
    with pytest.raises(ValueError) as error:
      export.load(os.path.relpath(damaged))
    assert helpers.one_line(error) == (f'The exported model {damaged} is damaged: {problem}; '
                                       'export the model again.'), how
  with pytest.raises(ValueError, match=f'Cannot write the exported model {tmp_path}/no/m.jax '
                     r'\(No such file or directory\)\.$'):
    export.save(exported, str(tmp_path / 'no' / 'm.jax'))


def test_untrained_statistics_are_not_exported():
  layer = variants.make_layer('bn_lstm', 6, max_length=4)
  variables = layer.init(jax.random.key(0), np.zeros((2, 4, 3), np.float32),
                         use_running_average=True, deterministic=True)
  with pytest.raises(ValueError, match='Cannot export untrained population statistics'):
    export.inference_function(layer, variables)


@pytest.mark.parametrize('temperature', ['1e-40', '1e40'])
def test_sampler_temperature_outside_float32_is_one_line(tmp_path, temperature):
  done = _command('experiments.sample', f'--workdir={tmp_path}',
                  f'--temperature={temperature}')
  assert done.returncode == 1
  line = helpers.last_line_without_traceback(done.stderr)
  assert line == (f'error: --temperature={float(temperature)!r} is not a normal float32 (the '
                  'sampler divides float32 logits by it); use a value in [1.18e-38, 3.4e+38].')


def test_missing_run_folder_is_one_line(tmp_path):
  with pytest.raises(ValueError, match='config.json not found'):
    export_command.load_run(str(tmp_path / 'nothing'))
