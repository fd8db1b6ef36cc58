r"""Training steps per second of a language-model config, variant against variant.

  python experiments/lm_speed.py --config=experiments/configs/ptb_char.py \
      --variants=lstm,bn_lstm,bn_input_only --steps=5 --rounds=3

Builds the real trainer (`loop.Trainer`: pmapped train step, real batches from the
config's data) for every variant in one process, compiles each once, then times `steps`
consecutive training steps per variant, round-robin over `rounds` rounds, so that load
from other processes hits all variants alike. Prints and optionally writes (`--output`
JSON) the median seconds per step, steps/s, and each variant's time relative to the first,
in wall-clock time and in this process's CPU time (steadier on a shared machine).
"""

import json
import os
import time

from absl import app
from absl import flags
import jax
import numpy as np
from ml_collections import config_flags

from bn_rnn_jax import loop

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Language-model config file.',
                                lock_config=False)
flags.DEFINE_list('variants', ['lstm', 'bn_lstm'], 'Variants to time (first = reference).')
flags.DEFINE_integer('steps', 5, 'Timed steps per variant per round.')
flags.DEFINE_integer('rounds', 3, 'Round-robin rounds.')
flags.DEFINE_string('output', None, 'Optional JSON output path.')
flags.mark_flags_as_required(['config'])


def build(config, variant):
  config = config.copy_and_resolve_references()
  config.model.variant = variant
  trainer = loop.Trainer(config)
  state = trainer.to_devices(trainer.initial_state())
  state, metrics = trainer.p_train_step(state, trainer.train_batch(0))   # compile
  jax.block_until_ready(metrics)
  return trainer, state


def main(argv):
  del argv
  runs = {v: build(FLAGS.config, v) for v in FLAGS.variants}
  times = {v: [] for v in FLAGS.variants}
  cpu_times = {v: [] for v in FLAGS.variants}
  step = 1
  for _ in range(FLAGS.rounds):
    for variant, (trainer, state) in runs.items():
      batches = [trainer.train_batch(step + i) for i in range(FLAGS.steps)]
      start, cpu_start = time.perf_counter(), time.process_time()
      for batch in batches:
        state, metrics = trainer.p_train_step(state, batch)
      jax.block_until_ready(metrics)
      times[variant].append((time.perf_counter() - start) / FLAGS.steps)
      cpu_times[variant].append((time.process_time() - cpu_start) / FLAGS.steps)
      runs[variant] = (trainer, state)
    step += FLAGS.steps
  reference = float(np.median(times[FLAGS.variants[0]]))
  cpu_reference = float(np.median(cpu_times[FLAGS.variants[0]]))
  result = {'config': {'hidden_size': FLAGS.config.model.hidden_size,
                       'batch_size': FLAGS.config.train.batch_size,
                       'seq_length': FLAGS.config.data.seq_length,
                       'backend': jax.default_backend(),
                       'devices': len(runs[FLAGS.variants[0]][0].devices)},
            'variants': {}}
  for variant, samples in times.items():
    median = float(np.median(samples))
    result['variants'][variant] = {'s_per_step': median, 'steps_per_s': 1.0 / median,
                                   'relative_to_first': median / reference,
                                   'samples_s_per_step': samples,
                                   'cpu_s_per_step': float(np.median(cpu_times[variant])),
                                   'cpu_relative_to_first':
                                       float(np.median(cpu_times[variant])) / cpu_reference}
    print(f'{variant:15s} {median * 1000:9.1f} ms/step  {1 / median:7.3f} steps/s  '
          f'x{median / reference:.2f}   (process CPU time: '
          f'{np.median(cpu_times[variant]) * 1000:.1f} ms/step, '
          f'x{np.median(cpu_times[variant]) / cpu_reference:.2f})')
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    with open(FLAGS.output, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  app.run(main)
