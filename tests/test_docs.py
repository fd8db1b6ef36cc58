"""The documentation: the Sphinx site builds without a warning, every example runs, every
quoted table matches its JSON, and the README says what CI does.

* `sphinx -W -b html docs` (warnings are errors) and the API reference holds every public
  name of every module (exhaustive tier).
* `sphinx -b doctest docs`: every example of the guides and every `>>>` of a docstring
  runs and prints what the page says, and each layer-guide example alone (exhaustive
  tier; the default run runs the README's examples).
* Every `<!-- json-table NAME -->` block of the README and docs/ equals `docs/tables.py`'s
  rendering of its JSON (the campaign tables: tests/test_campaign.py).
* Every config field has its description in bn_rnn_jax/training/config.py.
* The README's install and test commands are those of .ci/run, its library example runs,
  and no page narrates the history of the work or cites files outside the repository.
"""

import glob
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import time
import zlib

import pytest

import bn_rnn_jax
import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, 'docs')


def _load(name: str, path: str):
  """A module of docs/ under a name of its own (not importable from the repository)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


config_fields = _load('docs_config_fields', os.path.join(DOCS, '_ext', 'config_fields.py'))
tables = _load('docs_tables', os.path.join(DOCS, 'tables.py'))

with open(os.path.join(REPO, 'README.md')) as _f:
  README = _f.read()


def _sphinx(builder: str, out: str) -> tuple[subprocess.CompletedProcess, float]:
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-E', '-b', builder,
       DOCS, out], cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
  return done, time.monotonic() - started


@pytest.fixture(scope='module')
def html(tmp_path_factory):
  """The site, built once for the tests that read it."""
  out = str(tmp_path_factory.mktemp('html'))
  done, seconds = _sphinx('html', out)
  print(f'sphinx html: {seconds:.0f} s')
  return out, done


@pytest.mark.exhaustive
def test_site_builds_without_a_warning(html):
  out, done = html
  assert done.returncode == 0, f'sphinx-build -W failed:\n{done.stderr[-4000:]}'
  assert 'WARNING' not in done.stderr and 'ERROR' not in done.stderr, done.stderr[-4000:]
  for page in ('index', 'guide/layers', 'guide/training', 'guarantees', 'data', 'speed',
               'design', 'api/index', 'experiments/index', 'experiments/language_modelling'):
    assert os.path.exists(os.path.join(out, f'{page}.html')), page
  # The quoted tables' markers stay HTML comments: a reader sees none of them.
  for path in glob.glob(os.path.join(out, '**', '*.html'), recursive=True):
    with open(path) as f:
      shown = re.sub(r'<!--.*?-->', '', f.read(), flags=re.S)
    assert 'json-table' not in shown, path


def _inventory(out: str) -> set[str]:
  """The object names of a built site's objects.inv."""
  with open(os.path.join(out, 'objects.inv'), 'rb') as f:
    for _ in range(4):
      f.readline()
    body = zlib.decompress(f.read()).decode()
  return {line.split()[0] for line in body.splitlines()}


def _modules() -> list[str]:
  names = list(bn_rnn_jax._MODULES)  # pylint: disable=protected-access
  for package in ('input_pipeline', 'training'):
    names += [f'{package}.{m.name}' for m in pkgutil.iter_modules(
        getattr(bn_rnn_jax, package).__path__)]
  return [f'bn_rnn_jax.{name}' for name in names]


def public_names() -> list[str]:
  """Every public class and function defined in a module of bn_rnn_jax, the public
  methods of those classes, and the package's own names (`bn_rnn_jax.__all__`)."""
  out = []
  for name in _modules():
    module = importlib.import_module(name)
    for attr, value in vars(module).items():
      if attr.startswith('_') or getattr(value, '__module__', None) != name:
        continue
      if inspect.isfunction(value):
        out.append(f'{name}.{attr}')
      elif inspect.isclass(value):
        out.append(f'{name}.{attr}')
        out += [f'{name}.{attr}.{m}' for m, v in vars(value).items()
                if not m.startswith('_') and inspect.isfunction(v)]
  for attr, module in bn_rnn_jax._NAMES.items():  # pylint: disable=protected-access
    out.append(f'bn_rnn_jax.{module}.{attr}')
  return sorted(set(out))


@pytest.mark.exhaustive
def test_api_reference_holds_every_public_name(html):
  out, done = html
  assert done.returncode == 0, done.stderr[-2000:]
  documented = _inventory(out)
  names = public_names()
  assert len(names) > 200
  missing = [n for n in names if n not in documented]
  assert not missing, f'not in the API reference: {missing}'
  for module in _modules():
    assert module in documented, module


@pytest.mark.exhaustive
def test_examples_and_docstrings_run_as_doctests(tmp_path):
  done, seconds = _sphinx('doctest', str(tmp_path))
  print(f'sphinx doctest: {seconds:.0f} s')
  with open(tmp_path / 'output.txt') as f:
    report = f.read()
  assert done.returncode == 0, f'{done.stderr[-3000:]}\n{report[-3000:]}'
  tests = int(re.search(r'(\d+) tests\n', report.split('Doctest summary')[1]).group(1))
  assert tests >= 15 and '0 failures in tests' in report, report[-3000:]


def guide_blocks(path: str) -> list[tuple[str, str, str]]:
  """`(group, code, expected output)` of every `{testcode}` block of a guide page."""
  with open(path) as f:
    text = f.read()
  block = r'```\{%s\} (\S+)\n(.*?)```'
  codes = re.findall(block % 'testcode', text, re.S)
  outputs = dict(re.findall(block % 'testoutput', text, re.S))
  assert len(codes) == text.count('```{testcode}'), f'{path}: a testcode block has no group'
  return [(group, code, outputs.get(group, '')) for group, code in codes]


LAYER_GUIDE = guide_blocks(os.path.join(DOCS, 'guide', 'layers.md'))


def test_layer_guide_blocks_are_groups_of_their_own():
  groups = [group for group, _, _ in LAYER_GUIDE]
  assert len(groups) == len(set(groups)) >= 9, groups


@pytest.mark.parametrize('group,code,expected', [
    pytest.param(*block, id=block[0],
                 marks=pytest.mark.exhaustive)
    for block in LAYER_GUIDE])
def test_layer_guide_block_runs_on_its_own(group, code, expected):
  """Each example of the layer guide, alone in a fresh process (one CPU device, as the
  doctest build runs it), prints what the page says."""
  done = helpers.run_python(['-c', code], one_device=True)
  assert done.returncode == 0, f'{group}:\n{done.stderr[-3000:]}'
  assert done.stdout.strip() == expected.strip(), (group, done.stdout)


# ---------------------------------------------------------------------- quoted tables
QUOTED = [(os.path.relpath(path, REPO), name, args, text)
          for path in tables.documents()
          for name, args, text in tables.json_blocks(open(path).read())]


def test_json_tables_are_quoted_where_the_docs_say():
  quoted = {(doc, name) for doc, name, _, _ in QUOTED}
  assert ('README.md', 'experiments') in quoted and ('README.md', 'run_time') in quoted
  for name in ('rnn_speed', 'batch_sums', 'speed_targets', 'trainer_overhead', 'cell_speed',
               'gpu_compile', 'tpu_compile'):
    assert ('docs/speed.md', name) in quoted, name
  assert ('docs/experiments/figures.md', 'figures') in quoted


@pytest.mark.parametrize('doc,name,args,text', QUOTED,
                         ids=[f'{d}:{n}:{",".join(a)}' for d, n, a, _ in QUOTED])
def test_json_table_regenerates_from_its_json(doc, name, args, text):
  assert tables.render(name, *args).strip('\n') == text, (
      f'{doc}: json-table {name} {args} is stale; python docs/tables.py --write')


def test_same_steps_compares_two_results_at_their_common_steps(tmp_path):
  """Run `a` validated at steps 1, 2, 3 here and 2, 3 there; a metric that repeats another
  (a model without statistics) and a run only one side has are left out."""
  def results(path, runs):
    records = lambda values: [{'step': s, 'split': 'valid', 'bpc': v, 'bpc_batch': v}
                              for s, v in values]
    with open(path, 'w') as f:
      json.dump({'runs': {n: {'records': records(v)} for n, v in runs.items()}}, f)
    return str(path)
  first = results(tmp_path / 'a.json', {'a': [(1, 2.0), (2, 1.5), (3, 1.4)], 'b': [(1, 1.0)]})
  second = results(tmp_path / 'b.json', {'a': [(2, 1.45), (3, 1.41)]})
  assert tables.same_steps(first, second, 'bpc,bpc_batch') == (
      '| run | metric | steps compared | from–to | largest difference | mean difference |\n'
      '|---|---|---|---|---|---|\n'
      '| a | bpc | 2 | 2–3 | -0.0500 (step 2) | -0.0200 |')


def test_quoted_plain_text_is_fenced():
  """Quoted text of several lines that is neither a Markdown table nor a list sits in a
  code block: Markdown would join its lines, and make a heading of a header row above a
  rule of dashes."""
  marked = re.compile(r'<!-- json-table ([^>]*)-->\n(.*?)<!-- /', re.S)
  unfenced = []
  for path in tables.documents():
    with open(path) as f:
      for name, block in marked.findall(f.read()):
        if block.strip('\n').startswith('```'):
          continue
        for paragraph in block.strip('\n').split('\n\n'):
          if '\n' in paragraph and not paragraph.startswith(('|', '* ')):
            unfenced.append(f'{os.path.relpath(path, REPO)}: {name.strip()}')
  assert not unfenced, unfenced


def test_every_experiment_row_names_an_existing_config_and_page():
  readme = tables.experiments('readme')
  for link in re.findall(r'\]\(([^)]+)\)', readme):
    if not link.startswith('http'):
      assert os.path.exists(os.path.join(REPO, link)), link
  assert readme.count('\n') - 1 == len(tables._EXPERIMENTS)  # pylint: disable=protected-access


# ---------------------------------------------------------------------- config fields
def test_every_config_field_has_a_description():
  from bn_rnn_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  fields = config_fields.fields()
  paths = {f.path for f in fields}

  def leaves(node, prefix=''):
    for key in node.keys():
      value = node[key]
      if hasattr(value, 'keys') and prefix + key != 'data':
        yield from leaves(value, f'{prefix}{key}.')
      else:
        yield prefix + key

  assert paths == set(leaves(config_lib.default_config()))
  missing = [f.path for f in fields if not f.description]
  assert not missing, f'fields without a comment in bn_rnn_jax/training/config.py: {missing}'
  by_path = {f.path: f for f in fields}
  assert by_path['train.time_budget_s'].description.startswith('Wall-clock seconds')
  assert 'rmsprop' in by_path['optimizer.name'].description
  assert config_fields.default_text(by_path['model.max_length']) == 'None (int)'


# ---------------------------------------------------------------------- the README
def _shell_blocks(text: str) -> list[str]:
  return re.findall(r'```bash\n(.*?)```', text, re.S)


def test_readme_install_and_test_commands_are_what_ci_runs():
  install, test = _shell_blocks(README)[:2]
  with open(os.path.join(REPO, '.ci', 'run')) as f:
    ci = [line.strip() for line in f if line.strip() and not line.startswith('#')]
  install_pip = next(c for c in install.split(' && ') if c.startswith('pip install'))
  assert install_pip.replace('pip install', 'pip install -q') in ci, install_pip
  assert test.strip() in ci
  assert 'experiments/quickstart.py' in install


def test_readme_library_examples_run():
  """The examples of "Use it in your model", in order, in one namespace: the Linen cell,
  the NNX cell, the layer."""
  section = README.split('## Use it in your model\n')[1].split('\n## ')[0]
  blocks = re.findall(r'```python\n(.*?)```', section, re.S)
  assert len(blocks) == 3
  namespace = {}
  for code in blocks:
    exec(compile(code, 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
  assert namespace['ys'].shape == (16, 100, 32)
  assert namespace['stats']['BNLSTMCell_0']['recurrent']['mean'].shape == (100, 128)
  assert namespace['nnx_ys'].shape == (16, 100, 32)
  assert namespace['outputs'].shape == (2, 300, 32)
  assert namespace['layer_stats']['recurrent']['mean'].shape == (100, 128)


def test_readme_links_resolve():
  for link in re.findall(r'\]\(([^)#]+)(?:#[^)]*)?\)', README):
    if not link.startswith('http'):
      assert os.path.exists(os.path.join(REPO, link)), link


HISTORY = re.compile(r'previous\sstop|this\sstop|this\ssession|issue\s[0-9]+|\.\./shared|'
                     r'DESIGN\.md')


def test_docs_and_library_speak_of_the_project_alone():
  """No history of the work (issue numbers, "stops", sessions) and no file outside the
  repository, in the README, the docs, the library, the benchmarks and the CI script."""
  paths = [os.path.join(REPO, p) for p in ('README.md', 'setup.py', 'requirements.txt',
                                           os.path.join('.ci', 'run'))]
  for folder in ('docs', 'bn_rnn_jax', 'benchmarks', 'notebooks'):
    paths += [p for p in glob.glob(os.path.join(REPO, folder, '**', '*'), recursive=True)
              if os.path.isfile(p) and os.sep + 'results' + os.sep not in p
              and os.sep + '_build' + os.sep not in p
              and p.endswith(('.py', '.md', '.rst', '.sh', '.txt', '.ipynb'))]
  found = []
  for path in paths:
    with open(path, errors='replace') as f:
      for number, line in enumerate(f, 1):
        if HISTORY.search(line):
          found.append(f'{os.path.relpath(path, REPO)}:{number}: {line.strip()}')
  assert not found, '\n'.join(found)
