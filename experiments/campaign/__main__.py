r"""Run, follow, collect and report the campaigns of experiments/campaign_specs/.

  python -m experiments.campaign list                  # every table: command, expected time
  python -m experiments.campaign run NAME [--parallel=2] [--seeds=0,1] [--set=k=v ...]
                                 [--train_until=EPOCH_S]  # launches stop by then
  python -m experiments.campaign status NAME
  python -m experiments.campaign collect NAME          # -> experiments/results/NAME.json
                                 [--allow_fewer_runs]  # may replace one with more runs
                                 [--keep_runs]         # keeps its runs not found here
                                 [--include_unfinished]  # and runs that cannot go on
  python -m experiments.campaign report [NAME ...]     # its tables, from the JSON
                                 [--figure=PATH]       # and its figure, as PATH
  python -m experiments.campaign speed NAME            # -> the campaign's speed JSON

Runs live in `--runs_dir/<campaign>/<run>` (default `runs/`, outside version control);
`run` skips finished runs and resumes the others, so the same command continues a
campaign that was stopped. `--set=key=value` changes a config field of every run (and is
recorded in the results JSON); `--tiny` applies the spec's tiny budget (two steps, a small
model: what the tests run). Runs read their data under the data root, as
`experiments/main.py` does: `BN_RNN_JAX_DATA` (the runs inherit the environment) or
`--set=data.root=/path/to/datasets`.

`collect` counts a run as finished by the config it was trained with (its config.json and
its launches' step budget), whatever the flags now say. It never writes a results JSON
without runs, and does not replace one that holds more finished runs than it found unless
`--allow_fewer_runs` is given. With `--keep_runs` it adds the runs that the results JSON
holds and `--runs_dir` lacks (an arm retrained on another machine replaces its own run
and keeps the others); each run carries its launches, so the machines stay known. With
`--include_unfinished` a run stopped before its last step is collected as far as it went,
marked `unfinished` (a run whose checkpoints are gone with the machine it ran on).

`report` writes no tracked file: it draws the campaign's figure only as `--figure=PATH`,
or as `<results_dir>/NAME.png` beside results collected elsewhere (`--results_dir`). The
committed figures are redrawn with `--figure=experiments/results/NAME.png`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bn_rnn_jax import extras

with extras.needed_by('python -m experiments.campaign', exit=True):
  from absl import app
  from absl import flags

  from experiments import config_files
  from experiments.campaign import collect
  from experiments.campaign import runner
  from experiments.campaign import show
  from experiments.campaign import spec as spec_lib
  from experiments.campaign import speed as speed_lib

_COMMANDS = ('list', 'run', 'status', 'collect', 'report', 'speed', 'evaluate_run',
             'speed_run')
_RUNS_DIR = flags.DEFINE_string('runs_dir', 'runs', 'Where the runs live (one folder per '
                                'campaign, one per run).')
_RESULTS_DIR = flags.DEFINE_string('results_dir', None, 'Where results JSONs and figures '
                                   'are written and read (default experiments/results).')
_PARALLEL = flags.DEFINE_integer('parallel', 0, 'Runs at a time (0: the spec\'s).')
_SEEDS = flags.DEFINE_list('seeds', None, 'Seeds to run (default: the spec\'s).')
_ARMS = flags.DEFINE_list('arms', None, 'Arms to run (default: all).')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE: a config field of every run.')
_TINY = flags.DEFINE_bool('tiny', False, 'The spec\'s tiny budget (two steps, small model).')
_TRAIN_UNTIL = flags.DEFINE_float('train_until', None, 'run: the time (seconds since the '
                                   'epoch) training stops by: each launch\'s '
                                   'train.time_budget_s is what is left of it, and a run '
                                   'whose turn comes later is not started.')
_COMPILE_CACHE = flags.DEFINE_bool('compile_cache', False, 'A persistent XLA cache in '
                                   '--runs_dir shared by the runs (faster starts).')
_ALLOW_FEWER = flags.DEFINE_bool('allow_fewer_runs', False, 'collect: replace a results '
                                  'JSON that holds more finished runs than this collect '
                                  'found.')
_KEEP_RUNS = flags.DEFINE_bool('keep_runs', False, 'collect: keep the runs that the results '
                                'JSON already holds and --runs_dir lacks (arms trained '
                                'elsewhere); the runs found replace theirs.')
_INCLUDE_UNFINISHED = flags.DEFINE_bool('include_unfinished', False, 'collect: also the '
                                        'runs that stopped before their last step (marked '
                                        'unfinished), for runs that cannot go on.')
_FIGURE = flags.DEFINE_string('figure', None, 'report: the PNG to write (default: '
                              '<results_dir>/<name>.png with --results_dir, else none); '
                              '"none" draws nothing.')


def _extra(campaign: spec_lib.Campaign) -> dict:
  """The `--tiny` and `--set` overrides, typed by the config's fields."""
  trainer = spec_lib.get(campaign.source) if campaign.source else campaign
  extra = dict(trainer.tiny) if _TINY.value else {}
  if _SET.value:
    base = trainer.config_of(trainer.runs(arms=[next(iter(trainer.arms))])[0])
    extra.update(config_files.parse_assignment(text, base) for text in _SET.value)
  return extra


def _seeds():
  return None if _SEEDS.value is None else [int(s) for s in _SEEDS.value]


def _report(campaign: spec_lib.Campaign) -> None:
  names = show.available(campaign, _RESULTS_DIR.value)
  if not names:
    raise FileNotFoundError(f'No results for {campaign.name!r} in '
                            f'{_RESULTS_DIR.value or spec_lib.RESULTS}.')
  for table in names:
    print(f'## {campaign.name}: {table}\n\n'
          f'{show.render(campaign, table, _RESULTS_DIR.value)}\n')
  # The committed results' figure is not redrawn unless asked: a report writes no
  # tracked file.
  output = _FIGURE.value or (_RESULTS_DIR.value and os.path.join(
      _RESULTS_DIR.value, f'{campaign.name}.png'))
  if output and output != 'none' and names[0] in campaign.tables:
    png = show.draw(campaign, _RESULTS_DIR.value, output)
    if png:
      print(f'figure: {png}\n')


def _run_one(command: str, campaign: spec_lib.Campaign, options: list[str]) -> int:
  if command == 'run':
    failed = runner.run(campaign, _RUNS_DIR.value, _PARALLEL.value, _seeds(), _ARMS.value,
                        _extra(campaign), _COMPILE_CACHE.value, _TINY.value,
                        _TRAIN_UNTIL.value)
    if failed:
      print(f'{len(failed)} run(s) failed: {", ".join(failed)}', file=sys.stderr)
      return 1
  elif command == 'status':
    print(runner.status(campaign, _RUNS_DIR.value, _seeds(), _ARMS.value, _extra(campaign)))
  elif command == 'collect':
    collect_only = ('--keep_runs', '--allow_fewer_runs', '--include_unfinished')
    run_options = [o for o in options if o.partition('=')[0] not in collect_only]
    command = ' && '.join(collect.command_line([step, campaign.name, *step_options])
                          for step, step_options in (('run', run_options),
                                                     ('collect', options)))
    result = collect.collect(campaign, _RUNS_DIR.value, _seeds(), _ARMS.value,
                             _extra(campaign), command, _INCLUDE_UNFINISHED.value)
    path = collect.path_of(campaign.name, _RESULTS_DIR.value)
    if _KEEP_RUNS.value:
      kept = collect.keep_held_runs(result, path, campaign)
      if kept:
        print(f'kept from {path}: {", ".join(kept)}')
    collect.write_results(result, path, _ALLOW_FEWER.value)
    print(f'wrote {path} ({len(result["runs"])} runs)')
  elif command == 'report':
    _report(campaign)
  elif command == 'speed':
    if campaign.speed is None:
      raise ValueError(f'Campaign {campaign.name!r} has no speed table.')
    # In a child with the spec's environment (e.g. one XLA thread) and working folder,
    # as the runs are.
    env = {**os.environ, **campaign.env,
           **runner.child_env(_RUNS_DIR.value, _COMPILE_CACHE.value)}
    folders = [f'--runs_dir={os.path.abspath(_RUNS_DIR.value)}'] + (
        [f'--results_dir={os.path.abspath(_RESULTS_DIR.value)}'] if _RESULTS_DIR.value else [])
    return subprocess.call([sys.executable, '-m', 'experiments.campaign', 'speed_run',
                            campaign.name, *options, *folders], cwd=spec_lib.ROOT, env=env)
  elif command == 'speed_run':
    arms = [a for a in campaign.speed.arms if not _ARMS.value or a in _ARMS.value]
    result = speed_lib.measure(campaign, _extra(campaign), arms)
    path = collect.path_of(campaign.speed.name, _RESULTS_DIR.value)
    collect.write(result, path)
    for table in campaign.speed.tables.values():
      print(table(result))
    print(f'wrote {path}')
  return 0


def _evaluate_run(name: str, run_name: str) -> None:
  """One evaluation of an evaluation campaign (launched by `run`)."""
  campaign = spec_lib.get(name)
  source = os.path.join(os.path.abspath(_RUNS_DIR.value), campaign.source, run_name)
  out = os.path.join(os.path.abspath(_RUNS_DIR.value), campaign.name, run_name)
  os.makedirs(out, exist_ok=True)
  result = campaign.evaluate(source, _TINY.value)
  with open(os.path.join(out, collect.EVALUATION + '.tmp'), 'w') as f:
    json.dump(collect.scrub(result), f, indent=1)
  os.replace(os.path.join(out, collect.EVALUATION + '.tmp'),
             os.path.join(out, collect.EVALUATION))


def main(argv):
  if len(argv) < 2 or argv[1] not in _COMMANDS:
    raise app.UsageError(f'Give a command: {" | ".join(_COMMANDS[:-2])}.')
  command, names = argv[1], argv[2:]
  if command == 'list':
    print(show.listing())
    return 0
  if command == 'evaluate_run':
    _evaluate_run(*names)
    return 0
  if not names and command == 'report':
    names = [n for n in spec_lib.names()
             if show.available(spec_lib.get(n), _RESULTS_DIR.value)]
  if not names:
    raise app.UsageError(f'{command} needs a campaign name: {", ".join(spec_lib.names())}.')
  try:
    campaigns = [spec_lib.get(n) for n in names]
    options = list(sys.argv[1:])
    for positional in argv[1:]:
      options.remove(positional)
    return max(_run_one(command, c, options) for c in campaigns)
  except (ValueError, FileNotFoundError, extras.MissingExtra) as e:
    sys.exit(f'error: {e}')
  except runner.Stopped as e:
    print(e, file=sys.stderr)
    sys.exit(130)


if __name__ == '__main__':
  app.run(main)
