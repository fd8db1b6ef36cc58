r"""Where a trained run's running average loses against the papers' estimate, site by site
and step by step.

  python -m experiments.analysis.running_average_gap --workdir=RUNS/pmnist_fig2/pmnist_bn_lstm_s0

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.trained_runs.running_average_gap`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import trained_runs

if __name__ == '__main__':
  cli.main(trained_runs.running_average_gap)
