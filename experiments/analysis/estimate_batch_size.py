r"""The papers' population estimate early in training on 784-step MNIST, by the size of
its batches and the site they set.

  python -m experiments.analysis.estimate_batch_size [--mnist_dir=DIR] [--permute]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.early_estimates.estimate_batch_size`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import early_estimates

if __name__ == '__main__':
  cli.main(early_estimates.estimate_batch_size)
