"""Faults of the data pipelines: damaged, odd or missing files, and where datasets live.

One test per fault class, each asserting one of three outcomes: a one-line error naming
the file (for an archive, `<archive>:<member>`) and what is wrong; a rebuild or a fallback
with a warning; or a result bitwise identical to the one from undamaged data. Fixtures
are tiny files written here; nothing is trained, so the file runs in seconds.
"""

import gzip
import io
import logging
import os
import pickle
import shutil
import tarfile
import threading

import numpy as np
import pytest

from bn_rnn_jax import input_pipeline
from bn_rnn_jax.input_pipeline import files
from bn_rnn_jax.input_pipeline import kaldi
from bn_rnn_jax.input_pipeline import mnist
from bn_rnn_jax.input_pipeline import reading
from bn_rnn_jax.input_pipeline import tagging
from bn_rnn_jax.input_pipeline import text
from bn_rnn_jax.training import config as config_lib
from bn_rnn_jax.training import loop
import helpers
from helpers import one_line
import training_fixtures as fx

REPO = helpers.REPO
SPLITS = {'training': 4, 'validation': 3, 'test': 3}


# ====================================================================== cloze fixtures
def question(index: int, answer: int = 1, crlf: bool = False) -> str:
  """A DeepMind `.question` file whose context holds @entity0 and @entity1."""
  text = (f'http://x/{index}\n\nthe @entity0 met @entity1 in the river {index} .\n\n'
          f'@placeholder met @entity0\n\n@entity{answer}\n\n@entity0:Ann\n@entity1:Bob')
  return text.replace('\n', '\r\n') if crlf else text


def write_cloze(root, crlf: bool = False, extra=None) -> str:
  """`root/{training,validation,test}/*.question`; `extra` maps 'split/name' to bytes."""
  for folder, count in SPLITS.items():
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(count):
      with open(os.path.join(root, folder, f'q{i:02d}.question'), 'wb') as f:
        f.write(question(i, answer=i % 2, crlf=crlf).encode())
  for name, data in (extra or {}).items():
    with open(os.path.join(root, name), 'wb') as f:
      f.write(data)
  return str(root)


def archive_of(folder: str, target: str, arcname: str = 'set/questions') -> str:
  with tarfile.open(target, 'w:gz') as archive:
    archive.add(folder, arcname=arcname)
  return target


def assert_same_arrays(a, b):
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ====================================================================== undecodable bytes
def test_undecodable_question_file_names_the_file_byte_and_line(tmp_path):
  root = write_cloze(tmp_path / 'cloze', extra={'validation/zz.question': b'url\n\n\xd8\x00'})
  with pytest.raises(ValueError) as error:
    reading.load(root)
  assert one_line(error) == (f'{root}/validation/zz.question: not UTF-8 text: byte 0xd8 at '
                             "offset 5 (line 3): invalid continuation byte.")
  tgz = archive_of(root, str(tmp_path / 'cloze.tgz'))
  with pytest.raises(ValueError) as error:
    reading.load(tgz)
  assert one_line(error).startswith(
      f'{tgz}:set/questions/validation/zz.question: not UTF-8 text: byte 0xd8')


def test_undecodable_brown_and_ptb_files_name_the_file(tmp_path):
  folder = tmp_path / 'brown'
  folder.mkdir()
  (folder / 'ca01').write_bytes(b'\tThe/at jury/nn ./.\n\tIt/pps \xff/nn ./.\n')
  with pytest.raises(ValueError) as error:
    tagging.load_brown(str(folder))
  assert one_line(error).startswith(f'{folder}/ca01: not UTF-8 text: byte 0xff at offset '
                                    '28 (line 2)')
  for split in ('train', 'valid', 'test'):
    (tmp_path / f'ptb.{split}.txt').write_text(' a b \n')
  (tmp_path / 'ptb.valid.txt').write_bytes(b' a \x80 \n')
  with pytest.raises(ValueError, match=f'{tmp_path}/ptb.valid.txt: not UTF-8') as error:
    text.load_ptb(str(tmp_path), 'word')
  one_line(error)


# ====================================================================== damaged archives
def test_every_bit_flip_of_an_archive_is_caught_or_harmless(tmp_path):
  """80 single-bit flips spread over a reader archive: each either loads exactly the
  undamaged arrays (a flip in the gzip header's time stamp, say) or is one line naming
  the archive; none loads different tokens."""
  tgz = archive_of(write_cloze(tmp_path / 'cloze'), str(tmp_path / 'good.tgz'))
  clean = reading.load(tgz)
  data = open(tgz, 'rb').read()
  outcomes = {'identical': 0, 'error': 0}
  for position in np.linspace(0, len(data) - 1, 80).astype(int):
    flipped = bytearray(data)
    flipped[position] ^= 1 << int(position % 8)
    bad = str(tmp_path / 'flipped.tgz')
    with open(bad, 'wb') as f:
      f.write(flipped)
    try:
      arrays = reading.load(bad)
    except ValueError as e:
      assert str(e).startswith(bad) and '\n' not in str(e), str(e)
      outcomes['error'] += 1
    else:
      assert_same_arrays(arrays, clean)
      outcomes['identical'] += 1
  assert outcomes['error'] >= 60, outcomes   # nearly every flip lands in the deflate data
  truncated = str(tmp_path / 'truncated.tgz')
  with open(truncated, 'wb') as f:
    f.write(data[:len(data) - 5])
  with pytest.raises(ValueError, match='truncated.tgz: damaged gzip archive') as error:
    reading.load(truncated)
  one_line(error)


def test_archive_holding_two_data_sets_is_refused(tmp_path):
  folder = write_cloze(tmp_path / 'cloze')
  tgz = str(tmp_path / 'both.tgz')
  with tarfile.open(tgz, 'w:gz') as archive:
    archive.add(folder, arcname='cnn/questions')
    archive.add(folder, arcname='dailymail/questions')
  with pytest.raises(ValueError, match=f'{tgz} holds more than one data set') as error:
    reading.load(tgz)
  assert 'cnn/questions/' in one_line(error) and 'dailymail/questions/' in str(error.value)
  shutil.copy(tgz, tmp_path / 'other.tgz')    # a folder of two archives: which one?
  with pytest.raises(ValueError) as error:
    reading.load(str(tmp_path))
  assert one_line(error) == (f'{tmp_path} holds 2 archives (both.tgz, other.tgz); set '
                             'config.data.path to the one to read.')


def test_crlf_files_read_alike_from_a_folder_and_an_archive(tmp_path):
  lf = reading.load(write_cloze(tmp_path / 'lf'))
  crlf_folder = write_cloze(tmp_path / 'crlf', crlf=True)
  assert_same_arrays(reading.load(crlf_folder), lf)
  assert_same_arrays(reading.load(archive_of(crlf_folder, str(tmp_path / 'crlf.tgz'))), lf)


# ====================================================================== the token cache
@pytest.fixture
def cached(tmp_path):
  """`(source folder, cache folder, cache file, arrays)` after a first load."""
  source = write_cloze(tmp_path / 'cloze')
  cache = str(tmp_path / 'cache')
  arrays = reading.load(source, cache_dir=cache)
  (name,) = os.listdir(cache)
  return source, cache, os.path.join(cache, name), arrays


def _load_expecting(caplog, source, cache, message):
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    arrays = reading.load(source, cache_dir=cache)
  assert message in caplog.text, caplog.text
  return arrays


def test_cache_of_files_edited_in_place_is_rebuilt_with_a_warning(cached, caplog):
  source, cache, _, _ = cached
  folder = os.path.join(source, 'validation')
  stat = os.stat(folder)
  for name in os.listdir(folder):   # same files, same count, the answers changed
    file = os.path.join(folder, name)
    file_stat = os.stat(file)
    with open(file, 'r+') as f:
      content = f.read().replace('\n\n@entity0\n\n', '\n\n@entity9\n\n')
      content = content.replace('\n\n@entity1\n\n', '\n\n@entity0\n\n').replace(
          '\n\n@entity9\n\n', '\n\n@entity1\n\n')
      f.seek(0)
      f.write(content)
    os.utime(file, ns=(file_stat.st_atime_ns, file_stat.st_mtime_ns))
  os.utime(folder, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  arrays = _load_expecting(caplog, source, cache, 'is stale (built from another source_sha256)')
  assert_same_arrays(arrays, reading.load(source))
  assert len(os.listdir(cache)) == 1
  assert_same_arrays(reading.load(source, cache_dir=cache), arrays)   # read back as is


@pytest.mark.parametrize('damage', ['truncated', 'bit_flip', 'garbage'])
def test_damaged_cache_is_rebuilt_with_a_warning(cached, caplog, damage):
  source, cache, file, arrays = cached
  data = open(file, 'rb').read()
  if damage == 'truncated':
    data = data[:len(data) // 2]
  elif damage == 'bit_flip':   # inside the token ids (the zip's CRC-32 and our checksum)
    data = bytearray(data)
    data[data.index(arrays['train/document'].tobytes()) + 5] ^= 0x10
  else:
    data = b'\x93NUMPY junk that is neither a zip nor a valid array' * 10
  with open(file, 'wb') as f:
    f.write(bytes(data))
  assert_same_arrays(_load_expecting(caplog, source, cache, 'is damaged'), arrays)
  assert_same_arrays(reading.load(source, cache_dir=cache), arrays)   # the rebuilt file


def test_every_bit_flip_of_a_cache_gives_the_same_arrays(cached, caplog):
  """40 flips over the whole cache file: each start gives the arrays of a fresh parse,
  with a warning wherever the flip touched what is read (a flip in a zip header's time
  field is read by nobody)."""
  source, cache, file, arrays = cached
  data = open(file, 'rb').read()
  warned = 0
  for position in np.linspace(0, len(data) - 1, 40).astype(int):
    flipped = bytearray(data)
    flipped[position] ^= 1 << int(position % 8)
    with open(file, 'wb') as f:
      f.write(flipped)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      assert_same_arrays(reading.load(source, cache_dir=cache), arrays)
    warned += 'is damaged' in caplog.text
  assert warned >= 20, warned   # 29 of these 40 (the rest: zip time and version fields)


UNPICKLED = []


def _record_unpickling(what):
  UNPICKLED.append(what)


class _Trap:
  """An object whose unpickling leaves a record in UNPICKLED."""

  def __reduce__(self):
    return (_record_unpickling, ('unpickled',))


def test_cache_holding_pickled_objects_is_never_unpickled(cached, caplog):
  source, cache, file, arrays = cached
  with open(file, 'wb') as f:
    np.savez(f, vocab=np.array([_Trap()], dtype=object))
  assert pickle.loads(pickle.dumps(_Trap())) is None and UNPICKLED == ['unpickled']
  UNPICKLED.clear()
  assert_same_arrays(_load_expecting(caplog, source, cache, 'is damaged'), arrays)
  assert not UNPICKLED


def test_concurrent_cache_writers_use_unique_temporary_names(tmp_path, monkeypatch):
  source = write_cloze(tmp_path / 'cloze')
  cache = str(tmp_path / 'cache')
  renamed, real_replace = [], os.replace
  monkeypatch.setattr(os, 'replace', lambda a, b: (renamed.append(a), real_replace(a, b)))
  barrier, results, errors = threading.Barrier(6), [], []
  def start():
    barrier.wait()
    try:
      results.append(reading.load(source, cache_dir=cache))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  threads = [threading.Thread(target=start) for _ in range(6)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors and len(results) == 6
  assert len(set(renamed)) == len(renamed) >= 1       # no two writers shared a name
  assert os.listdir(cache) == [os.path.basename(reading.cache_file(
      cache, os.path.abspath(source), 0, 0))]         # no partial file left behind
  for arrays in results[1:]:
    assert_same_arrays(arrays, results[0])


def test_unwritable_cache_folder_is_a_warning(tmp_path, caplog):
  source = write_cloze(tmp_path / 'cloze')
  (tmp_path / 'a_file').write_text('')
  with caplog.at_level(logging.WARNING):
    arrays = reading.load(source, cache_dir=str(tmp_path / 'a_file' / 'cache'))
  assert 'Cannot write the cache' in caplog.text
  assert_same_arrays(arrays, reading.load(source))


# ====================================================================== questions
def test_questions_whose_answer_is_not_in_the_context_are_dropped_and_counted(tmp_path,
                                                                              caplog):
  only_in_query = question(7).replace('@placeholder met @entity0\n\n@entity1',
                                      '@placeholder met @entity2\n\n@entity2')
  absent = question(8, answer=5)
  root = write_cloze(tmp_path / 'cloze', extra={'validation/zz1.question': only_in_query.encode(),
                                                'validation/zz2.question': absent.encode()})
  with caplog.at_level(logging.WARNING):
    arrays = reading.load(root)
  assert ('Dropped 2 of 5 validation questions whose answer entity does not occur in the '
          f'context (they cannot be answered), e.g. {root}/validation/zz1.question'
          in caplog.text)
  assert arrays['dropped'].tolist() == [0, 2, 0]
  assert len(arrays['valid/answer']) == SPLITS['validation']
  dataset = reading.ReadingDataset(arrays, batch_size=2, seed=0, eval_batch_size=4)
  for batch in dataset.eval_batches('valid'):
    rows = np.arange(len(batch['labels']))
    assert np.all(batch['inputs']['candidates'][rows, batch['labels']] == 1)


def test_huge_entity_index_names_the_file(tmp_path):
  huge = question(9).replace('river', '@entity99999')
  root = write_cloze(tmp_path / 'cloze', extra={'training/zz.question': huge.encode()})
  with pytest.raises(ValueError) as error:
    reading.load(root, vocab_size=5000)
  assert one_line(error) == (
      f'{root}/training/zz.question: @entity99999 needs 100000 entity symbols, which with the '
      '3 special ones leave no room for words in config.data.vocab_size=5000.')


# ====================================================================== Brown
def _brown_folder(tmp_path, contents=True):
  folder = tmp_path / 'brown'
  folder.mkdir()
  for name in ('ca01', 'ca02', 'cb01'):
    (folder / name).write_text('\tThe/at jury/nn said/vbd ./.\n')
  if contents:
    (folder / 'CONTENTS').write_text('LIST OF TEXTS\n\nA01. The Atlanta Constitution\n'
                                     'A02. The Dallas Morning News\nB01. Editorial\n')
  return folder


def test_deleted_brown_file_is_named(tmp_path, caplog):
  folder = _brown_folder(tmp_path)
  assert sum(len(v) for v in tagging.load_brown(str(folder)).values()) == 3
  os.remove(folder / 'ca02')
  with pytest.raises(ValueError) as error:
    tagging.load_brown(str(folder))
  assert one_line(error) == (f'{folder}: 1 of the 3 corpus files that CONTENTS lists are '
                             'missing (ca02); copy the corpus again.')
  os.remove(folder / 'CONTENTS')   # no list to check against: a warning
  with caplog.at_level(logging.WARNING):
    tagging.load_brown(str(folder))
  assert "holds 2 of the Brown corpus's 500 files" in caplog.text


def test_empty_brown_file_is_named(tmp_path):
  folder = _brown_folder(tmp_path, contents=False)
  (folder / 'cb01').write_text('\n\n')
  with pytest.raises(ValueError, match=f'{folder}/cb01: no sentences') as error:
    tagging.load_brown(str(folder))
  one_line(error)


# ====================================================================== Kaldi
def _kaldi(tmp_path, valid=True, train_features=None, valid_features=None, labels=None):
  """A Kaldi config over tiny tables (train: 3 utterances, valid: 2), dims 4."""
  rng = np.random.default_rng(0)
  train_features = train_features or {f't{i}': rng.normal(size=(5, 4)).astype(np.float32)
                                      for i in range(3)}
  valid_features = valid_features or {f'v{i}': rng.normal(size=(4, 4)).astype(np.float32)
                                      for i in range(2)}
  lines = labels or [f'{u} ' + ' '.join(['1'] * len(x)) for u, x in
                     {**train_features, **valid_features}.items()]
  (tmp_path / 'ali.txt').write_text('\n'.join(lines) + '\n')
  helpers.write_kaldi_table(f'ark,scp:{tmp_path}/train.ark,{tmp_path}/train.scp', train_features)
  config = config_lib.default_config()
  config.data = tagging.default_data_config('kaldi')
  config.data.update(dict(root=str(tmp_path), train_feats='train.scp', train_labels='ali.txt',
                          num_classes=3, max_frames=6, buckets=(6,), train_eval_size=2))
  if valid:
    helpers.write_kaldi_table(f'ark:{tmp_path}/valid.ark', valid_features)
    config.data.update(dict(valid_feats='valid.ark', valid_labels='ali.txt'))
  config.model.bidirectional = True
  config.model.hidden_size, config.model.num_layers = 4, 1
  config.train.batch_size = config.eval.batch_size = 2
  config.train.num_devices = 1
  config.eval.splits = ('valid',)
  config.checkpoint.best_metric = 'valid/fce'
  config.checkpoint.best_mode = 'min'
  return config


def test_kaldi_tables_read_when_sound(tmp_path):
  dataset = kaldi.kaldi_dataset(_kaldi(tmp_path))
  assert dataset.num_sequences('train') == 3 and dataset.num_sequences('valid') == 2


@pytest.mark.parametrize('table', ['scp', 'ark'])
def test_truncated_ark_is_named(tmp_path, table):
  config = _kaldi(tmp_path)
  ark = tmp_path / ('train.ark' if table == 'scp' else 'valid.ark')
  ark.write_bytes(ark.read_bytes()[:-7])
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(config)
  if table == 'scp':
    assert one_line(error).startswith(f"{tmp_path}/train.scp:3: cannot read the features of "
                                      f"utterance 't2' from {tmp_path}/train.ark:")
  else:
    assert one_line(error).startswith(f"{tmp_path}/valid.ark: cannot read the features "
                                      "after utterance 'v0' (")
  assert str(error.value).endswith('a truncated or damaged ark.')


@pytest.mark.parametrize('split', ['train', 'valid'])
def test_empty_kaldi_table_is_named(tmp_path, split):
  config = _kaldi(tmp_path)
  empty = tmp_path / 'empty.scp'
  empty.write_text('')
  config.data[f'{split}_feats'] = str(empty)
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(config)
  assert one_line(error) == f'Kaldi features {empty} holds no utterance.'


def test_feature_dimension_that_differs_names_the_utterance(tmp_path):
  rng = np.random.default_rng(1)
  valid = {'v0': rng.normal(size=(4, 4)).astype(np.float32),
           'v1': rng.normal(size=(4, 5)).astype(np.float32)}
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(_kaldi(tmp_path, valid_features=valid))
  assert one_line(error) == (f"valid ({tmp_path}/valid.ark): utterance 'v1' has 5-dim "
                             "features; the training utterance 't0' has 4.")


@pytest.mark.parametrize('split, value', [('valid', np.nan), ('train', np.inf)])
def test_non_finite_features_name_the_utterance(tmp_path, split, value):
  rng = np.random.default_rng(2)
  features = {f'{split[0]}{i}': rng.normal(size=(5, 4)).astype(np.float32) for i in range(3)}
  features[f'{split[0]}1'][3, 2] = value
  config = _kaldi(tmp_path, **{f'{split}_features': features})
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(config)
  assert one_line(error).endswith(f"the features of utterance '{split[0]}1' hold NaN or inf "
                                  "(frame 3 of 5).")


def test_label_outside_the_classes_names_the_utterance(tmp_path):
  labels = ['t0 1 1 1 1 1', 't1 1 1 -1 1 1', 't2 0 0 0 0 0', 'v0 1 1 1 1', 'v1 2 2 2 2']
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(_kaldi(tmp_path, labels=labels))
  assert one_line(error) == (f"train ({tmp_path}/train.scp): utterance 't1' has label -1 at "
                             'frame 2; labels must lie in [0, 3) (config.data.num_classes; 0 '
                             '= 1 + the largest label).')


def test_duplicated_utterance_is_named(tmp_path):
  labels = ['t0 1 1 1 1 1', 't1 1 1 1 1 1', 't2 0 0 0 0 0', 'v0 1 1 1 1', 'v1 2 2 2 2',
            't1 2 2 2 2 2']
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(_kaldi(tmp_path, labels=labels))
  assert one_line(error) == (f"{tmp_path}/ali.txt:6: utterance 't1' appears twice (also "
                             'line 2).')
  config = _kaldi(tmp_path)
  scp = (tmp_path / 'train.scp').read_text()
  (tmp_path / 'train.scp').write_text(scp + scp.splitlines()[0] + '\n')
  with pytest.raises(ValueError) as error:
    kaldi.kaldi_dataset(config)
  assert one_line(error) == (f"{tmp_path}/train.scp:4: utterance 't0' appears twice (also "
                             'line 1).')


def test_train_and_valid_only_kaldi_data_says_how_to_run_without_a_test(tmp_path):
  config = _kaldi(tmp_path)
  config.eval.test_at_end = True
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert one_line(error) == ("No evaluation split 'test'; have ['valid', 'train_eval']. The "
                             'end-of-run test (config.eval.test_at_end) needs a test split: '
                             'give the data one, or pass --config.eval.test_at_end=False.')
  assert not os.path.exists(tmp_path / 'run' / 'metrics.jsonl')


# ====================================================================== the trainer's part
def test_best_metric_the_task_does_not_log_fails_at_start(tmp_path):
  config = fx.tiny_config(**{'checkpoint.best_metric': 'valid/bpc'})
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(config, str(tmp_path), fx.synthetic_dataset(config))
  assert one_line(error) == ("config.checkpoint.best_metric='valid/bpc' names no metric of "
                             "the 'classification' task; it logs ['accuracy', 'loss'].")
  assert not os.path.exists(tmp_path / 'metrics.jsonl')


def _main(args, cwd, env):
  result = helpers.run_python([os.path.join(REPO, 'experiments', 'main.py'), *args],
                              env=env, cwd=cwd)
  assert result.returncode == 1, result.stderr[-2000:]
  return helpers.last_line_without_traceback(result.stderr)


@pytest.mark.slow
def test_config_argument_typo_and_missing_data_root_are_one_line(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != input_pipeline.ENV_VAR}
  env = helpers.subprocess_env(env)
  config = os.path.join(REPO, 'experiments', 'configs', 'ptb_char.py')
  line = _main(['--config', f'{config}:lstmm', '--workdir', str(tmp_path / 'a')], '/tmp', env)
  assert line == ("error: ptb_char.py:lstmm: 'lstmm' is no variant and no preset; variant "
                  "must be one of ('lstm', 'bn_lstm', 'bn_input_only'), presets are ('tiny',).")
  line = _main(['--config', f'{config}:lstm', '--workdir', str(tmp_path / 'b'),
                '--config.train.num_steps=1'], '/tmp', env)
  assert line == ("error: config.data.path='ptb' is relative to the data root, and no data "
                  'root is set: pass --config.data.root=/path/to/datasets or set the '
                  'environment variable BN_RNN_JAX_DATA=/path/to/datasets.')


# ====================================================================== the data root
def test_paths_are_read_under_the_root_and_errors_name_absolute_paths(tmp_path, monkeypatch):
  monkeypatch.delenv(input_pipeline.ENV_VAR, raising=False)
  monkeypatch.chdir(tmp_path)
  config = config_lib.default_config()
  config.data = text.default_data_config('ptb_char')
  with pytest.raises(ValueError, match='no data root is set: pass --config.data.root='):
    text.get_dataset(config)
  config.data.root = 'datasets'          # relative to the working directory
  with pytest.raises(FileNotFoundError) as error:
    text.get_dataset(config)
  assert one_line(error) == (f'The data root {tmp_path}/datasets (config.data.root) is not a '
                             'folder; pass --config.data.root=/path/to/datasets or set the '
                             'environment variable BN_RNN_JAX_DATA=/path/to/datasets.')
  os.makedirs(tmp_path / 'datasets')
  with pytest.raises(FileNotFoundError) as error:
    text.get_dataset(config)
  assert one_line(error).startswith(
      f'Language-model data file not found: {tmp_path}/datasets/ptb/ptb.train.txt.')
  config.data.root = ''
  monkeypatch.setenv(input_pipeline.ENV_VAR, str(tmp_path / 'datasets'))
  assert input_pipeline.resolve_path(config.data, 'path') == f'{tmp_path}/datasets/ptb'
  config.data.path = str(tmp_path / 'elsewhere')    # absolute: used as it is
  assert input_pipeline.resolve_path(config.data, 'path') == f'{tmp_path}/elsewhere'


def test_offline_digits_need_no_root(monkeypatch):
  monkeypatch.delenv(input_pipeline.ENV_VAR, raising=False)
  config = config_lib.default_config()
  config.data = mnist.default_data_config('digits')
  config.train.batch_size, config.eval.batch_size = 10, 10
  assert mnist.get_dataset(config).num_train == 1297


def test_every_default_dataset_path_is_relative_to_the_root():
  data_configs = [mnist.default_data_config('mnist'), tagging.default_data_config('brown'),
                  tagging.default_data_config('kaldi')]
  data_configs += [text.default_data_config(n) for n in ('ptb_char', 'ptb_word', 'text8')]
  data_configs += [reading.default_data_config(n)
                   for n in ('brown_cloze', 'brown_cloze_large', 'cnn', 'dailymail')]
  for data in data_configs:
    assert data.root == ''
    for field in ('path', 'mnist_dir', 'train_feats', 'valid_feats', 'test_feats'):
      value = data.get(field, '')
      assert not os.path.isabs(value) and not value.startswith('..'), (data.name, value)


def test_gzip_check_names_a_damaged_file(tmp_path):
  path = tmp_path / 'x.gz'
  path.write_bytes(gzip.compress(b'some bytes' * 100)[:-3])
  with pytest.raises(ValueError, match=f'{path}: damaged gzip archive') as error:
    files.verify_gzip(str(path))
  one_line(error)
  buffer = io.BytesIO()
  with gzip.GzipFile(fileobj=buffer, mode='wb', mtime=0) as f:
    f.write(b'x' * 1000)
  data = bytearray(buffer.getvalue())
  data[-6] ^= 0xff                       # the stored CRC-32 (the data is intact)
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match='CRC check failed'):
    files.verify_gzip(str(path))
