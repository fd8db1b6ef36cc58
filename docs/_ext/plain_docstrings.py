"""Module docstrings as their authors laid them out.

The modules' docstrings are plain text: prose paragraphs, and indented blocks that are
code, command lines or aligned tables. reStructuredText would read those blocks as block
quotes and definition lists; this hook (`autodoc-process-docstring`, before napoleon)
makes each indented block of a module docstring a literal block, so it renders as
written. Blocks of doctest lines (`>>>`) are left to the doctest builder, which runs them.
Function and class docstrings are Google style and go to napoleon unchanged.
"""

from __future__ import annotations


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def literal_blocks(lines: list[str]) -> list[str]:
  """`lines` with every indented block (blank lines inside it included) made a literal
  block, unless it is a doctest block."""
  out, i = [], 0
  while i < len(lines):
    line = lines[i]
    if not line.strip() or _indent(line) == 0:
      out.append(line)
      i += 1
      continue
    end = i
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > 0):
      end += 1
    while end > i and not lines[end - 1].strip():
      end -= 1
    block = lines[i:end]
    if block[0].lstrip().startswith('>>>'):
      out.extend(block)
    else:
      if out and out[-1].strip():
        out.append('')
      out.extend(['::', ''] + ['  ' + l if l.strip() else '' for l in block] + [''])
    i = end
  return out


def _process(app, what, name, obj, options, lines):  # pylint: disable=unused-argument
  if what == 'module':
    lines[:] = literal_blocks(lines)


def setup(app):
  # Before napoleon (priority 500): napoleon leaves module docstrings alone anyway.
  app.connect('autodoc-process-docstring', _process, priority=400)
  return {'parallel_read_safe': True, 'parallel_write_safe': True}
