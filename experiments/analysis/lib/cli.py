"""The command line of an analysis script: its flags are the arguments of the library
function it runs (`--name=value`, defaults and types from the signature, help from the
docstring's `Args:`), and it prints the result as the result's kind renders it.

  if __name__ == '__main__':
    cli.main(trained_runs.estimate_trained)
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from typing import Callable, Optional, Sequence, Union

from absl import app
from absl import flags

from experiments import rendering
from experiments.analysis.lib import outputs

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def _help(function: Callable) -> dict[str, str]:
  """`{argument: its line(s) of the docstring's Args: section}`."""
  doc = inspect.getdoc(function) or ''
  section = doc.split('Args:', 1)[1] if 'Args:' in doc else ''
  return {name: ' '.join(text.split()) for name, text in re.findall(
      r'^  (\w+): (.*?)(?=^  \w+: |\Z)', section, re.M | re.S)}


def _flag_type(hint) -> tuple[Optional[type], bool]:
  """`(element type, is a list)` of an annotation a flag can hold, `(None, False)` else."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is Union and len(args) == 1:   # Optional[X]
    hint, args = args[0], typing.get_args(args[0])
  if typing.get_origin(hint) in (list, tuple, Sequence, typing.get_origin(Sequence)):
    return (args[0], True) if args and args[0] in (int, float, str) else (None, False)
  return (hint, False) if hint in _DEFINE else (None, False)


def define_flags(function: Callable, flag_values: flags.FlagValues = flags.FLAGS
                 ) -> Callable[[], dict]:
  """Define a flag per argument of `function` that a flag can hold (the others keep
  their defaults), listed by `--help` as the running script's; returns what gives the
  keyword arguments from the parsed flags."""
  hints, helps, readers = typing.get_type_hints(function), _help(function), {}
  for name, parameter in inspect.signature(function).parameters.items():
    kind, is_list = _flag_type(hints.get(name))
    if kind is None:
      continue
    default = parameter.default
    if default is inspect.Parameter.empty:
      default = None
    text = helps.get(name, name.replace('_', ' ') + '.')
    if is_list:
      holder = flags.DEFINE_list(name, None if default is None else [str(v) for v in default],
                                 text, flag_values=flag_values, module_name=sys.argv[0])
      readers[name] = lambda holder=holder, kind=kind: (
          None if holder.value is None else [kind(v) for v in holder.value])
    else:
      holder = _DEFINE[kind](name, default, text, flag_values=flag_values,
                             module_name=sys.argv[0])
      readers[name] = lambda holder=holder: holder.value
  required = [n for n, p in inspect.signature(function).parameters.items()
              if p.default is inspect.Parameter.empty and n in readers]
  def arguments() -> dict:
    values = {name: read() for name, read in readers.items()}
    missing = [n for n in required if values[n] is None]
    if missing:
      sys.exit(f'error: --{missing[0]} is required.')
    return values
  return arguments


def main(function: Callable) -> None:
  """Run `function` as a script: its flags, one line for a mistake or a missing package
  (`outputs.script`), and its result printed as its kind renders it."""
  arguments = define_flags(function)
  def run(argv):
    result = outputs.script(argv, lambda: function(**arguments()))
    print(rendering.render(result))
  app.run(run)
