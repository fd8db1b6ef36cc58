r"""What the two Fig. 3b campaigns share (Cooijmans et al.: character models on longer
sequences than they were trained on): the evaluation, its table and figure.

Not a campaign itself (`NAMES` leaves it out): `ptb_char_256_lengths.py` and
`ptb_char_1000_lengths.py` each evaluate the runs of one training campaign.

For a run's checkpoint (T_max = 100: past it, every population statistic is that of
step 99, Cooijmans et al. sec. 3), the split's text is cut into non-overlapping segments
of each length (every prediction counted once, the last segment masked; a long segment
in fewer rows a batch, `MAX_ROW_STEPS`) and also read as ONE sequence (in pieces that
carry the state and the step count on, `WHOLE_PIECE`). Bits per character with
  estimate   population statistics = the papers' estimate (minibatch moments averaged over
             `config.eval.population_batches` training batches, current parameters);
  running    population statistics = the running average kept during training;
  batch      batch statistics of the evaluation batch itself (per step; not defined for
             the single whole sequence, so left out there).
A plain LSTM has no statistics: its three columns coincide.
"""

from __future__ import annotations

import json
import math
import os

from experiments import plot
from experiments.campaign import spec
from experiments.campaign import columns

import functools

TINY_LENGTHS = (10, 30)
#: Rows x steps of one evaluation batch at most: a long segment is read in fewer rows, so
#: that the layer's per-step intermediates of a 1000-unit model fit in memory.
MAX_ROW_STEPS = 128_000
#: The whole split is read as one sequence in pieces of this many steps, the state (and
#: the step counter that picks the population rows) carried from each to the next.
WHOLE_PIECE = 10_000


def campaign(name: str, source: str, lengths: tuple[int, ...], split: str,
             checkpoint: str, expected: str) -> spec.Campaign:
  """The campaign that evaluates `source`'s bn_lstm and lstm runs at `lengths` on `split`
  (and the whole split as one sequence), from their `checkpoint` ('latest' or 'best')."""
  return spec.Campaign(
      name=name,
      title=f'Char-PTB models of {source} on longer sequences than trained on (Fig. 3b)',
      config='experiments/configs/ptb_char.py',
      arms={'bn_lstm': spec.Arm(config_arg='bn_lstm', label='BN-LSTM'),
            'lstm': spec.Arm(config_arg='lstm', label='LSTM')},
      source=source,
      evaluate=functools.partial(evaluate, lengths=lengths, split=split,
                                 checkpoint=checkpoint),
      tables={'lengths': lengths_table}, figure=figure, expected=expected)


# ---------------------------------------------------------------------- evaluation
def _load_run(workdir: str, checkpoint: str):
  """`(config, trainer, replicated state, step)` of a trained workdir's checkpoint."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import loop  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.train.num_devices = 1
  trainer = loop.Trainer(config, workdir)
  if trainer.dataset.task != 'language_model' or trainer.dataset.carries_state:
    raise ValueError(f'{workdir}: a character-level language model (independent '
                     'segments) is needed for this evaluation.')
  ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
  try:
    host_state, _ = ckpt.restore(trainer.initial_state(), best=(checkpoint == 'best'))
  finally:
    ckpt.close()
  return config, trainer, trainer.to_devices(host_state), int(host_state.step)


def _batch_stats_evaluator(config, trainer, length: int):
  """A device-mapped `(params, batch) -> (sums, count)` with the batch's own statistics:
  a copy of the model whose per-step statistics hold `length` rows, in training mode (no
  dropout in the character configs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import parallel  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import train  # pylint: disable=g-import-not-at-top
  fields = train.layer_fields(config, trainer.dataset.train_length)
  fields['max_length'] = max(length, fields['max_length'])
  model = trainer.task.build_model(config, dict(trainer.dataset.model_kwargs), fields)
  tokens = jnp.zeros((1, length), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, None,
                                             use_running_average=True, deterministic=True))
  fresh = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes.get('batch_stats', {}))

  def sums(params, batch):
    (_, logits), _ = trainer.task.apply(
        model, {'params': params, 'batch_stats': fresh}, batch, use_running_average=False,
        deterministic=False, carry=None,
        rngs={'dropout': jax.random.PRNGKey(0), 'noise': jax.random.PRNGKey(1)},
        mutable=['batch_stats'])
    s, n = trainer.task.loss_sums(logits, batch)
    return jax.lax.psum((s, n), parallel.AXIS)

  return parallel.device_map(sums, trainer.devices, trainer.backend)


def _piece_evaluator(trainer):
  """A device-mapped `(params, stats, batch, carry, first_step) -> (sums, count, carry)`
  with population statistics: one piece of a sequence read in pieces, its steps counted
  from `first_step` (which picks each step's population row) and its state from `carry`
  (None: zeros)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import parallel  # pylint: disable=g-import-not-at-top

  def sums(params, stats, batch, carry, first_step):
    (carry, logits), _ = trainer.task.apply(
        trainer.model, {'params': params, 'batch_stats': stats}, batch,
        use_running_average=True, deterministic=True, carry=carry, first_step=first_step)
    s, n = trainer.task.loss_sums(logits, batch)
    return jax.lax.psum((s, n), parallel.AXIS) + (carry,)

  return parallel.device_map(sums, trainer.devices, trainer.backend)


def _bits(loss_sums_and_counts) -> float:
  """Bits per character of `(sums, count)` pairs (device 0's psum-ed values)."""
  total, count = 0.0, 0.0
  for sums, n in loss_sums_and_counts:
    total += float(sums['loss'][0])
    count += float(n[0])
  return total / count / math.log(2.0)


def _whole_bits_per_char(trainer, state, stats, split, evaluate_piece) -> float:
  """bpc of `split` read as ONE sequence, in pieces of `WHOLE_PIECE` steps (one row), with
  `evaluate_piece` (`_piece_evaluator`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  def pieces():
    carry = None
    batches = trainer.dataset.eval_batches(split, seq_length=WHOLE_PIECE, batch_size=1)
    for i, batch in enumerate(batches):
      first_step = np.full((len(trainer.devices),), i * WHOLE_PIECE, np.int32)
      sums, n, carry = evaluate_piece(state.params, stats, trainer.shard(batch), carry,
                                      first_step)
      yield sums, n

  return _bits(pieces())


def _bits_per_char(trainer, state, stats, split, length, batch_size,
                   batch_fn=None) -> float:
  batches = (trainer.shard(b) for b in trainer.dataset.eval_batches(
      split, seq_length=length, batch_size=batch_size))
  if batch_fn is None:
    return _bits(trainer.p_eval_step(state.params, stats, b, None)[:2] for b in batches)
  return _bits(batch_fn(state.params, b) for b in batches)


def evaluate(workdir: str, tiny: bool = False, *, lengths: tuple[int, ...], split: str,
             checkpoint: str) -> dict:
  """bpc of the run in `workdir` at every length of `lengths` (`TINY_LENGTHS` when
  `tiny`) and on the whole `split`, with each kind of statistics."""
  import jax  # pylint: disable=g-import-not-at-top
  config, trainer, state, step = _load_run(workdir, checkpoint)
  whole = trainer.dataset.num_symbols(split) - 1
  has_stats = bool(jax.tree.leaves(state.batch_stats))
  # Without statistics every kind is the same pass: one suffices.
  population = {kind: trainer.population_stats(state, kind)
                for kind in (('estimate', 'running') if has_stats else ('estimate',))}
  evaluate_piece = _piece_evaluator(trainer)
  rows = []
  for length in list(TINY_LENGTHS if tiny else lengths) + [whole]:
    is_whole = length == whole
    rows_per_batch = 1 if is_whole else min(config.eval.batch_size,
                                            max(1, MAX_ROW_STEPS // length))
    row = {'length': 'whole' if is_whole else length, 'steps': length,
           'rows_per_batch': rows_per_batch}
    for kind, stats in population.items():
      row[kind] = (_whole_bits_per_char(trainer, state, stats, split, evaluate_piece)
                   if is_whole else
                   _bits_per_char(trainer, state, stats, split, length, rows_per_batch))
    row.setdefault('running', row['estimate'])
    if not is_whole:
      row['batch'] = (_bits_per_char(trainer, state, None, split, length, rows_per_batch,
                                     _batch_stats_evaluator(config, trainer, length))
                      if has_stats else row['estimate'])
    rows.append(row)
  return {'variant': config.model.variant, 'step': step, 'checkpoint': checkpoint,
          'train_length': trainer.dataset.train_length,
          'hidden_size': config.model.hidden_size, 'split': split, 'rows': rows}


# ---------------------------------------------------------------------- table, figure
def _evaluations(result: dict) -> dict:
  return {arm: runs[0]['evaluation'] for arm, runs in columns.runs_by_arm(result).items()}


def lengths_table(result: dict) -> str:
  runs = _evaluations(result)
  bn, lstm = runs['bn_lstm'], runs['lstm']
  rows = []
  for row, base in zip(bn['rows'], lstm['rows']):
    length = (f"whole text as one sequence ({row['steps']:,} steps)"
              if row['length'] == 'whole' else row['length'])
    rows.append([length, columns.fmt(row['estimate']), columns.fmt(row['running']),
                 columns.fmt(row['batch']) if 'batch' in row else 'n/a',
                 columns.fmt(base['estimate'])])
  return columns.markdown([f"{bn['split']} length", 'BN-LSTM, training-pass estimate',
                          'BN-LSTM, running average', 'BN-LSTM, batch statistics', 'LSTM'],
                         rows)


def figure(result: dict, output: str) -> None:
  runs = _evaluations(result)
  styles = {'estimate': '-', 'running': '--', 'batch': ':'}
  colors = ('tab:blue', 'tab:orange')
  series = []
  for (arm, run), color in zip(runs.items(), colors):
    for kind, style in styles.items():
      points = [(r['steps'], r[kind]) for r in run['rows'] if kind in r]
      series.append((f'{arm}, {kind}', [x for x, _ in points], [y for _, y in points],
                     dict(linestyle=style, color=color, marker='o')))
  first = next(iter(runs.values()))
  plot.plot_curves(
      series, output, logx=True, legend_size=8,
      xlabel='evaluation sequence length (last point: the whole split as one sequence)',
      ylabel=f"{first['split']} bits per character",
      title=f"Longer sequences than trained on (T_max = {first['train_length']})")
