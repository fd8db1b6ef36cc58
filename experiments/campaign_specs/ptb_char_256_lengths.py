r"""Character models on longer sequences than they were trained on (Cooijmans et al. Fig. 3b).

  python -m experiments.campaign run ptb_char_256_lengths   # trains ptb_char_256 if needed
  python -m experiments.campaign collect ptb_char_256_lengths
  python -m experiments.campaign report ptb_char_256_lengths

Expected: the evaluations of the two trained ptb_char_256 runs (bn_lstm, lstm; their time
was not recorded), plus the training of those runs where they are not finished (see
ptb_char_256). With the BN-LSTM, the training-pass
estimate beats the running average at every length, and both generalise to the whole
validation text read as one sequence of 393,041 steps.

Each run's latest checkpoint on the validation text, cut into segments of 100 to 1,000
characters and read whole; the evaluation, table and figure: `_lengths.py`.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _lengths


def get_campaign() -> spec.Campaign:
  return _lengths.campaign(
      'ptb_char_256_lengths', source='ptb_char_256', lengths=(100, 200, 500, 1000),
      split='valid', checkpoint='latest',
      expected='two evaluations after the ptb_char_256 runs (their time was not recorded)')
