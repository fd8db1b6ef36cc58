"""Wall time of the test tiers, each run as the README runs it.

    python benchmarks/suite_time.py [--tiers=default,core] [--out=PATH] [--log_dir=DIR]
    python benchmarks/suite_time.py --report [PATH]     # the saved lines

Each tier is `python -m pytest -q tests <its arguments>` in a fresh process, in this
repository, in the order of `TIERS`, all of them with one persistent compilation cache
that starts empty: the default and exhaustive tiers are timed cold, as CI runs them; the
core tier warm, as a developer runs it again while working (after an untimed run when no
tier before it filled the cache). The JSON records, per tier, the command, the cache, the
wall and CPU seconds (children included), pytest's closing line and the load; and the
machine (`benchmarks/results/suite_time.json` by default; docs/tables.py renders it). It
is written once all tiers ran, so that each tier reads the results the docs quote.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# pylint: disable=wrong-import-position
from experiments import machine_facts  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position
OUT = os.path.join(REPO, 'benchmarks', 'results', 'suite_time.json')
# tier -> the arguments after `python -m pytest -q tests` (README, "Install, quickstart, tests").
TIERS = {
    'default': ['--durations=20'],
    'core': ['-m', 'not slow'],  # the only tier timed with a filled cache (WARM)
    'exhaustive': ['--exhaustive', '--durations=20'],
}
WARM = ('core',)
_SUMMARY = re.compile(r'^=* ?(\d+ (?:passed|failed|error).*?) in [0-9.]+s', re.M)


def command(tier: str) -> list[str]:
  """`python -m pytest -q tests ...` of a tier, as the README and .ci/run write it."""
  return ['python', '-m', 'pytest', '-q', 'tests', *TIERS[tier]]


def time_tier(tier: str, cache: str, filled: bool, log: str = '') -> dict:
  """Run one tier with the compilation cache `cache` (filled by an untimed run first for
  a WARM tier, unless `filled`); its times and closing line (pytest's whole output
  written to `log` when given)."""
  argv = command(tier)
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
  if tier in WARM and not filled:
    subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env, capture_output=True,
                   check=False)
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  load = [round(v, 2) for v in os.getloadavg()]
  start = time.monotonic()
  done = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env,
                        capture_output=True, text=True, check=False)
  wall = time.monotonic() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if log:
    with open(log, 'w') as f:
      f.write(done.stdout + done.stderr)
  summary = _SUMMARY.findall(done.stdout)
  return {
      'command': shlex.join(argv),
      'cache': 'warm' if tier in WARM else 'cold',
      'exit_code': done.returncode,
      'wall_s': round(wall, 1),
      'cpu_s': round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
      'summary': summary[-1] if summary else done.stdout.strip().splitlines()[-1:],
      'load_average_1_5_15_min_at_start': load,
  }


def format_table(saved: dict) -> str:
  """One line per tier: its command, wall time and pytest's counts."""
  lines, order = [], list(TIERS)
  for tier, run in sorted(saved['tiers'].items(), key=lambda item: order.index(item[0])):
    minutes, seconds = divmod(round(run['wall_s']), 60)
    lines.append(f"* `{run['command']}` ({tier}, {run['cache']} compilation cache): "
                 f"{minutes} min {seconds:02d} s wall, {run['summary']}")
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tiers', default='default,core',
                      help=f'comma-separated, of {", ".join(TIERS)}')
  parser.add_argument('--out', default=OUT)
  parser.add_argument('--report', nargs='?', const=OUT, default=None, metavar='PATH',
                      help='print the lines of a saved JSON and exit')
  parser.add_argument('--log_dir', default='',
                      help="write each tier's pytest output to <log_dir>/<tier>.log")
  args = parser.parse_args(argv)
  if args.report:
    with open(args.report) as f:
      print(format_table(json.load(f)))
    return 0
  tiers = args.tiers.split(',')
  unknown = [t for t in tiers if t not in TIERS]
  if unknown:
    parser.error(f'unknown tiers {unknown}; have {", ".join(TIERS)}')
  saved = {'kind': 'suite_time', 'machine': machine_facts.machine(), 'tiers': {}}
  if os.path.exists(args.out):  # the tiers not run again keep their lines
    with open(args.out) as f:
      saved['tiers'] = {k: v for k, v in json.load(f)['tiers'].items() if k not in tiers}
  with tempfile.TemporaryDirectory(prefix='bn_rnn_jax_suite_cache_') as cache:
    for position, tier in enumerate(sorted(tiers, key=list(TIERS).index)):
      log = os.path.join(args.log_dir, f'{tier}.log') if args.log_dir else ''
      saved['tiers'][tier] = time_tier(tier, cache, filled=position > 0, log=log)
      print(format_table({'tiers': {tier: saved['tiers'][tier]}}), flush=True)
  with open(args.out, 'w') as f:
    json.dump(saved, f, indent=1)
    f.write('\n')
  return max(run['exit_code'] for run in saved['tiers'].values())


if __name__ == '__main__':
  sys.exit(main())
