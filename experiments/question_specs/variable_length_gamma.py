r"""The γ init's part: the LN-LSTM starts with γ = 1 and the batch-normalised arms with
γ = 0.1 (Cooijmans sec. 4); these arms swap them.

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=10000,30000 --question=variable_length_gamma
"""

from bn_rnn_jax import initializers
from experiments.analysis.lib import length_cause as cause


def get_question() -> cause.Question:
  return cause.Question(
      what='the LSTM, the BN-LSTM with a layer-normalised cell and gamma init 1, and the '
           'LN-LSTM with gamma init 0.1',
      arms={'lstm': cause.Arm('lstm'),
            'bn_lstm, cell layer norm, γ 1': cause.Arm(
                'bn_lstm', {'cell_norm': 'layer', 'scale_init': initializers.Constant(1.0)}),
            'ln_lstm, γ 0.1': cause.Arm('ln_lstm',
                                        {'scale_init': initializers.Constant(0.1)})})
