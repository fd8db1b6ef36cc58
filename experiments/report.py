r"""The README's tables and figure numbers, printed from the JSONs under experiments/results/.

  python experiments/report.py                         # every table, then the figures
  python experiments/report.py init_options figures    # some of them

A campaign's tables are `python -m experiments.campaign report <name>` (the campaign's
spec renders them from its results JSON; `python -m experiments.campaign list` names every
campaign with its command). `figures` prints the numbers the README's Figures section
quotes, from the JSONs of `experiments/analysis/` in `experiments/results/figures/`.
"""

import json
import os
import subprocess
import sys

from absl import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, 'experiments', 'results', 'figures')


def _figure(name: str) -> dict:
  with open(os.path.join(FIGURES, f'{name}.json')) as f:
    return json.load(f)


def figures() -> str:
  """The numbers the README's Figures section quotes, per figure JSON."""
  out = []
  g = _figure('gradient_flow')
  out.append('gradient_flow: |dL/dh_0| / |dL/dh_T| ' + '; '.join(
      f'W_h {init}: ' + ', '.join(f'gamma {k} {v:.2g}' for k, v in ratios.items())
      for init, ratios in g['ratio_first_to_last'].items()))
  t = _figure('tanh_derivative')
  diff = max(abs(a - b) for a, b in zip(t['mc_mean'], t['quadrature']))
  out.append(f"tanh_derivative: E tanh'(x) at s={t['stds'][-1]:g}: "
             f"{t['quadrature'][-1]:.4f}; max |Monte Carlo - quadrature| {diff:.4f}")
  p = _figure('population_stats')
  out.append(f"population_stats: valid bpc {p['valid_bits_per_char']:.3f} after "
             f"{p['steps']} steps; RMS mean shift < 0.1 from step " + ', '.join(
                 f"{s} {next((i for i, v in enumerate(c['mean_shift']) if v < 0.1), None)}"
                 for s, c in p['convergence'].items()))
  if 'shared_row' in p:
    out.append('population_stats: bn_lstm_shared row, pooled / averaged variance over units '
               + '; '.join(f"{s}: median {r['ratio_median']:.3f}, max {r['ratio_max']:.2f}, "
                           f"{100 * r['fraction_over_1.1']:.0f}% of units > 1.1"
                           for s, r in p['shared_row'].items()))
  s = _figure('gamma_sensitivity')
  for task, res in s['tasks'].items():
    finals = {k: h['eval'][-1]['metric'] for k, h in res['curves'].items()}
    firsts = {k: h['eval'][0]['metric'] for k, h in res['curves'].items()}
    out.append(f"gamma_sensitivity {task} ({res['steps']} steps): final valid " +
               ', '.join(f'gamma {k} {v:.3f}' for k, v in finals.items()) +
               '; first eval ' + ', '.join(f'{k} {v:.3f}' for k, v in firsts.items()))
  la = _figure('laurent_appendix')
  out.append(f"laurent_appendix ({la['steps']} steps): final valid bpc " +
             ', '.join(f'{k} {v:.3f}' for k, v in la['final_valid_bpc'].items()))
  for name in ('estimate_batch_size', 'estimate_batch_size_pmnist'):
    e = _figure(name)
    out.append(f"{name} ({e['steps']} steps): batch statistics "
               f"{e['batch_statistics']:.3f}; estimates " + '; '.join(
                   f"{k}: {', '.join(f'{v:.3f}' for v in vs)}"
                   for k, vs in e['estimates'].items()) +
               '; one site from 10 x batch: ' + ', '.join(
                   f'{k} {v:.3f}' for k, v in e['site_from_small'].items()))
  out.append('seconds: ' + ', '.join(
      f"{n} {_figure(n)['seconds']:.0f}" for n in (
          'gradient_flow', 'population_stats', 'gamma_sensitivity', 'laurent_appendix',
          'estimate_batch_size', 'estimate_batch_size_pmnist')))
  return '\n'.join('* ' + line for line in out)


def main(argv):
  names = argv[1:]
  campaigns = [n for n in names if n != 'figures']
  if campaigns or not names:
    # The campaigns' own renderer (`-m` from the repository root, as the tests import it).
    code = subprocess.call([sys.executable, '-m', 'experiments.campaign', 'report',
                            *campaigns, '--figure=none'], cwd=ROOT)
    if code:
      sys.exit(code)
  if 'figures' in names or not names:
    print(f'## figures\n\n{figures()}\n')


if __name__ == '__main__':
  app.run(main)
