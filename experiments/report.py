r"""Every committed result, printed from its JSON as its kind renders it (no runs needed).

  python experiments/report.py                          # all of them
  python experiments/report.py brown_tagger figures     # some of them
  python experiments/report.py --list                   # their names

The names: each JSON under experiments/results/ by its file name without `.json` (a
campaign's tables, its speed table, an analysis's table), `figures` (every JSON of
experiments/results/figures/, one line each), and each JSON under benchmarks/results/ by
its file name without `.json` and a trailing `_cpu`. What renders a JSON is named by the
JSON itself (its `kind`, `experiments.rendering`). An unknown name is a one-line error
listing the known ones.
"""

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # run as a script: the campaign modules import from the root
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax import extras

with extras.needed_by('experiments/report.py', exit=True):
  from absl import app
  from absl import flags

  from experiments import rendering
# pylint: enable=g-import-not-at-top,wrong-import-position

_LIST = flags.DEFINE_bool('list', False, 'Print the names of the result sets and exit.')


def result_sets() -> dict[str, str]:
  """`{name: JSON path}` of every result set, `figures` (the folder) among them."""
  out = {}
  for path in sorted(glob.glob(os.path.join(ROOT, 'experiments', 'results', '*.json'))):
    out[os.path.basename(path)[:-len('.json')]] = path
  out['figures'] = os.path.join(ROOT, 'experiments', 'results', 'figures')
  for path in sorted(glob.glob(os.path.join(ROOT, 'benchmarks', 'results', '*.json'))):
    stem = os.path.basename(path)[:-len('.json')]
    out[stem[:-len('_cpu')] if stem.endswith('_cpu') else stem] = path
  return out


def render(name: str) -> str:
  """One result set's text."""
  path = result_sets()[name]
  text = rendering.figures(path) if name == 'figures' else rendering.render_file(path)
  return f'## {name}\n\n{text}\n'


def main(argv):
  known = list(result_sets())
  if _LIST.value:
    print('\n'.join(known))
    return
  unknown = [n for n in argv[1:] if n not in known]
  if unknown:
    sys.exit(f'error: unknown result set {unknown[0]!r}; known: {", ".join(known)}.')
  for name in argv[1:] or known:
    print(render(name))


if __name__ == '__main__':
  app.run(main)
