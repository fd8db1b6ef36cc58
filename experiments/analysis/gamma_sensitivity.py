r"""Cooijmans et al. 2016, Fig. 6: the BN-LSTM's sensitivity to its initial gamma, on
permuted MNIST and character PTB.

  python -m experiments.analysis.gamma_sensitivity [--tasks=mnist,ptb] [--paper_scale]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.gamma_figures.gamma_sensitivity`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import gamma_figures

if __name__ == '__main__':
  cli.main(gamma_figures.gamma_sensitivity)
