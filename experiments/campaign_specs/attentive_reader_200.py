r"""Attentive Reader: every variant and the LSTM control at 200 steps, without the guard.

  python -m experiments.campaign run attentive_reader_200 --parallel=2
  python -m experiments.campaign collect attentive_reader_200
  python -m experiments.campaign report attentive_reader_200

Expected: about 25 min on 2 CPU cores (Intel Xeon VM, one XLA thread per run, two at a
time; the runs' own clocks sum to 47 min). No variant leaves the plateau in 200 steps;
BN-e* and BN-e** stop on a non-finite gradient at step 157 with seed 1
(`model.min_step_count=1`, as they were first made; the guard now prevents it).

As attentive_reader_long (the `cpu` preset on brown_cloze_large), two seeds, validation
and checkpoints every 100 steps.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _attentive_reader as reader


def get_campaign() -> spec.Campaign:
  return reader.campaign(
      'attentive_reader_200',
      'Attentive Reader, six variants and the LSTM control, 200 steps, without the guard',
      arms=reader.VARIANTS + ('lstm_lr8e-4_b40',), seeds=(0, 1),
      overrides={'train.num_steps': 200, 'eval.every': 100, 'checkpoint.every': 100,
                 'model.min_step_count': 1},
      expected='about 25 min on 2 CPU cores (Intel Xeon VM; one XLA thread per run, 2 at a '
               'time; the runs\' clocks sum to 47 min)')
