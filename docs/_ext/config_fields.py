"""The config reference: every field of `bn_rnn_jax.training.config.default_config()`, described
by its comment in `bn_rnn_jax/training/config.py` (the one place the descriptions live).

`fields()` pairs each field's default (from the function) with its comment (from the
source): the comment on the field's line with its continuation lines (comment-only lines
indented past the statement), or, for a field without one, the comment block just above
it. The Sphinx directive `config-fields` renders them as one table per section at build
time, so the table cannot fall behind the code; `tests/test_docs.py` checks that every
field has a description.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize
from typing import Any

from bn_rnn_jax.training import config as config_lib


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: `--config.<path>=...`."""
  path: str            # e.g. 'model.hidden_size'
  default: Any         # the default value (None for a placeholder)
  type_name: str       # the field's type ('int', 'float', ... or that of a placeholder)
  description: str     # its comment in config.py


def _comments(source: str) -> dict[int, tuple[int, str, bool]]:
  """`{line: (column, text, alone)}` of every comment; `alone`: nothing else on the line."""
  out, code_lines = {}, set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      out[token.start[0]] = (token.start[1], token.string.lstrip('#').strip(), False)
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
      code_lines.update(range(token.start[0], token.end[0] + 1))
  return {line: (col, text, line not in code_lines) for line, (col, text, _) in out.items()}


def _path(node: ast.expr, aliases: dict[str, str]) -> str | None:
  """'model.hidden_size' for `m.hidden_size` (m an alias of config.model), else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or node.id not in aliases:
    return None
  return '.'.join(([aliases[node.id]] if aliases[node.id] else []) + parts[::-1])


def _descriptions(source: str) -> dict[str, str]:
  """`{field path: description}` from the comments of `default_config`'s body."""
  comments = _comments(source)
  function = next(n for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.FunctionDef) and n.name == 'default_config')
  aliases = {'config': ''}
  out = {}
  for statement in function.body:
    if not isinstance(statement, ast.Assign):
      continue
    paths = [_path(t, aliases) for t in statement.targets]
    for target, path in zip(statement.targets, paths):
      if isinstance(target, ast.Name):   # `config.model = m = ConfigDict()`
        aliases[target.id] = next(p for p in paths if p is not None)
    path = next((p for p in paths if p), None)
    if path is None:
      continue
    lines = []
    for line in range(statement.lineno, statement.end_lineno + 1):
      if line in comments and not comments[line][2]:
        lines.append(comments[line][1])
    line = statement.end_lineno + 1
    while lines and line in comments and comments[line][2] and (
        comments[line][0] > statement.col_offset):
      lines.append(comments[line][1])
      line += 1
    if not lines:   # the comment block just above the field
      line = statement.lineno - 1
      while line in comments and comments[line][2]:
        lines.insert(0, comments[line][1])
        line -= 1
    out[path] = ' '.join(lines)
  return out


def _type_name(section, name: str) -> str:
  reference = section.get_ref(name)
  kind = reference.get_type()
  return getattr(kind, '__name__', str(kind))


def fields() -> list[Field]:
  """Every leaf field of `default_config()`, in the order the function sets them."""
  descriptions = _descriptions(inspect.getsource(config_lib))
  config = config_lib.default_config()
  out = []

  def visit(node, prefix):
    for name in node.keys():
      value = node[name]
      path = f'{prefix}{name}'
      if hasattr(value, 'keys') and path != 'data':
        visit(value, path + '.')
      else:
        out.append(Field(path, value.to_dict() if hasattr(value, 'to_dict') else value,
                         _type_name(node, name), descriptions.get(path, '')))

  visit(config, '')
  order = {path: i for i, path in enumerate(descriptions)}
  return sorted(out, key=lambda f: order.get(f.path, len(order)))


def default_text(field: Field) -> str:
  if field.default is None:
    return f'None ({field.type_name})'
  return repr(field.default)


# ---------------------------------------------------------------------- Sphinx
def _inline(text: str):
  """Text with `code` spans as docutils nodes."""
  from docutils import nodes  # pylint: disable=g-import-not-at-top
  paragraph = nodes.paragraph()
  for i, piece in enumerate(re.split(r'`([^`]*)`', text)):
    if piece:
      paragraph += nodes.literal(piece, piece) if i % 2 else nodes.Text(piece)
  return paragraph


def _table(rows: list[Field]):
  from docutils import nodes  # pylint: disable=g-import-not-at-top
  table = nodes.table(classes=['config-fields'])
  group = nodes.tgroup(cols=3)
  table += group
  for width in (28, 18, 54):
    group += nodes.colspec(colwidth=width)
  head, body = nodes.thead(), nodes.tbody()
  group += head
  group += body
  header = nodes.row()
  for title in ('field', 'default', 'meaning'):
    header += nodes.entry('', nodes.paragraph(text=title))
  head += header
  for field in rows:
    row = nodes.row()
    row += nodes.entry('', _inline(f'`{field.path}`'))
    row += nodes.entry('', _inline(f'`{default_text(field)}`'))
    row += nodes.entry('', _inline(field.description))
    body += row
  return table


def setup(app):
  from docutils import nodes  # pylint: disable=g-import-not-at-top
  from sphinx.util.docutils import SphinxDirective  # pylint: disable=g-import-not-at-top

  class ConfigFields(SphinxDirective):
    """`config-fields`: the table of every field of one section (the argument), or of
    the top-level fields (no argument)."""
    optional_arguments = 1

    def run(self):
      self.env.note_dependency(inspect.getsourcefile(config_lib))
      section = self.arguments[0] if self.arguments else ''
      rows = [f for f in fields()
              if (f.path.split('.')[0] == section and '.' in f.path) or
              (not section and ('.' not in f.path))]
      if not rows:
        raise self.error(f'config-fields: no fields in section {section!r}.')
      return [_table(rows)]

  del nodes
  app.add_directive('config-fields', ConfigFields)
  return {'parallel_read_safe': True, 'parallel_write_safe': True}
