r"""The BN-LSTM against the LSTM past T_max, by how long it trains and which statistics it
reads: the BN-LSTM, the BN-LSTM with c_t layer-normalised (batch statistics on W_h h and
W_x x only), and the LN-LSTM (no statistics at all).

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=1000,3000,10000,30000

Expected: about 50 minutes on 2 CPU cores with 2 workers.
"""

from experiments.analysis.lib import length_cause as cause


def get_question() -> cause.Question:
  return cause.Question(
      what='the LSTM, the BN-LSTM, the BN-LSTM with a layer-normalised cell and the '
           'LN-LSTM',
      arms={'lstm': cause.Arm('lstm'), 'bn_lstm': cause.Arm('bn_lstm', by_site=True),
            'bn_lstm, cell layer norm': cause.Arm('bn_lstm', {'cell_norm': 'layer'}),
            'ln_lstm': cause.Arm('ln_lstm')},
      figure=cause.by_steps_figure)
