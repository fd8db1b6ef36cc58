r"""Sequences longer than training, trained on variable lengths: the BN-LSTM against the
LSTM, by what its statistics do. About 12 minutes on 2 CPU cores.

  python -m experiments.analysis.variable_length [--steps=1000] [--seeds=5]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.length_studies.variable_length`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import length_studies

if __name__ == '__main__':
  cli.main(length_studies.variable_length)
