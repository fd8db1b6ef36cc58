"""Campaign specs: one module per paper table or figure set, `get_campaign() -> Campaign`;
a module whose name starts with '_' holds what several specs share. The campaigns are
the modules found here (`spec.names()`).

Each module's docstring opens with its commands and expected cost, in the manner of
big_vision's configs; `python -m experiments.campaign list` prints them all.
"""
