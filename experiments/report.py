r"""The README's tables and figure numbers, printed from the JSONs under experiments/results/.

Every number in the README comes from a JSON that a committed command wrote (the command
is in the README next to the table, and in most JSONs under 'command'); this script is the
one way those JSONs become tables:

  python experiments/report.py                       # every table and figure summary
  python experiments/report.py init_options seq_mnist14 figures

It also turns finished `experiments/main.py` runs into such a JSON (their metrics.jsonl,
no paths of this machine):

  python experiments/report.py --collect --collect_workdirs=/tmp/runs/ptb_char_256/lstm,... \
      --collect_setup='...' --collect_command='...' \
      --collect_output=experiments/results/ptb_char_256_valid_bpc.json
"""

from __future__ import annotations

import json
import os
from typing import Callable

from absl import app
from absl import flags

from bn_rnn_jax import metric_writer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'experiments', 'results')

# Prefixed names: quickstart.py and init_options.py import this module for command_line.
_COLLECT = flags.DEFINE_bool('collect', False,
                            'Write --collect_output from --collect_workdirs instead.')
_WORKDIRS = flags.DEFINE_list('collect_workdirs', [], 'experiments/main.py runs.')
_SETUP = flags.DEFINE_string('collect_setup', '', 'What the runs are.')
_COMMAND = flags.DEFINE_string('collect_command', '', 'The command that trained them.')
_OUTPUT = flags.DEFINE_string('collect_output', None, 'The JSON written.')


def command_line(script: str, argv: list[str], drop: tuple[str, ...] = ('--workdir',)) -> str:
  """`python <script> <argv>` without the flags in `drop` (and their values), which name
  paths of this machine."""
  kept, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    name = arg.split('=', 1)[0]
    if name in drop:
      skip = '=' not in arg
      continue
    kept.append(arg)
  return ' '.join(['python', script] + kept)


def _load(path: str) -> dict:
  with open(os.path.join(ROOT, path)) as f:
    return json.load(f)


def _table(header: list[str], rows: list[list]) -> str:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(lines)


def _at(records: list[dict], step: int, key: str):
  for r in records:
    if r['step'] == step:
      return r[key]
  return None


def _fmt(value, digits: int = 3) -> str:
  return '–' if value is None else f'{value:.{digits}f}'


# ---------------------------------------------------------------------- collect
def collect(workdirs: list[str], setup: str, command: str) -> dict:
  """`{'setup', 'command', 'runs': {variant: {'valid': [...], 'test': {...}, ...}}}` from
  the runs' config.json and metrics.jsonl (validation and test records whole)."""
  runs = {}
  for workdir in workdirs:
    with open(os.path.join(workdir, 'config.json')) as f:
      variant = json.load(f)['model']['variant']
    records = metric_writer.read_metrics(workdir)
    strip = lambda r: {k: v for k, v in r.items() if k != 'split'}
    train = [r for r in records if r['split'] == 'train']
    runs[variant] = {
        'valid': [strip(r) for r in records if r['split'] == 'valid'],
        'test': [strip(r) for r in records if r['split'] == 'test'],
        'last_train_window': strip(train[-1]) if train else None,
        'wall_time_s': max((r.get('time_s', 0.0) for r in records), default=None),
    }
  return {'setup': setup, 'command': command, 'runs': runs}


# ---------------------------------------------------------------------- tables
def quickstart_table(rows: dict) -> str:
  """The quickstart's printed table, from its `rows` (`quickstart.summarize` per variant)."""
  header = (f"{'variant':<10} {'steps':>6} {'acc@1/4':>12} {'acc@1/2':>12} "
            f"{'acc@end':>8} {'best':>6} {'train time':>11}")
  lines = [header, '-' * len(header)]
  for variant, s in rows.items():
    q, h = s['quarter'], s['half']
    lines.append(
        f"{variant:<10} {s['steps']:>6} {q['accuracy']:>6.3f} @{q['step']:<4} "
        f"{h['accuracy']:>6.3f} @{h['step']:<4} {s['end']['accuracy']:>8.3f} "
        f"{s['best']:>6.3f} {s['time_s']:>10.1f}s")
  return '\n'.join(lines)


def quickstart_digits() -> str:
  data = _load('experiments/results/quickstart_digits.json')
  return f"{data['setup']}\n\n```\n{quickstart_table(data['rows'])}\n```"


def seq_mnist14() -> str:
  """14x14 seq-MNIST, LSTM vs BN-LSTM, our initialisation: the 'ours' runs of
  init_options.json at every validation step."""
  data = _load('experiments/results/init_options.json')
  runs = {v: data['runs'][v]['ours'] for v in data['runs'] if 'ours' in data['runs'][v]}
  steps = sorted({r['step'] for run in runs.values() for r in run['valid']})
  rows = [[v] + [_fmt(_at(run['valid'], s, 'accuracy')) for s in steps]
          for v, run in runs.items()]
  return _table(['14×14 seq-MNIST, valid accuracy'] + [f'step {s}' for s in steps], rows)


def init_options() -> str:
  data = _load('experiments/results/init_options.json')
  variants = list(data['runs'])
  rows = []
  for name, option in data['options'].items():
    row = [f"`{name}`: {option['description']}"]
    for v in variants:
      run = data['runs'][v].get(name)
      row.append(_fmt(run['valid'][-1]['accuracy']) if run else '–')
    rows.append(row)
  last = max(r['step'] for v in variants for run in data['runs'][v].values()
             for r in run['valid'])
  return _table(['option'] + [f'{v} @ {last}' for v in variants], rows) + \
      f"\n\n{data['setup']}."


def ptb_char_256() -> str:
  data = _load('experiments/results/ptb_char_256_valid_bpc.json')
  rows = []
  for variant, run in data['runs'].items():
    valid = run['valid']
    last = valid[-1]
    running = last.get('bpc_running')
    rows.append([variant] + [_fmt(_at(valid, s, 'bpc')) for s in (100, 200)] +
                [_fmt(last['bpc']), '–' if variant == 'lstm' else _fmt(running),
                 _fmt(run['test_bpc'] if 'test_bpc' in run else run['test'][-1]['bpc'])])
  return _table(['variant', 'valid bpc @100 steps', '@200', f"@{valid[-1]['step']}",
                 f"@{valid[-1]['step']}, running-average stats", 'test bpc'], rows)


def ptb_char_256_lengths() -> str:
  data = _load('experiments/results/ptb_char_256_lengths.json')
  runs = {r['variant']: r for r in data['runs']}
  bn, lstm = runs['bn_lstm'], runs['lstm']
  rows = []
  for row, base in zip(bn['rows'], lstm['rows']):
    length = ('whole text as one sequence ' f"({row['steps']:,} steps)"
              if row['length'] == 'whole' else row['length'])
    rows.append([length, _fmt(row['estimate']), _fmt(row['running']),
                 _fmt(row.get('batch')) if 'batch' in row else 'n/a', _fmt(base['estimate'])])
  return _table(['valid length', 'BN-LSTM, training-pass estimate', 'BN-LSTM, running '
                 'average', 'BN-LSTM, batch statistics', 'LSTM'], rows)


def ptb_char_1000_speed() -> str:
  data = _load('experiments/results/ptb_char_1000_speed.json')
  rows = [[v, f"{r['steps_per_s']:.3f}", f"{r['relative_to_first']:.2f}",
           f"{r['cpu_relative_to_first']:.2f}"] for v, r in data['variants'].items()]
  return _table(['variant', 'steps/s', '× LSTM (wall)', '× LSTM (CPU)'], rows)


def ptb_word_small() -> str:
  data = _load('experiments/results/ptb_word_small.json')
  rows = [[t['variant'], f"{t['best_valid_ppl']:.1f}, epoch {t['best_valid_epoch']} "
           f"({t['paper_valid_ppl']})", f"{t['train_ppl_at_best_valid']:.1f}",
           f"{t['best_train_ppl']:.1f} ({t['paper_train_ppl']})",
           f"{t['test_ppl_best_checkpoint']:.1f}"] for t in data['table']]
  out = [_table(['variant', 'best valid ppl, epoch (Laurent)', 'train ppl at that epoch',
                 'lowest train ppl (Laurent)', 'test ppl, best checkpoint'], rows)]
  for key in ('valid_perplexity', 'train_perplexity'):
    out.append(f'\n{key} per epoch:')
    out += [f"* {r['variant']} " + ', '.join(f'{p:.0f}' for _, p in r[key])
            for r in data['runs']]
  out.append('wall time (h): ' + ', '.join(f"{t['variant']} {t['wall_time_s'] / 3600:.1f}"
                                             for t in data['table']))
  return '\n'.join(out)


def rnn_speed() -> str:
  data = _load('benchmarks/results/rnn_speed_cpu.json')
  base = {r['shape']: r for r in data['results'] if r['impl'] == 'flax_optimized_lstm'}
  rows = [[r['shape'], r['impl'], f"{r['ms']:.1f}", f"{r['ms'] / base[r['shape']]['ms']:.2f}",
           f"{r['cpu_ms']:.0f}", f"{r['cpu_ms'] / base[r['shape']]['cpu_ms']:.2f}"]
          for r in data['results']]
  return _table(['shape', 'impl', 'median fwd+bwd (ms)', 'ratio to flax_optimized_lstm',
                 'CPU ms', 'CPU ratio'], rows)


def figures() -> str:
  """The numbers the README's Figures section quotes, per figure JSON."""
  fig = lambda name: _load(f'experiments/results/figures/{name}.json')
  out = []
  g = fig('gradient_flow')
  out.append('gradient_flow: |dL/dh_0| / |dL/dh_T| ' + '; '.join(
      f'W_h {init}: ' + ', '.join(f'gamma {k} {v:.2g}' for k, v in ratios.items())
      for init, ratios in g['ratio_first_to_last'].items()))
  t = fig('tanh_derivative')
  diff = max(abs(a - b) for a, b in zip(t['mc_mean'], t['quadrature']))
  out.append(f"tanh_derivative: E tanh'(x) at s={t['stds'][-1]:g}: "
             f"{t['quadrature'][-1]:.4f}; max |Monte Carlo - quadrature| {diff:.4f}")
  p = fig('population_stats')
  out.append(f"population_stats: valid bpc {p['valid_bits_per_char']:.3f} after "
             f"{p['steps']} steps; RMS mean shift < 0.1 from step " + ', '.join(
                 f"{s} {next((i for i, v in enumerate(c['mean_shift']) if v < 0.1), None)}"
                 for s, c in p['convergence'].items()))
  if 'shared_row' in p:
    out.append('population_stats: bn_lstm_shared row, pooled / averaged variance over units '
               + '; '.join(f"{s}: median {r['ratio_median']:.3f}, max {r['ratio_max']:.2f}, "
                           f"{100 * r['fraction_over_1.1']:.0f}% of units > 1.1"
                           for s, r in p['shared_row'].items()))
  s = fig('gamma_sensitivity')
  for task, res in s['tasks'].items():
    finals = {k: h['eval'][-1]['metric'] for k, h in res['curves'].items()}
    firsts = {k: h['eval'][0]['metric'] for k, h in res['curves'].items()}
    out.append(f"gamma_sensitivity {task} ({res['steps']} steps): final valid " +
               ', '.join(f'gamma {k} {v:.3f}' for k, v in finals.items()) +
               '; first eval ' + ', '.join(f'{k} {v:.3f}' for k, v in firsts.items()))
  la = fig('laurent_appendix')
  out.append(f"laurent_appendix ({la['steps']} steps): final valid bpc " +
             ', '.join(f'{k} {v:.3f}' for k, v in la['final_valid_bpc'].items()))
  for name in ('estimate_batch_size', 'estimate_batch_size_pmnist'):
    e = fig(name)
    out.append(f"{name} ({e['steps']} steps): batch statistics "
               f"{e['batch_statistics']:.3f}; estimates " + '; '.join(
                   f"{k}: {', '.join(f'{v:.3f}' for v in vs)}"
                   for k, vs in e['estimates'].items()) +
               '; one site from 10 x batch: ' + ', '.join(
                   f'{k} {v:.3f}' for k, v in e['site_from_small'].items()))
  out.append('seconds: ' + ', '.join(
      f"{n} {fig(n)['seconds']:.0f}" for n in (
          'gradient_flow', 'population_stats', 'gamma_sensitivity', 'laurent_appendix',
          'estimate_batch_size', 'estimate_batch_size_pmnist')))
  return '\n'.join('* ' + line for line in out)


REPORTS: dict[str, Callable[[], str]] = {
    'quickstart_digits': quickstart_digits,
    'seq_mnist14': seq_mnist14,
    'init_options': init_options,
    'ptb_char_256': ptb_char_256,
    'ptb_char_256_lengths': ptb_char_256_lengths,
    'ptb_char_1000_speed': ptb_char_1000_speed,
    'ptb_word_small': ptb_word_small,
    'rnn_speed': rnn_speed,
    'figures': figures,
}


def main(argv):
  if _COLLECT.value:
    if not _WORKDIRS.value or not _OUTPUT.value:
      raise app.UsageError('--collect needs --collect_workdirs and --collect_output.')
    with open(_OUTPUT.value, 'w') as f:
      json.dump(collect(_WORKDIRS.value, _SETUP.value, _COMMAND.value), f, indent=1)
      f.write('\n')
    print(f'Wrote {_OUTPUT.value}')
    return
  names = argv[1:] or list(REPORTS)
  unknown = [n for n in names if n not in REPORTS]
  if unknown:
    raise app.UsageError(f'Unknown report(s) {unknown}; have {sorted(REPORTS)}.')
  for name in names:
    print(f'## {name}\n\n{REPORTS[name]()}\n')


if __name__ == '__main__':
  app.run(main)
