r"""Whether a trained run's running average trails batch statistics because it lags the
parameters.

  python -m experiments.analysis.running_average_lag --workdir=RUNS/pmnist_fig2/pmnist_bn_lstm_s0

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.trained_runs.running_average_lag`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import trained_runs

if __name__ == '__main__':
  cli.main(trained_runs.running_average_lag)
