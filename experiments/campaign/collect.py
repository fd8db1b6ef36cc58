"""The one collector: runs' records into a results JSON, with the machine and no paths.

`experiments/results/<campaign>.json`:

  kind                       'campaign' (`experiments.rendering`: `show` renders it)
  campaign, title, command   what made it (`command` names no path of this machine)
  spec                       the campaign's spec (`Campaign.describe`), `--set` values
  machine                    processor, cores, GPUs, XLA flags, library versions, load
                             average (of the first launch that trained)
  machines                   every machine the runs trained on, where there were several
  setup, baselines           the spec's one-line setup and the data's baselines, if any
  runs                       `{run name: {arm, seed, records, launches}}`: every record of
                             the run's metrics.jsonl (`bn_rnn_jax.training.metric_writer`), and
                             for an evaluation campaign its `evaluation` instead

Records are written one per line, so the JSON stays readable and diffs stay small.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

import ml_collections

from experiments import machine_facts
from experiments.campaign import spec as spec_lib
from experiments.campaign import validate

LAUNCHES = 'campaign_launches.jsonl'   # a run's launch records (runner.py, read_launches)
EVALUATION = 'evaluation.json'         # an evaluation job's output (runner.py)


def machines_used(launches: Sequence[dict]) -> list[dict]:
  """The different machines that launches trained on, in order of first use.

  A launch that ended without a step (e.g. refused at start) is left out; one killed
  before its end was recorded is kept. Machines differing only in load are one.
  """
  found = {}
  for launch in launches:
    after = launch.get('steps_after')
    if after is not None and after <= launch.get('steps_before', 0):
      continue
    facts = launch['machine']
    key = json.dumps({k: v for k, v in facts.items() if not k.startswith('load_average')},
                     sort_keys=True)
    found.setdefault(key, facts)
  return list(found.values())


def machine_fields(runs: Mapping[str, dict], fallback: Callable[[], dict]) -> dict:
  """`{'machine': the first machine the runs' launches used}`, with `'machines'` (all of
  them, in order of first use) when there are several; `fallback()` when no launch
  trained."""
  used = machines_used([l for r in runs.values() for l in r.get('launches', [])])
  fields = {'machine': used[0] if used else fallback()}
  if len(used) > 1:
    fields['machines'] = used
  return fields


def read_run(workdir: str) -> dict:
  """`{'records', 'launches'}` of a training run's workdir."""
  from bn_rnn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  return {'records': metric_writer.read_metrics(workdir),
          'launches': read_launches(workdir)}


def read_launches(workdir: str) -> list[dict]:
  """The launch records of a run, oldest first; a damaged line is skipped with a note
  naming it.

  The runner writes a launch's record when it starts and again, complete, when it ends:
  of the lines with the same `started`, the last counts. A launch whose end was never
  written (killed with the runner) keeps its start line: machine and `steps_before`,
  no `exit_code`.
  """
  path = os.path.join(workdir, LAUNCHES)
  if not os.path.exists(path):
    return []
  records = []
  with open(path, errors='replace') as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        if not isinstance(record, dict):
          raise ValueError('not an object')
      except ValueError:
        print(f'note: {path}, line {number}, is not a launch record; skipped.',
              file=sys.stderr)
        continue
      records.append(record)
  by_start = {}
  for index, record in enumerate(records):
    by_start[record.get('started', index)] = record   # a launch's last line wins
  return list(by_start.values())


def run_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  """The config a run in `workdir` was trained with (its config.json and the changes
  recorded since), or None without one."""
  from bn_rnn_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  return workdir_lib.load_config(workdir)


def launch_budget(launches: Sequence[dict]) -> Optional[int]:
  """The step budget of the newest launch that recorded one (config.json keeps the first
  launch's budget; a relaunch may raise or lower it), else None."""
  budgets = [l['num_steps'] for l in launches if isinstance(l.get('num_steps'), int)]
  return budgets[-1] if budgets else None


def trained_config(workdir: str, launches: Sequence[dict]) -> Optional[ml_collections.ConfigDict]:
  """The config a run was trained with: its own (`run_config`), with the step budget of
  its newest launch (`launch_budget`). None without config.json."""
  config = run_config(workdir)
  if config is None:
    return None
  budget = launch_budget(launches)
  if budget is not None:
    config.train.num_steps = budget
  return config


def finished(records: Sequence[dict], config: ml_collections.ConfigDict) -> bool:
  """Whether the records end as a finished run of `config` ends, or as a run a non-finite
  step stopped (its outcome: another launch stops at the same step)."""
  from bn_rnn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  if records and records[-1]['split'] == metric_writer.STOPPED:
    return True
  last = config.train.num_steps
  if config.eval.get('test_at_end', False):
    return any(r['split'] == 'test' and r['step'] == last for r in records)
  at_end = {r['split'] for r in records if r['step'] == last}
  return {'train', *config.eval.splits} <= at_end


def config_differences(workdir: str, config: ml_collections.ConfigDict) -> list[tuple]:
  """`(field, the run's value, config's value)` of each field of the run's meaning in
  which the run in `workdir` differs from `config`, in field order (none without a run)."""
  from bn_rnn_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  found = workdir_lib.run_config(workdir)
  if found is None:
    return []
  wanted = workdir_lib.flat_config(config)
  return [(k, found.get(k), wanted.get(k)) for k in sorted(set(found) | set(wanted))
          if found.get(k) != wanted.get(k) and not workdir_lib.harmless(k)]


def collect(campaign: spec_lib.Campaign, runs_dir: str, seeds: Optional[Sequence[int]] = None,
            arms: Optional[Sequence[str]] = None, extra: Mapping[str, Any] = (),
            command: str = '', include_unfinished: bool = False) -> dict:
  """The results JSON of the runs under `runs_dir/<campaign>/`. A run counts once its
  records reach the last step of the config it was trained with (`trained_config`, else
  the one the flags plan; `finished`): a run without records is left out with a note, an
  unfinished one too unless `include_unfinished` (for a run that cannot go on: it is
  collected with `'unfinished': True` and its records as far as they go). The tables
  show what there is. The setup line and baselines are read from the first collected
  run's own config, not from the flags."""
  runs, notes, config = {}, [], None
  for run in campaign.runs(seeds, arms):
    workdir = os.path.join(runs_dir, campaign.name, run.name)
    entry = {'arm': run.arm, 'seed': run.seed}
    if campaign.evaluate is not None:
      path = os.path.join(workdir, EVALUATION)
      if not os.path.exists(path):
        notes.append(f'{run.name} (no results yet)')
        continue
      entry['evaluation'] = read_json(path, 'an evaluation')
      entry['source'] = f'{campaign.source}/{run.name}'
      entry['launches'] = read_launches(workdir)
    else:
      if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
        notes.append(f'{run.name} (no results yet)')
        continue
      entry.update(read_run(workdir))
      validate.check_runs({run.name: entry},
                          os.path.join(os.path.abspath(workdir), 'metrics.jsonl'))
      planned = campaign.config_of(run, extra)
      own = trained_config(workdir, entry['launches'])
      trained = own or planned
      if not finished(entry['records'], trained):
        last = max((r['step'] for r in entry['records']), default=0)
        if not include_unfinished:
          notes.append(f'{run.name} (unfinished: step {last} of {trained.train.num_steps})')
          continue
        print(f'note: {run.name} is unfinished (step {last} of {trained.train.num_steps}); '
              'collected as far as it went.')
        entry['unfinished'] = True
      if config is None and own is not None:
        config = own
      differ = config_differences(workdir, planned)
      if differ:
        shown = ', '.join(f'{k} {there!r}, planned {wanted!r}'
                          for k, there, wanted in differ[:3])
        print(f'note: {run.name} was trained with another config than these flags plan '
              f'({shown}); collected as trained.')
    runs[run.name] = entry
  if notes:
    print(f'collect {campaign.name}: left out {", ".join(notes)}.')
  result = {
      'kind': 'campaign', 'campaign': campaign.name, 'title': campaign.title,
      'command': command,
      'spec': {**campaign.describe(), 'set': scrub(dict(extra))},
      **machine_fields(runs, lambda: {**machine_facts.machine(campaign.env.get('XLA_FLAGS'),
                                                              backend=False),
                                      'note': 'at collect time'}),
  }
  if config is None and (campaign.setup or campaign.baselines):
    source = _source(campaign)
    first = campaign.runs(seeds, arms)[0]
    own = run_config(os.path.join(runs_dir, source.name, first.name))
    config = own or source.config_of(first, extra)
  if campaign.setup:
    result['setup'] = campaign.setup(config)
  if campaign.baselines:
    result['baselines'] = campaign.baselines(config)
  result['runs'] = runs
  if include_unfinished:
    _leave_out_unreadable(campaign, result)
  return result


def _leave_out_unreadable(campaign: spec_lib.Campaign, result: dict) -> None:
  """Leave out of `result`, each with a note, the unfinished runs that the campaign's
  tables cannot read beside the finished ones (a run stopped before its first
  evaluation): `report` never refuses what `collect` writes."""
  from experiments.campaign import show  # pylint: disable=g-import-not-at-top
  runs = result['runs']
  finished_runs = {n: e for n, e in runs.items() if not e.get('unfinished')}
  if finished_runs and show.table_problem(campaign, {**result, 'runs': finished_runs}):
    return   # the finished runs' own problem, which `report` names
  for name in [n for n in runs if n not in finished_runs]:
    problem = show.table_problem(campaign, {**result, 'runs': {**finished_runs,
                                                               name: runs[name]}})
    if problem is not None:
      del runs[name]
      print(f'note: {name} is unfinished and left out: {problem}')


def read_json(path: str, what: str):
  try:
    with open(path) as f:
      value = json.load(f)
  except ValueError as e:
    raise ValueError(f'{path} is not {what} JSON ({" ".join(str(e).split())}); '
                     'remove it and make it again.') from None
  if not isinstance(value, dict) or not value:
    raise ValueError(f'{path} is not {what} JSON (empty or not an object); remove it and '
                     'make it again.')
  return value


def _source(campaign: spec_lib.Campaign) -> spec_lib.Campaign:
  return spec_lib.get(campaign.source) if campaign.source else campaign


def scrub(value):
  """Absolute paths (of this machine) replaced by '<path>', in any JSON value."""
  if isinstance(value, dict):
    return {k: scrub(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [scrub(v) for v in value]
  if isinstance(value, str) and os.path.isabs(value):
    return '<path>'
  return value


def command_line(argv: Sequence[str]) -> str:
  """`python -m experiments.campaign <argv>` without the options that name paths of
  this machine (`--runs_dir`, `--results_dir`; a `--set` value that is one reads <path>)."""
  kept, args = [], list(argv)
  while args:
    arg = args.pop(0)
    name, has_value, value = arg.partition('=')
    if name in ('--runs_dir', '--results_dir', '--set') and not has_value and args:
      value = args.pop(0)   # the `--flag value` spelling
    if name in ('--runs_dir', '--results_dir'):
      continue
    if name == '--set':
      key, _, setting = value.partition('=')
      arg = f'--set={key}={"<path>" if os.path.isabs(setting) else setting}'
    kept.append(arg)
  return ' '.join(['python -m experiments.campaign'] + kept)


# ---------------------------------------------------------------------- JSON files
def path_of(name: str, results_dir: Optional[str] = None) -> str:
  return os.path.join(results_dir or spec_lib.RESULTS, f'{name}.json')


def load(name: str, results_dir: Optional[str] = None) -> dict:
  path = path_of(name, results_dir)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No results for {name!r}: {path} does not exist (write it '
                            f'with `python -m experiments.campaign collect`).')
  return read_json(path, 'a results')


def write_results(result: dict, path: str, allow_fewer: bool = False) -> None:
  """Write a campaign's results JSON to `path`. Refused (ValueError, `path` left as it
  is) when it holds no run, or fewer runs than the results JSON already at `path` (one
  that does not read is replaced), unless `allow_fewer`."""
  path = os.path.abspath(path)
  found = len(result['runs'])
  if not found:
    raise ValueError(f'No finished run of {result["campaign"]!r} to collect; {path} is '
                     'not written.')
  if os.path.exists(path) and not allow_fewer:
    try:
      held = len(read_json(path, 'a results').get('runs') or {})
    except (OSError, ValueError):
      held = 0
    if found < held:
      raise ValueError(f'{path} holds {held} finished runs, this collect {found}; it is '
                       'left as it is (pass --allow_fewer_runs to replace it).')
  write(result, path)


def keep_held_runs(result: dict, path: str, campaign: spec_lib.Campaign) -> list[str]:
  """Add to `result` the runs that the results JSON at `path` holds and `result` lacks
  (arms trained on other machines or at other times, whose workdirs are elsewhere), in
  the campaign's run order; the machines are recounted from every run's launches.
  Returns the names of the runs kept. A missing `path` keeps none."""
  if not os.path.exists(path):
    return []
  held = read_json(path, 'a results').get('runs') or {}
  kept = [name for name in held if name not in result['runs']]
  if not kept:
    return []
  runs = {**result['runs'], **{name: held[name] for name in kept}}
  order = [run.name for run in campaign.runs()]
  result['runs'] = dict(sorted(runs.items(), key=lambda item: (
      order.index(item[0]) if item[0] in order else len(order), item[0])))
  result.pop('machines', None)
  result.update(machine_fields(result['runs'], lambda: result['machine']))
  return kept


def write(result: dict, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    f.write(dumps(result) + '\n')


def dumps(value, indent: int = 0) -> str:
  """JSON with one key per line down to lists of records, which get one record per line."""
  pad = ' ' * (indent + 1)
  if isinstance(value, dict) and value:
    items = [f'{pad}{json.dumps(k)}: {dumps(v, indent + 1)}' for k, v in value.items()]
    return '{\n' + ',\n'.join(items) + '\n' + ' ' * indent + '}'
  if isinstance(value, list) and value and all(isinstance(v, (dict, list)) for v in value):
    return '[\n' + ',\n'.join(pad + json.dumps(v) for v in value) + '\n' + ' ' * indent + ']'
  return json.dumps(value)
