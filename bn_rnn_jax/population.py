"""The papers' population statistics: minibatch moments averaged over training batches.

Cooijmans et al. (sec. 3) estimate the population statistics after training as the
average, per time step, of the minibatch means and variances over N training batches,
computed with the final parameters. This module is that estimate, in two pieces and one
entry point:

  minibatch_moments(model, variables, batch, rngs, **apply_kwargs)
                                                    one batch's moments, per site and step
  average_minibatch_moments(records)                their average over N batches
  estimate_population_stats(model, variables, batches, rng=, **apply_kwargs)
                                                    both, on one device

A batch is the arguments of one call of the model: a tuple of positional arguments
(`(x, mask)`) or a mapping of keyword arguments (`{'inputs': x, 'seq_lengths':
lengths}`, for a call whose lengths are keyword-only such as `RNN`'s). `apply_kwargs`
are the keywords that ask the model for batch statistics without dropout:
Flax's two flags `use_running_average=False, deterministic=True`
(`modes.BATCH_STATISTICS`) unless given; a module of your own with a flag of its own
passes that instead (`train=True`). Layers with `initial_state='noise'` draw their h0
noise in the estimate's pass as in training (from the 'noise' stream of `rngs`, by
default keys of `jax.random.key(0)`): population statistics are the moments training
normalised with, and on inputs that are constant across examples for many steps (the
black rows of in-order MNIST) the noise-free moments are round-off, which inference
would divide by sqrt(epsilon) (`docs/experiments/figures.md`). The estimate warns where
its result would otherwise be wrong without a word: a batch that looks zero-padded and
passes no lengths or mask (`padding_without_lengths`), a site no batch reached (returned
with count 0, which evaluation refuses).

The trainer maps the two pieces over devices (`train.minibatch_moments_step`); notebooks,
your own loops and the figure scripts call `estimate_population_stats`. Either way the
result is a `batch_stats` tree to evaluate with (`use_running_average=True`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import modes

MOMENTS = batch_stats.MOMENTS


def call_arguments(batch) -> tuple[tuple, dict]:
  """`(args, kwargs)` of one batch: a tuple (or list) of positional arguments, or a
  mapping of keyword arguments; anything else is a one-line TypeError."""
  if isinstance(batch, Mapping):
    return (), dict(batch)
  if isinstance(batch, (tuple, list)):
    return tuple(batch), {}
  raise TypeError('A batch is a tuple of positional arguments or a mapping of keyword '
                  f'arguments of the model\'s call, e.g. (x, mask); got {type(batch).__name__}'
                  f'{f" of shape {batch.shape}" if hasattr(batch, "shape") else ""}.')


def _mode_kwargs(model, apply_kwargs: Mapping[str, Any], batch_kwargs: Mapping[str, Any]
                 ) -> dict[str, Any]:
  """The keywords that ask for batch statistics (`apply_kwargs`, default Flax's flags:
  `modes.batch_statistics_kwargs`), which a batch's keywords must not repeat."""
  mode = dict(apply_kwargs) or modes.batch_statistics_kwargs(model)
  both = sorted(set(mode) & set(batch_kwargs))
  if both:
    raise ValueError(f'The batch passes {", ".join(map(repr, both))}, which the estimate '
                     f'sets itself ({mode}); leave it out of the batch.')
  return mode


def minibatch_moments(model: nn.Module, variables, batch, rngs=None, **apply_kwargs) -> Any:
  """The per-step moments one training batch gives every batch-normalised site.

  Runs the network with batch statistics as training runs it but without dropout
  (`model.apply(variables, *args, **kwargs, use_running_average=False,
  deterministic=True)`; h0 noise where a layer has it, as in training), with the
  `MOMENTS` collection mutable (the running averages are left alone), and returns that
  collection: per site `{'mean': [R, F], 'var': [R, F], 'count': [R]}`, count the valid
  sequences behind each row this batch reached.

  Args:
    model: the module.
    variables: its `{'params', 'batch_stats'}`.
    batch: the call's arguments, a tuple of positional arguments or a mapping of
      keyword arguments (`call_arguments`).
    rngs: the model's random streams; its 'noise' stream (h0 noise) defaults to
      `jax.random.key(0)`.
    **apply_kwargs: keywords that ask `model` for batch statistics, in place of Flax's
      two flags (`modes.BATCH_STATISTICS`), e.g. `train=True` for a module of your own
      whose `train` sets its cells' `use_running_average` (what else that flag turns
      on, such as dropout, runs too).
  """
  return _moments(model, variables, *call_arguments(batch), apply_kwargs, rngs)


def _moments(model, variables, args: tuple, kwargs: dict, apply_kwargs, rngs=None):
  """`minibatch_moments` of the call `(*args, **kwargs)`."""
  rngs = {'noise': jax.random.key(0), **(rngs or {})}
  _, mutated = model.apply(variables, *args, **kwargs, **_mode_kwargs(model, apply_kwargs, kwargs),
                           mutable=[MOMENTS], rngs=rngs)
  return mutated.get(MOMENTS, {})


def is_site(node) -> bool:
  """Whether `node` of a `batch_stats` (or `MOMENTS`) tree is one site's statistics,
  `{'mean', 'var', 'count'}`: the `is_leaf` of a `jax.tree.map` over sites."""
  return isinstance(node, Mapping) and set(node) == {'mean', 'var', 'count'}


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
  return jax.tree.map(_average_site, stacked, is_leaf=is_site)


def thin_rows(records: Sequence[Any]) -> list[str]:
  """One line per site whose rows rest on one sequence in every minibatch (a variance of
  0), and one per site whose rows some minibatch reached with too few sequences (the
  layer's `min_step_count`) and none supported: which rows,
  and how many sequences they rested on. Inference normalises those steps with the
  nearest supported row."""
  lines = []
  def visit(nodes, path):
    if is_site(nodes[0]):
      counts = np.stack([np.asarray(n['count']) for n in nodes])          # [N, R]
      supported = (counts > 0).any(axis=0)
      single = np.nonzero(supported & (counts <= 1).all(axis=0))[0]
      if single.size:
        lines.append(f"site '{'/'.join(path)}': rows {_ranges(single)} rest on one "
                     'sequence in every batch: their variance is 0; inference reads the '
                     "steady state there where they fall below the layer's min_row_support "
                     '(the default), and divides by sqrt(epsilon) with min_row_support=0')
      thin = np.nonzero((counts < 0).any(axis=0) & ~supported)[0]
      if thin.size:
        examples = -counts[:, thin][counts[:, thin] < 0]
        last = np.nonzero(supported)[0]
        uses = f'row {last[-1]}' if last.size else 'no supported row'
        low, high = examples.min(), examples.max()
        number = f'{low:g}' if low == high else f'{low:g}-{high:g}'
        lines.append(f"site '{'/'.join(path)}': rows {_ranges(thin)} rest on {number} "
                     'sequence(s) per batch, fewer than the layer\'s min_step_count; '
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


def padding_without_lengths(batch) -> Optional[str]:
  """What looks like padding in a batch that passes no lengths or mask, or None.

  A float input `x [batch, time, features]` beside no array of shape `[batch]` (lengths)
  or `[batch, time]` (a mask) looks padded when its rows end in runs of all-zero frames
  of different lengths and no all-zero frame occurs before a row's run (zero frames only
  at the ends, as padding puts them; zeros that are data, such as a background pixel,
  occur elsewhere too). Checked on the host, on concrete arrays only; padding that is
  not zeros cannot be told from data.
  """
  leaves = [leaf for leaf in jax.tree.leaves(call_arguments(batch))
            if hasattr(leaf, 'shape') and not isinstance(leaf, jax.core.Tracer)]
  for x in leaves:
    if np.ndim(x) != 3 or not jnp.issubdtype(x.dtype, jnp.floating):
      continue
    rows, length = x.shape[:2]
    if any(np.shape(leaf) in ((rows,), (rows, length)) for leaf in leaves):
      continue
    zero = ~np.asarray(x).any(axis=-1)                                    # [B, T]
    run = np.cumprod(zero[:, ::-1], axis=1).sum(axis=1)                   # trailing zeros
    inside = zero & (np.arange(length)[None, :] < (length - run)[:, None])
    if np.unique(run).size > 1 and not inside.any():
      short, full = int(np.argmax(run)), int(np.argmin(run))
      return (f'inputs {tuple(x.shape)} with no lengths or mask, whose rows end in '
              f'different numbers of all-zero frames (row {short} in {run[short]}, row '
              f'{full} in {run[full]}), as padding does')
  return None


def padding_warning(function: str, batch) -> Optional[str]:
  """The one-line warning `function` gives for a batch that looks padded and passes no
  lengths (`padding_without_lengths`), or None."""
  found = padding_without_lengths(batch)
  if found is None:
    return None
  return (f'{function}: a batch passes {found}; the padding would count in the '
          'statistics as data. Pass the lengths or mask the model trains with, e.g. '
          "(x, mask) or {'inputs': x, 'seq_lengths': lengths}.")


def _fresh_site(site):
  """Statistics no batch reached, shaped as `site`: mean 0, var 1, count 0."""
  return {'mean': jnp.zeros_like(site['mean']), 'var': jnp.ones_like(site['var']),
          'count': jnp.zeros_like(site['count'])}


def with_every_site(estimate, stats_tree) -> tuple[Any, list[str]]:
  """`estimate` with every site of `stats_tree` (the model's `batch_stats`) that it
  lacks, as statistics no batch reached (`_fresh_site`), so that evaluation refuses
  them (`batch_stats._check_trained`) rather than find them missing; and those sites'
  paths."""
  missing = []
  def visit(estimate, node, path):
    if is_site(node):
      if estimate is None:
        missing.append('/'.join(path))
        return _fresh_site(node)
      return estimate
    estimate = {} if estimate is None else dict(estimate)
    for key, value in node.items():
      estimate[key] = visit(estimate.get(key), value, path + (str(key),))
    return estimate
  return visit(estimate, stats_tree, ()), missing


def unreached_warning(function: str, missing: Sequence[str]) -> str:
  """The one-line warning `function` gives for the sites (paths) no batch reached."""
  sites = ', '.join(repr(path) for path in missing)
  return (f'{function}: no batch reached site(s) {sites} (count 0 in every row); '
          'evaluation with the estimate refuses them until a batch that runs them is '
          'estimated.')


@functools.partial(jax.jit, static_argnums=(0, 4))
def _minibatch_moments_jit(model, variables, args, kwargs, apply_kwargs, noise_key):
  return _moments(model, variables, args, kwargs, dict(apply_kwargs), {'noise': noise_key})


_average_jit = jax.jit(average_minibatch_moments)


def estimate_population_stats(model: nn.Module, variables, batches, *, rng=None,
                              **apply_kwargs):
  """The papers' population statistics of `model` on one device.

  Runs `model` on each batch with batch statistics and the current parameters, as
  training runs it but without dropout (h0 noise where a layer has it:
  `minibatch_moments`), and averages the moments each step's row received. Compiled
  once per model, keywords and batch shape.

  The batches need not be of the training size: larger ones estimate the statistics of
  sites downstream of other normalised terms (the cell, upper layers) for the
  population-mode network better (`experiments/analysis/estimate_batch_size.py`).

  Args:
    model: a module built from `RecurrentLayer` layers (a layer, a stack, a model, or a
      module of your own with the library's cells or layers).
    variables: its `{'params', 'batch_stats'}`.
    batches: iterable of batches of training data, each the arguments of one call: a
      tuple of positional arguments (`(x, mask)`) or a mapping of keyword arguments
      (`{'inputs': x, 'seq_lengths': lengths}`). Give them the lengths or mask the model
      trains with: a batch whose inputs look zero-padded and that passes neither warns
      (`padding_without_lengths`).
    rng: the key of the h0 noise (default `jax.random.key(0)`); batch i draws from
      `jax.random.fold_in(rng, i)`.
    **apply_kwargs: keywords that ask `model` for batch statistics without dropout;
      default Flax's two flags, `use_running_average=False, deterministic=True`.
      A module of your own with a flag of its own passes it here, e.g. `train=True`.

  Returns:
    A `batch_stats` tree to evaluate with: `{**variables, 'batch_stats': result}`. It
    holds every site of `variables['batch_stats']`; a site no batch reached has count 0
    (a warning names it) and evaluation refuses it.

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
  mode = tuple(sorted(apply_kwargs.items()))
  for what, value, name in (('model', model, type(model).__name__),
                            ('keywords', mode, f'{dict(mode)}')):
    try:
      hash(value)
    except TypeError as e:
      raise ValueError(f'estimate_population_stats compiles once per model and keywords, '
                       f'so the {what} must be hashable; {name} is not ({e}): give them as '
                       'tuples or frozen dataclasses, not lists or dicts.') from None
  rng = jax.random.key(0) if rng is None else rng
  records, padded = [], None
  for i, batch in enumerate(batches):
    args, kwargs = call_arguments(batch)
    padded = padded or padding_warning('estimate_population_stats', batch)
    records.append(_minibatch_moments_jit(model, variables, args, kwargs, mode,
                                          jax.random.fold_in(rng, i)))
  if not records:
    raise ValueError('estimate_population_stats needs at least one batch.')
  if padded:
    warnings.warn(padded, stacklevel=2)
  for line in thin_rows(records):
    warnings.warn(f'estimate_population_stats: {line}.', stacklevel=2)
  estimate, missing = with_every_site(_average_jit(tuple(records)),
                                      variables.get('batch_stats', {}))
  if missing:
    warnings.warn(unreached_warning('estimate_population_stats', missing), stacklevel=2)
  return estimate
