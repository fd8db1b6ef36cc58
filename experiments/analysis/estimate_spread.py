r"""Which sites and steps carry the spread of a trained run's estimate over its draws.

  python -m experiments.analysis.estimate_spread --workdir=RUNS/mnist_fig2/seq_bn_lstm_s0

Its flags (`--help`) are the arguments of `experiments.analysis.lib.trained_runs.estimate_spread`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import trained_runs

if __name__ == '__main__':
  cli.main(trained_runs.estimate_spread)
