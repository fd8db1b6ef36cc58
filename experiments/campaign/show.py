"""Tables and figures from results JSONs (no runs needed), and the list of campaigns.

A campaign's results JSON is of kind `campaign`, its speed JSON of kind `campaign_speed`;
their renderers (`RENDERERS`, `experiments.rendering`) print their spec's tables."""

from __future__ import annotations

import os
from typing import Optional

from experiments.campaign import collect
from experiments.campaign import spec as spec_lib
from experiments.campaign import validate


def table_names(campaign: spec_lib.Campaign) -> list[str]:
  """The campaign's tables, then its speed tables."""
  speed = list(campaign.speed.tables) if campaign.speed else []
  return list(campaign.tables) + speed


def load_result(campaign: spec_lib.Campaign, results_dir: Optional[str] = None) -> dict:
  """The results JSON. One that is not shaped as a results JSON with runs, or whose runs
  hold a value of the wrong type or range (`validate.check_results`), is a ValueError
  naming it."""
  result = collect.load(campaign.name, results_dir)
  validate.check_results(result, os.path.abspath(collect.path_of(campaign.name, results_dir)))
  return result


def render(campaign: spec_lib.Campaign, table: str, results_dir: Optional[str] = None) -> str:
  """One table's text, from the committed (or `results_dir`'s) JSONs. A JSON that lacks
  what the table reads (a metric, a field) is one ValueError naming the file."""
  if campaign.speed and table in campaign.speed.tables:
    return render_speed(collect.load(campaign.speed.name, results_dir),
                        collect.path_of(campaign.speed.name, results_dir)[:-5], table)
  if table not in campaign.tables:
    raise ValueError(f'Campaign {campaign.name!r} has no table {table!r}; it has '
                     f'{table_names(campaign)}.')
  return _campaign_tables(campaign, load_result(campaign, results_dir),
                          collect.path_of(campaign.name, results_dir)[:-5], table)


def render_campaign(result: dict, source: str, table: Optional[str] = None) -> str:
  """A campaign's results JSON at `source` (its path without `.json`): the table
  `table`, or every table of its spec under a heading."""
  return _campaign_tables(_campaign_of(result, source), result, source, table)


def _campaign_of(result: dict, source: str) -> spec_lib.Campaign:
  if not isinstance(result.get('campaign'), str):
    raise ValueError(f'{source}.json names no campaign ("campaign").')
  return spec_lib.get(result['campaign'])


def _campaign_tables(campaign: spec_lib.Campaign, result: dict, source: str,
                     table: Optional[str]) -> str:
  """Its speed JSON, where one lies beside the results JSON, is read under 'speed' (a
  table may quote it)."""
  validate.check_results(result, source + '.json')
  speed = campaign.speed and os.path.join(os.path.dirname(source), campaign.speed.name + '.json')
  if speed and os.path.exists(speed):
    result = {**result, 'speed': collect.read_json(speed, 'a speed')}
  return _tables(campaign.name, campaign.tables, result, source + '.json', table)


def render_speed(result: dict, source: str, table: Optional[str] = None) -> str:
  """A campaign's speed JSON: the table `table`, or every speed table under a heading."""
  campaign = _campaign_of(result, source)
  return _tables(campaign.name, campaign.speed.tables, result, source + '.json', table)


def _tables(campaign: str, tables: dict, result: dict, name: str,
            table: Optional[str]) -> str:
  if table is not None:
    if table not in tables:
      raise ValueError(f'{name}: campaign {campaign!r} has no table {table!r} of this '
                       f'kind; it has {list(tables)}.')
    return _checked(tables[table], result, name, table)
  return '\n'.join(f'## {campaign}: {t}\n\n{_checked(make, result, name, t)}\n'
                   for t, make in tables.items())


def table_problem(campaign: spec_lib.Campaign, result: dict) -> Optional[str]:
  """Why `result` (a results JSON not written yet) would not render as every table of
  `campaign`, in one line, or None when it would."""
  try:
    validate.check_results(result, 'the result')
    for table, make_table in campaign.tables.items():
      _checked(make_table, result, 'the result', table)
  except ValueError as e:
    return str(e)
  return None


def _checked(make_table, result: dict, path: str, table: str) -> str:
  try:
    return make_table(result)
  except (KeyError, IndexError, TypeError, AttributeError, ZeroDivisionError) as e:
    what = f'no {e.args[0]!r}' if isinstance(e, KeyError) and e.args else ' '.join(
        str(e).split())
    raise ValueError(f'{path} lacks what the {table!r} table reads ({what}); collect it '
                     'again (python -m experiments.campaign collect).') from None


def available(campaign: spec_lib.Campaign, results_dir: Optional[str] = None) -> list[str]:
  """The tables whose JSON exists."""
  out = []
  if os.path.exists(collect.path_of(campaign.name, results_dir)):
    out += list(campaign.tables)
  if campaign.speed and os.path.exists(collect.path_of(campaign.speed.name, results_dir)):
    out += list(campaign.speed.tables)
  return out


def draw(campaign: spec_lib.Campaign, results_dir: Optional[str] = None,
         output: Optional[str] = None) -> Optional[str]:
  """The campaign's figure from its JSON, as `<results_dir>/<name>.png` (or `output`)."""
  if campaign.figure is None:
    return None
  output = output or os.path.join(results_dir or spec_lib.RESULTS, f'{campaign.name}.png')
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  _checked(lambda result: campaign.figure(result, output), load_result(campaign, results_dir),
           collect.path_of(campaign.name, results_dir), 'figure')
  return output


def listing() -> str:
  """Every campaign: its tables, results, commands and expected run time."""
  blocks = []
  for name in spec_lib.names():
    campaign = spec_lib.get(name)
    results = os.path.relpath(collect.path_of(name), spec_lib.ROOT)
    there = '' if os.path.exists(collect.path_of(name)) else ', not collected yet'
    lines = [f'{name}: {campaign.title}',
             f'  tables:   {", ".join(campaign.tables)} ({results}{there})',
             f'  command:  {campaign.command}',
             f'  report:   python -m experiments.campaign report {name}',
             f'  expected: {campaign.expected}']
    if campaign.speed:
      speed = campaign.speed
      results = os.path.relpath(collect.path_of(speed.name), spec_lib.ROOT)
      lines += [f'  speed:    {", ".join(speed.tables)} ({results})',
                f'  command:  python -m experiments.campaign speed {name}',
                f'  expected: {speed.expected}']
    blocks.append('\n'.join(lines))
  return '\n\n'.join(blocks)


RENDERERS = {'campaign': render_campaign, 'campaign_speed': render_speed}
