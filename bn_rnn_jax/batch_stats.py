"""Normalisation sites and their statistics in the Flax `batch_stats` collection.

A *site* is one batch-normalised term (a layer's 'recurrent', 'input' or 'cell' term, or a
`MaskedBatchNorm`); its population statistics are one entry `{'mean': [R, F], 'var': [R,
F], 'count': [R]}`, `count` the valid sequences training batches had at each row.
`Site.kind` says how a site keeps them over time, and every rule below asks only that:

  | kind | training moments | rows R | inference at step t |
  |---|---|---|---|
  | 'per_step' | per step, over the batch | T_max | row min(t, last trained row) |
  | 'sequence' | over batch and valid steps (Laurent eq. 20-21) | 1 | the row |
  | 'shared' | per step, pooled into the row (Cooijmans' ablation) | 1 | the row |

A layer's `statistics` ('per_step', 'sequence', 'shared') gives its input term the kind
'per_step', 'sequence', 'sequence' and its other sites 'per_step', 'per_step', 'shared'.
Training folds the minibatch's moments into a running average and, when the collection
`MOMENTS` is mutable, writes them there (the papers' estimate averages those). Misuse is
an error, as in `flax.linen.BatchNorm`: batch statistics need `batch_stats` or `MOMENTS`
mutable; statistics no training batch reached are refused when concrete and normalise to
NaN when traced (`allow_untrained_statistics()` opts out).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings
from typing import Iterator, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import checks
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization
from bn_rnn_jax import policy

Array = jax.Array

#: How a layer's sites keep statistics (the module docstring).
STATISTICS = ('per_step', 'sequence', 'shared')
#: The collection a training pass writes its minibatch moments to, when mutable.
MOMENTS = 'minibatch_moments'


def is_site(node) -> bool:
  """Whether `node` is one site's `{'mean', 'var', 'count'}` (an `is_leaf` over sites)."""
  return isinstance(node, Mapping) and set(node) == {'mean', 'var', 'count'}


def check_statistics(statistics: str) -> None:
  if statistics not in STATISTICS:
    raise ValueError(f'statistics must be one of {STATISTICS}; got {statistics!r}.')


@dataclasses.dataclass(frozen=True)
class Site:
  """One batch-normalised term: its `name`, `features` F, `kind` (the module docstring)
  and its population rows `rows` (T_max for 'per_step', else 1)."""
  name: str
  features: int
  kind: str
  rows: int

  @property
  def over_time(self) -> bool:
    """Training moments over batch and valid steps (one set per call)."""
    return self.kind == 'sequence'


def site_kind(site: str, statistics: str) -> str:
  """The kind of a recurrent layer's `site` under the layer's `statistics`."""
  check_statistics(statistics)
  if statistics == 'per_step' or (statistics == 'sequence' and site != 'input'):
    return 'per_step'
  return 'sequence' if site == 'input' else 'shared'


def layer_sites(features: Mapping[str, int], statistics: str, max_length: int
                ) -> tuple[Site, ...]:
  """The `Site`s of a layer's batch-normalised terms `{name: F}`."""
  sites = []
  for name, width in features.items():
    kind = site_kind(name, statistics)
    sites.append(Site(name, width, kind, max_length if kind == 'per_step' else 1))
  return tuple(sites)


def statistics_length(module: nn.Module, max_length: Optional[int], names, length: int) -> int:
  """T_max: `max_length`, or the rows the per-step sites `names` were made with (the
  time length of `init`'s input); `length` when none is made yet."""
  if max_length is not None:
    return max_length
  for name in names:
    if module.has_variable('batch_stats', name):
      return module.get_variable('batch_stats', name)['count'].shape[0]
  return length


# ------------------------------------------------------------------ untrained statistics
_UNTRAINED_ALLOWED = contextvars.ContextVar('untrained_statistics_allowed', default=False)


@contextlib.contextmanager
def allow_untrained_statistics() -> Iterator[None]:
  """Inside this context `use_running_average=True` accepts statistics no training batch
  reached (mean 0, variance 1), e.g. to look at an untrained model. A jitted function
  follows the context it is traced in."""
  token = _UNTRAINED_ALLOWED.set(True)
  try:
    yield
  finally:
    _UNTRAINED_ALLOWED.reset(token)


def is_untrained(site_stats) -> bool:
  """Whether concrete statistics have no row a training batch reached (False if traced)."""
  count = site_stats['count']
  return not isinstance(count, jax.core.Tracer) and not np.any(np.asarray(count) > 0)


def untrained_sites(stats_tree) -> list[str]:
  """Paths (`'rnn/layer_0/recurrent'`) of a `batch_stats` tree's sites no training batch
  reached (an evaluation refuses them).

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
    if is_site(node):
      if is_untrained(node):
        found.append('/'.join(path))
    elif isinstance(node, Mapping):
      for key, value in node.items():
        visit(value, path + (str(key),))
  visit(stats_tree, ())
  return found


def _where(module: nn.Module, site: str) -> str:
  """`RecurrentLayer 'rnn/layer_0' site 'cell'` (no path for a top-level module)."""
  path = '/'.join(str(p) for p in module.path)
  return f"{type(module).__name__}{f' {path!r}' if path else ''} site {site!r}"


def _untrained_message(module: nn.Module, site: str) -> str:
  return (f'{_where(module, site)}: use_running_average=True with population statistics no '
          'training batch reached (count 0 in every row: mean 0, variance 1); train or '
          'estimate them first, or call inside batch_stats.allow_untrained_statistics().')


# ------------------------------------------------------------------ the running average
class RunningAverageWarning(UserWarning):
  """An evaluation whose population statistics may be the running average that training
  kept (`note_call`)."""


@dataclasses.dataclass
class _Process:
  """What this process has traced: training passes (`batch_stats` mutable), estimate
  passes (`MOMENTS` mutable, `batch_stats` not), and whether it has warned."""
  trained: bool = False
  estimated: bool = False
  warned: bool = False


_PROCESS = _Process()


def note_call(module: nn.Module, site: str, batch_statistics: bool) -> None:
  """Record a training or estimate pass; warn once a process (`RunningAverageWarning`) at
  the first evaluation with population statistics after a training pass when no estimate
  pass was made: its statistics are then the running average, or were made elsewhere."""
  if batch_statistics:
    if module.is_mutable_collection('batch_stats'):
      _PROCESS.trained = True
    else:
      _PROCESS.estimated = True
    return
  if _PROCESS.trained and not (_PROCESS.estimated or _PROCESS.warned):
    _PROCESS.warned = True
    warnings.warn(
        f'{_where(module, site)}: evaluating with population statistics '
        '(use_running_average=True) after training in this process with no population '
        'estimate made. If they are the running average training kept, they lag the '
        'parameters and can score far below batch statistics: evaluate with '
        'br.estimate_population_stats(model, variables, training_batches) '
        '(docs/guide/layers.md, "Population statistics"). Warned once a process.',
        RunningAverageWarning, stacklevel=2)


def check_batch_rows(module: nn.Module, sites, batch: int, axis_name: Optional[str]) -> None:
  """Refuse batch statistics whose moments average one row: a batch of 1 on one device
  (as under `jax.vmap` without an axis name) at a site with moments per step or per row
  (not over time), whose normalised term would be a constant."""
  if batch != 1 or axis_name is not None or module.is_initializing():
    return
  per_row = [site.name for site in sites if not site.over_time]
  if per_row:
    raise ValueError(
        f'{_where(module, per_row[0])}: batch statistics over a batch of 1 with '
        'axis_name=None average one row (variance 0: the normalised term is a constant). '
        "Under jax.vmap, name the mapped axis and give the layer that name (jax.vmap(f, "
        "axis_name='batch') and axis_name='batch'); otherwise use batches of 2 or more.")


def site_variable(module: nn.Module, site: Site, *, batch_statistics: bool):
  """The `batch_stats` variable of `site` (fresh: mean 0, var 1, count 0), after the
  misuse checks of the module docstring (none at `init`)."""
  variable = module.variable('batch_stats', site.name, normalization.init_population_stats,
                             site.rows, site.features)
  if module.is_initializing():
    return variable
  if batch_statistics:
    if not (module.is_mutable_collection('batch_stats')
            or module.is_mutable_collection(MOMENTS)):
      raise ValueError(
          f"{_where(module, site.name)}: use_running_average=False needs "
          f"mutable=['batch_stats'] in apply (or mutable=['{MOMENTS}'] for the population "
          'estimate pass); without it the population statistics would silently not be '
          'updated.')
  elif not _UNTRAINED_ALLOWED.get() and is_untrained(variable.value):
    raise ValueError(_untrained_message(module, site.name))
  note_call(module, site.name, batch_statistics)
  return variable


def population_rows(module: nn.Module, site: Site, site_stats, length: int, first_step=0,
                    min_support: float = 0.0, *, training: bool = False
                    ) -> tuple[Array, Array]:
  """`normalization.population_rows` of `site` (a one-row site's row at every step).
  Traced statistics no training batch reached give a NaN variance (and fail
  `checks.checkify`), unless `allow_untrained_statistics()` or `training`: the
  `min_step_count` fallback of a training step reads them as they are (mean 0, var 1)."""
  if site.rows == 1:
    shape = (length, site.features)
    mean, var = (jnp.broadcast_to(site_stats[k], shape) for k in ('mean', 'var'))
  else:
    mean, var = normalization.population_rows(site_stats, length, first_step, min_support)
  if (isinstance(site_stats['count'], jax.core.Tracer) and not training
      and not _UNTRAINED_ALLOWED.get()):
    trained = jnp.any(site_stats['count'] > 0)
    checks.check(trained, _untrained_message(module, site.name).replace('{', '{{'))
    var = jnp.where(trained, var, jnp.nan)
  return mean, var


def record(module: nn.Module, variable, site: Site, mean: Array, var: Array, count: Array,
           *, momentum: float, min_count: float = 1, first_row=0,
           full_count: Optional[Array] = None) -> None:
  """Fold one call's moments of `site` into `variable` (when `batch_stats` is mutable) and
  write them to `MOMENTS` (when that is mutable), each row weighted by its valid count.

  mean, var: `[T, F]` per step (`[F]` over time); count: `[T]` (scalar) global valid
  sequences. 'shared' sites pool the steps into their row, weighting each by its count.
  `min_count`: per-step rows resting on fewer sequences are recorded thin (and steps that
  trained on population rows are not recorded); `first_row`: the row of step 0;
  `full_count`: a row every sequence reached (`normalization.update_running_stats`)."""
  mean, var, count = jax.lax.stop_gradient((mean, var, count))
  if site.kind == 'shared':
    weights = jnp.where(count >= min_count, count, 0.0)
    share = (weights / jnp.maximum(jnp.sum(weights), 1.0))[:, None]
    mean, var, count = jnp.sum(mean * share, 0), jnp.sum(var * share, 0), jnp.sum(weights)
  if site.kind != 'per_step':
    min_count, first_row = 1, 0
  minibatch = normalization.minibatch_moments_record(mean, var, count, site.rows, min_count,
                                                     first_row)
  if module.is_mutable_collection('batch_stats'):
    variable.value = normalization.update_running_stats(variable.value, minibatch, momentum,
                                                        full_count)
  if module.is_mutable_collection(MOMENTS):
    if module.has_variable(MOMENTS, site.name):  # a sequence recorded piece by piece
      earlier = module.get_variable(MOMENTS, site.name)
      written = minibatch['count'] != 0
      minibatch = jax.tree.map(
          lambda new, old: jnp.where(written.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
          minibatch, earlier)
    module.put_variable(MOMENTS, site.name, minibatch)


class MaskedBatchNorm(nn.Module):
  """`BN(x; gamma, beta)` with masked, cross-device moments and statistics kept as the
  layers' sites (the attention terms of Cooijmans et al.'s BN-everywhere reader).

  `statistics`: for x `[batch, time, F]` with a mask `[batch, time]`, 'per_step'
  (`max_length` rows) or 'sequence' (one row); x `[batch, F]` has one row. The other
  fields as `RecurrentLayer`'s (`batch_sums` 'auto': the target platform's). Call: `(x,
  mask | None, use_running_average=None)` -> x normalised (float32).
  """
  statistics: str = 'per_step'
  max_length: Optional[int] = None
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  scale_init: initializers.Initializer = initializers.Constant(0.1)
  axis_name: Optional[str] = None
  min_row_support: float = normalization.DEFAULT_MIN_ROW_SUPPORT
  batch_sums: str = 'auto'
  use_running_average: Optional[bool] = None

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None) -> Array:
    batch = not nn.merge_param('use_running_average', self.use_running_average,
                               use_running_average)
    if self.statistics not in ('per_step', 'sequence'):
      raise ValueError("MaskedBatchNorm.statistics must be 'per_step' or 'sequence'; got "
                       f'{self.statistics!r}.')
    if not 0.0 <= self.min_row_support <= 1.0:
      raise ValueError('MaskedBatchNorm.min_row_support must be in [0, 1]; got '
                       f'{self.min_row_support}.')
    if x.ndim not in (2, 3):
      raise ValueError(f'MaskedBatchNorm expects x [batch, F] or [batch, time, F]; got '
                       f'{x.shape}.')
    per_step = x.ndim == 3 and self.statistics == 'per_step'
    rows = statistics_length(self, self.max_length, ['stats'], x.shape[1]) if per_step else 1
    site = Site('stats', x.shape[-1], 'per_step' if per_step else 'sequence', rows)
    stats = site_variable(self, site, batch_statistics=batch)
    if batch:
      check_batch_rows(self, [site], x.shape[0], self.axis_name)
    scale = self.param('scale', self.scale_init, (site.features,))
    bias = self.param('bias', nn.initializers.zeros, (site.features,))
    if not batch:
      mean, var = population_rows(self, site, stats.value, x.shape[1] if x.ndim == 3 else 1,
                                  min_support=self.min_row_support)
      if x.ndim == 2:
        mean, var = mean[0], var[0]
      return normalization.normalize(x, mean, var, scale, bias, self.epsilon)
    if per_step:
      normalization.check_length(x.shape[1], rows, 'document')
    y, mean, var, count = normalization.batch_norm(
        x, scale, bias, mask=None if mask is None else mask[..., None],
        reduce_axes=(0,) if x.ndim == 2 or per_step else (0, 1), axis_name=self.axis_name,
        epsilon=self.epsilon,
        batch_sums=policy.batch_sums_for(policy.target_platforms()[0], self.batch_sums))
    if not self.is_initializing():
      record(self, stats, site, mean, var, count, momentum=self.momentum)
    return y
