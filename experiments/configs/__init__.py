"""Experiment configs: one ml_collections file per paper experiment (`get_config()`).

Each starts from `bn_rnn_jax.config.default_config()` (the fields every run has) and sets
the paper's hyperparameters. Load one with `experiments/main.py --config <file>`; any
field can then be overridden on the command line, e.g. `--config.model.variant=lstm`.

  seq_mnist.py   sequential MNIST (Cooijmans et al. sec. 5.1)
  pmnist.py      permuted sequential MNIST (sec. 5.1)
  quickstart.py  LSTM vs BN-LSTM on 8x8 digits (or 14x14 MNIST) in minutes on a CPU
"""
