r"""Attentive Reader variants on brown_cloze_large, 3,000 steps (Cooijmans et al. sec. 5.4).

  python -m experiments.campaign run attentive_reader_long --parallel=2
  python -m experiments.campaign collect attentive_reader_long
  python -m experiments.campaign report attentive_reader_long   # table and Fig. 4a-like PNG
  python -m experiments.campaign speed attentive_reader_long    # the speed table

Expected: about 2 hours on 2 CPU cores (AMD EPYC VM, one XLA thread per run, the two
seeds of an arm side by side; the 16 runs' own clocks sum to 3.6 h, at load average 4-6:
BN-e** ~35 min a run, the LSTM ~6). Only BN-e* and
BN-e** leave the initial plateau at the paper's learning rates; the controls (LSTM and
BN-LSTM at BN-e*'s lr 8e-4 and batch 40) leave it too, a little later.

The six variants of sec. 5.4 / App. C and the two controls, 2 seeds each, the `cpu`
preset (64 units, 10,000 symbols, 8 length groups), 3,000 steps, validation on all 3,174
questions every 250 steps (the papers' estimate from 5 training batches), the test of the
best-validation checkpoint at the end. Baselines are computed from the data
(`reading.frequency_baselines`); the paper's numbers are on CNN and not comparable in
level. The speed table times one training step of each variant at batch 40 on one batch
of documents 128 long.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _attentive_reader as reader


def get_campaign() -> spec.Campaign:
  return reader.campaign(
      'attentive_reader_long',
      'Attentive Reader, six variants and two controls, 3,000 steps, two seeds',
      arms=tuple(reader.ARMS), seeds=(0, 1),
      overrides={'train.num_steps': 3000, 'eval.every': 250, 'checkpoint.every': 250},
      expected='about 2 h on 2 CPU cores (AMD EPYC VM; one XLA thread per run, 2 at a time; '
               'the runs\' clocks sum to 3.6 h)',
      speed=spec.Speed(
          name='attentive_reader_speed', arms=reader.VARIANTS, steps=10, rounds=3,
          overrides={'train.batch_size': 40},
          what='one training step (fwd + bwd + Adam update), batch 40, documents of T = 128',
          tables={'speed': reader.speed_table}, batches=reader.speed_batches,
          expected='a few minutes on 2 CPU cores (AMD EPYC VM, one XLA thread; not '
                   'recorded)'))
