"""Sequential and permuted MNIST (Cooijmans et al. sec. 5.1), 14x14 MNIST, 8x8 digits.

Images become pixel sequences `[N, T, 1]` in scan-line order, pixels in [0, 1]: T = 784
(28x28), 196 (14x14, 2x2 mean-pooled) or 64 (the 8x8 digits). Permuted MNIST applies one
permutation of the T steps, drawn from `config.data.permutation_seed` and kept in the
run's workdir as `permutation.npy`. MNIST is read from the four IDX .gz files in
`config.data.mnist_dir` (`config.data.source = 'idx'`) or with `tfds.data_source`
('tfds'); valid is the last `num_valid` training images. The digits (`'digits'`,
scikit-learn's) split 1,297 / 250 / 250 by a fixed permutation, independent of the seed.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Iterator, Optional

import numpy as np

from bn_rnn_jax import extras
from bn_rnn_jax import input_pipeline as ip

IDX_FILES = {
    'train_images': 'train-images-idx3-ubyte.gz',
    'train_labels': 'train-labels-idx1-ubyte.gz',
    'test_images': 't10k-images-idx3-ubyte.gz',
    'test_labels': 't10k-labels-idx1-ubyte.gz',
}
_GET_DATA = ('Get the four files from https://yann.lecun.com/exdb/mnist/ (or a mirror such '
             'as https://ossci-datasets.s3.amazonaws.com/mnist/) into that folder (by '
             'default <data root>/mnist; --config.data.mnist_dir), or use '
             '--config.data.source=tfds.')
DIGITS_SPLIT = (1297, 250, 250)


# ------------------------------------------------------------------ readers
def read_idx(path: str) -> np.ndarray:
  """An IDX file (optionally gzip-compressed) as a numpy array (uint8 data only)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'MNIST file not found: {path}. {_GET_DATA}')
  opener = gzip.open if path.endswith('.gz') else open
  try:
    with opener(path, 'rb') as f:
      data = f.read()
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    # A partial download or a file that is not gzip at all: name it, not a zlib trace.
    raise ValueError(f'{path} is not a complete gzip file ({e}); download it again. '
                     f'{_GET_DATA}') from e
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
    raise ValueError(f'{path} is not an unsigned-byte IDX file (magic {data[:4]!r}).')
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
  offset = 4 + 4 * ndim
  if len(data) - offset != int(np.prod(shape)):
    raise ValueError(f'{path}: header says shape {shape} but holds '
                     f'{len(data) - offset} bytes.')
  return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


def load_idx(mnist_dir: str) -> dict[str, np.ndarray]:
  """`{'train_images' [60000, 28, 28] uint8, 'train_labels' [60000], 'test_*'}`."""
  mnist_dir = os.path.abspath(mnist_dir)
  if not os.path.isdir(mnist_dir):
    raise FileNotFoundError(f'MNIST folder not found: {mnist_dir}. {_GET_DATA}')
  return {key: read_idx(os.path.join(mnist_dir, name)) for key, name in IDX_FILES.items()}


def _tfds_split(split: str, data_dir: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
  with extras.needed_by('MNIST from tfds (config.data.source=tfds)'):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    # download=False: offline machines get the message below, not a hanging download.
    source = tfds.data_source('mnist', split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises several types for "not prepared".
    raise FileNotFoundError(
        f'tfds mnist ({split}) is not available in array_record format under data_dir='
        f'{data_dir!r} ({type(e).__name__}: {e}). Prepare it once with network access: '
        "tfds.builder('mnist', data_dir=...).download_and_prepare(file_format="
        "'array_record'), or use --config.data.source=idx.") from e
  examples = [source[i] for i in range(len(source))]
  images = np.stack([ex['image'][..., 0] for ex in examples]).astype(np.uint8)
  labels = np.asarray([ex['label'] for ex in examples], np.int64)
  return images, labels


def load_tfds(data_dir: Optional[str] = None) -> dict[str, np.ndarray]:
  """The same arrays as `load_idx`, read with `tfds.data_source` (no TensorFlow)."""
  train_images, train_labels = _tfds_split('train', data_dir)
  test_images, test_labels = _tfds_split('test', data_dir)
  return {'train_images': train_images, 'train_labels': train_labels,
          'test_images': test_images, 'test_labels': test_labels}


def load_digits() -> dict[str, np.ndarray]:
  """scikit-learn's 8x8 digits split deterministically: `{split: (images [N, 8, 8] float32
  in [0, 1], labels [N] int32)}`."""
  with extras.needed_by('The 8x8 digits (config.data.name=digits)'):
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  images = (digits.images / 16.0).astype(np.float32)
  labels = digits.target.astype(np.int32)
  order = np.random.default_rng(0).permutation(len(labels))
  n_train, n_valid, _ = DIGITS_SPLIT
  parts = {'train': order[:n_train], 'valid': order[n_train:n_train + n_valid],
           'test': order[n_train + n_valid:]}
  return {split: (images[index], labels[index]) for split, index in parts.items()}


# ------------------------------------------------------------------ transforms
def mean_pool(images: np.ndarray, factor: int) -> np.ndarray:
  """`[N, H, W]` -> `[N, H/factor, W/factor]` by averaging factor x factor blocks."""
  n, h, w = images.shape
  if h % factor or w % factor:
    raise ValueError(f'images {images.shape[1:]} do not pool by {factor}.')
  return images.reshape(n, h // factor, factor, w // factor, factor).mean(axis=(2, 4))


def to_sequences(images: np.ndarray, permutation: Optional[np.ndarray] = None) -> np.ndarray:
  """`[N, H, W]` in [0, 1] -> `[N, H*W, 1]` float32 pixel sequences (scan-line order)."""
  seq = images.reshape(images.shape[0], -1).astype(np.float32)
  if permutation is not None:
    seq = seq[:, permutation]
  return seq[..., None]


def make_permutation(seed: int, length: int) -> np.ndarray:
  """A permutation of 0..length-1 drawn from `seed`."""
  return np.random.default_rng(seed).permutation(length)


def load_or_make_permutation(seed: int, length: int, workdir: Optional[str]) -> np.ndarray:
  """The run's pixel permutation: `workdir/permutation.npy` if there, else drawn from
  `seed` and saved there."""
  path = None if workdir is None else os.path.join(workdir, 'permutation.npy')
  if path is not None and os.path.exists(path):
    permutation = np.load(path)
    if sorted(permutation.tolist()) != list(range(length)):
      raise ValueError(f'{path} is not a permutation of {length} steps; delete it or use '
                       'another workdir.')
    return permutation
  permutation = make_permutation(seed, length)
  if path is not None:
    os.makedirs(workdir, exist_ok=True)
    np.save(path, permutation)
  return permutation


# ------------------------------------------------------------------ dataset
class SequenceDataset:
  """Classification of `[N, T, I]` sequences; see `input_pipeline` for the interface."""
  task = 'classification'
  carries_state = False

  def __init__(self, splits: dict[str, tuple[np.ndarray, np.ndarray]], *, seed: int,
               batch_size: int, eval_batch_size: int, num_classes: int = 10,
               process_index: int = 0, process_count: int = 1):
    self.splits = {name: {'inputs': x, 'labels': y.astype(np.int32)}
                   for name, (x, y) in splits.items()}
    self.seed = seed
    self.batch_size = batch_size
    self.eval_batch_size = eval_batch_size
    self.process_index = process_index
    self.process_count = process_count
    ip.per_process_batch(batch_size, process_count)
    ip.per_process_batch(eval_batch_size, process_count)
    for name, split in self.splits.items():
      # Found now, at load time, rather than at the first evaluation.
      if not len(split['labels']):
        raise ValueError(f'The {name!r} split has no examples.')
    self.num_train = len(self.splits['train']['labels'])
    if batch_size > self.num_train:
      raise ValueError(f'batch size {batch_size} exceeds the {self.num_train} training '
                       'examples.')
    self.steps_per_epoch = self.num_train // batch_size
    self.train_length = self.splits['train']['inputs'].shape[1]
    self.model_kwargs = {'num_classes': num_classes}

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    index = ip.train_indices(self.seed, step, self.batch_size, self.num_train,
                             self.process_index, self.process_count)
    batch = ip.gather(self.splits['train'], index)
    batch['weights'] = np.ones(len(index), np.float32)
    return batch

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    if split not in self.splits:
      raise ValueError(f'Unknown split {split!r}; have {sorted(self.splits)}.')
    data = self.splits[split]
    for index, weights in ip.eval_index_batches(len(data['labels']), self.eval_batch_size,
                                                self.process_index, self.process_count):
      batch = ip.gather(data, index)
      batch['weights'] = weights
      yield batch


def _mnist_images(config) -> dict[str, np.ndarray]:
  source = config.data.source
  if source == 'idx':
    return load_idx(ip.resolve_path(config.data, 'mnist_dir'))
  if source == 'tfds':
    return load_tfds(config.data.get('tfds_data_dir'))
  raise ValueError(f"config.data.source must be 'idx' or 'tfds'; got {source!r}.")


def mnist_splits(config, workdir: Optional[str] = None):
  """`{split: (sequences [N, T, 1] float32, labels [N])}` for MNIST as configured."""
  raw = _mnist_images(config)
  resolution = config.data.get('resolution', 28)
  if resolution not in (28, 14):
    raise ValueError(f'config.data.resolution must be 28 or 14; got {resolution}.')
  def prepare(images):
    images = images.astype(np.float32) / 255.0
    return mean_pool(images, 2) if resolution == 14 else images
  train_images = prepare(raw['train_images'])
  test_images = prepare(raw['test_images'])
  length = resolution * resolution
  permutation = None
  if config.data.get('permute', False):
    permutation = load_or_make_permutation(config.data.permutation_seed, length, workdir)
  num_valid = config.data.get('num_valid', 5000)
  if not 0 < num_valid < len(train_images):
    raise ValueError(f'config.data.num_valid must be in (0, {len(train_images)}); '
                     f'got {num_valid}.')
  cut = len(train_images) - num_valid
  labels = raw['train_labels']
  return {
      'train': (to_sequences(train_images[:cut], permutation), labels[:cut]),
      'valid': (to_sequences(train_images[cut:], permutation), labels[cut:]),
      'test': (to_sequences(test_images, permutation), raw['test_labels']),
  }


def digits_splits(config, workdir: Optional[str] = None):
  """The 8x8 digits as `[N, 64, 1]` sequences (optionally permuted)."""
  splits = load_digits()
  permutation = None
  if config.data.get('permute', False):
    permutation = load_or_make_permutation(config.data.permutation_seed, 64, workdir)
  return {name: (to_sequences(x, permutation), y) for name, (x, y) in splits.items()}


def get_dataset(config, workdir: Optional[str] = None, process_index: int = 0,
                process_count: int = 1) -> SequenceDataset:
  if config.data.name == 'mnist':
    splits = mnist_splits(config, workdir)
  elif config.data.name == 'digits':
    splits = digits_splits(config, workdir)
  else:
    raise ValueError(f'mnist.get_dataset cannot read {config.data.name!r}.')
  return SequenceDataset(splits, seed=config.seed, batch_size=config.train.batch_size,
                         eval_batch_size=config.eval.batch_size,
                         process_index=process_index, process_count=process_count)


def default_data_config(name: str = 'mnist'):
  """`config.data` fields of this module's datasets."""
  with extras.needed_by(f'{__name__}.default_data_config'):
    import ml_collections  # pylint: disable=g-import-not-at-top
  data = ml_collections.ConfigDict()
  data.name = name                  # 'mnist' | 'digits' (offline, needs no data root)
  data.root = ''                    # '' = $BN_RNN_JAX_DATA (see bn_rnn_jax/input_pipeline)
  data.source = 'idx'               # 'idx' | 'tfds'
  data.mnist_dir = 'mnist'          # the four IDX .gz files (source 'idx'), under the root
  data.tfds_data_dir = ml_collections.config_dict.placeholder(str)
  data.resolution = 28              # 28 (784 steps) | 14 (2x2 mean-pooled, 196 steps)
  data.permute = False              # permuted MNIST
  data.permutation_seed = 0
  data.num_valid = 5000             # the last num_valid training images
  return data
