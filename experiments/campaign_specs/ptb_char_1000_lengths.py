r"""Cooijmans et al. Fig. 3b at the paper's shape: the 1000-unit character models of
`ptb_char_1000` on test sequences longer than the 100 characters they were trained on.

  python -m experiments.campaign run ptb_char_1000_lengths --runs_dir=DIR   # after ptb_char_1000
  python -m experiments.campaign collect ptb_char_1000_lengths --runs_dir=DIR
  python -m experiments.campaign report ptb_char_1000_lengths
  python -m experiments.campaign report ptb_char_1000_lengths --figure=experiments/results/ptb_char_1000_lengths.png

Expected: two evaluations of forward passes over the test text per length and kind of
statistics after the ptb_char_1000 runs (which it trains first where they have not
reached the budget of their newest launch); minutes on a GPU, about an hour on 2 CPU
cores.

Each run's best-validation checkpoint (the one Table 2 tests) on the test text, cut into
segments of 100 to 10,000 characters and read whole as one sequence, with the papers'
estimate, the running average and batch statistics; the evaluation, table and figure:
`_lengths.py`.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _lengths


def get_campaign() -> spec.Campaign:
  return _lengths.campaign(
      'ptb_char_1000_lengths', source='ptb_char_1000',
      lengths=(100, 200, 500, 1000, 2000, 5000, 10000), split='test', checkpoint='best',
      expected='two evaluations after the ptb_char_1000 runs: minutes on a GPU, about an '
               'hour on 2 CPU cores')
