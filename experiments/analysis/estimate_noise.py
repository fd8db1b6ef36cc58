r"""Does the population estimate need training's h0 noise? On 784-step MNIST, early in
training.

  python -m experiments.analysis.estimate_noise [--mnist_dir=DIR]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.early_estimates.estimate_noise`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import early_estimates

if __name__ == '__main__':
  cli.main(early_estimates.estimate_noise)
