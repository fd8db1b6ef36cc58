"""MNIST / digits pipeline: IDX files (the real ones under the data root), tfds mock data,
permutation, 14x14 pooling, deterministic batches and eval coverage."""

import gzip
import os

import numpy as np
import pytest

from bn_rnn_jax import input_pipeline as ip
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.training import config as config_lib
import real_data

REAL_MNIST = real_data.path('mnist')
needs_mnist = real_data.needs('mnist', mnist.IDX_FILES['train_images'])


def _config(**data):
  config = config_lib.default_config()
  config.data = mnist.default_data_config('mnist')   # mnist_dir 'mnist' under the data root
  config.data.update(data)
  config.train.batch_size = 100
  config.eval.batch_size = 1000
  return config


@pytest.fixture(scope='module')
def raw_idx():
  return mnist.load_idx(REAL_MNIST)


@needs_mnist
@pytest.mark.slow
def test_idx_files_are_the_real_mnist(raw_idx):
  assert raw_idx['train_images'].shape == (60000, 28, 28)
  assert raw_idx['test_images'].shape == (10000, 28, 28)
  # Published facts about MNIST (see the shared data README), not values from our code.
  counts = np.bincount(raw_idx['train_labels'], minlength=10)
  assert counts.tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
  pixels = raw_idx['train_images'] / 255.0
  assert abs(pixels.mean() - 0.1307) < 1e-4 and abs(pixels.std() - 0.3081) < 1e-4


@needs_mnist
def test_sequential_splits_14x14_and_validation_is_the_last_5000(raw_idx):
  splits = mnist.mnist_splits(_config(resolution=14))
  x_train, y_train = splits['train']
  x_valid, y_valid = splits['valid']
  assert x_train.shape == (55000, 196, 1) and x_valid.shape == (5000, 196, 1)
  assert splits['test'][0].shape == (10000, 196, 1)
  np.testing.assert_array_equal(y_valid, raw_idx['train_labels'][-5000:])
  # 2x2 mean pooling written out pixel by pixel, in float64.
  image = raw_idx['train_images'][-5000].astype(np.float64) / 255.0
  pooled = np.array([[(image[2 * r, 2 * c] + image[2 * r + 1, 2 * c] + image[2 * r, 2 * c + 1]
                       + image[2 * r + 1, 2 * c + 1]) / 4 for c in range(14)]
                     for r in range(14)])
  np.testing.assert_allclose(x_valid[0, :, 0], pooled.reshape(-1), rtol=1e-6)
  assert 0.0 <= x_train.min() and x_train.max() <= 1.0


def test_idx_reader_and_missing_path_errors(tmp_path):
  data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  path = tmp_path / 'x-idx3-ubyte.gz'
  header = bytes([0, 0, 8, 3]) + b''.join(n.to_bytes(4, 'big') for n in data.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + data.tobytes())
  np.testing.assert_array_equal(mnist.read_idx(str(path)), data)
  bad = tmp_path / 'bad.gz'
  with gzip.open(bad, 'wb') as f:
    f.write(bytes([0, 0, 9, 1, 0, 0, 0, 1, 0]))
  with pytest.raises(ValueError, match='not an unsigned-byte IDX file'):
    mnist.read_idx(str(bad))
  missing = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='nowhere.*yann.lecun.com'):
    mnist.get_dataset(_config(mnist_dir=missing))


def test_tfds_path_with_mock_data():
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=30):
    config = _config(source='tfds', num_valid=10)
    config.train.batch_size = 10
    config.eval.batch_size = 10
    dataset = mnist.get_dataset(config)
    train_source = tfds.data_source('mnist', split='train')
    last = np.stack([train_source[i]['image'][..., 0] for i in range(20, 30)])
  assert dataset.train_length == 784 and dataset.num_train == 20
  valid = next(dataset.eval_batches('valid'))
  np.testing.assert_allclose(valid['inputs'][..., 0], last.reshape(10, 784) / 255.0,
                             rtol=1e-6)
  batch = dataset.train_batch(0)
  assert batch['inputs'].shape == (10, 784, 1) and batch['labels'].shape == (10,)


def test_permutation_is_true_saved_and_applied(tmp_path):
  workdir = str(tmp_path)
  config = _config(permute=True, permutation_seed=3)
  config.data.name = 'digits'
  splits = mnist.digits_splits(config, workdir)
  permutation = np.load(os.path.join(workdir, 'permutation.npy'))
  assert sorted(permutation.tolist()) == list(range(64))  # no repeats
  assert (permutation != np.arange(64)).any()
  plain = mnist.load_digits()['train'][0].reshape(-1, 64)
  np.testing.assert_array_equal(splits['train'][0][..., 0], plain[:, permutation])
  # A resumed run reads the saved permutation back, whatever the seed says now.
  config.data.permutation_seed = 4
  again = mnist.digits_splits(config, workdir)
  np.testing.assert_array_equal(again['train'][0], splits['train'][0])


def test_digits_split_is_deterministic_and_disjoint():
  a, b = mnist.load_digits(), mnist.load_digits()
  sizes = {name: len(y) for name, (_, y) in a.items()}
  assert sizes == {'train': 1297, 'valid': 250, 'test': 250}
  for name in a:
    np.testing.assert_array_equal(a[name][0], b[name][0])
  # The three splits hold every image exactly once (a multiset comparison).
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  everything = (datasets.load_digits().images / 16.0).astype(np.float32)
  ours = sorted(x.tobytes() for images, _ in a.values() for x in images)
  assert ours == sorted(x.tobytes() for x in everything)
  assert max(x.max() for x, _ in a.values()) == 1.0


def test_train_batches_are_a_function_of_seed_and_step():
  n, batch = 50, 10
  first = ip.train_indices(0, 7, batch, n)
  np.testing.assert_array_equal(first, ip.train_indices(0, 7, batch, n))
  epoch = np.concatenate([ip.train_indices(0, s, batch, n) for s in range(5)])
  assert sorted(epoch.tolist()) == list(range(n))  # one epoch visits every example once
  assert (ip.train_indices(1, 0, batch, n) != ip.train_indices(0, 0, batch, n)).any()
  # Two processes read disjoint halves of the same global batch.
  halves = [ip.train_indices(0, 7, batch, n, p, 2) for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), first)


def test_eval_batches_cover_the_split_once_with_padding():
  splits = {name: (np.arange(n * 3, dtype=np.float32).reshape(n, 3, 1),
                   np.arange(n) % 10) for name, n in [('train', 20), ('valid', 13),
                                                      ('test', 5)]}
  dataset = mnist.SequenceDataset(splits, seed=0, batch_size=10, eval_batch_size=4)
  batches = list(dataset.eval_batches('valid'))
  assert len(batches) == 4 and all(b['inputs'].shape == (4, 3, 1) for b in batches)
  weights = np.concatenate([b['weights'] for b in batches])
  labels = np.concatenate([b['labels'] for b in batches])
  assert weights.sum() == 13 and weights[13:].sum() == 0
  np.testing.assert_array_equal(labels[:13], np.arange(13) % 10)


def test_tfds_path_without_prepared_data_says_how_to_prepare(tmp_path):
  pytest.importorskip('tensorflow_datasets')
  config = _config(source='tfds', tfds_data_dir=str(tmp_path / 'empty'))
  with pytest.raises(FileNotFoundError, match="download_and_prepare.*array_record"):
    mnist.get_dataset(config)
  assert not os.path.exists(tmp_path / 'empty' / 'downloads')  # no download was tried
