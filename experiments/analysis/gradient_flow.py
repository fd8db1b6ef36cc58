r"""Cooijmans et al. 2016, Fig. 1(a): gradient flow through a batch-normalised tanh RNN at
initialisation, for several initial gammas.

  python -m experiments.analysis.gradient_flow [--mnist_dir=DIR] [--gammas=0.1,1.0]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.gamma_figures.gradient_flow`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import gamma_figures

if __name__ == '__main__':
  cli.main(gamma_figures.gradient_flow)
