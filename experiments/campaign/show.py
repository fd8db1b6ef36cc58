"""Tables and figures from results JSONs (no runs needed), and the list of campaigns."""

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
  """The results JSON, with the speed JSON under 'speed' when there is one. One that
  is not shaped as a results JSON with runs, or whose runs hold a value of the wrong type
  or range (`validate.check_results`), is a ValueError naming it."""
  result = collect.load(campaign.name, results_dir)
  validate.check_results(result, os.path.abspath(collect.path_of(campaign.name, results_dir)))
  if campaign.speed and os.path.exists(collect.path_of(campaign.speed.name, results_dir)):
    result = {**result, 'speed': collect.load(campaign.speed.name, results_dir)}
  return result


def render(campaign: spec_lib.Campaign, table: str, results_dir: Optional[str] = None) -> str:
  """One table's text, from the committed (or `results_dir`'s) JSONs. A JSON that lacks
  what the table reads (a metric, a field) is one ValueError naming the file."""
  if table in campaign.tables:
    return _checked(campaign.tables[table], load_result(campaign, results_dir),
                    collect.path_of(campaign.name, results_dir), table)
  if campaign.speed and table in campaign.speed.tables:
    return _checked(campaign.speed.tables[table], collect.load(campaign.speed.name, results_dir),
                    collect.path_of(campaign.speed.name, results_dir), table)
  raise ValueError(f'Campaign {campaign.name!r} has no table {table!r}; it has '
                   f'{table_names(campaign)}.')


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
