r"""Character models on longer sequences than they were trained on (Cooijmans et al. Fig. 3b).

  python experiments/lm_eval_lengths.py --workdirs=/tmp/runs/char/bn_lstm,/tmp/runs/char/lstm \
      --lengths=100,200,500,1000 --whole --output=experiments/results/ptb_char_lengths

For every trained workdir (its `config.json` and checkpoint; `--checkpoint=best|latest`),
the validation text is cut into non-overlapping segments of each length (every prediction
counted once, the last segment masked) and, with `--whole`, read as ONE sequence of
N-1 = 393,041 steps (PTB). Bits per character are computed with
  estimate   population statistics = the papers' estimate (minibatch moments averaged over
             `config.eval.population_batches` training batches, current parameters);
  running    population statistics = the running average kept during training;
  batch      batch statistics of the evaluation batch itself (per step; not defined for
             the single whole sequence, so left out there).
Past the training length T_max every population statistic is that of step T_max - 1
(Cooijmans et al. sec. 3). A plain LSTM has no statistics: its three columns coincide.
Writes `<output>.json` (the table) and `<output>.png` (bpc against length).
"""

import json
import math
import os
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import ml_collections

from bn_rnn_jax import checkpoint as checkpoint_lib
from bn_rnn_jax import parallel
from bn_rnn_jax import train
from bn_rnn_jax import loop

FLAGS = flags.FLAGS
flags.DEFINE_list('workdirs', None, 'Trained language-model run directories.')
flags.DEFINE_list('labels', None, 'Legend labels (default: the variants).')
flags.DEFINE_enum('checkpoint', 'best', ['best', 'latest'], 'Which checkpoint to load.')
flags.DEFINE_string('split', 'valid', 'Split to evaluate.')
flags.DEFINE_list('lengths', ['100', '200', '500', '1000'], 'Segment lengths.')
flags.DEFINE_bool('whole', True, 'Also evaluate the whole split as one sequence.')
flags.DEFINE_list('stats', ['estimate', 'running', 'batch'],
                  'Statistics to compare: estimate, running, batch.')
flags.DEFINE_integer('batch_size', 0, 'Rows per segment batch (0 = config.eval.batch_size).')
flags.DEFINE_string('data_path', None, 'Override config.data.path.')
flags.DEFINE_string('output', None, 'Output prefix: <output>.json and <output>.png.')
flags.mark_flags_as_required(['workdirs', 'output'])


def load_run(workdir: str, which: str, data_path=None):
  """`(config, trainer, replicated state, step)` of a trained workdir."""
  with open(os.path.join(workdir, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if data_path:
    config.data.path = data_path
  trainer = loop.Trainer(config, workdir)
  if trainer.dataset.task != 'language_model' or trainer.dataset.carries_state:
    raise ValueError(f'{workdir}: a character-level language model (independent '
                     'segments) is needed for this evaluation.')
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    host_state, _ = ckpt.restore(trainer.initial_state(), best=(which == 'best'))
  finally:
    ckpt.close()
  return config, trainer, trainer.to_devices(host_state), int(host_state.step)


def batch_stats_evaluator(config, trainer, length: int):
  """A pmapped `(params, batch) -> (sums, count)` with the eval batch's own statistics.

  A copy of the model whose per-step statistics hold `length` rows, run in training mode
  (no dropout rng is needed: the character configs have no dropout).
  """
  options = train.layer_options(config, trainer.dataset.train_length)
  options['max_length'] = max(length, options['max_length'])
  model = trainer.task.build_model(config, dict(trainer.dataset.model_kwargs), options)
  tokens = jnp.zeros((1, length), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, None,
                                             train=False))
  fresh = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes.get('batch_stats', {}))

  def sums(params, batch):
    (_, logits), _ = trainer.task.apply(
        model, {'params': params, 'batch_stats': fresh}, batch, train=True, carry=None,
        rngs={'dropout': jax.random.PRNGKey(0), 'noise': jax.random.PRNGKey(1)},
        mutable=['batch_stats'])
    s, n = trainer.task.loss_sums(logits, batch)
    return jax.lax.psum((s, n), parallel.AXIS)

  return parallel.device_map(sums, trainer.devices, trainer.backend)


def bits_per_char(trainer, state, stats, split, length, batch_size, batch_fn=None) -> float:
  """bpc of `split` in segments of `length` (population `stats`, or `batch_fn`)."""
  total, count = 0.0, 0.0
  for batch in trainer.dataset.eval_batches(split, seq_length=length, batch_size=batch_size):
    batch = trainer.shard(batch)
    if batch_fn is None:
      sums, n, _ = trainer.p_eval_step(state.params, stats, batch, None)
    else:
      sums, n = batch_fn(state.params, batch)
    total += float(sums['loss'][0])
    count += float(n[0])
  return total / count / math.log(2.0)


def evaluate_run(workdir: str) -> dict:
  config, trainer, state, step = load_run(workdir, FLAGS.checkpoint, FLAGS.data_path)
  batch_size = FLAGS.batch_size or config.eval.batch_size
  split = FLAGS.split
  whole = trainer.dataset.num_symbols(split) - 1
  lengths = [int(x) for x in FLAGS.lengths] + ([whole] if FLAGS.whole else [])
  has_stats = bool(jax.tree.leaves(state.batch_stats))
  population = {}
  if 'estimate' in FLAGS.stats:
    population['estimate'] = trainer.population_stats(state, 'estimate')
  if 'running' in FLAGS.stats:
    population['running'] = trainer.population_stats(state, 'running')
  rows = []
  for length in lengths:
    is_whole = length == whole
    rows_per_batch = 1 if is_whole else batch_size
    row = {'length': 'whole' if is_whole else length, 'steps': length}
    for kind, stats in population.items():
      start = time.time()
      row[kind] = bits_per_char(trainer, state, stats, split, length, rows_per_batch)
      logging.info('%s L=%s %s: %.4f bpc (%.0f s)', workdir, row['length'], kind, row[kind],
                   time.time() - start)
    if 'batch' in FLAGS.stats and not is_whole:
      if has_stats:
        row['batch'] = bits_per_char(trainer, state, None, split, length, rows_per_batch,
                                     batch_stats_evaluator(config, trainer, length))
      else:
        row['batch'] = row.get('estimate', row.get('running'))
    rows.append(row)
    print(json.dumps({'workdir': workdir, **row}), flush=True)
  # The run's last two path parts only: results carry no paths of this machine.
  return {'run': '/'.join(os.path.normpath(workdir).split(os.sep)[-2:]), 'variant': config.model.variant, 'step': step,
          'checkpoint': FLAGS.checkpoint, 'train_length': trainer.dataset.train_length,
          'hidden_size': config.model.hidden_size, 'split': split, 'rows': rows}


def plot(results, labels, output):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  styles = {'estimate': '-', 'running': '--', 'batch': ':'}
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for result, label, color in zip(results, labels, colors):
    for kind, style in styles.items():
      points = [(r['steps'], r[kind]) for r in result['rows'] if kind in r]
      if points:
        x, y = zip(*points)
        ax.plot(x, y, style, color=color, marker='o', label=f'{label}, {kind}')
  ax.set_xscale('log')
  ax.set_xlabel('evaluation sequence length (last point: the whole split as one sequence)')
  ax.set_ylabel(f'{results[0]["split"]} bits per character')
  ax.set_title(f'Longer sequences than trained on (T_max = {results[0]["train_length"]})')
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(output, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  results = [evaluate_run(w) for w in FLAGS.workdirs]
  labels = FLAGS.labels or [r['variant'] for r in results]
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
  with open(FLAGS.output + '.json', 'w') as f:
    json.dump({'runs': results, 'labels': labels}, f, indent=1)
  plot(results, labels, FLAGS.output + '.png')
  print(f'wrote {FLAGS.output}.json and {FLAGS.output}.png')


if __name__ == '__main__':
  app.run(main)
