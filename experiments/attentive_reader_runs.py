r"""Attentive Reader variants on brown_cloze_large (Cooijmans et al. sec. 5.4, Fig. 4a).

  python experiments/attentive_reader_runs.py           # 6 variants + controls, 2 seeds
  python experiments/attentive_reader_runs.py --report  # JSON + PNG from the runs

The README's runs are these (the cpu preset, 3,000 steps), made with
  python experiments/attentive_reader_runs.py --runs_dir runs/ar_long2 \
      --variants bn_e_star_star lstm_bidirectional bn_e_star bn_everywhere bn_lstm lstm \
      lstm_lr8e-4_b40 -- --config.train.num_steps=3000 --config.eval.every=250 \
      --config.checkpoint.every=250
  python experiments/attentive_reader_runs.py --runs_dir runs/ar_long2 \
      --variants bn_lstm_lr8e-4_b40 -- --config.train.num_steps=3000 \
      --config.eval.every=250 --config.checkpoint.every=250
  python experiments/attentive_reader_runs.py --report --runs_dir runs/ar_long2

  # Earlier budgets, made before the min_step_count guard (add
  # --config.model.min_step_count=1 to repeat them): 200 steps, all variants, 2 seeds
  # (--name attentive_reader, --config.train.num_steps=200 --config.eval.every=100
  # --config.checkpoint.every=100), and 1,200 steps (lstm, bn_lstm, bn_e_star; seed 0):
  python experiments/attentive_reader_runs.py --name attentive_reader_1200 --seeds 0 \
      --variants lstm bn_lstm bn_e_star --runs_dir runs/ar_long -- \
      --config.train.num_steps=1200 --config.eval.every=200 --config.checkpoint.every=200
  python experiments/attentive_reader_runs.py --report --name attentive_reader_1200 \
      --seeds 0 --variants lstm bn_lstm bn_e_star --runs_dir runs/ar_long

Each run is `experiments/main.py --config experiments/configs/attentive_reader.py:<v>,cpu`
in `<runs_dir>/<variant>_s<seed>` (checkpoints stay there, outside the repository), started
with `nice -n 5` and single-threaded XLA, `--parallel` runs at a time. A finished run is
skipped; an interrupted one resumes. Its `metrics.jsonl` is copied to
`experiments/results/<name>/<variant>_s<seed>/metrics.jsonl` (the provenance of the
report; `--name` defaults to attentive_reader). `--report` reads those copies and writes
`experiments/results/<name>.json` and `.png`: training cost and validation error against steps for every variant (the
manner of Fig. 4a), a table of the best validation error and the test error of the
best-validation checkpoint beside the data's frequency baselines (computed here from the
data) and the paper's numbers, the steps/s of every variant, and the first step at which
each run's training accuracy (mean of a window) passes the most-frequent-entity baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bn_rnn_jax.metric_writer import read_metrics  # pylint: disable=wrong-import-position

VARIANTS = ('lstm', 'bn_lstm', 'bn_everywhere', 'bn_e_star', 'bn_e_star_star',
            'lstm_bidirectional')
# Runs beyond the six variants: name -> (variant, extra flags). The controls separate the
# effect of BN-e*'s learning rate and batch (8e-4, 40) from that of batch norm: LSTM and
# BN-LSTM trained with them.
CONTROLS = {'lstm_lr8e-4_b40': ('lstm', ['--config.optimizer.learning_rate=8e-4',
                                         '--config.train.batch_size=40']),
            'bn_lstm_lr8e-4_b40': ('bn_lstm', ['--config.optimizer.learning_rate=8e-4',
                                               '--config.train.batch_size=40'])}
LABELS = {'lstm': 'LSTM', 'bn_lstm': 'BN-LSTM', 'bn_everywhere': 'BN-everywhere',
          'bn_e_star': 'BN-e*', 'bn_e_star_star': 'BN-e**',
          'lstm_bidirectional': 'LSTM bidirectional',
          'lstm_lr8e-4_b40': 'LSTM, lr 8e-4, batch 40 (control)',
          'bn_lstm_lr8e-4_b40': 'BN-LSTM, lr 8e-4, batch 40 (control)'}
# Cooijmans et al. 2016: Fig. 4a validation-error minima (CNN, 4-sentence contexts), and
# Table 4 test errors on the full CNN task.
PAPER_FIG4A_MIN_VALID_ERROR = {'lstm': 0.503, 'bn_lstm': 0.495, 'bn_everywhere': 0.500,
                               'bn_e_star': 0.471, 'bn_e_star_star': 0.439}
PAPER_TABLE4_TEST_ERROR = {'lstm': 0.450, 'bn_e_star_star': 0.363}
RESULTS = os.path.join(ROOT, 'experiments', 'results')
CONFIG = os.path.join(ROOT, 'experiments', 'configs', 'attentive_reader.py')
XLA_ONE_CORE = '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'


def run_name(variant: str, seed: int) -> str:
  return f'{variant}_s{seed}'


def command(name: str, seed: int, workdir: str, cache_dir: str, extra) -> list[str]:
  variant, flags = CONTROLS.get(name, (name, []))
  return ['nice', '-n', '5', sys.executable, os.path.join(ROOT, 'experiments', 'main.py'),
          f'--config={CONFIG}:{variant},cpu', f'--workdir={workdir}', f'--config.seed={seed}',
          f'--config.data.cache_dir={cache_dir}', *flags, *extra]


def finished(workdir: str) -> bool:
  """Whether a run's log ends with its test of the best checkpoint (so a second launch
  does not test it again)."""
  if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    return False
  return any(r['split'] == 'test' for r in read_metrics(workdir))


def launch(args) -> None:
  """Run every (variant, seed), `args.parallel` at a time; copy each metrics.jsonl."""
  logs = os.path.join(RESULTS, args.name)
  os.makedirs(logs, exist_ok=True)
  cache_dir = os.path.join(args.runs_dir, 'data_cache')
  # A persistent XLA cache: the second seed of a variant reuses the first one's programs.
  env = {**os.environ, 'XLA_FLAGS': XLA_ONE_CORE, 'PYTHONPATH': ROOT,
         'JAX_COMPILATION_CACHE_DIR': os.path.join(args.runs_dir, 'jax_cache'),
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
         'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}
  # Parse the data once before the runs start, so that no two runs write the cache.
  subprocess.run([sys.executable, '-c', 'from bn_rnn_jax.input_pipeline import reading, '
                  'resolve_path; from experiments.configs import attentive_reader as c; '
                  'd = c.get_config("lstm,cpu").data; reading.load(resolve_path(d, "path"), '
                  f'd.vocab_size, d.top_k_sentences, {cache_dir!r})'], check=True, env=env,
                 cwd=ROOT)
  # Variant by variant, its seeds side by side: with `--parallel` = seeds, both seeds of a
  # variant share the machine's load alike.
  queue = [(v, s) for v in args.variants for s in args.seeds]
  running = []
  while queue or running:
    while queue and len(running) < args.parallel:
      variant, seed = queue.pop(0)
      workdir = os.path.join(args.runs_dir, run_name(variant, seed))
      if finished(workdir):
        print(f'{run_name(variant, seed)} finished before; skipped', flush=True)
        continue
      os.makedirs(workdir, exist_ok=True)
      log = open(os.path.join(workdir, 'stdout.log'), 'a')
      cmd = command(variant, seed, workdir, cache_dir, args.extra)
      print(' '.join(cmd), flush=True)
      running.append((variant, seed, workdir, subprocess.Popen(
          cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
    time.sleep(5)
    for item in list(running):
      variant, seed, workdir, process = item
      if process.poll() is not None:
        running.remove(item)
        print(f'{run_name(variant, seed)} exited with {process.returncode}', flush=True)
        source = os.path.join(workdir, 'metrics.jsonl')
        if os.path.exists(source):
          os.makedirs(os.path.join(logs, run_name(variant, seed)), exist_ok=True)
          shutil.copy(source, os.path.join(logs, run_name(variant, seed), 'metrics.jsonl'))


# ====================================================================== report
def baselines(cache_dir: str, config_arg: str = 'lstm,cpu') -> dict:
  """The data's frequency baselines per split, computed from the data."""
  from bn_rnn_jax import input_pipeline  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.input_pipeline import reading  # pylint: disable=g-import-not-at-top
  from experiments.configs import attentive_reader  # pylint: disable=g-import-not-at-top
  data = attentive_reader.get_config(config_arg).data
  arrays = reading.load(input_pipeline.resolve_path(data, 'path'), data.vocab_size,
                        data.top_k_sentences, cache_dir)
  return {split: reading.frequency_baselines(arrays, split)
          for split in ('train', 'valid', 'test')}


SMOOTH = 5         # training accuracy: running mean over this many logged windows
PLOT_SMOOTH = 20   # training-cost curves of the figure: the same over more windows


def smooth(values, window: int = SMOOTH) -> np.ndarray:
  """Running mean over the last `window` values (fewer at the start)."""
  values = np.asarray(values, np.float64)
  sums = np.cumsum(np.concatenate([[0.0], values]))
  starts = np.maximum(np.arange(1, len(values) + 1) - window, 0)
  return (sums[1:] - sums[starts]) / (np.arange(1, len(values) + 1) - starts)


def first_pass(steps, values, threshold: float):
  """First logged step whose value exceeds `threshold` (None if never)."""
  for step, value in zip(steps, values):
    if value > threshold:
      return step
  return None


def summarize_run(records: list[dict], most_frequent_train: float) -> dict:
  train = [r for r in records if r['split'] == 'train']
  valid = [r for r in records if r['split'] == 'valid']
  test = [r for r in records if r['split'] == 'test']
  out = {'train_steps': [r['step'] for r in train],
         'train_loss': [r['loss'] for r in train],
         'train_accuracy': [r['accuracy'] for r in train],
         'valid_steps': [r['step'] for r in valid],
         'valid_error': [r['error'] for r in valid]}
  if valid:
    best = int(np.argmin(out['valid_error']))
    out['best_valid_error'] = out['valid_error'][best]
    out['best_valid_step'] = out['valid_steps'][best]
  if test:
    out['test_error'] = test[-1]['error']
    out['test_checkpoint_step'] = test[-1].get('checkpoint_step')
  # Steps/s of training from the logged wall times, evaluation time excluded: the time
  # between consecutive train records that have no evaluation between them.
  rates = []
  for previous, record in zip(records, records[1:]):
    if previous['split'] == 'train' and record['split'] == 'train':
      seconds = record['time_s'] - previous['time_s']
      if seconds > 0:
        rates.append((record['step'] - previous['step']) / seconds)
  out['steps_per_second'] = float(np.median(rates)) if rates else None
  grad_norms = [r['grad_norm'] for r in train]
  out['median_logged_grad_norm'] = float(np.median(grad_norms)) if grad_norms else None
  out['max_logged_grad_norm'] = float(np.max(grad_norms)) if grad_norms else None
  out['complete'] = bool(test)
  out['last_train_step'] = out['train_steps'][-1] if train else 0
  out['step_train_accuracy_passes_most_frequent'] = first_pass(
      out['train_steps'], smooth(out['train_accuracy']), most_frequent_train)
  out['step_valid_error_below_most_frequent'] = None
  return out


def report(args) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  base = baselines(os.path.join(args.runs_dir, 'data_cache'))
  runs = {}
  for variant in list(args.variants) + [c for c in CONTROLS if c not in args.variants]:
    for seed in args.seeds:
      folder = os.path.join(RESULTS, args.name, run_name(variant, seed))
      source = os.path.join(args.runs_dir, run_name(variant, seed), 'metrics.jsonl')
      if os.path.exists(source):   # the run's own log, when this machine has it
        os.makedirs(folder, exist_ok=True)
        shutil.copy(source, os.path.join(folder, 'metrics.jsonl'))
      if not os.path.exists(os.path.join(folder, 'metrics.jsonl')):
        print(f'missing {os.path.relpath(folder, ROOT)}/metrics.jsonl; skipped', flush=True)
        continue
      summary = summarize_run(read_metrics(folder), base['train']['most_frequent'])
      valid_mf_error = 1.0 - base['valid']['most_frequent']
      for step, error in zip(summary['valid_steps'], summary['valid_error']):
        if error < valid_mf_error:
          summary['step_valid_error_below_most_frequent'] = step
          break
      runs.setdefault(variant, {})[str(seed)] = summary

  table = []
  for variant, seeds in runs.items():
    best = [s['best_valid_error'] for s in seeds.values() if 'best_valid_error' in s]
    tests = [s['test_error'] for s in seeds.values() if 'test_error' in s]
    rates = [s['steps_per_second'] for s in seeds.values() if s['steps_per_second']]
    table.append({
        'variant': variant, 'seeds': sorted(seeds),
        'best_valid_error': best, 'best_valid_error_mean': float(np.mean(best)),
        'test_error_of_best_valid': tests,
        'test_error_mean': float(np.mean(tests)) if tests else None,
        'steps_per_second': float(np.mean(rates)) if rates else None,
        'paper_fig4a_min_valid_error': PAPER_FIG4A_MIN_VALID_ERROR.get(variant),
        'paper_table4_test_error': PAPER_TABLE4_TEST_ERROR.get(variant)})
  result = {
      'what': 'Attentive Reader variants (Cooijmans et al. 2016 sec. 5.4) on '
              'brown_cloze_large, reduced size (config attentive_reader.py:<variant>,cpu)',
      'command': args.command,
      'machine': '2-core shared CPU VM, one core per run (single-threaded XLA), '
                 f'{args.parallel_note}',
      'baselines_error': {split: {k: 1.0 - v for k, v in b.items()}
                          for split, b in base.items()},
      'paper': {'fig4a_min_valid_error': PAPER_FIG4A_MIN_VALID_ERROR,
                'table4_test_error': PAPER_TABLE4_TEST_ERROR,
                'note': 'CNN corpus, 240 units (120 for BN-e** in Table 4); not comparable '
                        'in level with brown_cloze_large'},
      'table': table, 'runs': runs}
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, f'{args.name}.json'), 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')

  fig, (ax_cost, ax_valid) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = dict(zip(VARIANTS + tuple(CONTROLS),
                    plt.rcParams['axes.prop_cycle'].by_key()['color']))
  for variant, seeds in runs.items():
    for i, (seed, s) in enumerate(sorted(seeds.items())):
      style = dict(color=colors[variant], alpha=0.9 if i == 0 else 0.5,
                   linestyle='-' if i == 0 else '--',
                   label=LABELS[variant] if i == 0 else None)
      ax_cost.plot(s['train_steps'], smooth(s['train_loss'], PLOT_SMOOTH), **style)
      ax_valid.plot(s['valid_steps'], s['valid_error'], marker='.', **style)
  for split, ls in (('valid', ':'),):
    for name, label, style in (('most_frequent', 'most frequent entity', ':'),
                               ('exclusive_frequency', 'exclusive frequency', '-.'),
                               ('random_candidate', 'random candidate', '--')):
      ax_valid.axhline(1.0 - base[split][name], color='gray', linestyle=style, linewidth=1,
                       label=f'{label} ({split})')
  ax_cost.set(xlabel='training step',
              ylabel=f'training cost (nats; mean of the last {PLOT_SMOOTH} logs of 10 steps)',
              title='Training cost (seed 0 solid, seed 1 dashed)')
  ax_valid.set(xlabel='training step', ylabel='validation error',
               title='Validation error (population statistics)')
  ax_cost.legend(fontsize=8)
  ax_valid.legend(fontsize=7)
  fig.suptitle('Attentive Reader on brown_cloze_large (reduced size, CPU): manner of '
               'Cooijmans et al. Fig. 4a', fontsize=10)
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS, f'{args.name}.png'), dpi=110)
  plt.close(fig)
  print(markdown_table(result))


def markdown_table(result: dict) -> str:
  """The README table of a report JSON."""
  pct = lambda v: '–' if v is None else f'{100 * v:.1f}'
  lines = ['| variant | seeds | best valid error % (per seed) | test error % of the best-valid '
           'checkpoint | steps/s | train acc. passes most-frequent (step, per seed) | '
           'valid error below most-frequent (step, per seed) | '
           'gradient norm before clipping (median / max of the 10-step means) | '
           'paper Fig. 4a min valid % | paper Table 4 test % |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for row in result['table']:
    runs = result['runs'][row['variant']]
    stopped = [f"seed {s} stopped; last log at step {runs[s]['last_train_step']}"
               for s in row['seeds'] if not runs[s]['complete']]
    passes = ', '.join(str(runs[s]['step_train_accuracy_passes_most_frequent'] or 'never')
                       for s in row['seeds'])
    below = ', '.join(str(runs[s]['step_valid_error_below_most_frequent'] or 'never')
                      for s in row['seeds'])
    norms = ', '.join(f"{runs[s]['median_logged_grad_norm']:.2g} / "
                      f"{runs[s]['max_logged_grad_norm']:.2g}" for s in row['seeds'])
    lines.append(
        f"| {LABELS[row['variant']]} | {len(row['seeds'])}"
        f"{' (' + '; '.join(stopped) + ')' if stopped else ''} | "
        f"{' / '.join(pct(v) for v in row['best_valid_error'])} | "
        f"{' / '.join(pct(v) for v in row['test_error_of_best_valid'])} | "
        f"{row['steps_per_second']:.2f} | {passes} | {below} | {norms} | "
        f"{pct(row['paper_fig4a_min_valid_error'])} | {pct(row['paper_table4_test_error'])} |")
  base = result['baselines_error']
  for name, label in (('most_frequent', 'most frequent entity'),
                      ('exclusive_frequency', 'exclusive frequency'),
                      ('random_candidate', 'random candidate (expected)')):
    lines.append(f"| *{label}* | – | {pct(base['valid'][name])} | {pct(base['test'][name])} "
                 '| – | – | – | – | – | – |')
  return '\n'.join(lines)


# ====================================================================== speed
def measure_speed(args) -> None:
  """Train steps/s of every variant in one process (same batch: the first 40 questions of
  one length group, T = 128), wall and process CPU time, after a warm-up. Writes
  `experiments/results/attentive_reader_speed.json`."""
  import jax  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax import input_pipeline, models, tasks  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.input_pipeline import reading  # pylint: disable=g-import-not-at-top
  from experiments.configs import attentive_reader  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  config = attentive_reader.get_config('lstm,cpu')
  arrays = reading.load(input_pipeline.resolve_path(config.data, 'path'),
                        config.data.vocab_size, 0, os.path.join(args.runs_dir, 'data_cache'))
  dataset = reading.ReadingDataset(arrays, batch_size=40, seed=0, length_multiple=64,
                                   length_groups=8)
  batch = next(b for b in (dataset.train_batch(s) for s in range(100))
               if b['inputs']['document'].shape[1] == 128)
  out = {'what': 'one Adam step (fwd + bwd + update), batch 40, document T = 128, 64 units',
         'machine': '2-core CPU VM, single-threaded XLA',
         'load_average_1_5_15_min_at_start': [round(v, 2) for v in os.getloadavg()],
         'timed_steps': args.speed_steps,
         'variants': {}}
  tx = optax.adam(1e-4)
  for variant in VARIANTS:
    model = models.AttentiveReader(vocab_size=len(dataset.vocab),
                                   num_entities=dataset.num_entities, variant=variant,
                                   hidden_size=64, layer_options=dict(max_length=384))
    variables = model.init(jax.random.PRNGKey(0), batch['inputs'], train=False)
    def step(params, opt_state, batch_stats, batch, model=model):
      def loss(p):
        logits, mutated = model.apply({'params': p, 'batch_stats': batch_stats},
                                      batch['inputs'], train=True, mutable=['batch_stats'])
        sums, count = tasks.get('reading_comprehension').loss_sums(logits, batch)
        return sums['loss'] / count, mutated
      grads, mutated = jax.grad(loss, has_aux=True)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, mutated.get('batch_stats', {})
    step = jax.jit(step)
    state = (variables['params'], tx.init(variables['params']),
             variables.get('batch_stats', {}))
    state = jax.block_until_ready(step(*state, batch))
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.speed_steps):
      state = jax.block_until_ready(step(*state, batch))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out['variants'][variant] = {'steps_per_second_wall': args.speed_steps / wall,
                                'steps_per_cpu_second': args.speed_steps / cpu}
    print(variant, out['variants'][variant], flush=True)
  lstm = out['variants']['lstm']['steps_per_cpu_second']
  for record in out['variants'].values():
    record['cpu_time_vs_lstm'] = lstm / record['steps_per_cpu_second']
  with open(os.path.join(RESULTS, 'attentive_reader_speed.json'), 'w') as f:
    json.dump(out, f, indent=1)
    f.write('\n')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--report', action='store_true', help='write the JSON and PNG only')
  parser.add_argument('--speed', action='store_true', help='steps/s of every variant')
  parser.add_argument('--speed_steps', type=int, default=10)
  parser.add_argument('--runs_dir', default=os.path.join(ROOT, 'runs', 'attentive_reader'))
  parser.add_argument('--variants', nargs='+', default=list(VARIANTS) + list(CONTROLS),
                      help=f'names of {VARIANTS} or of the controls {tuple(CONTROLS)}')
  parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
  parser.add_argument('--parallel', type=int, default=2, help='runs at a time')
  parser.add_argument('--parallel_note',
                      default='the two seeds of a variant at a time, beside the two seeds '
                              'of the control and, at times, the test suite and benchmarks '
                              '(load average 4-6)',
                      help='what the report says about the machine load')
  parser.add_argument('--name', default='attentive_reader_long',
                      help='--report: read experiments/results/<name>/<run>/metrics.jsonl, '
                           'write experiments/results/<name>.json and .png')
  parser.add_argument('--command', default='python experiments/attentive_reader_runs.py '
                      '--runs_dir runs/ar_long2 --variants bn_e_star_star lstm_bidirectional '
                      'bn_e_star bn_everywhere bn_lstm lstm lstm_lr8e-4_b40 -- '
                      '--config.train.num_steps=3000 --config.eval.every=250 '
                      '--config.checkpoint.every=250 && python '
                      'experiments/attentive_reader_runs.py --runs_dir runs/ar_long2 '
                      '--variants bn_lstm_lr8e-4_b40 -- --config.train.num_steps=3000 '
                      '--config.eval.every=250 --config.checkpoint.every=250 && python '
                      'experiments/attentive_reader_runs.py --report --runs_dir runs/ar_long2',
                      help='--report: the commands that made the runs, for the JSON')
  parser.add_argument('extra', nargs='*', help='more --config.x=y flags for every run')
  args = parser.parse_args()
  if args.speed:
    measure_speed(args)
  elif args.report:
    report(args)
  else:
    launch(args)


if __name__ == '__main__':
  main()
