"""The papers' population statistics: minibatch moments averaged over training batches.

Cooijmans et al. (sec. 3) estimate the population statistics after training as the
average, per time step, of the minibatch means and variances over N training batches,
computed with the final parameters. This module is that estimate, in two pieces and one
entry point:

  minibatch_moments(model, variables, args, rngs)   one batch's moments, per site and step
  average_minibatch_moments(records)                their average over N batches
  estimate_population_stats(model, variables, batches)   both, on one device

The trainer maps the two pieces over devices (`train.minibatch_moments_step`); notebooks,
your own loops and the figure scripts call `estimate_population_stats`. Either way the
result is a `batch_stats` tree to evaluate with (`use_running_average=True`).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import modes

MOMENTS = batch_stats.MOMENTS


def minibatch_moments(model: nn.Module, variables, args: tuple, rngs=None) -> Any:
  """The per-step moments one training batch gives every batch-normalised site.

  Runs the network as inference runs it but with batch statistics
  (`model.apply(variables, *args, use_running_average=False, deterministic=True)`: no
  dropout, h0 zeros), with the `MOMENTS` collection mutable (the running averages are
  left alone), and returns that collection: per site `{'mean': [R, F], 'var': [R, F],
  'count': [R]}`, count the valid sequences behind each row this batch reached. A module
  of your own whose call takes `train` but not Flax's two flags runs with `train=True`.
  `rngs`: for a model that draws randomness even so; the library's models draw none.
  """
  _, mutated = model.apply(variables, *args, **_batch_statistics_kwargs(model),
                           mutable=[MOMENTS], rngs=rngs)
  return mutated.get(MOMENTS, {})


def _batch_statistics_kwargs(model: nn.Module) -> dict[str, bool]:
  """How to ask `model` for batch statistics without noise: Flax's two flags where its
  call takes them (every module of this library), else `train=True` (a module of your
  own that takes only `train`: its dropout and noise then run as in training)."""
  parameters = inspect.signature(type(model).__call__).parameters
  takes_flags = all(name in parameters for name in ('use_running_average', 'deterministic'))
  takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
  if takes_flags or (takes_any and 'train' not in parameters):
    return modes.BATCH_STATISTICS.kwargs()
  return {'train': True}


def _is_site(node) -> bool:
  return isinstance(node, dict) and set(node) == {'mean', 'var', 'count'}


def _average_site(site):
  """One site's records stacked on a leading axis of N minibatches -> their average,
  each minibatch's row weighted by its valid count (`normalization.record_weights`)."""
  weights = jnp.maximum(site['count'], 0.0)
  count = jnp.sum(weights, axis=0)
  denom = jnp.maximum(count, 1e-12)[:, None]
  seen = count[:, None] > 0
  mean = jnp.sum(site['mean'] * weights[..., None], axis=0) / denom
  var = jnp.sum(site['var'] * weights[..., None], axis=0) / denom
  return {'mean': jnp.where(seen, mean, 0.0), 'var': jnp.where(seen, var, 1.0),
          'count': count}


def average_minibatch_moments(records: Sequence[Any]) -> Any:
  """The population estimate from N records of `minibatch_moments`.

  Per site and row r, over the minibatches i that reached it with at least the layer's
  `min_step_count` examples (n_ir of them):

    mean_r = sum_i n_ir mean_ir / sum_i n_ir,   var_r = sum_i n_ir var_ir / sum_i n_ir,

  the papers' average of minibatch means and variances (Cooijmans et al. sec. 3) when
  every minibatch has the same count, and weighted by what each saw when lengths are
  uneven. `count` is `sum_i n_ir`. Rows no minibatch supported keep mean 0, var 1, and
  inference reads the nearest supported row instead (`batch_stats.population_rows`).
  The records are stacked here, so that one compiled program (jit or a device map of
  this function) does the whole estimate.
  """
  if not records:
    raise ValueError('The population estimate needs at least one minibatch record.')
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *records)
  return jax.tree.map(_average_site, stacked, is_leaf=_is_site)


def thin_rows(records: Sequence[Any]) -> list[str]:
  """One line per site whose rows rest on one sequence in every minibatch (a variance of
  0), and one per site whose rows some minibatch reached with too few sequences (the
  layer's `min_statistics_count` or `min_step_count`) and none supported: which rows,
  and how many sequences they rested on. Inference normalises those steps with the
  nearest supported row."""
  lines = []
  def visit(nodes, path):
    if _is_site(nodes[0]):
      counts = np.stack([np.asarray(n['count']) for n in nodes])          # [N, R]
      supported = (counts > 0).any(axis=0)
      single = np.nonzero(supported & (counts <= 1).all(axis=0))[0]
      if single.size:
        lines.append(f"site '{'/'.join(path)}': rows {_ranges(single)} rest on one "
                     'sequence in every batch: their variance is 0 (inference divides by '
                     'sqrt(epsilon) there); min_statistics_count=2 uses the last row two '
                     'sequences supported instead')
      thin = np.nonzero((counts < 0).any(axis=0) & ~supported)[0]
      if thin.size:
        examples = -counts[:, thin][counts[:, thin] < 0]
        last = np.nonzero(supported)[0]
        uses = f'row {last[-1]}' if last.size else 'no supported row'
        low, high = examples.min(), examples.max()
        number = f'{low:g}' if low == high else f'{low:g}-{high:g}'
        lines.append(f"site '{'/'.join(path)}': rows {_ranges(thin)} rest on {number} "
                     'sequence(s) per batch, fewer than the layer\'s min_statistics_count; '
                     f'inference uses {uses} there')
      return
    for key in nodes[0]:
      visit([n[key] for n in nodes], path + (str(key),))
  if records:
    visit(list(records), ())
  return lines


def _ranges(rows) -> str:
  """`[3, 4, 5, 9]` -> `'3-5, 9'`."""
  parts, start = [], rows[0]
  for previous, row in zip(rows, list(rows[1:]) + [None]):
    if row is None or row != previous + 1:
      parts.append(f'{start}' if start == previous else f'{start}-{previous}')
      start = row
  return ', '.join(parts)


@functools.partial(jax.jit, static_argnums=(0,))
def _minibatch_moments_jit(model, variables, args):
  return minibatch_moments(model, variables, args)


_average_jit = jax.jit(average_minibatch_moments)


def estimate_population_stats(model: nn.Module, variables, batches):
  """The papers' population statistics of `model` on one device.

  Runs `model` on each batch with batch statistics and the current parameters, but
  otherwise as inference runs it (no dropout, h0 zeros: `minibatch_moments`), and
  averages the moments each step's row received. Compiled once per model and batch
  shape.

  The batches need not be of the training size: larger ones estimate the statistics of
  sites downstream of other normalised terms (the cell, upper layers) for the
  population-mode network better (on 784-step MNIST early in training, 2 batches of
  1,000 gave a better validation accuracy than 10 batches of 100;
  `experiments/analysis/estimate_batch_size.py`).

  Args:
    model: a module built from `RecurrentLayer` layers (a layer, a stack or a model).
    variables: its `{'params', 'batch_stats'}`.
    batches: iterable of argument tuples, e.g. `[(x, mask), ...]` of training data.

  Returns:
    A `batch_stats` tree to evaluate with: `{**variables, 'batch_stats': result}`.

  Example:
    >>> import bn_rnn_jax as br
    >>> layer = br.make_layer('bn_lstm', 4, max_length=5)
    >>> batches = [(jnp.full((3, 5, 2), float(i)),) for i in range(4)]   # [batch, time, 2]
    >>> variables = layer.init(jax.random.key(0), *batches[0], use_running_average=True,
    ...                        deterministic=True)
    >>> stats = br.estimate_population_stats(layer, variables, batches)
    >>> outputs = layer.apply({**variables, 'batch_stats': stats}, *batches[0],
    ...                       use_running_average=True, deterministic=True)
    >>> stats['cell']['mean'].shape, outputs.shape
    ((5, 4), (3, 5, 4))
  """
  try:
    hash(model)
  except TypeError as e:
    raise ValueError(f'estimate_population_stats compiles once per model, so the model '
                     f'must be hashable; {type(model).__name__} is not ({e}): give its '
                     'fields as tuples or frozen dataclasses, not lists or dicts.') from None
  records = [_minibatch_moments_jit(model, variables, tuple(args)) for args in batches]
  if not records:
    raise ValueError('estimate_population_stats needs at least one batch.')
  for line in thin_rows(records):
    warnings.warn(f'estimate_population_stats: {line}.', stacklevel=2)
  return _average_jit(tuple(records))
