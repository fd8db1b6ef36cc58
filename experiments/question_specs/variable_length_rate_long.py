r"""The best model of `variable_length_rate` past T_max, the BN-LSTM with batch statistics
on W_h h only at Adam 1e-2, beside the LSTM, trained longer.

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=30000 --question=variable_length_rate_long
"""

from experiments.analysis.lib import length_cause as cause
from experiments.question_specs import variable_length_rate as rate


def get_question() -> cause.Question:
  best = rate.arm_name('bn_lstm, input unnormalised, cell layer norm', '1e-2')
  return cause.Question(
      what='the LSTM and the BN-LSTM with batch statistics on the recurrent term only at '
           "Adam's learning rate 1e-2",
      arms={name: rate.arms()[name] for name in ('lstm', best)})
