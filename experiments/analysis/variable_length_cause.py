r"""Why the BN-LSTM trained on lengths 5-50 trails the LSTM past T_max: a question's arms
(experiments/question_specs/) for several training lengths.

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=10000,30000 [--question=NAME]

Its flags (`--help`) are the arguments of `experiments.analysis.lib.length_cause.answer`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import length_cause

if __name__ == '__main__':
  cli.main(length_cause.answer)
