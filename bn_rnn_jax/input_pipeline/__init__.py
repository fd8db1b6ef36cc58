"""Input pipelines: datasets as pure functions of (seed, step).

The training loop (`bn_rnn_jax/training/loop.py`) is task-generic. It talks to a dataset only
through the interface below, so a new task (e.g. language modelling in `text.py`) plugs in
by returning an object with these members from `get_dataset`.

Dataset interface
-----------------
  task: str
      'classification' (model: `SequenceClassifier`, logits `[B, C]`) or
      'language_model' (model: `LanguageModel`, logits `[B, T, V]`) or
      'tagging' (model: `SequenceTagger`, logits `[B, T, C]`; `tagging.py`).
  model_kwargs: dict
      Sizes the model needs from the data, e.g. `{'num_classes': 10}` or
      `{'vocab_size': 50}`; passed to the model constructor.
  train_length: int
      Time steps of a training sequence (the model's `max_length` must be >= it).
  steps_per_epoch: int
      Training steps that make one pass over the training set (for schedules).
  unit: str (optional)
      What one position of a sequence is, where it decides the metrics (`tasks.get`):
      'character' (bits per character) or 'word' (perplexity) for language models.
  carries_state: bool
      True when the model's final recurrent state of step k is the initial state of
      step k+1 (truncated BPTT over a stream, Zaremba et al. 2014). The trainer then keeps
      it in `TrainState.carry`, checkpoints it, and passes it as `initial_carries`.
  train_batch(step) -> dict of numpy arrays
      This process's share of the global training batch of `step`. A pure function of
      (config seed, step, process index): resuming at step k reads the same data as an
      uninterrupted run. Keys (leading axis = this process's batch):
        classification: 'inputs' [B, T, I] float32, 'labels' [B] int32,
                        optional 'mask' [B, T] (1 = valid step).
        language_model: 'inputs' [B, T] int32, 'targets' [B, T] int32, 'mask' [B, T],
                        optional 'reset' [B] (1 = zero the carried state before this batch).
        tagging:        'inputs' [B, T] int32 or [B, T, F] float32, 'labels' [B, T] int32,
                        'mask' [B, T].
      Every batch also has 'weights' [B] float32 (0 = padding example, not counted).
  eval_batches(split) -> iterator of batch dicts
      Fixed-shape batches covering `split` ('valid' or 'test') once, in order, padded
      with weight-0 examples so that every batch has the same shape (one compilation,
      divisible over devices). Same keys as `train_batch`.

`get_dataset(config, workdir=None, process_index=0, process_count=1)` builds the dataset
that `config.data.name` names. Batch sizes in the config are global (all processes).

Where datasets live
-------------------
Every dataset that needs files reads them under ONE data root: `config.data.root`
(`--config.data.root=/path/to/datasets`), or, when that is empty, the environment variable
`BN_RNN_JAX_DATA`. Each dataset's path in the config (`config.data.path`,
`config.data.mnist_dir`, the Kaldi tables) is relative to that root unless it is absolute.
A run that needs files while no root is set stops at once with one line saying how to set
it; every error of a reader names the absolute path it tried. The offline sets (`digits`,
and the synthetic data of the tests) need no root. Nothing is downloaded; nothing is
copied into the repository. Per dataset, its public source, its licence and the layout
expected under the root: `docs/data.md`.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator, Optional

import numpy as np

from bn_rnn_jax.input_pipeline.paths import data_root  # pylint: disable=unused-import
from bn_rnn_jax.input_pipeline.paths import ENV_VAR  # pylint: disable=unused-import
from bn_rnn_jax.input_pipeline.paths import resolve_path  # pylint: disable=unused-import

# config.data.name -> module of this package that defines `get_dataset`.
_MODULES = {
    'mnist': 'mnist',
    'digits': 'mnist',
    'ptb_char': 'text',
    'ptb_word': 'text',
    'text8': 'text',
    # Sequence labelling (task 'tagging'): Brown POS tags, Kaldi feats + alignments.
    'brown': 'tagging',
    'kaldi': 'kaldi',
}


def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1):
  """The dataset of `config.data.name` (see the module docstring for its interface)."""
  name = config.data.name
  if name not in _MODULES:
    raise ValueError(f'Unknown config.data.name {name!r}; choose one of {sorted(_MODULES)}.')
  module = importlib.import_module(f'bn_rnn_jax.input_pipeline.{_MODULES[name]}')
  return module.get_dataset(config, workdir=workdir, process_index=process_index,
                            process_count=process_count)


# ------------------------------------------------------------------ shared helpers
def per_process_batch(global_batch: int, process_count: int) -> int:
  """The batch one process feeds; the global batch must split evenly."""
  if global_batch <= 0:
    raise ValueError(f'batch size must be positive; got {global_batch}.')
  if global_batch % process_count:
    raise ValueError(f'batch size {global_batch} does not divide over {process_count} '
                     'processes.')
  return global_batch // process_count


def epoch_order(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """The shuffled example order of one epoch: a pure function of (seed, epoch)."""
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def train_indices(seed: int, step: int, global_batch: int, num_examples: int,
                  process_index: int = 0, process_count: int = 1) -> np.ndarray:
  """Example indices of this process's part of training step `step`'s batch.

  Epoch e = step // steps_per_epoch walks `epoch_order(seed, e)` in consecutive slices of
  `global_batch` (the remainder of an epoch is dropped, so every batch is full); process p
  takes the p-th contiguous share of the slice.
  """
  if step < 0:
    raise ValueError(f'step must be >= 0; got {step}.')
  steps_per_epoch = num_examples // global_batch
  if steps_per_epoch == 0:
    raise ValueError(f'batch size {global_batch} exceeds the {num_examples} training '
                     'examples.')
  epoch, index = divmod(step, steps_per_epoch)
  order = epoch_order(seed, epoch, num_examples)
  start = index * global_batch
  local = per_process_batch(global_batch, process_count)
  start += process_index * local
  return order[start:start + local]


def eval_index_batches(num_examples: int, global_batch: int, process_index: int = 0,
                       process_count: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """`(indices, weights)` of fixed-size eval batches covering 0..num_examples-1 in order.

  The last batch is padded by repeating index 0 with weight 0. Each process gets its
  contiguous share of every global batch.
  """
  local = per_process_batch(global_batch, process_count)
  for start in range(0, num_examples, global_batch):
    index = np.arange(start, start + global_batch)
    weights = (index < num_examples).astype(np.float32)
    index = np.where(index < num_examples, index, 0)
    part = slice(process_index * local, (process_index + 1) * local)
    yield index[part], weights[part]


def gather(arrays: dict[str, np.ndarray], index: np.ndarray) -> dict[str, Any]:
  return {k: v[index] for k, v in arrays.items()}


# Reading comprehension (DeepMind Q&A .question format; `reading.py`).
_MODULES.update({'brown_cloze_large': 'reading', 'brown_cloze': 'reading', 'cnn': 'reading',
                 'dailymail': 'reading', 'reading': 'reading'})
