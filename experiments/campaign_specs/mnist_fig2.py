r"""Cooijmans et al. Fig. 2, sequential MNIST at the paper's shape (784 steps): LSTM
against BN-LSTM for 10k iterations, where the figure's claim is decided.

  python -m experiments.campaign run mnist_fig2 --parallel=2 --runs_dir=DIR \
      --set=train.time_budget_s=7200         # in launches of 2 h; the same command resumes
  python -m experiments.campaign collect mnist_fig2 --runs_dir=DIR
  python -m experiments.campaign report mnist_fig2     # milestone table
  python -m experiments.campaign report mnist_fig2 --figure=experiments/results/mnist_fig2.png

Expected: on 2 CPU cores (one XLA thread per run, two runs at a time) a training step of
batch 100 takes about 0.6-0.75 s on an idle machine, so the pair takes about 2.5 h, plus
a validation every 500 steps. On one GPU the same command runs both runs side by side
(`XLA_PYTHON_CLIENT_PREALLOCATE=false`); the launch records in the results JSON give
their clocks. Setup, statistics and the paper's milestones: `_fig2.py`.
"""

from experiments.campaign import spec
from experiments.campaign_specs import _fig2


def get_campaign() -> spec.Campaign:
  return _fig2.campaign('seq', expected='about 2.5 h on 2 CPU cores (two runs at a time, '
                        'one XLA thread each, an idle machine), about 12 min on one NVIDIA '
                        'H200 shared by both runs')
