"""Permuted sequential MNIST (Cooijmans et al. 2016, sec. 5.1): the 784 pixels in one
fixed random order. Same hyperparameters as `seq_mnist.py`.

Initialisation as in `seq_mnist.py` (W_h identity on all gate blocks, forget bias 0).
The permutation is a true permutation drawn from `config.data.permutation_seed`: the
authors' code drew the pixel order with replacement (`np.random.randint`), which repeats
some pixels and drops others; a fixed random *order* of all pixels is what the paper
describes, so we keep the true permutation. It is saved as `permutation.npy` in
the workdir, which is read back when a run resumes.

The population estimate from 2 batches of 1,000 is inherited from `seq_mnist.py`. On
this task it scores the same as the papers' 10 batches of 100 (0.63-0.64 validation
accuracy after 300 steps, `experiments/analysis/estimate_batch_size.py --eb_permute`).

  python experiments/main.py --config experiments/configs/pmnist.py \
      --workdir /tmp/pmnist --config.data.mnist_dir=/path/to/mnist
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seq_mnist  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config():
  config = seq_mnist.get_config()
  config.data.permute = True
  config.data.permutation_seed = 0
  return config
