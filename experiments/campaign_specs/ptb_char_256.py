r"""Character-level PTB at 256 units, 400 steps: LSTM, BN-LSTM, input-only BN.

  python -m experiments.campaign run ptb_char_256 --parallel=2
  python -m experiments.campaign collect ptb_char_256
  python -m experiments.campaign report ptb_char_256   # the README's table
  python -m experiments.campaign report ptb_char_256 --figure=experiments/results/ptb_char_256.png
  python -m experiments.campaign speed ptb_char_256    # the 1000-unit speed table

Expected: about 20 minutes on 2 CPU cores (AMD EPYC VM, one XLA thread per run, two at a
time; the three runs' own clocks sum to 36 min, measured with 3 runs at once). The BN-LSTM leads from the first
validation on: valid bpc 2.020 at step 400 against the LSTM's 2.824, test 1.986.

`experiments/configs/ptb_char.py:<variant>` (Cooijmans et al. sec. 5.2: Adam 2e-3, batch
64, length 100, clip 1, orthogonal init) at 256 units and 400 steps (0.51 epoch);
validation every 50 steps on the whole validation text with the papers' estimate over 10
training batches and the running average beside it; the test of the best checkpoint at the
end. The paper's numbers (Table 2: test 1.38 / 1.32 bpc) come from full training at 1000
units and are not comparable in level. The speed table times the config's own 1000 units.
"""

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only')


def get_campaign() -> spec.Campaign:
  return spec.Campaign(
      name='ptb_char_256',
      title='Character-level PTB, 256 units, 400 steps: LSTM, BN-LSTM, input-only BN',
      config='experiments/configs/ptb_char.py',
      arms={v: spec.Arm(config_arg=v, label=v) for v in VARIANTS}, seeds=(0,), parallel=2,
      overrides={'model.hidden_size': 256, 'train.num_steps': 400, 'train.log_every': 25,
                 'eval.every': 50, 'eval.batch_size': 128, 'eval.population_batches': 10,
                 'eval.compare': ('running',), 'checkpoint.every': 50,
                 'eval.test_at_end': True},
      tables={'valid_bpc': valid_bpc}, figure=figure, setup=setup,
      paper={'table2_test_bpc': {'lstm': 1.38, 'bn_lstm': 1.32}},
      expected='about 20 min on 2 CPU cores (AMD EPYC VM; one XLA thread per run, 2 at a '
               'time; the runs\' clocks sum to 36 min)',
      tiny=TINY,
      speed=spec.Speed(
          name='ptb_char_1000_speed', arms=VARIANTS, steps=2, rounds=3,
          what='one training step of ptb_char.py (1000 units, batch 64, length 100)',
          tables={'speed': speed_table},
          expected='a few minutes on 2 CPU cores (AMD EPYC VM; not recorded)'))


TINY = {'train.num_steps': 2, 'model.hidden_size': 8, 'data.seq_length': 20,
        'model.max_length': 20, 'train.batch_size': 8, 'eval.batch_size': 8,
        'eval.population_batches': 1}


def setup(config) -> str:
  c = config
  return (f'char-level PTB, {c.model.num_layers} layer, {c.model.hidden_size} units, batch '
          f'{c.train.batch_size}, T={c.data.seq_length}, Adam {c.optimizer.learning_rate:g}, '
          f'clip {c.optimizer.clip_norm}, {c.model.recurrent_init} init, '
          f'{c.train.num_steps} steps, eval every {c.eval.every} steps on the whole '
          f"validation text with population statistics (papers' estimate over "
          f'{c.eval.population_batches} training batches; *_running = running average, '
          f'momentum {c.model.momentum})')


def valid_bpc(result: dict) -> str:
  """Validation bpc at steps 100, 200 and the last, the running average's at the last,
  and the test bpc of the best checkpoint; the lowest final and test values in bold."""
  rows, finals, tests = [], {}, {}
  last_step = None
  for arm, runs in columns.runs_by_arm(result).items():
    records = runs[0]['records']
    last = columns.last(records, 'valid')
    last_step = last['step']
    test = columns.last(records, 'test')
    finals[arm], tests[arm] = last['bpc'], test and test['bpc']
    rows.append([arm, columns.fmt(columns.at_step(records, 'valid', 'bpc', 100)),
                 columns.fmt(columns.at_step(records, 'valid', 'bpc', 200)), last['bpc'],
                 columns.DASH if arm == 'lstm' else columns.fmt(last.get('bpc_running')),
                 test and test['bpc']])

  def bold(value, column):
    text = columns.fmt(value)
    lowest = min((v for v in column.values() if v is not None), default=None)
    return f'**{text}**' if value is not None and value == lowest else text

  for row, arm in zip(rows, finals):
    row[3], row[5] = bold(row[3], finals), bold(row[5], tests)
  return columns.markdown(['variant', 'valid bpc @100 steps', '@200', f'@{last_step}',
                          f'@{last_step}, running-average stats',
                          f'test bpc @{last_step}'], rows)


def figure(result: dict, output: str) -> None:
  series = []
  for arm, runs in columns.runs_by_arm(result).items():
    steps, values = columns.curve(runs[0]['records'], 'valid', 'bpc')
    series.append((f'{arm} (valid)', steps, values, dict(marker='.', linestyle='-')))
  plot.plot_curves(series, output, ylabel='bpc')


def speed_table(speed: dict) -> str:
  """Steps/s and each variant's time per step over the first's, wall and CPU."""
  arms = speed['arms']
  first = next(iter(arms.values()))
  rows = [[arm, f"{1.0 / r['wall_s_per_step']:.3f}",
           f"{r['wall_s_per_step'] / first['wall_s_per_step']:.2f}",
           f"{r['cpu_s_per_step'] / first['cpu_s_per_step']:.2f}"] for arm, r in arms.items()]
  return columns.markdown(['variant', 'steps/s', '× LSTM (wall)', '× LSTM (CPU)'], rows)
