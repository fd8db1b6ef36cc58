r"""The learning rate's part: the LSTM, the BN-LSTM and the BN-LSTM with batch statistics
on W_h h only, each at Adam's learning rates 1e-3, 3e-3, 1e-2 and 3e-2; every arm is
paired with the LSTM at 3e-3.

  python -m experiments.analysis.variable_length_cause --workers=2 \
      --steps=1000,3000,10000 --question=variable_length_rate
"""

from experiments.analysis.lib import length_cause as cause

#: Adam's learning rates by name, the default 3e-3 among them.
RATES = {'1e-3': 1e-3, '3e-3': 3e-3, '1e-2': 1e-2, '3e-2': 3e-2}
MODELS = {'lstm': cause.Arm('lstm'), 'bn_lstm': cause.Arm('bn_lstm'),
          'bn_lstm, input unnormalised, cell layer norm': cause.Arm('bn_lstm',
                                                                    cause.RECURRENT_ONLY)}


def arm_name(model: str, rate: str) -> str:
  """The arm of `MODELS[model]` at `RATES[rate]` ('lstm' is the LSTM at 3e-3)."""
  return 'lstm' if (model, rate) == ('lstm', '3e-3') else f'{model}, adam {rate}'


def arms() -> dict[str, cause.Arm]:
  return {arm_name(model, rate): arm._replace(learning_rate=RATES[rate])
          for model, arm in MODELS.items() for rate in RATES}


def get_question() -> cause.Question:
  return cause.Question(
      what="the LSTM, the BN-LSTM and the BN-LSTM with batch statistics on the recurrent "
           "term only, each at Adam's learning rates 1e-3, 3e-3, 1e-2 and 3e-2",
      arms=arms(), figure=cause.by_rate_figure(list(MODELS), RATES, arm_name))
