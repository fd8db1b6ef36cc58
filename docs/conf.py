"""Sphinx configuration of the bn_rnn_jax documentation.

  python -m sphinx -W -b html docs docs/_build/html       # the site, warnings as errors
  python -m sphinx -W -b doctest docs docs/_build/doctest # every example, run

Both run in the test suite (`tests/test_docs.py`).
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'docs', '_ext'))
# The examples run on one CPU device, whatever the machine has (the test suite's processes
# ask for 8 fake ones; an example's batch then need not divide over them).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ['XLA_FLAGS'] = re.sub(r'--xla_force_host_platform_device_count=\d+', '',
                                 os.environ.get('XLA_FLAGS', '')).strip()

project = 'bn_rnn_jax'
author = 'the bn_rnn_jax authors'
copyright = 'the bn_rnn_jax authors'  # pylint: disable=redefined-builtin

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.doctest',
    'sphinx.ext.mathjax',
    'myst_parser',
    'config_fields',
    'plain_docstrings',
]

source_suffix = {'.md': 'markdown', '.rst': 'restructuredtext'}
exclude_patterns = ['_build']
root_doc = 'index'
# Docstrings write code in single backticks, as in Markdown.
default_role = 'code'
# Flags and quotes as typed: `--config.x` stays two hyphens outside code too.
smartquotes = False
myst_enable_extensions = ['colon_fence', 'dollarmath']
myst_heading_anchors = 3

autodoc_member_order = 'bysource'
autodoc_typehints = 'description'
# Flax's own module fields (parent, scope) are left to Flax's documentation.
autodoc_default_options = {'members': True, 'undoc-members': True, 'show-inheritance': False,
                           'exclude-members': 'parent,scope'}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Google 'Attributes:' sections as a field list: the fields are also documented by autodoc.
napoleon_use_ivar = True

doctest_global_setup = '''
import jax
import jax.numpy as jnp
import numpy as np
'''

html_theme = 'furo'
html_title = 'bn_rnn_jax'
html_static_path = ['_static']
html_css_files = ['tables.css']
