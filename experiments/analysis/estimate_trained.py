r"""A trained run's population estimate against batch statistics, by the estimate's size;
the run's folder is read only.

  python -m experiments.analysis.estimate_trained \
      --workdir=RUNS/mnist_fig2/seq_bn_lstm_s0 [--step=N]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.trained_runs.estimate_trained`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import trained_runs

if __name__ == '__main__':
  cli.main(trained_runs.estimate_trained)
