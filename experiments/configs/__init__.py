"""Experiment configs: one ml_collections file per paper experiment (`get_config(arg)`).

Each starts from `bn_rnn_jax.training.config.default_config()` (the fields every run has) and sets
the paper's hyperparameters. Each opens with the command that runs it, the hardware and
time, the expected result (pointing at its `experiments/results/` JSON where this project
has one) and its tiny command. Load one with `experiments/main.py --config <file>[:<arg>]`;
any field can then be overridden on the command line, e.g. `--config.model.variant=lstm`,
and `--show_config` prints them all.

The argument (`bn_rnn_jax.training.config.parse_arg`) names at most one variant or size and any
presets, comma-separated: `ptb_char.py:bn_lstm,tiny`, `attentive_reader.py:lstm,cpu`.
Every file has the preset `tiny`: the whole run (data, training, evaluation, test) in
well under a minute on 2 CPU cores, a smoke test whose numbers mean nothing
(`tests/test_tiny_presets.py` runs them all).

  quickstart.py        LSTM vs BN-LSTM on 8x8 digits (or 14x14 MNIST) on a CPU
  seq_mnist.py         sequential MNIST (Cooijmans et al. sec. 5.1)
  pmnist.py            permuted sequential MNIST (sec. 5.1)
  ptb_char.py          character-level Penn Treebank (sec. 5.2)
  text8.py             text8 (sec. 5.3)
  attentive_reader.py  the Attentive Reader (sec. 5.4)
  ptb_word.py          word-level Penn Treebank (Laurent et al. sec. 5.2)
  laurent_speech.py    WSJ frame classification (Laurent et al. sec. 5.1)
  brown_tagger.py      the same transposed to Brown part-of-speech tagging
"""
