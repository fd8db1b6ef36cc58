"""Tiny configs, synthetic datasets and fixture files shared by the tests that train
(not a test module): configs that compile and run in about a second, datasets that fail
on cue, a run's checkpoint and records read back."""

import os
import tarfile

import numpy as np
import pytest

from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.input_pipeline import reading
from bn_rnn_jax.training import checkpoint
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
import helpers


def tiny_config(variant='bn_lstm', **overrides):
  """A config whose model and data compile and run in about a second, on one device (the
  tests about devices ask for more with `**{'train.num_devices': n}`)."""
  config = config_lib.default_config()
  config.train.num_devices = 1
  config.data = mnist.default_data_config('synthetic')
  config.model.variant = variant
  config.model.hidden_size = 8
  config.model.gamma_init = 0.1
  config.train.batch_size = 16
  config.train.num_steps = 6
  config.train.log_every = 3
  config.eval.every = 3
  config.eval.batch_size = 8
  config.eval.population_batches = 2
  config.eval.test_at_end = False
  config.checkpoint.every = 2
  config.checkpoint.keep = 2
  for key, value in overrides.items():
    node = config
    *path, name = key.split('.')
    for part in path:
      node = node[part]
    node[name] = value
  return config


class Killed(Exception):
  """Raised by `KillAt`: a run "killed" before a training step."""


class KillAt:
  """Wraps a dataset; asking for the batch of step `kill_step` "kills" the run."""

  def __init__(self, dataset, kill_step):
    self._dataset, self._kill_step = dataset, kill_step

  def __getattr__(self, name):
    return getattr(self._dataset, name)

  @property
  def name(self):
    """The name config.json records: the wrapped dataset's (a resume gives it unwrapped)."""
    return getattr(self._dataset, 'name', type(self._dataset).__name__)

  def train_batch(self, step):
    if step == self._kill_step:
      raise Killed(step)
    return self._dataset.train_batch(step)


class NaNAt(KillAt):
  """Wraps a dataset; the batch of step `kill_step` has NaN inputs."""

  def train_batch(self, step):
    batch = self._dataset.train_batch(step)
    if step == self._kill_step:
      batch = dict(batch, inputs=np.full_like(batch['inputs'], np.nan))
    return batch


def restore(config, workdir, dataset):
  """`(state, meta)` of the newest intact checkpoint of the run in `workdir`."""
  trainer = loop.Trainer(config, workdir, dataset)
  ckpt = checkpoint.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    return ckpt.restore(trainer.initial_state())
  finally:
    ckpt.close()


def records_without_time(workdir):
  """The run's metrics records without their wall times (equal across equal runs)."""
  return [{k: v for k, v in r.items() if k != 'time_s'}
          for r in metric_writer.read_metrics(workdir)]


def one_step(config, dataset, num_devices):
  """One train step and a validation pass on `num_devices` devices:
  `(initial host state, host state after the step, metrics, valid metrics)`."""
  config = config.copy_and_resolve_references()
  config.train.num_devices = num_devices
  trainer = loop.Trainer(config, None, dataset)
  init = trainer.initial_state()
  state, metrics = trainer.p_train_step(trainer.to_devices(init), trainer.train_batch(0))
  valid = trainer.evaluate(state, 'valid')
  return init, trainer.to_host(state), {k: float(v[0]) for k, v in metrics.items()}, valid


def synthetic_splits(num_train=64, num_eval=12, length=6, features=2, seed=0):
  """Random sequences whose class depends on the sign of their mean (learnable)."""
  rng = np.random.default_rng(seed)
  def split(n):
    x = rng.normal(size=(n, length, features)).astype(np.float32)
    y = (x.mean(axis=(1, 2)) > 0).astype(np.int32) + 2 * (x[:, 0, 0] > 0)
    return x, y
  return {'train': split(num_train), 'valid': split(num_eval), 'test': split(num_eval)}


def synthetic_dataset(config, **kwargs):
  return mnist.SequenceDataset(synthetic_splits(**kwargs), seed=config.seed,
                               batch_size=config.train.batch_size,
                               eval_batch_size=config.eval.batch_size, num_classes=4)


class LanguageModelDataset:
  """A random token stream cut into contiguous [B, T] segments (carried state)."""
  task = 'language_model'
  carries_state = True

  def __init__(self, batch_size=16, length=5, vocab=7, steps=10, seed=0):
    rng = np.random.default_rng(seed)
    self.stream = rng.integers(0, vocab, size=(batch_size, steps * length + 1))
    self.batch_size, self.train_length, self.steps_per_epoch = batch_size, length, steps
    self.model_kwargs = {'vocab_size': vocab}

  def train_batch(self, step):
    index = step % self.steps_per_epoch
    s = slice(index * self.train_length, (index + 1) * self.train_length)
    s1 = slice(s.start + 1, s.stop + 1)
    return {'inputs': self.stream[:, s].astype(np.int32),
            'targets': self.stream[:, s1].astype(np.int32),
            'mask': np.ones((self.batch_size, self.train_length), np.float32),
            'reset': np.full((self.batch_size,), float(index == 0), np.float32),
            'weights': np.ones((self.batch_size,), np.float32)}

  def eval_batches(self, split):
    del split
    for step in range(2):
      yield self.train_batch(step)


# ----------------------------------------------------------------------------- text
WORDS = ('the', 'cat', 'dog', 'sat', 'on', 'a', 'mat', 'ran', 'to', 'big', 'red', 'house')


def write_ptb_fixture(folder, seed=0, lines=(300, 40, 40)):
  """Mikolov-format files of random short sentences over the 12 `WORDS`."""
  rng = np.random.default_rng(seed)
  for split, count in zip(('train', 'valid', 'test'), lines):
    text = ''.join(' ' + ' '.join(rng.choice(WORDS, size=rng.integers(3, 8))) + ' \n'
                   for _ in range(count))
    (folder / f'ptb.{split}.txt').write_text(text)
  return str(folder)


def load_config(name, arg):
  """`experiments/configs/<name>.py`'s `get_config(arg)`."""
  return helpers.load_experiment_config(name).get_config(arg)


def tiny_text_config(config, data_path, batch_size, seq_length, hidden=16):
  """A language-model config cut down to fixture text and one device."""
  config.data.path = data_path
  config.data.seq_length = seq_length
  config.model.hidden_size = hidden
  config.model.max_length = seq_length
  if config.model.get('embed_size'):
    config.model.embed_size = hidden
  config.train.batch_size = batch_size
  config.train.num_devices = 1
  config.eval.batch_size = batch_size
  config.eval.population_batches = 2
  config.eval.test_at_end = False
  return config


# ----------------------------------------------------------------------------- Brown
BROWN_FIXTURE = {
    'ca01': ['\tThe/at Fulton/np-tl jury/nn said/vbd ./.', '',
             '\tThe/at jury/nn did/dod n\'t/*  go/vb ./.', '\tHe/pps said/vbd it/pps ./.'],
    'cb02': ['\tThe/at city/nn-hl was/bedz n\'t/* big/jj and/cc the/at jury/nn said/vbd '
             'so/rb ./.', '\tIt/pps said/vbd ./.'],
    'ca09': ['\tThe/AT jury/NN-TL said/VBD il/fw-at ./.'],
    'cr10': ['\tHe\'s/pps+bez big/jj ./.', '\tThe/at unseen/jj word/nn ./.'],
}


def write_brown(folder, files=BROWN_FIXTURE):
  """Brown-corpus files (`files`: name -> lines) and a README that is not one, in `folder`."""
  os.makedirs(folder, exist_ok=True)
  for name, lines in files.items():
    with open(os.path.join(folder, name), 'w') as f:
      f.write('\n'.join(lines) + '\n')
  with open(os.path.join(folder, 'README'), 'w') as f:
    f.write('not a corpus file\n')
  return str(folder)


# ----------------------------------------------------------------------------- questions
QUESTION_WORDS = ('the', 'a', 'house', 'runs', 'said', 'of', 'and', 'river', 'old', 'new')
QUESTION_SPLITS = {'training': 24, 'validation': 8, 'test': 8}


def question_text(rng, index):
  """A `.question` file in DeepMind's layout with 2-4 entities; lengths vary."""
  num_entities = int(rng.integers(2, 5))
  context = []
  for entity in range(num_entities):
    context += list(rng.choice(QUESTION_WORDS, int(rng.integers(1, 4)))) + [f'@entity{entity}', '.']
  context += list(rng.choice(QUESTION_WORDS, int(rng.integers(0, 5))))
  answer = int(rng.integers(0, num_entities))
  query = list(rng.choice(QUESTION_WORDS, 3)) + ['@placeholder', '@entity0' if answer else 'river']
  lines = '\n'.join(f'@entity{e}:Name {e}' for e in range(num_entities))
  return f'http://x/{index}\n\n{" ".join(context)}\n\n{" ".join(query)}\n\n@entity{answer}' \
         f'\n\n{lines}'


def write_questions(root, seed=0):
  """`root/{training,validation,test}/*.question` files of `question_text`."""
  rng = np.random.default_rng(seed)
  for folder, count in QUESTION_SPLITS.items():
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(count):
      with open(os.path.join(root, folder, f'{folder}{i:03d}.question'), 'w') as f:
        f.write(question_text(rng, i))
  return root


def write_question_set(base):
  """`<base>/cloze/questions/{training,validation,test}` and `<base>/cloze.tgz` of it."""
  write_questions(str(base / 'cloze' / 'questions'))
  with tarfile.open(str(base / 'cloze.tgz'), 'w:gz') as archive:
    archive.add(str(base / 'cloze'), arcname='cloze')
  return base


@pytest.fixture(scope='module')
def cloze_dir(tmp_path_factory):
  """`write_question_set` in a temporary folder."""
  return write_question_set(tmp_path_factory.mktemp('reading'))


@pytest.fixture(scope='module')
def cloze_arrays(cloze_dir):  # pylint: disable=redefined-outer-name
  """`reading.load` of `cloze_dir`'s questions."""
  return reading.load(str(cloze_dir / 'cloze'))


def tiny_reading_dataset(arrays, batch_size=8, seed=0):
  """The reader's dataset of `reading.load`'s arrays, documents padded to 32 steps."""
  return reading.ReadingDataset(arrays, batch_size=batch_size, seed=seed, eval_batch_size=8,
                                length_multiple=32)
