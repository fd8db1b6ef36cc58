"""`extras.py`: every module that imports an optional package, without it, fails with one
line naming the package and the extra that installs it (in this process: the package is
hidden by a `None` in `sys.modules`, which makes its import fail as a missing one does).
The table of packages is setup.py's extras."""

import ast
import importlib
import importlib.util
import os
import re
import sys

import jax
import jax.numpy as jnp
import pytest

from bn_rnn_jax import extras
import helpers


def _hide(monkeypatch, package: str, *reimported: str) -> None:
  """Make `package` missing, and `reimported` (modules already loaded) load again."""
  monkeypatch.setitem(sys.modules, package, None)
  for name in reimported:
    monkeypatch.delitem(sys.modules, name, raising=False)


def _line(who: str, distribution: str, extra: str) -> str:
  return (f"{who} needs {distribution} (the '{extra}' extra): pip install -e '.[{extra}]' "
          'in the bn_rnn_jax repository')


@pytest.mark.parametrize('module', ['bn_rnn_jax.training.loop', 'bn_rnn_jax.training.config',
                                    'bn_rnn_jax.input_pipeline.tagging'])
def test_importing_a_training_module_without_its_extra_is_one_line(monkeypatch, module):
  _hide(monkeypatch, 'ml_collections', module, 'bn_rnn_jax.training.config',
        'bn_rnn_jax.training.loop')
  with pytest.raises(extras.MissingExtra) as raised:
    importlib.import_module(module)
  assert str(raised.value) == _line(module, 'ml_collections', 'train')
  assert raised.value.__cause__ is None and raised.value.__suppress_context__
  assert isinstance(raised.value, ModuleNotFoundError)


@pytest.mark.parametrize('packages, module, distribution', [
    (('orbax', 'orbax.checkpoint'), 'bn_rnn_jax.training.checkpoint', 'orbax-checkpoint'),
    (('optax',), 'bn_rnn_jax.training.optim', 'optax'),
    (('tensorboardX',), 'bn_rnn_jax.training.metric_writer', 'tensorboardX')])
def test_the_trainer_without_a_package_of_its_extra_is_one_line_at_import(
    monkeypatch, packages, module, distribution):
  """The trainer imports every package it needs with its modules, so a missing one is
  found before a run starts (no step trained, no workdir file): importing the loop
  without tensorboardX, which the first metrics record used to need, is the line."""
  for package in packages:
    _hide(monkeypatch, package)
  training = importlib.import_module('bn_rnn_jax.training')
  for name in (module, 'bn_rnn_jax.training.loop'):   # imported again, not found loaded
    monkeypatch.delitem(sys.modules, name, raising=False)
    if name.split('.')[-1] in vars(training):   # (hasattr would import it: __getattr__)
      monkeypatch.delattr(training, name.split('.')[-1])
  importing = ['bn_rnn_jax.training.loop', module] if distribution == 'tensorboardX' else [module]
  for name in importing:
    with pytest.raises(extras.MissingExtra) as raised:
      importlib.import_module(name)
    assert str(raised.value) == _line(module, distribution, 'train')


def test_the_digits_without_scikit_learn_is_one_line(monkeypatch):
  from bn_rnn_jax.input_pipeline import mnist  # pylint: disable=g-import-not-at-top
  _hide(monkeypatch, 'sklearn', 'sklearn.datasets')
  with pytest.raises(extras.MissingExtra, match=re.escape(_line(
      'The 8x8 digits (config.data.name=digits)', 'scikit-learn', 'data'))):
    mnist.load_digits()


def test_saving_an_export_without_flatbuffers_is_one_line(monkeypatch, tmp_path):
  """jax.export wraps its own ModuleNotFoundError for flatbuffers in an ImportError."""
  from bn_rnn_jax import export  # pylint: disable=g-import-not-at-top
  exported = export.export(lambda x: 2 * x, [jax.ShapeDtypeStruct((2,), jnp.float32)])
  _hide(monkeypatch, 'flatbuffers', 'jax._src.export.serialization',
        'jax._src.export.serialization_generated')
  with pytest.raises(extras.MissingExtra, match=re.escape(_line(
      'bn_rnn_jax.export.save', 'flatbuffers', 'export'))):
    export.save(exported, str(tmp_path / 'f.jax'))
  assert not os.path.exists(tmp_path / 'f.jax')


def test_a_script_exits_with_the_line(monkeypatch):
  _hide(monkeypatch, 'matplotlib')
  with pytest.raises(SystemExit) as raised:
    with extras.needed_by('experiments/plot.py', exit=True):
      import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  assert raised.value.code == 'error: ' + _line('experiments/plot.py', 'matplotlib', 'plot')


def test_other_import_errors_pass_unchanged(monkeypatch):
  with pytest.raises(ModuleNotFoundError) as raised:
    with extras.needed_by('here'):
      import no_such_package_anywhere  # pylint: disable=g-import-not-at-top,unused-import
  assert type(raised.value) is ModuleNotFoundError   # pylint: disable=unidiomatic-typecheck
  # A MissingExtra from further in keeps the module it names.
  _hide(monkeypatch, 'ml_collections', 'bn_rnn_jax.training.config')
  with pytest.raises(extras.MissingExtra, match='^bn_rnn_jax.training.config needs'):
    with extras.needed_by('outer'):
      importlib.import_module('bn_rnn_jax.training.config')


def _setup_extras() -> dict[str, list[str]]:
  """setup.py's EXTRAS (the literal dict), each requirement without its version."""
  with open(os.path.join(helpers.REPO, 'setup.py')) as f:
    tree = ast.parse(f.read())
  node = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and getattr(n.targets[0], 'id', None) == 'EXTRAS')
  return {extra: [re.split(r'[<>=!~\[ ]', r, maxsplit=1)[0] for r in requirements]
          for extra, requirements in ast.literal_eval(node.value).items()}


def test_packages_are_setup_extras():
  """Every package of the extras the library and experiments import from is in the
  table, with its extra; the table names no other."""
  wanted = {(distribution, extra) for extra, names in _setup_extras().items()
            if extra in ('train', 'data', 'export', 'plot') for distribution in names}
  assert set(extras.PACKAGES.values()) == wanted
  for module in extras.PACKAGES:   # each key is the module its distribution installs
    assert importlib.util.find_spec(module) is not None, module


def test_the_package_names_the_extra_of_a_training_name(monkeypatch):
  """`bn_rnn_jax.train_and_evaluate` loads the trainer on first use: without its extra,
  the one line (the layers need none: tests/test_install.py)."""
  import bn_rnn_jax as br  # pylint: disable=g-import-not-at-top
  _hide(monkeypatch, 'ml_collections', 'bn_rnn_jax.training.loop', 'bn_rnn_jax.training.config')
  with pytest.raises(extras.MissingExtra, match='^bn_rnn_jax.training.loop needs ml_collections'):
    br.train_and_evaluate  # pylint: disable=pointless-statement


def test_the_export_script_without_flatbuffers_ends_before_any_work(monkeypatch):
  """`experiments/export_run.py` imports jax.export's serialisation package with its own,
  so a missing one ends it with the line before a run is loaded or estimated."""
  _hide(monkeypatch, 'flatbuffers', 'experiments.export_run')
  with pytest.raises(SystemExit) as raised:
    import experiments.export_run  # pylint: disable=g-import-not-at-top,unused-import
  assert raised.value.code == 'error: ' + _line('experiments/export_run.py', 'flatbuffers',
                                                'export')
