"""setup.py: the layers and cells need jax, jaxlib, flax and numpy only.

The exhaustive test builds a bare virtual environment offline: a new venv (no system
site-packages) holding only the installed distributions that `install_requires` pulls in,
jax, jaxlib, flax and numpy and their own requirements (read from their metadata), linked
from this environment's site-packages. In it, `import bn_rnn_jax` and the layers and cells
build, and a training step (plain `jax.grad`, SGD) runs. The core test checks, in a
subprocess of this environment, that they import no trainer, data or plotting package.
"""

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

import helpers

#: Packages of the extras (`setup.py`), which the layers and cells must not import.
EXTRA_MODULES = ('ml_collections', 'tensorboardX', 'tensorflow_datasets', 'tensorflow',
                 'array_record', 'sklearn', 'kaldiio', 'matplotlib', 'tensorboard',
                 'bn_rnn_jax.training', 'bn_rnn_jax.input_pipeline')

# Builds the layers and cells (and, with TRAIN, runs a training step of each); prints the
# modules it imported.
SCRIPT = '''
import sys
import jax, jax.numpy as jnp
import bn_rnn_jax as br

TRAIN = %s
x, mask = jnp.ones((4, 6, 3)), jnp.ones((4, 6)).at[0, 4:].set(0)
layer = br.make_layer('bn_lstm', 5, max_length=6)
encoder = br.RNN(br.BNLSTMCell(5, max_length=6, use_running_average=False))
models = [(layer, (x, mask), dict(use_running_average=False, deterministic=False)),
          (encoder, (x,), dict(seq_lengths=jnp.array([4, 6, 6, 6])))]
for model, args, kwargs in models * TRAIN:
  variables = model.init(jax.random.key(0), *args, **kwargs)
  def loss(params, stats):
    out, updates = model.apply({'params': params, 'batch_stats': stats}, *args,
                               mutable=['batch_stats'], **kwargs)
    return jnp.mean(out) ** 2, updates
  grads, updates = jax.grad(loss, has_aux=True)(variables['params'], variables['batch_stats'])
  params = jax.tree.map(lambda p, g: p - 0.1 * g, variables['params'], grads)
  assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(params))
print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))
print(' '.join(sorted(name for name in sys.modules if name.startswith('bn_rnn_jax'))))
'''


#: The public names of the layers, cells, models and statistics (the package docstring).
MODEL_NAMES = (
    'RecurrentLayer', 'make_layer', 'VARIANTS', 'Execution', 'StackedRNN',
    'Bidirectional', 'MaskedBatchNorm', 'reverse_valid', 'BNLSTMCell', 'BNInputLSTMCell',
    'LNLSTMCell', 'NormalizedLSTMCell', 'LSTMCarry', 'RNN', 'SequenceClassifier',
    'LanguageModel', 'SequenceTagger', 'AttentiveReader', 'estimate_population_stats',
    'batch_norm', 'batch_moments', 'layer_norm', 'normalize')
#: Packages of the 'train' and 'data' extras that the path above must not import.
TRAINER_PACKAGES = ('optax', 'orbax', 'absl', 'ml_collections', 'tensorflow_datasets')
#: Our modules and subpackages that import them (or need an extra): the trainer
#: (`bn_rnn_jax.training`), the data pipelines and `extras`; none may load on that path.
TRAINER_MODULES = ('extras', 'input_pipeline', 'training')

# Touches MODEL_NAMES with every import statement traced; prints, as JSON, the imports
# made by our own modules (importer, module) and the bn_rnn_jax modules it loaded.
TRACE_SCRIPT = '''
import builtins, json, sys
original, made = builtins.__import__, set()

def traced(name, globals=None, locals=None, fromlist=(), level=0):
  importer = (globals or {}).get('__name__') or ''
  if level == 0 and importer.split('.')[0] == 'bn_rnn_jax':
    made.add((importer, name))
  return original(name, globals, locals, fromlist, level)

builtins.__import__ = traced
import bn_rnn_jax
for name in %r:
  getattr(bn_rnn_jax, name)
builtins.__import__ = original
print(json.dumps({'made': sorted(made),
                  'ours': sorted(m for m in sys.modules if m.startswith('bn_rnn_jax.'))}))
'''


def _install_requires() -> list[str]:
  """`install_requires` of setup.py, read without running it."""
  with open(os.path.join(helpers.REPO, 'setup.py')) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == 'install_requires':
      return ast.literal_eval(node.value)
  raise AssertionError('setup.py has no install_requires')


def _name(requirement: str) -> str:
  return re.split(r'[ ;<>=!~\[(]', requirement.strip(), maxsplit=1)[0]


def _closure(requirements) -> list[importlib.metadata.Distribution]:
  """The installed distributions that `requirements` pull in, with their requirements
  (environment markers evaluated, extras not followed)."""
  from packaging.requirements import Requirement  # pylint: disable=g-import-not-at-top
  found, todo = {}, list(requirements)
  while todo:
    requirement = Requirement(todo.pop())
    if requirement.marker is not None and not requirement.marker.evaluate({'extra': ''}):
      continue
    key = requirement.name.lower().replace('_', '-')
    if key in found:
      continue
    found[key] = importlib.metadata.distribution(requirement.name)
    todo += found[key].requires or []
  return list(found.values())


def _check_output(stdout: str) -> None:
  modules, ours = stdout.strip().splitlines()[-2:]
  modules, ours = set(modules.split()), set(ours.split())
  assert not modules & set(EXTRA_MODULES), sorted(modules & set(EXTRA_MODULES))
  assert not ours & set(EXTRA_MODULES), sorted(ours & set(EXTRA_MODULES))
  assert 'bn_rnn_jax.flax_cells' in ours and 'bn_rnn_jax.recurrent' in ours


def test_install_requires_is_the_layers_alone():
  assert sorted(map(_name, _install_requires())) == ['flax', 'jax', 'jaxlib', 'numpy']


def test_layers_and_cells_import_no_extra_package():
  done = helpers.run_python(['-c', SCRIPT % False], one_device=True)
  assert done.returncode == 0, done.stderr[-3000:]
  _check_output(done.stdout)


def test_our_layers_cells_and_models_import_only_jax_numpy_and_flax():
  """In a fresh process, `import bn_rnn_jax` and the layer, cell, model and statistics
  names: our modules import nothing but the standard library, jax, numpy and flax, and
  none of the trainer's modules loads. (Flax itself imports absl in `flax.linen` and
  optax in `flax.nnx`, so those may be in `sys.modules`; what is checked here is what
  our code imports.)"""
  done = helpers.run_python(['-c', TRACE_SCRIPT % (MODEL_NAMES,)], one_device=True)
  assert done.returncode == 0, done.stderr[-3000:]
  traced = json.loads(done.stdout.strip().splitlines()[-1])
  outside = sorted((importer, name) for importer, name in traced['made']
                   if name.split('.')[0] not in sys.stdlib_module_names
                   and name.split('.')[0] not in ('bn_rnn_jax', 'jax', 'numpy', 'flax'))
  assert not outside, outside
  assert not {name.split('.')[0] for _, name in traced['made']} & set(TRAINER_PACKAGES)
  loaded = {name.split('.')[1] for name in traced['ours']}
  assert not loaded & set(TRAINER_MODULES), sorted(loaded & set(TRAINER_MODULES))
  assert {'models', 'flax_cells', 'recurrent', 'population'} <= loaded, sorted(loaded)


@pytest.mark.exhaustive
def test_layers_and_cells_train_in_a_bare_environment(tmp_path):
  """A venv holding only install_requires and their requirements, built offline."""
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  site = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                        capture_output=True, text=True, check=True).stdout.strip()
  linked = set()
  for dist in _closure(_install_requires()):
    for file in dist.files or ():
      top = file.parts[0]
      source = os.path.join(str(dist.locate_file('')), top)
      if top not in linked and top != '..' and os.path.exists(source):
        os.symlink(source, os.path.join(site, top))
        linked.add(top)
  # The repository itself, by path (as `pip install -e .` would put it), and nothing else.
  with open(os.path.join(site, 'bn_rnn_jax_checkout.pth'), 'w') as f:
    f.write(helpers.REPO + '\n')
  env = {'PATH': os.environ.get('PATH', ''), 'HOME': str(tmp_path), 'JAX_PLATFORMS': 'cpu'}
  probe = subprocess.run(
      [python, '-c', 'import importlib.util as u; print([m for m in ("optax", "pytest", '
       '"ml_collections", "tensorboardX", "tensorflow_datasets", "sklearn") if u.find_spec(m)])'],
      capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True)
  # optax is a requirement of flax itself; the trainer's and tests' own packages are absent.
  assert probe.stdout.strip() == "['optax']", probe.stdout
  done = subprocess.run([python, '-c', SCRIPT % True], capture_output=True, text=True, env=env,
                        cwd=str(tmp_path), timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  _check_output(done.stdout)
