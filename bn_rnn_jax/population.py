"""The papers' population statistics: minibatch moments averaged over training batches.

Cooijmans et al. (sec. 3) estimate the population statistics after training as the
average, per time step, of the minibatch means and variances over N training batches with
the final parameters: `minibatch_moments` gives one batch's, `average_minibatch_moments`
their average, `estimate_population_stats` both.

A batch is the arguments of one call: a tuple of positional arguments (`(x, mask)`) or a
mapping of keyword arguments (`{'inputs': x, 'seq_lengths': lengths}`). `apply_kwargs`
ask the model for batch statistics without dropout: by default Flax's flags
(`modes.batch_statistics_kwargs`); a module with a flag of its own passes it (`train=True`).
The pass draws the layers' h0 noise as training does, so the statistics are the moments
training normalised with (docs/guide/layers.md).

The estimate checks a batch's concrete mask and lengths as the layer's eager call does,
refuses NaN or inf moments, and warns where its result would otherwise be wrong without
a word: a zero-padded batch with no lengths, thin rows, and sites no batch reached or
supported (count 0, which evaluation refuses). The trainer maps the two pieces over
devices; the NNX estimate (`nnx_bridge`) runs the same batch loop (`records`, `complete`).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import flax_cells
from bn_rnn_jax import modes
from bn_rnn_jax import sequence

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
  """The `MOMENTS` collection one batch's pass gives (batch statistics, no dropout, h0
  noise from `rngs`' 'noise' stream, default `jax.random.key(0)`; the running averages
  untouched): per site `{'mean': [R, F], 'var': [R, F], 'count': [R]}`."""
  return _moments(model, variables, *call_arguments(batch), apply_kwargs, rngs)


def _moments(model, variables, args: tuple, kwargs: dict, apply_kwargs, rngs=None):
  """`minibatch_moments` of the call `(*args, **kwargs)`."""
  rngs = {'noise': jax.random.key(0), **(rngs or {})}
  _, mutated = model.apply(variables, *args, **kwargs, **_mode_kwargs(model, apply_kwargs, kwargs),
                           mutable=[MOMENTS], rngs=rngs)
  return mutated.get(MOMENTS, {})


#: How the estimate combines the minibatch variances of a row (`average_minibatch_moments`).
VARIANCES = ('averaged', 'pooled')


def check_variance(variance: str) -> None:
  if variance not in VARIANCES:
    raise ValueError(f'variance must be one of {VARIANCES}; got {variance!r}.')


def _average_site(site, variance: str):
  """One site's records stacked over N minibatches -> their count-weighted average, the
  variances averaged or pooled (`average_minibatch_moments`)."""
  weights = jnp.maximum(site['count'], 0.0)
  count = jnp.sum(weights, axis=0)
  denom = jnp.maximum(count, 1e-12)[:, None]
  seen = count[:, None] > 0
  mean = jnp.sum(site['mean'] * weights[..., None], axis=0) / denom
  var = jnp.sum(site['var'] * weights[..., None], axis=0) / denom
  if variance == 'pooled':
    spread = jnp.where(weights[..., None] > 0, site['mean'] - mean, 0.0)
    var = var + jnp.sum(spread * spread * weights[..., None], axis=0) / denom
  return {'mean': jnp.where(seen, mean, 0.0), 'var': jnp.where(seen, var, 1.0),
          'count': count}


def average_minibatch_moments(records: Sequence[Any], variance: str = 'averaged') -> Any:
  """The estimate from N records of `minibatch_moments`: per site and row r, over the
  minibatches i that supported it (n_ir sequences, at least `min_step_count`),

    mean_r = sum_i n_ir mean_ir / sum_i n_ir,
    var_r  = sum_i n_ir var_ir / sum_i n_ir                              ('averaged')
    var_r  = sum_i n_ir (var_ir + (mean_ir - mean_r)^2) / sum_i n_ir     ('pooled')

  'averaged' is the papers' average of the minibatch variances (0 on a row one sequence
  reached in every minibatch); 'pooled' is the variance of every sequence the
  minibatches hold at row r (the law of total variance: within plus between minibatches;
  docs/experiments/variable_length.md measures both). `count` is `sum_i n_ir` (rows none
  supported keep mean 0, var 1, count 0)."""
  check_variance(variance)
  if not records:
    raise ValueError('The population estimate needs at least one minibatch record.')
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *records)
  return jax.tree.map(lambda site: _average_site(site, variance), stacked,
                      is_leaf=batch_stats.is_site)


def thin_rows(records: Sequence[Any]) -> list[str]:
  """One line per site whose rows rest on one sequence in every minibatch (variance 0), and
  per site whose rows only minibatches thinner than `min_step_count` reached."""
  lines = []
  for entries in zip(*(sites(record) for record in records)):
    path = entries[0][0]
    counts = np.stack([np.asarray(site['count']) for _, site in entries])     # [N, R]
    supported = (counts > 0).any(axis=0)
    single = np.nonzero(supported & (counts <= 1).all(axis=0))[0]
    if single.size:
      lines.append(f"site '{path}': rows {_ranges(single)} rest on one sequence in every "
                   'batch: their variance is 0; inference reads the steady state there '
                   "where they fall below the layer's min_row_support (the default), and "
                   'divides by sqrt(epsilon) with min_row_support=0. Estimate from larger '
                   'batches (the same sequences joined), or leave such rows out with '
                   'min_step_count=2 on the layer')
    thin = np.nonzero((counts < 0).any(axis=0) & ~supported)[0]
    if thin.size:
      examples = -counts[:, thin][counts[:, thin] < 0]
      last = np.nonzero(supported)[0]
      uses = f'row {last[-1]}' if last.size else 'no supported row'
      low, high = examples.min(), examples.max()
      number = f'{low:g}' if low == high else f'{low:g}-{high:g}'
      lines.append(f"site '{path}': rows {_ranges(thin)} rest on {number} sequence(s) per "
                   "batch, fewer than the layer's min_step_count; inference uses "
                   f'{uses} there')
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
  """What looks like padding in a batch with no lengths or mask, or None: a float
  `x [batch, time, features]`, beside no `[batch]` or `[batch, time]` array, whose rows
  end in all-zero frames of different lengths with none before (concrete arrays only)."""
  leaves = [leaf for leaf in jax.tree.leaves(call_arguments(batch))
            if hasattr(leaf, 'shape') and not isinstance(leaf, jax.core.Tracer)]
  for x in leaves:
    if np.ndim(x) == 3 and not any(np.shape(leaf) in (x.shape[:1], x.shape[:2])
                                   for leaf in leaves):
      found = sequence.trailing_zero_padding(x)
      if found:
        return found
  return None


def check_concrete_batch(module, args: tuple, kwargs: dict, where: str) -> None:
  """The layer's checks of a concrete `mask` and `seq_lengths` (`module.__call__`'s
  arguments of those names) on one batch before the estimate traces it: the layer's
  one-line ValueError, after `where`."""
  try:
    bound = inspect.signature(module.__call__).bind_partial(*args, **kwargs).arguments
  except (TypeError, ValueError):
    return
  mask, lengths = bound.get('mask'), bound.get('seq_lengths')
  inputs = bound.get('inputs', args[0] if args else None)
  try:
    if mask is not None:
      check = sequence.check_mask_prefix if np.ndim(mask) == 2 else sequence.check_mask_values
      check(mask)
    if lengths is not None and np.ndim(inputs) >= 2:
      time_major = bound.get('time_major')
      if time_major is None:
        time_major = getattr(module, 'time_major', False)
      shape = np.shape(inputs)
      batch_shape, length = (shape[1:-1], shape[0]) if time_major else (shape[:-2], shape[-2])
      flax_cells.check_seq_lengths(lengths, batch_shape, length)
  except ValueError as e:
    raise ValueError(f'{where}: {e}') from None


def sites(tree) -> list[tuple[str, Any]]:
  """`[(path, site)]` of the sites (`batch_stats.is_site`) of a `batch_stats` or `MOMENTS`
  tree."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=batch_stats.is_site)[0]
  return [('/'.join(str(getattr(key, 'key', key)) for key in path), node)
          for path, node in leaves if batch_stats.is_site(node)]


def nonfinite_moments(records: Sequence[Any]) -> Optional[str]:
  """`batch i gives non-finite moments at site 'p' (rows r)` for the first record holding
  NaN or inf, or None."""
  for i, record in enumerate(jax.device_get(list(records))):
    found = []   # (first bad row, path, bad rows): the earliest row is where NaN entered
    for path, site in sites(record):
      bad = np.nonzero(~(np.isfinite(site['mean']).all(-1) & np.isfinite(site['var']).all(-1)))[0]
      if bad.size:
        found.append((int(bad[0]), path, bad))
    if found:
      _, path, bad = min(found, key=lambda entry: entry[:2])
      return f"batch {i} gives non-finite moments at site '{path}' (rows {_ranges(bad)})"
  return None


def with_every_site(estimate, stats_tree) -> tuple[Any, list[str]]:
  """`estimate` with the sites of `stats_tree` it lacks as fresh statistics (which
  evaluation refuses), and their paths."""
  missing = []
  def visit(estimate, node, path):
    if batch_stats.is_site(node):
      if estimate is None:
        missing.append('/'.join(path))
        return {'mean': jnp.zeros_like(node['mean']), 'var': jnp.ones_like(node['var']),
                'count': jnp.zeros_like(node['count'])}
      return estimate
    estimate = {} if estimate is None else dict(estimate)
    for key, value in node.items():
      estimate[key] = visit(estimate.get(key), value, path + (str(key),))
    return estimate
  return visit(estimate, stats_tree, ()), missing


_FUNCTION = 'estimate_population_stats'


def records(batches, module, record) -> list:
  """`record(i, args, kwargs)` (one batch's `MOMENTS`) for each batch, after the
  concrete checks (`check_concrete_batch` of `module`'s call); warns of a batch that
  looks padded and passes no lengths, and of thin rows; refuses no batch, and NaN or inf
  moments, in one line."""
  found, padded = [], None
  for i, batch in enumerate(batches):
    args, kwargs = call_arguments(batch)
    check_concrete_batch(module, args, kwargs, f'{_FUNCTION}: batch {i}')
    padded = padded or padding_without_lengths(batch)
    found.append(record(i, args, kwargs))
  if not found:
    raise ValueError(f'{_FUNCTION} needs at least one batch.')
  nonfinite = nonfinite_moments(found)
  if nonfinite:
    raise ValueError(f'{_FUNCTION}: {nonfinite}: the batch\'s inputs at valid steps, or the '
                     'parameters, hold NaN or inf, and the estimate would be NaN there.')
  if padded:
    warnings.warn(f'{_FUNCTION}: a batch passes {padded}; the padding would count in the '
                  'statistics as data. Pass the lengths or mask the model trains with, e.g. '
                  "(x, mask) or {'inputs': x, 'seq_lengths': lengths}.", stacklevel=3)
  for line in thin_rows(found):
    warnings.warn(f'{_FUNCTION}: {line}.', stacklevel=3)
  return found


def complete(estimates) -> list:
  """Warn of the sites no batch reached and those no batch supported in any row: given
  `(prefix, estimate of the sites, their model's batch_stats)` per model part, returns
  the estimates holding every site (count 0 where none)."""
  unreached, empty, done = [], [], []
  for prefix, estimate, stats_tree in estimates:
    estimate, missing = with_every_site(estimate, stats_tree)
    name = lambda site: f'{prefix}/{site}' if prefix else site
    unreached += [name(site) for site in missing]
    empty += [name(site) for site in batch_stats.untrained_sites(estimate)
              if site not in missing]
    done.append(estimate)
  if unreached:
    sites_text = ', '.join(map(repr, unreached))
    warnings.warn(f'{_FUNCTION}: no batch reached site(s) {sites_text} (count 0 in every '
                  'row); evaluation with the estimate refuses them until a batch that runs '
                  'them is estimated.', stacklevel=3)
  if empty:
    sites_text = ', '.join(map(repr, empty))
    warnings.warn(f'{_FUNCTION}: the batches give site(s) {sites_text} no supported row '
                  '(count 0 in every row: the batches are empty, all padding, or thinner '
                  'than the layer\'s min_step_count); evaluation with the estimate refuses '
                  'them until batches with valid steps are estimated.', stacklevel=3)
  return done


@functools.partial(jax.jit, static_argnums=(0, 4))
def _minibatch_moments_jit(model, variables, args, kwargs, apply_kwargs, noise_key):
  return _moments(model, variables, args, kwargs, dict(apply_kwargs), {'noise': noise_key})


_average_jit = jax.jit(average_minibatch_moments, static_argnames='variance')


def estimate_population_stats(model: nn.Module, variables, batches, *, rng=None,
                              variance: str = 'averaged', **apply_kwargs):
  """The papers' population statistics of `model` (a layer, stack, model, or module of
  your own holding the library's layers or cells) on one device, from `batches` of
  training data (see the module docstring), compiled once per model, keywords and batch
  shape. Batch i draws its h0 noise from `jax.random.fold_in(rng, i)` (default key 0).
  `variance`: how each row's minibatch variances combine (`average_minibatch_moments`:
  'averaged', the papers', or 'pooled').

  Returns a `batch_stats` tree holding every site of `variables['batch_stats']`, to
  evaluate with (`{**variables, 'batch_stats': result}`).

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
      raise ValueError(f'{_FUNCTION} compiles once per model and keywords, so the {what} '
                       f'must be hashable; {name} is not ({e}): give them as tuples or '
                       'frozen dataclasses, not lists or dicts.') from None
  check_variance(variance)
  rng = jax.random.key(0) if rng is None else rng
  found = records(batches, model, lambda i, args, kwargs: _minibatch_moments_jit(
      model, variables, args, kwargs, mode, jax.random.fold_in(rng, i)))
  (estimate,) = complete([('', _average_jit(tuple(found), variance=variance),
                           variables.get('batch_stats', {}))])
  return estimate
