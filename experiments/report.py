r"""Every result set the docs quote, printed from the committed JSONs (no runs needed).

  python experiments/report.py                          # all of them
  python experiments/report.py brown_tagger figures     # some of them
  python experiments/report.py --list                   # their names

The names:
  <campaign>        its tables, rendered by its spec (`python -m experiments.campaign list`
                    names every campaign with its command); a campaign's speed table is
                    also reachable by the name of its JSON (e.g. brown_tagger_speed)
  figures           the numbers of the figures, from the JSONs of `experiments/analysis/`
                    in `experiments/results/figures/`
  <benchmark>       each JSON under benchmarks/results/, by its file name without
                    `.json` and a trailing `_cpu` (rnn_speed, rnn_speed_cells,
                    rnn_speed_gpu_a, trainer_overhead, launch_profile_gpu_a, ...),
                    printed by its script's --report
  variable_length, variable_length_cause, variable_length_gamma,
  variable_length_shared, variable_length_input, variable_length_rate,
  variable_length_rate_long, longer_sequences
                    batch statistics on variable-length data, what the BN-LSTM's gap past
                    the training length depends on (the γ init's part in it, statistics
                    not kept per step, which site's batch norm, the learning rate), and
                    population statistics past the training length
                    (experiments/analysis/<name>.py; variable_length_gamma, _shared,
                    _input, _rate and _rate_long by variable_length_cause --vc_arms;
                    their JSONs in results/)
An unknown name is a one-line error listing the known ones.
"""

import glob
import importlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # run as a script: the campaign modules import from the root
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax import extras

with extras.needed_by('experiments/report.py', exit=True):
  from absl import app
  from absl import flags

  from experiments.campaign import show
  from experiments.campaign import spec
# pylint: enable=g-import-not-at-top,wrong-import-position

FIGURES = os.path.join(ROOT, 'experiments', 'results', 'figures')
# The benchmark scripts that print a table from their JSON (`--report PATH`).
BENCHMARK_SCRIPTS = ('rnn_speed', 'trainer_overhead', 'launch_profile', 'donation_memory',
                     'suite_time', 'gpu_compile', 'tpu_compile')


def benchmarks() -> dict[str, list[str]]:
  """Each JSON under benchmarks/results/, named as its file without `.json` (and without
  a trailing `_cpu`): the command that prints its table (the script its name starts
  with, `--report`)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(ROOT, 'benchmarks', 'results', '*.json'))):
    stem = os.path.basename(path)[:-len('.json')]
    script = next((s for s in BENCHMARK_SCRIPTS if stem.startswith(s)), None)
    if script is None:
      raise ValueError(f'{path}: no benchmark script of {BENCHMARK_SCRIPTS} names it.')
    name = stem[:-len('_cpu')] if stem.endswith('_cpu') else stem
    out[name] = [f'benchmarks/{script}.py', '--report', os.path.relpath(path, ROOT)]
  return out


_LIST = flags.DEFINE_bool('list', False, 'Print the names of the result sets and exit.')


def _figure(name: str) -> dict:
  with open(os.path.join(FIGURES, f'{name}.json')) as f:
    return json.load(f)


def _of_runs(script: str) -> list[str]:
  """The figure JSONs a script made of trained runs (`<script>_<run folder>`)."""
  return sorted(os.path.basename(p)[:-len('.json')]
                for p in glob.glob(os.path.join(FIGURES, f'{script}_*.json')))


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
  n = _figure('estimate_noise')
  out.append(f"estimate_noise ({n['steps']} steps, {n['estimate']}, {n['valid_examples']} "
             f"images): batch statistics {n['batch_statistics']:.4f}; " + '; '.join(
                 f"{k} {', '.join(f'{v:.4f}' for v in vs)} (mean {n['summary'][k]['mean']:.4f} "
                 f"± {n['summary'][k]['sd']:.4f})" for k, vs in n['accuracy'].items()) +
             f"; paired difference (without - with) {n['paired_difference']['mean']:+.4f}; "
             'largest relative variance change ' + ', '.join(
                 f'{site.split("/")[-1]} {v:.3g}'
                 for site, v in n['largest_relative_variance_change'].items()))
  trained = _of_runs('estimate_trained')
  for name in trained:
    e = _figure(name)
    out.append(f"{name} ({e['run']}, step {e['step']:,}, {e['valid_examples']} images): "
               f"batch statistics {e['batch_statistics']:.4f}; running average "
               f"{e['running_average']:.4f}; estimates " + '; '.join(
                   f"{k}: {', '.join(f'{v:.4f}' for v in vs)}"
                   for k, vs in e['estimates'].items()))
  gaps = _of_runs('running_average_gap')
  for name in gaps:
    g = _figure(name)
    out.append(f"{name} ({g['run']}, step {g['step']:,}, {g['valid_examples']} images, "
               f"estimate {g['estimate_batches']}): " + ', '.join(
                   f'{k} {g[k]:.4f}' for k in ('batch', 'running', 'estimate',
                                               'noise-free', 'pooled')) +
               '; the estimate with the running average\'s ' + ', '.join(
                   f"{k.replace('site ', '').split('/')[-1]} {v:.4f}"
                   for k, v in g['hybrids'].items()))
  spreads = _of_runs('estimate_spread')
  for name in spreads:
    e = _figure(name)
    draws = lambda values: ', '.join(f'{v:.4f}' for v in values)
    out.append(f"{name} ({e['run']}, step {e['step']:,}, {e['valid_examples']} images, "
               f"{e['estimate_batches']}): batch {e['batch']:.4f}; draws "
               f"{draws(e['draws'])}; noise-free draws {draws(e['noise-free draws'])}; "
               f"all draws {e['all draws']:.4f}; pooled "
               f"{draws(e['pooled'])}; all draws with each draw's " + ', '.join(
                   f"{k.replace('site ', '').split('/')[-1]} "
                   f"{draws(h[k] for h in e['hybrids'])}" for k in e['hybrids'][0]))
  lags = _of_runs('running_average_lag')
  for name in lags:
    g = _figure(name)
    scores = lambda r: '/'.join(f'{r[k]:.4f}' for k in ('batch', 'running', 'estimate'))
    out.append(f"{name} ({g['run']}, training on from step {g['step']:,}, "
               f"{g['valid_examples']} images; batch/running/estimate): restored "
               f"{scores(g['restored'])}; " + '; '.join(
                   f"{arm}: " + ', '.join(f"step {r['step']:,} {scores(r)}" for r in records)
                   for arm, records in g['arms'].items()))
  out.append('seconds: ' + ', '.join(
      f"{n} {_figure(n)['seconds']:.0f}" for n in (
          'gradient_flow', 'population_stats', 'gamma_sensitivity', 'laurent_appendix',
          'estimate_batch_size', 'estimate_batch_size_pmnist', 'estimate_noise',
          *trained, *gaps, *spreads, *lags)))
  return '\n'.join('* ' + line for line in out)


def _speed_campaigns() -> dict:
  """`{speed JSON name: the campaign that measures it}`."""
  out = {}
  for name in spec.names():
    campaign = spec.get(name)
    if campaign.speed is not None:
      out[campaign.speed.name] = campaign
  return out


#: `{JSON name in experiments/results/: the analysis module that renders it}` (each module
#: has `table(result)`; `variable_length_cause --vc_arms` writes variable_length_gamma,
#: variable_length_shared, variable_length_input, variable_length_rate and
#: variable_length_rate_long).
ANALYSES = {'variable_length': 'variable_length',
            'variable_length_cause': 'variable_length_cause',
            'variable_length_gamma': 'variable_length_cause',
            'variable_length_shared': 'variable_length_cause',
            'variable_length_input': 'variable_length_cause',
            'variable_length_rate': 'variable_length_cause',
            'variable_length_rate_long': 'variable_length_cause',
            'longer_sequences': 'longer_sequences'}


def names() -> list[str]:
  """Every result set this script prints, in the order it prints them (a campaign still
  training has none yet)."""
  from experiments import campaign_specs  # pylint: disable=g-import-not-at-top
  done = [n for n in spec.names() if n not in campaign_specs.IN_PROGRESS]
  return done + ['figures', *ANALYSES] + list(benchmarks()) + sorted(
      _speed_campaigns())


def render(name: str) -> str:
  """One result set's text."""
  if name in spec.names():
    campaign = spec.get(name)
    return '\n'.join(f'## {name}: {table}\n\n{show.render(campaign, table)}\n'
                     for table in show.available(campaign))
  if name == 'figures':
    return f'## figures\n\n{figures()}\n'
  if name in ANALYSES:
    analysis = importlib.import_module(f'experiments.analysis.{ANALYSES[name]}')
    with open(os.path.join(ROOT, 'experiments', 'results', f'{name}.json')) as f:
      return f'## {name}\n\n{analysis.table(json.load(f))}\n'
  commands = benchmarks()
  if name in commands:
    done = subprocess.run([sys.executable, *commands[name]], cwd=ROOT, capture_output=True,
                          text=True, check=False,
                          env={**os.environ, 'PYTHONPATH': os.pathsep.join(
                              [ROOT, os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)})
    if done.returncode:
      raise RuntimeError(f'{" ".join(commands[name])} failed: {done.stderr.strip()[-500:]}')
    return f'## {name}\n\n{done.stdout.strip()}\n'
  campaign = _speed_campaigns()[name]
  return '\n'.join(f'## {campaign.name}: {table}\n\n{show.render(campaign, table)}\n'
                   for table in campaign.speed.tables)


def main(argv):
  known = names()
  if _LIST.value:
    print('\n'.join(known))
    return
  wanted = argv[1:]
  unknown = [n for n in wanted if n not in known]
  if unknown:
    sys.exit(f'error: unknown result set {unknown[0]!r}; known: {", ".join(known)}.')
  # Without names: every set once (the speed tables are in their campaigns' sets).
  for name in wanted or [n for n in known if n not in _speed_campaigns()]:
    print(render(name))


if __name__ == '__main__':
  app.run(main)
