r"""Laurent et al. 2016, appendix A: batch norm inside the recurrence of a tanh RNN.

Their first attempt normalised the whole pre-activation, h_t = tanh(BN(W_h h_{t-1} +
W_x x_t)) with per-step statistics and gamma, beta shared over time (eq. 17), on
character-level PTB with windows of 100 symbols and an embedding of 250 -> 3 tanh-RNN
layers of 250 -> softmax. It never beat the plain RNN ("slightly worse than, or at best
equivalent to, the baseline", best valid 1.11 vs 1.10 bits/char after 20 epochs), which
led them to normalise the input term only (eq. 18). This script trains, with the same
architecture, batches and seed:
  rnn                    no batch norm
  rnn_bn_input           BN on W_x x only (Laurent eq. 18), gamma 1
  rnn_bn_recurrence      BN(W_h h + W_x x) (eq. 17, appendix A), gamma 1 (theirs)
  rnn_bn_recurrence      the same with gamma 0.1 (Cooijmans et al.'s remedy, sec. 4)
Deviations for a minutes-long CPU budget: a few hundred steps instead of 20 epochs, Adam
(lr 2e-3, clipping at 1) for every model instead of their per-model random search over
SGD-with-momentum settings, and the library's orthogonal weights instead of Glorot.
Validation bits per character use the papers' population estimate.

  python -m experiments.analysis.laurent_appendix [--la_variants=rnn,rnn_bn_input:1.0]
"""

from __future__ import annotations

import time
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bn_rnn_jax.training import loop
from experiments.analysis import common

_VARIANTS = flags.DEFINE_list(
    'la_variants', ['rnn', 'rnn_bn_input:1.0', 'rnn_bn_recurrence:1.0',
                    'rnn_bn_recurrence:0.1'],
    'variant[:initial gamma] entries; gamma is ignored for rnn.')
_STEPS = flags.DEFINE_integer('la_steps', 400, 'Training steps per model.')
_HIDDEN = flags.DEFINE_integer('la_hidden_size', 250, 'Units per layer (Laurent: 250).')
_LAYERS = flags.DEFINE_integer('la_num_layers', 3, 'Layers (Laurent: 3).')
_EMBED = flags.DEFINE_integer('la_embed_size', 250, 'Lookup-table width (Laurent: 250).')
_BATCH = flags.DEFINE_integer('la_batch_size', 32, 'Batch size (Laurent: 32/64/128).')
_LR = flags.DEFINE_float('la_learning_rate', 2e-3, 'Adam learning rate.')
_EVALS = flags.DEFINE_integer('la_num_evals', 8, 'Validation points per curve.')


def parse_variants(entries: Sequence[str]) -> list[tuple[str, float]]:
  """'name[:gamma]' -> (name, gamma); gamma defaults to 1 (standard batch norm)."""
  out = []
  for entry in entries:
    name, _, gamma = entry.partition(':')
    if name not in ('rnn', 'rnn_bn_input', 'rnn_bn_recurrence'):
      raise ValueError(f'Variant {name!r} is not a tanh-RNN variant of variants.VARIANTS '
                       "('rnn', 'rnn_bn_input', 'rnn_bn_recurrence').")
    out.append((name, float(gamma) if gamma else 1.0))
  if not out:
    raise ValueError('No variants given.')
  return out


def label(name: str, gamma: float) -> str:
  return name if name == 'rnn' else f'{name} gamma={gamma:g}'


def run(output_dir: str, ptb_dir: str, variants: Sequence[tuple[str, float]], *,
        num_steps: int = 400, hidden_size: int = 250, num_layers: int = 3,
        embed_size: int = 250, batch_size: int = 32, length: int = 100,
        learning_rate: float = 2e-3, num_evals: int = 8, eval_batches: int = 8,
        seed: int = 0) -> dict:
  """Writes `laurent_appendix.{png,json}`; returns the JSON dict.

  JSON: `curves[label]` = training history (`step`, `train_loss` in nats, `eval_step`,
  `eval` = [{'loss', 'metric' (bits/char)}]), `final_valid_bpc[label]`.
  """
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  curves, data = {}, None
  for name, gamma in variants:
    config = common.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                               length=length, learning_rate=learning_rate,
                               eval_batches=eval_batches, population_batches=4, seed=seed,
                               variant=name, num_layers=num_layers, embed_size=embed_size,
                               gamma_init=gamma)
    trainer = loop.Trainer(config)
    data = common.data_description(config, trainer.dataset)
    _, history = common.fit(trainer, trainer.to_devices(trainer.initial_state()), num_steps,
                            max(1, num_steps // num_evals))
    curves[label(name, gamma)] = history
    logging.info('%s: valid bpc %s (%.0fs)', label(name, gamma),
                 [round(e['metric'], 3) for e in history['eval']], history['seconds'])

  plt = common.matplotlib_pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for index, (key, h) in enumerate(curves.items()):
    color = f'C{index}'
    axes[0].plot(h['step'], common.smooth(np.asarray(h['train_loss']) / np.log(2.0), 20),
                 color=color, label=key)
    axes[1].plot(h['eval_step'], [e['metric'] for e in h['eval']], 'o-', color=color,
                 label=key)
  for ax, ylabel in zip(axes, ('training bits/char (smoothed)', 'validation bits/char')):
    ax.set_xlabel('training step')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f'Laurent et al. appendix A: BN inside the tanh-RNN recurrence, char PTB; '
               f'embed {embed_size}, {num_layers}x{hidden_size} tanh RNN, batch '
               f'{batch_size}, T={length}, Adam {learning_rate:g}', fontsize=9)
  fig.tight_layout()
  result = {
      'figure': 'Laurent et al. 2016 appendix A (Fig. 3)',
      'data': data,
      'embed_size': embed_size, 'hidden_size': hidden_size, 'num_layers': num_layers,
      'batch_size': batch_size, 'length': length, 'steps': num_steps,
      'optimizer': f'Adam lr={learning_rate:g}, clip 1',
      'curves': curves,
      'final_valid_bpc': {k: h['eval'][-1]['metric'] for k, h in curves.items()},
      'seconds': time.time() - start,
  }
  common.save_outputs(output_dir, 'laurent_appendix', fig, result)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  paper = common.PAPER_SCALE.value
  # Paper scale: 20 epochs of ~5M characters in windows of 100 at batch 32.
  run(common.OUTPUT_DIR.value, common.PTB_DIR.value, parse_variants(_VARIANTS.value),
      num_steps=31_000 if paper else _STEPS.value, hidden_size=_HIDDEN.value,
      num_layers=_LAYERS.value, embed_size=_EMBED.value, batch_size=_BATCH.value,
      learning_rate=_LR.value, num_evals=40 if paper else _EVALS.value,
      eval_batches=120 if paper else 8, seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
