r"""The papers' batch-normalised LSTMs whose statistics are not kept per step:
`bn_lstm_shared` (one population row per site, Cooijmans' ablation) and
`bn_input_only_seq` (the input term only, sequence-wise: Laurent eq. 20-21).

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=10000,30000 --question=variable_length_shared
"""

from experiments.analysis.lib import length_cause as cause


def get_question() -> cause.Question:
  return cause.Question(
      what="the LSTM, the BN-LSTM with statistics shared over time (Cooijmans' ablation) "
           "and the LSTM with sequence-wise batch norm on the input term (Laurent's)",
      arms={'lstm': cause.Arm('lstm'), 'bn_lstm_shared': cause.Arm('bn_lstm_shared'),
            'bn_input_only_seq': cause.Arm('bn_input_only_seq')})
