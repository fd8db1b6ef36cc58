"""An experiment config file loaded by path and argument (`<file>[:<arg>]`), and fields
set on it by name and typed by it (`a.b=value`, as `--config.a.b=value` and a campaign's
`--set` read them): every mistake is one line, from the config's own fields and
validation, before absl or ml_collections apply anything."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
from typing import Any, Mapping, Optional, Sequence

import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _config_module(path: str):
  full = os.path.join(ROOT, path)
  if not os.path.isfile(full):
    raise ValueError(f'no config file at {full}.')
  module_spec = importlib.util.spec_from_file_location(
      'campaign_config_' + os.path.splitext(os.path.basename(path))[0], full)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_config(path: str, arg: Optional[str] = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file (relative to the repository root)."""
  module = _config_module(path)
  return module.get_config() if arg is None else module.get_config(arg)


def apply(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> None:
  """Set dotted fields (`'model.variant'`) of `config`; an unknown one is a ValueError."""
  for key, value in overrides.items():
    node = config
    *path, field = key.split('.')
    for part in path:
      if part not in node:
        raise ValueError(f'Unknown config field {key!r} (no {part!r}).')
      node = node[part]
    if field not in node:
      raise ValueError(f'Unknown config field {key!r}.')
    node[field] = value


def parse_assignment(text: str, config: ml_collections.ConfigDict,
                     flag: str = '--set=') -> tuple[str, Any]:
  """`'a.b=value'` -> `('a.b', value)`, the value read as the field's type, as
  `--config.a.b=value` reads it. A field `config` lacks, or a value not of its type, is
  a ValueError of one line naming `flag` + `text`, with the nearest field's name."""
  key, sep, raw = text.partition('=')
  if not sep or not key:
    raise ValueError(f'{flag}{text}: give FIELD=VALUE.')
  current, where = config, 'config'
  for part in key.split('.'):
    if not isinstance(current, ml_collections.ConfigDict) or part not in current:
      near = difflib.get_close_matches(part, list(current) if isinstance(
          current, ml_collections.ConfigDict) else [], n=1)
      raise ValueError(f'{flag}{text}: {where} has no field {part!r}; ' + (
          f'did you mean {near[0]!r}?' if near else '--show_config prints every field.'))
    current, where = current[part], f'{where}.{part}'
  kind = type(current).__name__
  wrong = ValueError(f"{flag}{text}: {where} takes a{'n' if kind[0] in 'aeiou' else ''} "
                     f'{kind}; got {raw!r}.')
  if isinstance(current, bool):
    if raw.lower() not in ('true', 'false'):
      raise wrong
    return key, raw.lower() == 'true'
  if isinstance(current, str):
    return key, raw
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if current is None:
      return key, raw
    raise wrong from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if current is not None and not isinstance(value, (type(current), list, tuple) if isinstance(
      current, (list, tuple)) else type(current)):
    raise wrong
  return key, value


def check_arguments(args: Sequence[str]) -> None:
  """A command line's `--config=<file>[:<arg>]` and each `--config.<field>=<value>`,
  checked by the config itself before absl applies them: the file's `get_config(arg)`
  (whose own mistakes are one line) and `parse_assignment`. A one-line ValueError."""
  given, fields = None, []
  for i, arg in enumerate(args):
    name, has_value, value = arg.partition('=')
    if not has_value and i + 1 < len(args) and not args[i + 1].startswith('--'):
      value = args[i + 1]   # the `--flag value` spelling
    if name == '--config':
      given = value
    elif name.startswith('--config.'):
      fields.append(f'{name[len("--config."):]}={value}')
  if not given:
    raise ValueError('--config is required: an experiment config file, e.g. '
                     '--config=experiments/configs/quickstart.py (one per paper experiment '
                     'in experiments/configs/).')
  path, _, arg = given.partition(':')
  if not os.path.isfile(path):
    raise ValueError(f'--config={given}: no config file at {os.path.abspath(path)}.')
  config = load_config(os.path.abspath(path), arg or None)
  for field in fields:
    parse_assignment(field, config, flag='--config.')


def flag_value(value: Any) -> str:
  """A value as `--config.x=<value>` reads it back."""
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)
