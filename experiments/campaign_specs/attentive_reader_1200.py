r"""Attentive Reader: LSTM, BN-LSTM and BN-e* at 1,200 steps, without the min_step_count guard.

  python -m experiments.campaign run attentive_reader_1200 --parallel=2
  python -m experiments.campaign collect attentive_reader_1200
  python -m experiments.campaign report attentive_reader_1200

Expected: about 30 min on 2 CPU cores (Intel Xeon VM, one XLA thread per run, two at a
time, beside other jobs at load average 4-6; the three runs' own clocks sum to 53 min).
No variant leaves the plateau; BN-e* stops on a non-finite gradient at step 474 (what
the guard, `model.min_step_count=8`, now prevents; these runs set it to 1 as they were
first made).

As attentive_reader_long (the `cpu` preset on brown_cloze_large), seed 0, validation and
checkpoints every 200 steps.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _attentive_reader as reader


def get_campaign() -> spec.Campaign:
  return reader.campaign(
      'attentive_reader_1200',
      'Attentive Reader, LSTM / BN-LSTM / BN-e*, 1,200 steps, without the few-rows guard',
      arms=('lstm', 'bn_lstm', 'bn_e_star'), seeds=(0,),
      overrides={'train.num_steps': 1200, 'eval.every': 200, 'checkpoint.every': 200,
                 'model.min_step_count': 1},
      expected='about 30 min on 2 CPU cores (Intel Xeon VM; one XLA thread per run, 2 at a '
               'time, load average 4-6; the runs\' clocks sum to 53 min)')
