r"""Quickstart: LSTM vs BN-LSTM, same budget, real data, offline, CPU-friendly.

  python experiments/quickstart.py                 # in ~/.cache/bn_rnn_jax/quickstart
  python experiments/quickstart.py --workdir DIR   # in DIR

Runs the `quickstart` campaign (`experiments/campaign_specs/quickstart.py`): both variants on
scikit-learn's 8x8 digits read pixel by pixel (64 steps, nothing to download), five seeds,
two runs at a time, then prints its table (every seed's validation accuracy, and what
holds in every seed) and writes `<workdir>/learning_curves.png`. About 3 minutes on 2 CPU
cores. It is

  python -m experiments.campaign run quickstart --runs_dir=<workdir> ...
  python -m experiments.campaign collect quickstart --results_dir=<workdir> ...
  python -m experiments.campaign report quickstart --results_dir=<workdir> ...

with the runs in `<workdir>/quickstart/<variant>_s<seed>`. The default workdir is the
user's own (`bn_rnn_jax/quickstart` under `$XDG_CACHE_HOME`, else `~/.cache`), so users
of one machine run side by side; a quickstart started on a workdir another one is
running in stops at once, naming it. Started again after it ended, it skips the finished
runs and resumes the others; below the table it then says how many of its runs finished
before this command, when and where, and how to train afresh (another `--workdir`). Any field of `experiments/configs/quickstart.py`
can be set for every run with `--config.a.b=value`, `--config.variants` picks the
variants and `--seeds` the seeds. Sequential MNIST at 14x14 (196 steps) instead:

  python experiments/quickstart.py --workdir /tmp/quickstart_mnist \
      --config.data.name=mnist --config.data.root=/path/to/datasets \
      --config.train.num_steps=600 --config.eval.every=100
"""

import datetime
import json
import os
import subprocess
import sys
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # run as a script: the package imports from the repository
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax import extras

with extras.needed_by('experiments/quickstart.py', exit=True):
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  from experiments.campaign_specs import quickstart
# pylint: enable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined when run, not at import: the tests import the
  functions here beside other scripts' flags)."""
  config_flags.DEFINE_config_file(
      'config', os.path.join(ROOT, 'experiments', 'configs', 'quickstart.py'),
      'The quickstart config; `--config.a.b=value` sets a field of every run.')
  flags.DEFINE_string('workdir', quickstart.default_workdir(), 'Directory of the runs, '
                      'table and plot (default: bn_rnn_jax/quickstart in the user\'s cache '
                      'folder).')
  flags.DEFINE_list('seeds', None, 'Seeds (default: the campaign\'s five).')
  flags.DEFINE_integer('parallel', 0, 'Runs at a time (default: the campaign\'s two).')


def _value(value) -> str:
  return repr(tuple(value)) if isinstance(value, (list, tuple)) else str(value)


def finished_before(result: dict, since: float) -> dict[str, float]:
  """`{run: when it finished (seconds since the epoch)}` of the runs of a results JSON
  that no launch since `since` trained: they finished before."""
  out = {}
  for name, run in result['runs'].items():
    launches = [(datetime.datetime.fromisoformat(l['started']).timestamp(),
                 l.get('wall_s') or 0.0) for l in run.get('launches') or []]
    if launches and max(start for start, _ in launches) < since:
      out[name] = max(start + wall for start, wall in launches)
  return out


def earlier_runs_note(result: dict, runs_dir: str, since: float) -> Optional[str]:
  """The lines saying that the table holds runs finished before `since`, when, where,
  and how to train afresh; None when every run trained since."""
  earlier = finished_before(result, since)
  if not earlier:
    return None
  when = lambda seconds: datetime.datetime.fromtimestamp(
      seconds, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
  first, last = when(min(earlier.values())), when(max(earlier.values()))
  span = f'on {first}' if first == last else f'between {first} and {last}'
  return (f'{len(earlier)} of the {len(result["runs"])} runs in this table finished before '
          f'this command, {span}, in {runs_dir}: they were not trained again.\n'
          'To train afresh: python experiments/quickstart.py --workdir NEW_FOLDER (or '
          f'remove {runs_dir}).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  overrides = dict(config_flags.get_override_values(FLAGS['config']))
  variants = overrides.pop('variants', None)
  workdir = os.path.abspath(FLAGS.workdir)
  options = [f'--set={key}={_value(value)}' for key, value in overrides.items()]
  options += [f'--arms={",".join(variants)}'] if variants else []
  options += [f'--seeds={",".join(FLAGS.seeds)}'] if FLAGS.seeds else []
  campaign = [sys.executable, '-m', 'experiments.campaign']
  steps = (['run', 'quickstart', f'--runs_dir={workdir}', f'--parallel={FLAGS.parallel}'],
           ['collect', 'quickstart', f'--runs_dir={workdir}', f'--results_dir={workdir}'],
           ['report', 'quickstart', f'--results_dir={workdir}',
            f'--figure={os.path.join(workdir, "learning_curves.png")}'])
  since = time.time()
  for step in steps:
    # `-m` from the repository root: the campaign package imports as it does in the tests.
    code = subprocess.call(campaign + step + options, cwd=ROOT)
    if code:
      sys.exit(code)
  with open(os.path.join(workdir, 'quickstart.json')) as f:
    note = earlier_runs_note(json.load(f), os.path.join(workdir, 'quickstart'), since)
  if note:
    print(note)


if __name__ == '__main__':
  define_flags()
  app.run(main)
