"""Executes notebooks/quickstart.ipynb headless so that it cannot rot.

The kernel is the interpreter running the tests: jupyter_client starts a kernelspec whose
command is `python` with `sys.executable`, and when no `python3` kernelspec is installed at
all, the test registers one for this interpreter under a temporary JUPYTER_DATA_DIR.
"""

import os
import re
import subprocess
import sys

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'notebooks', 'quickstart.ipynb')


def _ensure_kernel(tmp_path_factory):
  from jupyter_client import kernelspec  # pylint: disable=g-import-not-at-top
  if 'python3' in kernelspec.find_kernel_specs():
    return
  data_dir = str(tmp_path_factory.mktemp('jupyter'))
  os.environ['JUPYTER_DATA_DIR'] = data_dir
  subprocess.run([sys.executable, '-m', 'ipykernel', 'install', '--user', '--name', 'python3'],
                 check=True, capture_output=True)


@pytest.fixture(scope='module')
def executed(tmp_path_factory):
  _ensure_kernel(tmp_path_factory)
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  env_before = os.environ.get('XLA_FLAGS')
  # One CPU device is enough for the notebook (conftest asks for 8 fake ones).
  os.environ['XLA_FLAGS'] = ''
  try:
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name='python3',
                                     resources={'metadata': {'path': REPO}})
    client.execute()
  finally:
    if env_before is None:
      os.environ.pop('XLA_FLAGS', None)
    else:
      os.environ['XLA_FLAGS'] = env_before
  return notebook


def _text(cell):
  return ''.join(o.get('text', '') for o in cell.get('outputs', [])
                 if o.get('output_type') == 'stream')


@pytest.mark.exhaustive
def test_quickstart_runs_and_learns(executed):
  code = [c for c in executed.cells if c.cell_type == 'code']
  assert all(not any(o.get('output_type') == 'error' for o in c.outputs) for c in code)
  log = '\n'.join(_text(c) for c in code)
  accuracies = dict(re.findall(r'^(\w+)\s+valid accuracy ([0-9.]+)', log, re.M))
  assert set(accuracies) == {'lstm', 'bn_lstm'}, log
  # 10 classes: chance is 0.1; a few hundred steps on 8x8 digits reach far above it.
  assert float(accuracies['bn_lstm']) > 0.6, log
  images = [o for c in code for o in c.outputs if 'image/png' in o.get('data', {})]
  assert len(images) == 2
