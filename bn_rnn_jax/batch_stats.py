"""Normalisation sites and their statistics in the Flax `batch_stats` collection.

A *site* is one normalised term (a recurrent layer's `'recurrent'`, `'input'` and
`'cell'` terms; a `MaskedBatchNorm`). Its population statistics are one `batch_stats`
entry `{'mean': [R, F], 'var': [R, F], 'count': [R]}`: R rows, one per time step (R =
`max_length`, T_max) or a single row shared over time. `count[t]` is the number of
training minibatches that reached row t.

`statistics` names how a layer's sites keep them (one vocabulary for every module):

  'per_step'  every site per step (Cooijmans et al.; Laurent's frame-wise)
  'sequence'  the input term W_x x: one row over batch and valid steps (Laurent eq.
              20-21); the recurrent term and the cell per step
  'shared'    the input term as 'sequence'; the recurrent term and the cell: per-step
              batch moments in training, one population row (Cooijmans' ablation)

In training a site normalises with the minibatch's moments and folds them into a running
average (`momentum`; a row's first update takes the batch value). When the collection
`MOMENTS` is mutable, it also writes this minibatch's moments there, in the same layout:
averaging those over N training batches is the papers' population estimate
(`population.estimate_population_stats`). In inference step t reads row
`min(t, last row seen in training)`, so sequences longer than any trained one reuse the
statistics of the longest (Cooijmans et al. sec. 3).

Misuse is an error, as in `flax.linen.BatchNorm` (`site_variable` checks both, for every
site of every module):

  batch statistics (`use_running_average=False`): outside `init`, one of
               `batch_stats` (training) or `MOMENTS` (the papers' estimate pass,
               `population.minibatch_moments`) must be mutable; else the pass would
               update nothing. To use batch statistics and keep none, pass
               `mutable=['batch_stats']` and drop the update.
  population statistics (`use_running_average=True`): a site whose statistics no
               training batch reached (`count` 0 in every row) would normalise with
               mean 0, variance 1. Checked at once when the statistics are concrete
               values (an eager `apply`, or variables closed over by a jitted
               function), and when the computation runs when they are traced (variables
               passed to `jax.jit`, `pmap` or `nnx.jit`: a `jax.errors.JaxRuntimeError`
               carrying the message; `sequence.check_when_run`).
               `untrained_sites(variables['batch_stats'])` names them beforehand;
               `allow_untrained_statistics()` opts out (read when the call is traced).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import initializers
from bn_rnn_jax import modes
from bn_rnn_jax import normalization
from bn_rnn_jax import policy
from bn_rnn_jax import sequence

Array = jax.Array

#: How a layer's sites keep statistics (the module docstring).
STATISTICS = ('per_step', 'sequence', 'shared')
#: The collection a training pass writes its minibatch moments to, when mutable.
MOMENTS = 'minibatch_moments'


def check_statistics(statistics: str) -> None:
  if statistics not in STATISTICS:
    raise ValueError(f'statistics must be one of {STATISTICS}; got {statistics!r}.')


def sequence_wise_input(statistics: str) -> bool:
  """Whether the input term's statistics reduce over batch *and* time."""
  return statistics != 'per_step'


def per_step_rows(site: str, statistics: str) -> bool:
  """Whether a recurrent layer's `site` keeps one population row per step under
  `statistics` (else one row)."""
  if site == 'input':
    return not sequence_wise_input(statistics)
  return statistics != 'shared'


def num_rows(site: str, statistics: str, max_length: int) -> int:
  """R, the population rows of a recurrent layer's `site` under `statistics`."""
  return max_length if per_step_rows(site, statistics) else 1


def statistics_length(module: nn.Module, max_length: Optional[int], sites,
                      length: int) -> int:
  """T_max, the rows of a module's per-step statistics: `max_length`, or when it is None
  the rows its `sites` (the per-step ones) were made with, which is the time length of
  the input they were first made for (`init`'s); `length` when none is made yet."""
  if max_length is not None:
    return max_length
  for site in sites:
    if module.has_variable('batch_stats', site):
      return module.get_variable('batch_stats', site)['count'].shape[0]
  return length


_UNTRAINED_ALLOWED = contextvars.ContextVar('untrained_statistics_allowed', default=False)


@contextlib.contextmanager
def allow_untrained_statistics() -> Iterator[None]:
  """Inside this context `use_running_average=True` accepts statistics no training batch
  reached (they normalise with mean 0, variance 1), e.g. to look at an untrained model.
  A jitted function follows the context it is traced in."""
  token = _UNTRAINED_ALLOWED.set(True)
  try:
    yield
  finally:
    _UNTRAINED_ALLOWED.reset(token)


def _where(module: nn.Module, site: str) -> str:
  """`RecurrentLayer 'rnn/layer_0' site 'cell'` (no path for a top-level module)."""
  path = '/'.join(str(p) for p in module.path)
  return f"{type(module).__name__}{f' {path!r}' if path else ''} site {site!r}"


def _check_recorded(module: nn.Module, site: str) -> None:
  """Batch statistics (`use_running_average=False`) must be able to write their moments
  somewhere."""
  if not (module.is_mutable_collection('batch_stats') or module.is_mutable_collection(MOMENTS)):
    raise ValueError(
        f"{_where(module, site)}: use_running_average=False needs mutable=['batch_stats'] "
        f"in apply (or mutable=['{MOMENTS}'] for the population estimate pass); without "
        'it the population statistics would silently not be updated.')


def is_untrained(site_stats) -> bool:
  """Whether concrete statistics `{'mean', 'var', 'count'}` have no row any training batch
  reached; False for traced ones (no values to check)."""
  count = site_stats['count']
  if isinstance(count, jax.core.Tracer):
    return False
  return _no_row_reached(count)


def _no_row_reached(count) -> bool:
  """Whether concrete counts `[R]` hold no row a training batch reached."""
  return not np.any(np.asarray(count) > 0)


def untrained_sites(stats_tree) -> list[str]:
  """Paths (`'rnn/layer_0/recurrent'`) of the sites in a `batch_stats` tree that no
  training batch reached: the sites an evaluation with it refuses (they would normalise
  with mean 0, variance 1).

  Example:
    >>> import bn_rnn_jax as br
    >>> layer = br.make_layer('bn_lstm', 4, max_length=5)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 5, 1)),
    ...                        use_running_average=True, deterministic=True)
    >>> br.batch_stats.untrained_sites(variables['batch_stats'])
    ['recurrent', 'input', 'cell']
  """
  found = []
  def visit(node, path):
    if isinstance(node, Mapping) and set(node) == {'mean', 'var', 'count'}:
      if is_untrained(node):
        found.append('/'.join(path))
    elif isinstance(node, Mapping):
      for key, value in node.items():
        visit(value, path + (str(key),))
  visit(stats_tree, ())
  return found


def _check_trained(module: nn.Module, site: str, site_stats: Any) -> None:
  """Population statistics (`use_running_average=True`) must not be ones that no
  training batch reached: checked now when their counts are concrete, else when the
  computation runs (`sequence.check_when_run`)."""
  if _UNTRAINED_ALLOWED.get():
    return
  where = _where(module, site)

  def check(count):
    if _no_row_reached(count):
      raise ValueError(
          f'{where}: use_running_average=True with population statistics no training '
          'batch reached (count 0 in every row: mean 0, variance 1); train or estimate '
          'them first, or call inside batch_stats.allow_untrained_statistics().')
  sequence.check_when_run(check, site_stats['count'])


def site_variable(module: nn.Module, site: str, rows: int, features: int, *,
                  batch_statistics: bool):
  """The `batch_stats` variable of `site` (fresh: mean 0, var 1, count 0), after the
  misuse checks of the module docstring (none at `init`). `batch_statistics`: the call
  normalises with batch statistics (`use_running_average=False`)."""
  variable = module.variable('batch_stats', site, normalization.init_population_stats, rows,
                             features)
  if not module.is_initializing():
    if batch_statistics:
      _check_recorded(module, site)
    else:
      _check_trained(module, site, variable.value)
  return variable


def record(module: nn.Module, variable, site: str, mean: Array, var: Array, count: Array,
           momentum: float, min_count: float = 1, first_row=0,
           full_count: Optional[Array] = None) -> None:
  """Fold one minibatch's moments into `variable` (when `batch_stats` is mutable) and
  write them to `MOMENTS` (when that is mutable), each row weighted by its valid count.

  mean, var: `[T, F]` per-step moments or `[F]` for a single row; count: `[T]` or scalar
  global valid counts (a row whose count is 0 saw only padding and is not written, nor
  is one whose count is below `min_count`: `normalization.minibatch_moments_record`).
  first_row: the row of step 0. full_count: the count of a step every sequence of the
  batch reaches (`normalization.update_running_stats`; default the largest of `count`).
  """
  mean, var, count = jax.lax.stop_gradient((mean, var, count))
  rows = variable.value['count'].shape[0]
  minibatch = normalization.minibatch_moments_record(mean, var, count, rows, min_count,
                                                     first_row)
  if module.is_mutable_collection('batch_stats'):
    variable.value = normalization.update_running_stats(variable.value, minibatch, momentum,
                                                        full_count)
  if module.is_mutable_collection(MOMENTS):
    if module.has_variable(MOMENTS, site):  # a sequence recorded piece by piece
      earlier = module.get_variable(MOMENTS, site)
      written = minibatch['count'] != 0
      minibatch = jax.tree.map(
          lambda new, old: jnp.where(written.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
          minibatch, earlier)
    module.put_variable(MOMENTS, site, minibatch)


def population_rows(site_stats, length: int, first_step=0,
                    min_support: float = 0.0) -> tuple[Array, Array]:
  """`(mean, var)`, each `[length, F]`: the population rows of steps `first_step ..
  first_step + length - 1` (row `min(t, last seen)`; a single row serves every step).
  `first_step`: an int or int scalar array (e.g. a sampling loop's counter), or a
  `[batch]` vector of each row's step (then `[length, batch, F]`). `min_support`: rows
  less supported are the steady state (`normalization.steady_tail`)."""
  return normalization.population_rows(site_stats, length, first_step, min_support)


class MaskedBatchNorm(nn.Module):
  """`BN(x; gamma, beta)` with masked, cross-device moments and population statistics
  kept like the recurrent layers' sites (the attention terms of Cooijmans et al.'s
  BN-everywhere reader, sec. 5.4).

  Attributes:
    statistics: for x `[batch, time, F]` with a mask `[batch, time]`: 'per_step' (one
      row per step, `max_length` rows; inference past the last trained row reuses it) or
      'sequence' (one row over batch and valid steps). x `[batch, F]` has one row.
    max_length, momentum, epsilon, scale_init, axis_name, min_row_support: as
      `RecurrentLayer` (None: T_max is the time length of `init`'s x).
    batch_sums: how the batch sums run (`policy.batch_sums_for`).

  Call: `(x, mask | None, use_running_average=...)` -> x normalised (float32);
  `deterministic=` is taken and unused (no noise), as the layers take it.
  """
  statistics: str = 'per_step'
  max_length: Optional[int] = None
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  scale_init: initializers.Initializer = initializers.Constant(0.1)
  axis_name: Optional[str] = None
  min_row_support: float = normalization.DEFAULT_MIN_ROW_SUPPORT
  batch_sums: str = 'auto'

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None) -> Array:
    batch = modes.resolve(use_running_average, deterministic).batch_statistics
    if self.statistics not in ('per_step', 'sequence'):
      raise ValueError("MaskedBatchNorm.statistics must be 'per_step' or 'sequence'; got "
                       f'{self.statistics!r}.')
    if not 0.0 <= self.min_row_support <= 1.0:
      raise ValueError('MaskedBatchNorm.min_row_support must be in [0, 1]; got '
                       f'{self.min_row_support}.')
    if x.ndim not in (2, 3):
      raise ValueError(f'MaskedBatchNorm expects x [batch, F] or [batch, time, F]; got '
                       f'{x.shape}.')
    features = x.shape[-1]
    per_step = x.ndim == 3 and self.statistics == 'per_step'
    max_length = statistics_length(self, self.max_length, ['stats'] if per_step else [],
                                   x.shape[1] if per_step else 1)
    stats = site_variable(self, 'stats', max_length if per_step else 1, features,
                          batch_statistics=batch)
    scale = self.param('scale', self.scale_init, (features,))
    bias = self.param('bias', nn.initializers.zeros, (features,))
    if not batch:
      if x.ndim == 3:
        mean, var = population_rows(stats.value, x.shape[1], 0,
                                    self.min_row_support)               # [T, F]
      else:
        mean, var = stats.value['mean'][0], stats.value['var'][0]       # [F]
      return normalization.normalize(x, mean, var, scale, bias, self.epsilon)
    if per_step:
      normalization.check_length(x.shape[1], max_length, 'document')
    reduce_axes = (0, 1) if x.ndim == 3 and not per_step else (0,)
    y, mean, var, count = normalization.batch_norm(
        x, scale, bias, mask=None if mask is None else mask[..., None],
        reduce_axes=reduce_axes, axis_name=self.axis_name, epsilon=self.epsilon,
        batch_sums=policy.batch_sums_for(jax.default_backend(), self.batch_sums))
    if not self.is_initializing():
      record(self, stats, 'stats', mean, var, count, self.momentum)
    return y
