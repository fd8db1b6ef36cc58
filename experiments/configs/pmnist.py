r"""Permuted sequential MNIST (Cooijmans et al. 2016, sec. 5.1): the 784 pixels in one
fixed random order. Same hyperparameters as `seq_mnist.py`.

  python experiments/main.py --config experiments/configs/pmnist.py \
      --workdir runs/pmnist_bn_lstm --config.model.variant=bn_lstm

Hardware and time: as `seq_mnist.py` (the permutation costs nothing): sized for a GPU;
about 7 hours of training steps on 2 CPU cores.
Expected: the paper's test accuracy, 95.4 % (BN-LSTM) and 90.2 % (LSTM), Table 1; not
run to the end here. The first 12k steps of both models, where Fig. 2's claim is
decided: the `pmnist_fig2` campaign (about 3 h on 2 CPU cores, or minutes on a GPU;
experiments/results/pmnist_fig2.json, `python -m experiments.campaign report
pmnist_fig2`, quoted in docs/experiments/sequential_mnist.md).
Tiny (the whole run in well under a minute on 2 CPU cores; a smoke test, not a result):

  python experiments/main.py --config experiments/configs/pmnist.py:tiny \
      --workdir /tmp/pmnist_tiny

Data: the MNIST IDX files under the data root (`<root>/mnist`), as `seq_mnist.py`.

Initialisation and optimizer as in `seq_mnist.py` (the authors' code: W_h identity on the
candidate block, forget bias 1, RMSProp without momentum).
The permutation is a true permutation drawn from `config.data.permutation_seed`: the
authors' code drew the pixel order with replacement (`np.random.randint`), which repeats
some pixels and drops others; a fixed random *order* of all pixels is what the paper
describes, so we keep the true permutation. It is saved as `permutation.npy` in
the workdir, which is read back when a run resumes.

The population estimate from 2 batches of 1,000 is inherited from `seq_mnist.py`. On
this task it scores the same as the papers' 10 batches of 100 (0.63-0.64 validation
accuracy after 300 steps, `python -m experiments.analysis.estimate_batch_size --permute`;
experiments/results/figures/estimate_batch_size_pmnist.json).
"""

from bn_rnn_jax.training import config as config_lib
from experiments.configs import seq_mnist


def get_config(arg: str = ''):
  config_lib.parse_arg(arg, 'pmnist.py')   # errors name this file
  config = seq_mnist.get_config(arg)
  config.data.permute = True
  config.data.permutation_seed = 0
  return config
