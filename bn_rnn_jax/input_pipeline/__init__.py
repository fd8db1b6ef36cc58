"""Input pipelines: datasets as pure functions of (seed, step).

`get_dataset(config, workdir=None, process_index=0, process_count=1)` builds the dataset
that `config.data.name` names, its files read under the data root (`paths.py`). Batch
sizes in the config are global (all processes). The trainer reads a dataset only through
these members:

  task             'classification' (`SequenceClassifier`, logits `[B, C]`),
                   'language_model' (`LanguageModel`, `[B, T, V]`), 'tagging'
                   (`SequenceTagger`, `[B, T, C]`) or 'reading_comprehension'
                   (`AttentiveReader`, `[B, E]`).
  model_kwargs     sizes the model takes from the data, e.g. `{'num_classes': 10}`.
  train_length     time steps of a training sequence (at most the model's `max_length`).
  steps_per_epoch  training steps of one pass over the training set.
  unit             (optional) 'character' or 'word': a language model's metrics.
  carries_state    the final recurrent state of step k is the initial state of step k+1
                   (kept in `TrainState.carry`, passed as `initial_carries`).
  train_batch(step)    this process's share of the global batch of `step`, a pure
                       function of (seed, step, process index):
    classification  'inputs' [B, T, I] float32, 'labels' [B] int32, optional 'mask' [B, T]
    language_model  'inputs', 'targets' [B, T] int32, 'mask' [B, T], optional 'reset' [B]
                    (1 = zero the carried state before this batch)
    tagging         'inputs' [B, T] int32 or [B, T, F] float32, 'labels' [B, T] int32,
                    'mask' [B, T]
    and always 'weights' [B] float32 (0 = a padding example); 'mask' is 1 on valid steps.
  eval_batches(split)  batches of one shape covering 'valid' or 'test' once, in order,
                       padded with weight-0 examples; the keys of `train_batch`.
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
  """The dataset of `config.data.name` (the interface: the module docstring)."""
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
  """Example indices of this process's share of training batch `step`: epoch
  `step // steps_per_epoch` of `epoch_order` in full consecutive slices of `global_batch`."""
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
  """`(indices, weights)` of fixed-size eval batches covering 0..num_examples-1 in order; the
  last is padded with index 0 at weight 0, and each process takes its contiguous share."""
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
