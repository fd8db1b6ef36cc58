"""One mechanism for every paper table: a spec per table, one runner, one collector.

  spec.py      Campaign / Arm / Speed: the config, the grid (arms x seeds), environment
  runner.py    launch experiments/main.py runs, skip finished ones, resume the others
  collect.py   the runs' records -> experiments/results/<name>.json (machine, no paths)
  columns.py   the tables' columns (best, at a step, test of the best, first past ...)
  speed.py     the interleaved timer of a campaign's speed table
  show.py      tables and figures from a results JSON, the list of campaigns

The specs are `experiments/campaign_specs/<name>.py`; the command line is `__main__.py`
(`python -m experiments.campaign list`).
"""
