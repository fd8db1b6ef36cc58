r"""Every table the docs quote, rendered from the JSON it comes from.

The README and the pages under docs/ quote marked blocks,

  <!-- json-table NAME [ARG ...] --> ... <!-- /json-table -->

whose text is one of two things:

* a result as its kind renders it (`experiments.rendering`): NAME is a JSON under
  `experiments/results/` without `.json` (a campaign's results, an analysis's), or a
  JSON's path from the repository root; ARG, for instance, one of a campaign's tables;
* a view of this module (`VIEWS`) across results: the map of the experiments, a JSON's
  machine or run time, the figures' numbers, the benchmarks' tables.

A block whose quoted text opens with a code fence keeps it.

  python docs/tables.py               # is every quoted block current? (exit 1 if not)
  python docs/tables.py --write       # rewrite every quoted block from its JSON
  python docs/tables.py NAME [ARG]    # print one block's text

`tests/test_docs.py` checks every block byte for byte, so no quoted number can drift from
its artefact.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import machine_facts
from experiments import rendering
# pylint: enable=g-import-not-at-top,wrong-import-position

RESULTS = os.path.join(ROOT, 'experiments', 'results')
BENCHMARKS = os.path.join(ROOT, 'benchmarks')
DASH = '–'

JSON_BLOCK = re.compile(r'(<!-- json-table (\S+)((?: [^\s>]+)*) -->\n)(.*?)(<!-- /json-table -->)',
                        re.S)


def _load(*parts: str) -> dict:
  with open(os.path.join(ROOT, *parts)) as f:
    return json.load(f)


def _result(name: str) -> dict:
  return _load('experiments', 'results', f'{name}.json')


def markdown(header, rows) -> str:
  from experiments.campaign import columns  # pylint: disable=g-import-not-at-top
  return columns.markdown(header, rows)


# ---------------------------------------------------------------------- experiments
def _records(result: dict, arm: str, seed: int = 0) -> list[dict]:
  return result['runs'][f'{arm}_s{seed}']['records']


def _quickstart() -> tuple[str, str]:
  from experiments.campaign_specs import quickstart  # pylint: disable=g-import-not-at-top
  result = _result('quickstart')
  runs = {(r['arm'], r['seed']): quickstart._row(r)  # pylint: disable=protected-access
          for r in result['runs'].values()}
  seeds = sorted({seed for _, seed in runs})
  step = runs['lstm', seeds[0]]['at'][0][0]
  gaps = [runs['bn_lstm', s]['at'][0][1] - runs['lstm', s]['at'][0][1] for s in seeds]
  ahead = sum(g > 0 for g in gaps)
  return (f'BN-LSTM ahead of the LSTM at step {step} in {ahead} of {len(seeds)} seeds '
          f'(valid accuracy {min(gaps):+.3f} to {max(gaps):+.3f})', DASH)


def _init_options() -> tuple[str, str]:
  result = _result('init_options')
  valid = {arm: _records(result, arm)[-1] for arm in ('lstm_ours', 'bn_lstm_ours')}
  step = valid['lstm_ours']['step']
  paper = result['spec']['paper']['table1_test_accuracy_mnist']
  return (f"valid accuracy at step {step}: LSTM {valid['lstm_ours']['accuracy']:.3f}, "
          f"BN-LSTM {valid['bn_lstm_ours']['accuracy']:.3f}",
          f"Table 1, 784-step MNIST test accuracy: LSTM {paper['lstm']:.3f}, BN-LSTM "
          f"{paper['bn_lstm']:.3f}")


def _fig2(panel: str) -> tuple[str, str]:
  """The headline of one panel of Fig. 2: `panel` is 'seq' or 'pmnist'."""
  from experiments.campaign import columns  # pylint: disable=g-import-not-at-top
  from experiments.campaign_specs import _fig2 as fig2  # pylint: disable=g-import-not-at-top
  result = _result(fig2.NAMES[panel])
  lstm, bn = f'{panel}_lstm', f'{panel}_bn_lstm'
  batch = {arm: fig2.validation_curve(_records(result, arm), 'accuracy_batch')
           for arm in (lstm, bn)}
  last = {arm: (steps[-1], values[-1]) for arm, (steps, values) in batch.items()}
  ninety = columns.first_past(*batch[bn], 0.9, above=True)
  paper = result['spec']['paper']['milestones']
  test = {arm: [r for r in _records(result, arm) if r['split'] == 'test'][-1]['accuracy']
          for arm in (lstm, bn)}
  return (f"valid accuracy at step {last[bn][0]:,} (batch statistics): LSTM "
          f"{last[lstm][1]:.3f}, BN-LSTM {last[bn][1]:.3f}; BN-LSTM past 90 % at step "
          f"{ninety:,}; test accuracy of the early-stopped checkpoint with population "
          f"statistics: LSTM {test[lstm]:.3f}, BN-LSTM {test[bn]:.3f}",
          f"Fig. 2: BN-LSTM past 90 % at ~{paper[bn]['0.9']:,} steps, LSTM at "
          f"~{paper[lstm]['0.9']:,}; Table 1 (full training): LSTM "
          f"{fig2.TABLE1[lstm]:.3f}, BN-LSTM {fig2.TABLE1[bn]:.3f}")


def _ptb_char() -> tuple[str, str]:
  result = _result('ptb_char_256')
  tests = {arm: [r for r in _records(result, arm) if r['split'] == 'test'][-1]
           for arm in ('lstm', 'bn_lstm', 'bn_input_only')}
  step = tests['lstm']['checkpoint_step']
  paper = result['spec']['paper']['table2_test_bpc']
  return (f"test bpc after {step} steps (256 units): LSTM {tests['lstm']['bpc']:.3f}, "
          f"BN-LSTM {tests['bn_lstm']['bpc']:.3f}, input-only BN "
          f"{tests['bn_input_only']['bpc']:.3f}",
          f"Table 2, test bpc (1000 units, trained to convergence): LSTM {paper['lstm']}, "
          f"BN-LSTM {paper['bn_lstm']}")


def _ptb_char_lengths() -> tuple[str, str]:
  result = _result('ptb_char_256_lengths')
  rows = result['runs']['bn_lstm_s0']['evaluation']['rows']
  return (f"BN-LSTM valid bpc at length {rows[0]['length']}: {rows[0]['estimate']:.3f}, "
          f"on the whole text as one sequence: {rows[-1]['estimate']:.3f}",
          'Fig. 3b: a curve (generalises to longer sequences)')


def _ptb_char_1000() -> tuple[str, str, str]:
  """Ours and the paper's, and the run time: the 2-CPU-core runs' launches and the GPU's."""
  from experiments.campaign import columns  # pylint: disable=g-import-not-at-top
  cpu = _result('ptb_char_1000')
  gpu = _load('experiments', 'results', 'h200', 'ptb_char_1000.json')
  arms = ('lstm', 'bn_lstm')
  tests = {arm: columns.last(_records(cpu, arm), 'test') for arm in arms}
  steps = columns.last(_records(cpu, 'lstm'), 'valid')['step']
  best_on_gpu = {arm: columns.best(_records(gpu, arm), 'valid', 'bpc')['step'] for arm in arms}
  longest_on_gpu = max(columns.last(_records(gpu, arm), 'valid')['step'] for arm in arms)
  paper = cpu['spec']['paper']['table2_test_bpc']
  launches = max(len(columns.trained_launches(run)) for run in cpu['runs'].values())
  # The records' clock runs on across launches: the last record's is the run's time.
  clock = lambda result: max(run['records'][-1]['time_s'] for run in result['runs'].values())
  cpu_hours, gpu_minutes = clock(cpu) / 3600, clock(gpu) / 60
  return (f"test bpc of the best-validation checkpoint after {steps:,} steps: LSTM "
          f"{tests['lstm']['bpc']:.3f}, BN-LSTM {tests['bn_lstm']['bpc']:.3f}; trained on "
          f"to {longest_on_gpu:,} steps on a GPU, the best validation stays at step "
          f"{best_on_gpu['lstm']:,} (LSTM) and {best_on_gpu['bn_lstm']:,} (BN-LSTM)",
          f"Table 2, test bpc (early-stopped): LSTM {paper['lstm']}, BN-LSTM "
          f"{paper['bn_lstm']}",
          f"{cpu_hours:.0f} h on 2 CPU cores ({launches} launches); {gpu_minutes:.0f} min "
          'on one H200')


def _ptb_char_1000_lengths() -> tuple[str, str]:
  result = _result('ptb_char_1000_lengths')
  rows = {arm: result['runs'][f'{arm}_s0']['evaluation']['rows'] for arm in ('bn_lstm', 'lstm')}
  return (f"test bpc with the estimate, segments of {rows['bn_lstm'][0]['length']} / the "
          f"whole text as one sequence: BN-LSTM {rows['bn_lstm'][0]['estimate']:.3f} / "
          f"{rows['bn_lstm'][-1]['estimate']:.3f}, LSTM {rows['lstm'][0]['estimate']:.3f} / "
          f"{rows['lstm'][-1]['estimate']:.3f}",
          'Fig. 3b: a curve (generalises to longer sequences)')


def _ptb_word_small() -> tuple[str, str]:
  from experiments.campaign_specs import ptb_word_small  # pylint: disable=g-import-not-at-top
  result = _result('ptb_word_small')
  best = {arm: min(p for _, p in ptb_word_small.epochs(_records(result, arm))['valid'])
          for arm in ('lstm', 'bn_input_only')}
  paper = result['spec']['paper']['table2_small']
  return (f"best valid perplexity: LSTM {best['lstm']:.1f}, BN {best['bn_input_only']:.1f}",
          f"Table 2: LSTM {paper['lstm']['valid']}, BN {paper['bn_input_only']['valid']}")


def _brown_tagger() -> tuple[str, str]:
  result = _result('brown_tagger')
  fer = {arm: min(r['fer'] for r in _records(result, arm) if r['split'] == 'valid')
         for arm in ('lstm', 'bn_input_only_seq', 'bn_input_only')}
  paper = result['spec']['paper']['table1_wsj']
  return (f"best valid frame error: BL {fer['lstm']:.3f}, BN {fer['bn_input_only_seq']:.3f}, "
          f"frame-wise BN {fer['bn_input_only']:.3f}",
          f"Table 1 (WSJ speech frames, dev): BL {paper['lstm']['dev_fer']}, BN "
          f"{paper['bn_input_only_seq']['dev_fer']}")


def _attentive_reader() -> tuple[str, str]:
  result = _result('attentive_reader_long')
  best = {}
  for arm in ('lstm', 'bn_e_star_star'):
    errors = [min(r['error'] for r in _records(result, arm, seed) if r['split'] == 'valid')
              for seed in result['spec']['seeds']]
    best[arm] = ' / '.join(f'{100 * e:.1f}' for e in errors)
  paper = result['spec']['paper']['fig4a_min_valid_error']
  return (f"best valid error % (2 seeds, brown_cloze_large): LSTM {best['lstm']}, BN-e** "
          f"{best['bn_e_star_star']}",
          f"Fig. 4a (CNN): LSTM {100 * paper['lstm']:.1f}, BN-e** "
          f"{100 * paper['bn_e_star_star']:.1f}")


def _variable_length_time() -> str:
  """The run time of the length studies: every analysis result directly under
  experiments/results/ (the campaigns' are of kind campaign or campaign_speed)."""
  seconds = sum(result['seconds'] for result in map(rendering.load, sorted(glob.glob(
      os.path.join(RESULTS, '*.json')))) if not result['kind'].startswith('campaign'))
  return f'{seconds / 60:.0f} min in all on 2 CPU cores'


def _figures_time() -> str:
  seconds = sum(_load('experiments', 'results', 'figures', os.path.basename(p))['seconds']
                for p in glob.glob(os.path.join(RESULTS, 'figures', '*.json')))
  return f'{seconds / 60:.0f} min in all'


# (experiment, config, data, campaign or command, docs page, headline): a campaign's
# headline gives (ours, paper) from its JSON; a command's, the run time (a string, or a
# function of the JSONs).
_SOURCES = {
    'digits': '[8×8 digits](https://archive.ics.uci.edu/dataset/80) (in scikit-learn)',
    'mnist': '[MNIST](https://yann.lecun.com/exdb/mnist/)',
    'ptb': '[PTB](http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz) (Mikolov)',
    'text8': '[text8](http://mattmahoney.net/dc/text8.zip)',
    'brown': '[Brown corpus](https://www.nltk.org/nltk_data/) (NLTK)',
    'brown_cloze': 'cloze questions built from the Brown corpus',
    'wsj': 'WSJ ([LDC93S6B](https://catalog.ldc.upenn.edu/LDC93S6B)) through Kaldi',
    'analysis': 'MNIST, PTB',
    'synthetic': 'synthetic: signs of Gaussian sums of lengths 5 to 200',
}
_EXPERIMENTS = [
    ('Quickstart', 'quickstart.py', 'digits', 'quickstart', 'sequential_mnist', _quickstart),
    ('Sequential MNIST 14×14, four initialisations (Cooijmans 5.1)',
     'quickstart.py (`data.name=mnist`)', 'mnist', 'init_options', 'sequential_mnist',
     _init_options),
    ('Sequential MNIST, 784 steps, Fig. 2 (Cooijmans 5.1)', 'seq_mnist.py', 'mnist',
     'mnist_fig2', 'sequential_mnist', lambda: _fig2('seq')),
    ('Permuted MNIST, 784 steps, Fig. 2 (Cooijmans 5.1)', 'pmnist.py', 'mnist',
     'pmnist_fig2', 'sequential_mnist', lambda: _fig2('pmnist')),
    ('Character PTB, 256 units (Cooijmans 5.2)', 'ptb_char.py', 'ptb', 'ptb_char_256',
     'language_modelling', _ptb_char),
    ('Longer sequences than trained on (Cooijmans Fig. 3b)', 'ptb_char.py', 'ptb',
     'ptb_char_256_lengths', 'language_modelling', _ptb_char_lengths),
    ('Character PTB, 1000 units: Table 2, Fig. 3a (Cooijmans 5.2)', 'ptb_char.py', 'ptb',
     'ptb_char_1000', 'language_modelling', _ptb_char_1000),
    ('Longer sequences, 1000 units (Cooijmans Fig. 3b)', 'ptb_char.py', 'ptb',
     'ptb_char_1000_lengths', 'language_modelling', _ptb_char_1000_lengths),
    ('text8 (Cooijmans 5.3)', 'text8.py', 'text8',
     'python experiments/main.py --config experiments/configs/text8.py --workdir W',
     'language_modelling', 'not run here: 2000 units on 90M characters, sized for a GPU'),
    ('Word PTB, small (Laurent 5.2)', 'ptb_word.py:small', 'ptb', 'ptb_word_small',
     'language_modelling', _ptb_word_small),
    ('Word PTB, medium and large (Laurent 5.2)', 'ptb_word.py:medium', 'ptb',
     'python experiments/main.py --config experiments/configs/ptb_word.py:medium --workdir W',
     'language_modelling', 'not run here: sized for a GPU'),
    ('Speech frames (Laurent 5.1)', 'laurent_speech.py', 'wsj',
     'python experiments/main.py --config experiments/configs/laurent_speech.py --workdir W',
     'tagging', 'not run here: WSJ is licensed by the LDC, not shipped'),
    ('POS tagging, Laurent 5.1 transposed', 'brown_tagger.py', 'brown', 'brown_tagger',
     'tagging', _brown_tagger),
    ('Attentive Reader (Cooijmans 5.4)', 'attentive_reader.py', 'brown_cloze',
     'attentive_reader_long', 'attentive_reader', _attentive_reader),
    ('Variable lengths, longer than training (Cooijmans 3, Laurent 4.1)',
     '`experiments/analysis/`', 'synthetic',
     'python -m experiments.analysis.NAME', 'variable_length', _variable_length_time),
    ('Figures (Cooijmans Figs. 1, 5, 6; Laurent app. A)', '`experiments/analysis/`',
     'analysis', 'python -m experiments.analysis.NAME', 'figures', _figures_time),
]


def experiments(where: str = 'readme') -> str:
  """The map of every experiment: config, data, command, run time, ours beside the paper.

  `where`: 'readme' (links relative to the repository root) or 'docs' (to docs/experiments/).
  """
  from experiments.campaign import spec  # pylint: disable=g-import-not-at-top
  page = ('docs/experiments/{}.md' if where == 'readme' else '{}.md').format
  configs = 'experiments/configs/' if where == 'readme' else '../../experiments/configs/'
  rows = []
  for title, config, data, command, page_name, headline in _EXPERIMENTS:
    if command in spec.names():
      result = _result(command)
      ours, paper, *measured = headline()   # a third item: the run time as it ran
      time = measured[0] if measured else result['spec']['expected'].split(' (')[0]
      command = f'`python -m experiments.campaign run {command}`'
    else:   # no committed run, or the figures (their JSONs record each one's seconds)
      time = headline() if callable(headline) else headline
      ours, paper = DASH, DASH
      command = f'`{command}`'
    if config.endswith('.py') or '.py:' in config or config.endswith(')'):
      name = config.split(' ')[0]
      config = f"[`{name}`]({configs}{name.split(':')[0]}){config[len(name):]}"
    if where == 'readme':
      rows.append([title, config, _SOURCES[data], command, time, ours, paper,
                   f'[page]({page(page_name)})'])
    else:   # the title links to the page
      rows.append([f'[{title}]({page(page_name)})', config, _SOURCES[data], command, time,
                   ours, paper])
  header = ['experiment', 'config', 'data', 'command', 'run time', 'ours', 'paper']
  return markdown(header + ['docs'] if where == 'readme' else header, rows)


# ---------------------------------------------------------------------- speed
def _benchmark_module(name: str):
  if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
  import importlib  # pylint: disable=g-import-not-at-top
  return importlib.import_module(name)


def _kept(rows: list[dict], omit: str) -> list[dict]:
  """`rows` without those whose impl is in the comma-separated `omit`."""
  left_out = set(filter(None, omit.split(',')))
  return [row for row in rows if row['impl'] not in left_out]


def rnn_speed(path: str = 'benchmarks/results/rnn_speed_cpu.json', omit: str = '') -> str:
  """`benchmarks/rnn_speed.py --report`'s main table (without the impls in `omit`)."""
  return _benchmark_module('rnn_speed').format_table(_kept(_load(path)['results'], omit))


def cell_speed(path: str = 'benchmarks/results/rnn_speed_cells_cpu.json') -> str:
  """The BN-LSTM cell under `RNN` (`bn_lstm_cell`) beside the layer (`bn_lstm`) of the
  same `rnn_speed.py` run: process CPU time and peak memory, and their ratios."""
  rows = {(r['shape'], r['impl']): r for r in _load(path)['results']
          if r.get('dtype', 'float32') == 'float32'}
  out = []
  for shape in sorted({shape for shape, _ in rows}):
    layer, cell = rows.get((shape, 'bn_lstm')), rows.get((shape, 'bn_lstm_cell'))
    if layer is None or cell is None:
      continue
    mib = lambda row: row['peak_bytes'] / 2**20
    out.append([_benchmark_module('rnn_speed').shape_label(shape),
                f"{layer['cpu_ms']:.0f}", f"{cell['cpu_ms']:.0f}",
                f"{cell['cpu_ms'] / layer['cpu_ms']:.2f}", f'{mib(layer):.1f}',
                f'{mib(cell):.1f}', f"{cell['peak_bytes'] / layer['peak_bytes']:.2f}"])
  return markdown(['shape', 'layer CPU ms', 'cell CPU ms', 'cell / layer', 'layer peak MiB',
                   'cell peak MiB', 'cell / layer'], out)


def suite_time(path: str = 'benchmarks/results/suite_time.json') -> str:
  """`benchmarks/suite_time.py`'s line per test tier, and the machine."""
  saved = _load(path)
  return (_benchmark_module('suite_time').format_table(saved) + '\n\n' +
          f"Machine: {machine_facts.describe(saved['machine'])}.")


def batch_sums(path: str = 'benchmarks/results/rnn_speed_cpu.json') -> str:
  """`benchmarks/rnn_speed.py --report`'s table of the two ways to sum over the batch."""
  saved = _load(path)
  clock = 'cpu' if saved['machine'].get('backend', 'cpu') == 'cpu' else 'wall'
  return _benchmark_module('batch_sum_speed').format_table(saved['batch_sums'], clock)


def machine(path: str) -> str:
  """One line saying where a JSON's numbers were measured, and for a campaign its
  expected run time (`path` from the repository root, or a campaign name)."""
  saved = _load(path) if path.endswith('.json') else _result(path)
  expected = f" Run time: {saved['spec']['expected']}." if 'expected' in saved.get(
      'spec', {}) else ''
  m = saved['machine']
  if m.get('recorded') is False:
    return f"Machine, as the JSON describes it: {m['description']}.{expected}"
  if saved.get('machines'):   # a campaign whose runs moved between machines
    return ('Machines, in the order the runs used them: ' +
            ' Then '.join(machine_facts.describe(m) + '.' for m in saved['machines']) + expected)
  return 'Machine: ' + machine_facts.describe(m) + '.' + expected


def run_time(name: str) -> str:
  """A campaign's expected run time in one line, without the machine's details (`machine`
  has them)."""
  return f"Run time: {_result(name)['spec']['expected']}."


# Targets of the layer's speed on CPU: (what, shape, impl, column, bound, above).
_TARGETS = [
    ('BN-LSTM time / Flax LSTM', 'a', 'bn_lstm', 'cpu_ms', 1.0),
    ('BN-LSTM time / Flax LSTM', 'c', 'bn_lstm', 'cpu_ms', 1.0),
    ('BN-LSTM time / Flax LSTM', 'd', 'bn_lstm', 'cpu_ms', 1.0),
    ('our LSTM time / Flax LSTM', 'c', 'lstm', 'cpu_ms', 0.85),
    ('BN-LSTM peak memory / our LSTM', 'a', 'bn_lstm', 'peak_bytes', 1.5),
    ('BN-LSTM peak memory / our LSTM', 'b', 'bn_lstm', 'peak_bytes', 1.5),
    ('BN-LSTM peak memory / our LSTM', 'c', 'bn_lstm', 'peak_bytes', 1.5),
    ('BN-LSTM peak memory / our LSTM', 'd', 'bn_lstm', 'peak_bytes', 1.5),
]


def speed_targets(path: str = 'benchmarks/results/rnn_speed_cpu.json') -> str:
  """The layer's speed and memory targets, and where the committed run stands (process
  CPU time, the layer's defaults)."""
  rows = {(r['shape'], r['impl'], r.get('dtype', 'float32')): r for r in _load(path)['results']}
  out = []
  for what, shape, impl, column, bound in _TARGETS:
    base = 'flax_optimized_lstm' if 'Flax' in what else 'lstm'
    ratio = rows[shape, impl, 'float32'][column] / rows[shape, base, 'float32'][column]
    label = _benchmark_module('rnn_speed').shape_label(shape)
    out.append([what, label, f'≤ {bound:.2f}', f'{ratio:.2f}',
                'met' if ratio <= bound else 'not met'])
  return markdown(['target', 'shape', 'bound', 'measured', ''], out)


def launch_profile(path: str = 'benchmarks/results/launch_profile_gpu_a.json',
                   omit: str = '') -> str:
  """`benchmarks/launch_profile.py --report`: kernels per time step, and their share
  (without the impls in `omit`)."""
  saved = _load(path)
  return _benchmark_module('launch_profile').format_table(
      {**saved, 'rows': _kept(saved['rows'], omit)})


def gpu_compile(path: str = 'benchmarks/results/gpu_compile_h100.json') -> str:
  """`benchmarks/gpu_compile.py --report`: the layer's forms compiled for an H100 without a
  GPU, what each time step launches, and each Pallas kernel's registers and spills."""
  saved = _load(path)
  target = saved['target']
  return (f"Target: {target['device']} (compile-only, compute capability "
          f"{target['compute_capability']}), jax-cuda13-plugin {target['jax_cuda_plugin']}, "
          f"ptxas {target['ptxas'].split(', ')[-1]}.\n\n"
          + _benchmark_module('gpu_compile').format_table(saved)
          + ''.join(f'\n\nNot compiled: {line}' for line in saved['skipped']))


def tpu_compile(path: str = 'benchmarks/results/tpu_compile.json') -> str:
  """`benchmarks/tpu_compile.py --report`: the layer's forms, Flax's LSTM and the train step
  compiled for TPUs without one: per time step, ops, fusions, matmuls and stashes."""
  saved = _load(path)
  return (f"Compiler: libtpu {saved['libtpu']}.\n\n"
          + _benchmark_module('tpu_compile').format_table(saved))


def trainer_overhead(path: str = 'benchmarks/results/trainer_overhead_cpu.json') -> str:
  """`benchmarks/trainer_overhead.py`: the loop against the bare compiled step, and the
  quickstart's runs end to end."""
  saved = _load(path)
  rows = [[r['shape'], f"{r['bare_steps_per_s']:.2f}", f"{r['loop_steps_per_s']:.2f}",
           f"{r['loop_over_bare']:.2f}", f"{r['sync_over_bare']:.2f}",
           f"{100 * r['host_work_over_step']:.2f} %"] for r in saved['shapes']]
  text = markdown(['shape (1 device)', 'bare steps/s', 'loop steps/s', 'loop / bare',
                   'waiting loop / bare', 'host work / step'], rows)
  p = saved.get('quickstart_population')
  if p:
    per_repeat = ', '.join(f'{r:.2f}' for r in p['bn_lstm_over_lstm_per_repeat'])
    text += '\n\n' + markdown(
        ['quickstart, 300 steps (medians of {} pairs)'.format(p['repeats']), 'lstm',
         'bn_lstm', 'bn_lstm / lstm'],
        [['wall time, s', f"{p['lstm']['wall_s']:.1f}", f"{p['bn_lstm']['wall_s']:.1f}",
          f"{p['bn_lstm_over_lstm']:.2f} (pairs: {per_repeat})"],
         ['of which XLA compilation, s', f"{p['lstm']['compile_s']:.1f}",
          f"{p['bn_lstm']['compile_s']:.1f}",
          f"{p['bn_lstm_over_lstm_without_compile']:.2f} without it"],
         ['of which the population estimate, s', f"{p['lstm']['population_s']:.1f}",
          f"{p['bn_lstm']['population_s']:.1f}",
          f"{100 * p['bn_lstm_population_share']:.0f} % of bn_lstm's time"]])
  return text


def evaluation_statistics(path: str = 'benchmarks/results/evaluation_statistics.json') -> str:
  """`benchmarks/evaluation_statistics.py --report`: each way of making the statistics
  after training against batch statistics, on three small tasks, with the machine."""
  return (machine(path) + '\n\n' +
          _benchmark_module('evaluation_statistics').format_table(_load(path)))


def donation_memory(path: str = 'benchmarks/results/donation_memory_cpu.json') -> str:
  """`benchmarks/donation_memory.py`: the compiled train step's memory with its state
  donated and not, and where the device keeps statistics, the measured peaks (MB)."""
  saved = _load(path)
  c = saved['config']
  mb = lambda value: f'{value / 1e6:.1f}'
  measured = lambda r, kind: mb(r['measured'][kind]['peak']) if r.get('measured') else '-'
  rows = [[f"{arm} (B{c['batch']} T{c['length']} H{c['hidden']} {c['variant']})",
           mb(r['compiled']['argument']), mb(r['compiled']['output']),
           mb(r['compiled']['alias']), mb(r['compiled']['temp']),
           mb(r['compiled']['implied_peak']), 'yes' if r['input_deleted'] else 'no',
           measured(r, 'steps'), measured(r, 'loop')]
          for arm, r in saved['arms'].items()]
  return markdown(['donation', 'arguments, MB', 'outputs, MB', 'aliased, MB', 'temp, MB',
                   'peak, MB', 'input deleted', 'measured peak, steps', 'measured peak, loop'],
                  rows)


# ---------------------------------------------------------------------- figures
def figures() -> str:
  """`python experiments/report.py figures`: the numbers behind each figure."""
  return rendering.figures()


def inference_statistics() -> str:
  """The default inference path (the trainer's estimate) against batch statistics, on the
  committed classification runs that evaluated with both: the batch-normalised arms of
  the quickstart, init_options and brown_tagger campaigns at their last validation
  (the tagger's accuracy is per frame),
  `estimate_spread`'s draws on the Fig. 2 BN-LSTMs, with and without the h0 noise, and
  `estimate_trained`'s draws of four sizes on the in-order BN-LSTM at 10k steps. A
  binomial standard error is that of the batch-statistics accuracy on what was scored."""
  rows = []

  def row(task, run, count, batch, estimates):
    error = math.sqrt(batch * (1.0 - batch) / count)
    worst = max(estimates, key=lambda e: abs(e - batch))
    shown = ', '.join(f'{e:.4f}' for e in estimates)
    rows.append([task, run, f'{count:,}', f'{batch:.4f}', shown, f'{worst - batch:+.4f}',
                 f'{error:.4f}', 'yes' if abs(worst - batch) <= error else 'no'])

  for campaign, task in (('quickstart', '8×8 digits (quickstart)'),
                         ('init_options', '14×14 MNIST'),
                         ('brown_tagger', 'Brown tagging (frames)')):
    for run in _result(campaign)['runs'].values():
      last = [r for r in run['records'] if r['split'] == 'valid'][-1]
      if run['arm'].startswith('bn_') and 'accuracy_batch' in last:
        row(task, f"{run['arm']} seed {run['seed']}, step {last['step']}", last['count'],
            last['accuracy_batch'], [last['accuracy']])
  for panel, task in (('seq', '784-step MNIST'), ('pmnist', '784-step permuted MNIST')):
    spread = _load('experiments', 'results', 'figures',
                   f'estimate_spread_{panel}_bn_lstm_s0.json')
    where = f"{spread['run']}, step {spread['step']:,}"
    row(task, where, spread['valid_examples'], spread['batch'], spread['draws'])
    row(f'{task}, without h0 noise', where, spread['valid_examples'], spread['batch'],
        spread['noise-free draws'])
  trained = _load('experiments', 'results', 'figures', 'estimate_trained_seq_bn_lstm_s0.json')
  row('784-step MNIST, estimates of four sizes', f"{trained['run']}, step {trained['step']:,}",
      trained['valid_examples'], trained['batch_statistics'],
      [e for draws in trained['estimates'].values() for e in draws])
  return markdown(['task', 'run', 'scored', 'batch statistics', 'estimate (each draw)',
                   'largest difference', 'standard error', 'within one'], rows)


def same_steps(first: str, second: str, metrics: str = 'bpc', split: str = 'valid') -> str:
  """Two results JSONs of one campaign (paths from the repository root; e.g. its runs on
  two machines) at the steps where both have a `split` record: per run and metric (of the
  comma-separated `metrics`; one that repeats another metric's values, as a model without
  statistics does, is left out), how many steps, the largest difference (second minus
  first) and its step, and the mean difference."""
  results = [_load(first), _load(second)]
  rows = []
  for name, run in results[0]['runs'].items():
    if name not in results[1]['runs']:
      continue
    values = [{r['step']: r for r in found['records'] if r['split'] == split}
              for found in (run, results[1]['runs'][name])]
    steps = sorted(set(values[0]) & set(values[1]))
    shown = []
    for metric in metrics.split(','):
      pairs = [(values[0][t].get(metric), values[1][t].get(metric)) for t in steps]
      if None in (v for pair in pairs for v in pair) or pairs in shown:
        continue
      shown.append(pairs)
      differences = [(b - a, t) for (a, b), t in zip(pairs, steps)]
      largest = max(differences, key=lambda d: abs(d[0]))
      rows.append([name, metric, len(steps), f'{steps[0]:,}–{steps[-1]:,}',
                   f'{largest[0]:+.4f} (step {largest[1]:,})',
                   f'{sum(d for d, _ in differences) / len(differences):+.4f}'])
  return markdown(['run', 'metric', 'steps compared', 'from–to', 'largest difference',
                   'mean difference'], rows)


#: The views across results a block may quote (any other name is a result's).
VIEWS: dict[str, Callable[..., str]] = {
    'experiments': experiments, 'rnn_speed': rnn_speed, 'batch_sums': batch_sums,
    'speed_targets': speed_targets, 'trainer_overhead': trainer_overhead,
    'donation_memory': donation_memory, 'machine': machine, 'run_time': run_time,
    'figures': figures, 'launch_profile': launch_profile, 'suite_time': suite_time,
    'cell_speed': cell_speed, 'inference_statistics': inference_statistics,
    'same_steps': same_steps, 'gpu_compile': gpu_compile, 'tpu_compile': tpu_compile,
    'evaluation_statistics': evaluation_statistics,
}


# ---------------------------------------------------------------------- blocks
def documents() -> list[str]:
  """The README and every Markdown page of docs/ (absolute paths)."""
  return [os.path.join(ROOT, 'README.md')] + sorted(
      glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))


def render(name: str, *args: str) -> str:
  """A block's text: the view `name`, or the result `name` as its kind renders it."""
  if name in VIEWS:
    return VIEWS[name](*args)
  return rendering.render_file(name if name.endswith('.json') else
                               os.path.join(RESULTS, f'{name}.json'), *args)


def json_blocks(text: str) -> list[tuple[str, tuple[str, ...], str]]:
  """`(name, args, quoted text)` of every json-table block of a document (without the
  code fence of a fenced one)."""
  return [(name, tuple(args.split()), _unfenced(block.strip('\n')))
          for _, name, args, block, _ in JSON_BLOCK.findall(text)]


def _unfenced(text: str) -> str:
  return text.split('\n', 1)[1].rsplit('```', 1)[0].rstrip('\n') if text.startswith(
      '```') else text


def refresh(text: str) -> str:
  """`text` with every marked block rendered again from its JSON."""
  def block(m):
    rendered = render(m[2], *m[3].split())
    if m[4].strip('\n').startswith('```'):
      rendered = f'```\n{rendered}\n```'
    return f'{m[1]}\n{rendered}\n\n{m[5]}'
  return JSON_BLOCK.sub(block, text)


def main(argv: list[str]) -> int:
  if argv and not argv[0].startswith('--'):
    print(render(argv[0], *argv[1:]))
    return 0
  stale = []
  for path in documents():
    with open(path) as f:
      text = f.read()
    new = refresh(text)
    if new != text:
      stale.append(os.path.relpath(path, ROOT))
      if '--write' in argv:
        with open(path, 'w') as f:
          f.write(new)
  verb = 'rewrote' if '--write' in argv else 'stale (python docs/tables.py --write)'
  for path in stale:
    print(f'{verb}: {path}')
  return 1 if stale and '--write' not in argv else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
