"""The variable-length task of the length studies: x_t ~ N(0, 1) for t < L, L uniform in
a length range; the label is whether the valid inputs sum to more than 0. Its models (a
two-class `SequenceClassifier`), their training (Adam, gradients clipped at 1, batches of
lengths 5-50: T_max = 50), their accuracy on fresh sequences per length range, and the
summaries over seeds that the studies' tables print."""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np
import optax

import bn_rnn_jax as br
from bn_rnn_jax import population

TRAIN_LENGTHS = (5, 50)
TEST_LENGTHS = ((5, 50), (51, 100), (101, 200))
TEST_EXAMPLES = 1000
HIDDEN = 32
BATCH = 64
#: Adam's learning rate unless an arm says otherwise.
LEARNING_RATE = 3e-3


def batch(rng: np.random.Generator, size: int, lengths: tuple[int, int], width: int,
          bucketed: bool = False):
  """`(x [size, width, 1], mask [size, width], labels [size])`: lengths uniform in
  `lengths`, one per sequence, or one for the whole batch when `bucketed`."""
  length = rng.integers(lengths[0], lengths[1] + 1, 1 if bucketed else size)
  mask = (np.arange(width)[None] < np.broadcast_to(length, (size,))[:, None]).astype(
      np.float32)
  x = rng.normal(size=(size, width, 1)).astype(np.float32) * mask[..., None]
  return x, mask, (x.sum(axis=(1, 2)) > 0).astype(np.int32)


def classifier(variant: str, hidden: int, max_length: int,
               fields: Optional[dict] = None) -> br.SequenceClassifier:
  """The task's model: a two-class `SequenceClassifier` of `variant` with `max_length`
  rows of per-step statistics and any other layer `fields`."""
  return br.SequenceClassifier(2, br.make_layer(variant, hidden, max_length=max_length,
                                               **(fields or {})))


def train_arm(variant: str, fields: dict, seed: int, steps: int, hidden: int,
              batch_size: int, optimizer=None, track=None, bucketed: bool = False):
  """A trained `(model, variables, rng)`; `optimizer` an optax transformation (default
  Adam at `LEARNING_RATE`), clipped at global norm 1; `bucketed`: one length per training
  batch; `rng` continues the training draws. `track`: `(init(batch_stats) -> tracked,
  update(tracked, minibatch moments) -> tracked)`, statistics of one's own kept from
  every training step's minibatch moments, returned as `variables['tracked']`."""
  width = TRAIN_LENGTHS[1]
  model = classifier(variant, hidden, width, fields)
  rng = np.random.default_rng(seed)
  x, mask, _ = batch(rng, batch_size, TRAIN_LENGTHS, width, bucketed)
  variables = model.init(jax.random.key(seed), x, mask, use_running_average=True,
                         deterministic=True)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer or optax.adam(LEARNING_RATE))
  params, stats = variables['params'], variables.get('batch_stats', {})
  opt_state = tx.init(params)
  init, update = track or (lambda stats: {}, lambda tracked, moments: tracked)
  tracked = init(stats)

  @jax.jit
  def step(params, stats, tracked, opt_state, x, mask, labels):
    def loss_fn(p):
      logits, mutated = model.apply({'params': p, 'batch_stats': stats}, x, mask,
                                    use_running_average=False, deterministic=False,
                                    mutable=['batch_stats', population.MOMENTS])
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      return loss, mutated
    (_, mutated), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    tracked = update(tracked, mutated.get(population.MOMENTS, {}))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), mutated.get('batch_stats', stats),
            tracked, opt_state)

  for _ in range(steps):
    x, mask, labels = batch(rng, batch_size, TRAIN_LENGTHS, width, bucketed)
    params, stats, tracked, opt_state = step(params, stats, tracked, opt_state, x, mask,
                                             labels)
  variables = {'params': params, 'batch_stats': stats}
  return model, {**variables, 'tracked': tracked} if track else variables, rng


def accuracy(model, variables, rng, lengths, batch_statistics: bool = False) -> float:
  """Accuracy on `TEST_EXAMPLES` fresh sequences of `lengths`, with population
  statistics, or with the test batch's own (`batch_statistics`: up to T_max only)."""
  x, mask, labels = batch(rng, TEST_EXAMPLES, lengths, lengths[1])
  if batch_statistics:
    logits, _ = model.apply(variables, x, mask, use_running_average=False,
                            deterministic=True, mutable=['batch_stats'])
  else:
    logits = model.apply(variables, x, mask, use_running_average=True, deterministic=True)
  return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def by_range(model, variables, seed: int) -> dict[str, float]:
  """`{'lo-hi': accuracy}` on every range of `TEST_LENGTHS`, the same test sequences for
  every arm of a seed."""
  test_rng = np.random.default_rng(1000 + seed)
  return {f'{lo}-{hi}': accuracy(model, variables, test_rng, (lo, hi))
          for lo, hi in TEST_LENGTHS}


def summary(results: dict) -> dict:
  """`{arm: {length range: {mean, min, max, sd}}}` over the seeds of `results`
  (`{arm: {seed: {length range: accuracy}}}`); sd with ddof 1 (0 for one seed)."""
  out = {}
  for arm, by_seed in results.items():
    out[arm] = {}
    for length_range in next(iter(by_seed.values())):
      values = [scores[length_range] for scores in by_seed.values()]
      out[arm][length_range] = {
          'mean': float(np.mean(values)), 'min': float(np.min(values)),
          'max': float(np.max(values)),
          'sd': float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
  return out


def paired_difference(by_seed: dict, partner: dict) -> dict:
  """`{length range: {mean, se, wins, seeds}}`: `by_seed` minus `partner` (each `{seed:
  {length range: accuracy}}`), seed by seed over the seeds both have: the mean difference,
  its standard error (sd / sqrt(seeds), 0 for one seed) and the seeds where `by_seed`
  scores at least `partner`'s."""
  seeds = [s for s in by_seed if s in partner]
  out = {}
  for length_range in by_seed[seeds[0]]:
    d = np.array([by_seed[s][length_range] - partner[s][length_range] for s in seeds])
    out[length_range] = {
        'mean': float(d.mean()),
        'se': float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0,
        'wins': int(np.sum(d >= 0)), 'seeds': len(d)}
  return out


def ranges(result: dict) -> list[str]:
  """The test length ranges of a study's result, as its tables name them."""
  return [f'{lo}-{hi}' for lo, hi in result['setup']['test_lengths']]


def mean_sd(stats: Optional[dict]) -> str:
  """A table cell: 'mean ± sd' of a `summary` entry, '–' without one."""
  return f"{stats['mean']:.3f} ± {stats['sd']:.3f}" if stats else '–'
