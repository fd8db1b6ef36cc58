"""Every experiment config's `tiny` preset runs end to end through `experiments/main.py`.

`--config experiments/configs/<name>.py:<argument>,tiny` is the config's whole run in
seconds: its data (the real data under the data root, or a fixture written here where the
data cannot be had: text8, Kaldi features and alignments), its model at 8 units, four
steps, an evaluation of two batches and, where the config tests, the end-of-run test on
the whole test split. The runs are fresh processes with one CPU device, as a user starts
them, three at a time, sharing a persistent compilation cache (seq_mnist and pmnist compile
the same programs).
"""

import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from bn_rnn_jax.training import metric_writer
import helpers
import real_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARALLEL = 3

# config file -> (its argument, the real data it reads under the data root; None: offline
# data or a fixture written here), the longest runs first: they are launched in this order.
RUNS = {
    'attentive_reader': ('bn_e_star,tiny', 'brown_cloze_large'),
    'brown_tagger': ('tiny', 'brown'),
    'seq_mnist': ('tiny', 'mnist'),
    'laurent_speech': ('lstm,tiny', None),
    'ptb_char': ('bn_lstm,tiny', 'ptb'),
    'ptb_word': ('small,tiny', 'ptb'),
    'quickstart': ('tiny', None),
    'pmnist': ('tiny', 'mnist'),
    'text8': ('tiny', None),
}
TEXT8_SPLITS = (20_000, 2_000, 2_000)


def _write_text8(path: str) -> list[str]:
  """A text8-like file (a-z and spaces) and the arguments that read it."""
  rng = np.random.default_rng(0)
  words = [''.join(rng.choice(list('abcdefghijklmnopqrstuvwxyz'), size=rng.integers(1, 9)))
           for _ in range(200)]
  text = ' '.join(rng.choice(words, size=sum(TEXT8_SPLITS)))[:sum(TEXT8_SPLITS)]
  with open(path, 'w') as f:
    f.write(text)
  return [f'--config.data.path={path}', f'--config.data.text8_split_sizes={TEXT8_SPLITS}']


def _write_kaldi(folder: str) -> list[str]:
  """Kaldi features (an ark with its scp) and text alignments for three splits, and the
  arguments that read them."""
  import kaldiio  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  args = []
  for split, count in (('train', 24), ('valid', 6), ('test', 6)):
    feats = f'{folder}/{split}_feats'
    with kaldiio.WriteHelper(f'ark,scp:{feats}.ark,{feats}.scp') as writer, \
        open(f'{folder}/{split}_ali.txt', 'w') as alignments:
      for i in range(count):
        frames = int(rng.integers(20, 60))
        writer(f'{split}{i}', rng.normal(size=(frames, 6)).astype(np.float32))
        alignments.write(f'{split}{i} ' + ' '.join(map(str, rng.integers(0, 5, frames))) + '\n')
    args += [f'--config.data.{split}_feats={feats}.scp',
             f'--config.data.{split}_labels={folder}/{split}_ali.txt']
  return args


def _missing_data(name: str):
  """Why `name`'s run cannot start here (its real data is absent), or None."""
  data = RUNS[name][1]
  if data is None:
    return None
  root = real_data.input_pipeline.data_root()
  if root is None:
    return f'${real_data.input_pipeline.ENV_VAR} is not set: no real {data} data to read'
  if not os.path.exists(os.path.join(root, data)):
    return f'{os.path.join(root, data)} not found (the real data under the data root)'
  return None


def _launch(name: str, workdir: str, extra: list[str], env: dict) -> dict:
  """Run `name`'s tiny preset; its exit code, log, wall and CPU seconds (its own, whatever
  else the machine runs)."""
  argument = RUNS[name][0]
  argv = [sys.executable, 'experiments/main.py',
          f'--config=experiments/configs/{name}.py:{argument}', f'--workdir={workdir}', *extra]
  start = time.time()
  with open(f'{workdir}.log', 'w+') as log:
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read()
  return {'returncode': process.returncode, 'log': text, 'wall_s': time.time() - start,
          'cpu_s': usage.ru_utime + usage.ru_stime, 'workdir': workdir,
          'command': ' '.join(argv[1:])}


@pytest.fixture(scope='module')
def tiny_runs(tmp_path_factory):
  """`{config: result of its tiny run}` for every config whose data is here."""
  base = tmp_path_factory.mktemp('tiny_presets')
  data = base / 'data'
  (data / 'kaldi').mkdir(parents=True)
  extra = {'text8': _write_text8(str(data / 'text8')),
           'laurent_speech': _write_kaldi(str(data / 'kaldi'))}
  # A fresh process as a user starts it: one CPU device (conftest asks for 8 fake ones).
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env = helpers.subprocess_env(env, JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(base / 'jax_cache'),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  names = [n for n in RUNS if _missing_data(n) is None]
  start = time.time()
  with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
    futures = {n: pool.submit(_launch, n, str(base / n), extra.get(n, []), env)
               for n in names}
    results = {n: f.result() for n, f in futures.items()}
  load = os.getloadavg()
  print(f'\ntiny presets, {PARALLEL} at a time: {time.time() - start:.0f} s in all (load '
        f'average {load[0]:.1f}); wall / CPU seconds: ' +
        ', '.join(f'{n} {r["wall_s"]:.0f} / {r["cpu_s"]:.0f}' for n, r in results.items()))
  return results


def test_every_config_file_has_a_tiny_run():
  files = {os.path.splitext(os.path.basename(p))[0]
           for p in glob.glob(os.path.join(REPO, 'experiments', 'configs', '[!_]*.py'))}
  assert files == set(RUNS)


@pytest.mark.exhaustive
@pytest.mark.parametrize('name', list(RUNS))
def test_tiny_preset_runs_end_to_end(name, tiny_runs):
  missing = _missing_data(name)
  if missing:
    pytest.skip(missing)
  run = tiny_runs[name]
  assert run['returncode'] == 0, f'{run["command"]}\n{run["log"][-3000:]}'
  with open(os.path.join(run['workdir'], 'config.json')) as f:
    config = json.load(f)
  assert config['train']['num_steps'] == 4 and config['model']['hidden_size'] == 8
  records = metric_writer.read_metrics(run['workdir'])
  by_split = {}
  for record in records:
    by_split.setdefault(record['split'], []).append(record)
  assert [r['step'] for r in by_split['train']] == [2, 4]
  for split in config['eval']['splits']:
    assert [r['step'] for r in by_split[split]] == [4], split
    # Training records carry the metrics evaluations derive (bpc, perplexity, fer, ...).
    # (Evaluations add the count they scored and the metrics of `eval.compare`.)
    compared = {k for k in by_split[split][0]
                if any(k.endswith(f'_{kind}') for kind in config['eval']['compare'])}
    assert by_split[split][0]['count'] > 0
    assert set(by_split[split][0]) - {'time_s', 'count'} - compared <= set(
        by_split['train'][0])
    evaluated = re.search(rf'evaluated {split}: (\d+) batches', run['log'])
    assert evaluated and 1 <= int(evaluated.group(1)) <= 2, run['log'][-3000:]
  assert ('test' in by_split) == config['eval']['test_at_end']
  if config['eval']['test_at_end']:
    assert 'on the whole test split' in run['log'] and 'evaluated test:' in run['log']
