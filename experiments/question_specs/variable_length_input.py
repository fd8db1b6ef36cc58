r"""Which site's batch norm costs past T_max. With one input feature, layer norm of W_x x
keeps only the sign of x (every step's W_x x is x times one vector): the BN-LSTM with
batch statistics on W_h h only (the cell layer-normalised; the input term
layer-normalised or unnormalised) and the LN-LSTM with its input term unnormalised.

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=1000,3000,10000,30000 --question=variable_length_input
"""

from experiments.analysis.lib import length_cause as cause


def get_question() -> cause.Question:
  return cause.Question(
      what='the LSTM, the LN-LSTM with the input term unnormalised, and the BN-LSTM with '
           'batch statistics on the recurrent term only: the cell layer-normalised, the '
           'input term layer-normalised or unnormalised',
      arms={'lstm': cause.Arm('lstm'),
            'ln_lstm, input unnormalised': cause.Arm('ln_lstm', {'input_norm': None}),
            'bn_lstm, input and cell layer norm': cause.Arm(
                'bn_lstm', {'input_norm': 'layer', 'cell_norm': 'layer'}),
            'bn_lstm, input unnormalised, cell layer norm': cause.Arm(
                'bn_lstm', cause.RECURRENT_ONLY)})
