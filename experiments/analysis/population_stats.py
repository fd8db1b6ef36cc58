r"""Cooijmans et al. 2016, Fig. 5: a BN-LSTM's population statistics per step settle within
a few steps.

  python -m experiments.analysis.population_stats [--ptb_dir=DIR] [--paper_scale]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.recurrence_figures.population_stats`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import recurrence_figures

if __name__ == '__main__':
  cli.main(recurrence_figures.population_stats)
