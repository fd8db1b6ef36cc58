r"""Cooijmans et al. 2016, Fig. 1(b): the expected derivative of tanh under Gaussian input,
by Monte Carlo and by quadrature.

  python -m experiments.analysis.tanh_derivative [--samples=N] [--paper_scale]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.gamma_figures.tanh_derivative`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import gamma_figures

if __name__ == '__main__':
  cli.main(gamma_figures.tanh_derivative)
