"""The cells of `flax_cells.py` as Flax NNX modules, for `nnx.RNN` and `nnx.Bidirectional`.

  BNLSTMCell(in_features, hidden_features, max_length=T, rngs=nnx.Rngs(0))

builds its parameters at once (no example input): `nnx.Param` attributes with the names
and shapes of the matching `RecurrentLayer` (`input_kernel [I, 4H]`, ...), and per
batch-normalised site the population statistics `batch_stats[site] = {'mean': [T_max, F],
'var': [T_max, F], 'count': [T_max]}` as `nnx.BatchStat`. `model.train()` (batch
statistics, folded into their running average row by row) and `model.eval()` (population
statistics) set `use_running_average`, as for `nnx.BatchNorm`. The step, its masking by
`nnx.RNN`'s `seq_lengths` and the carry `LSTMCarry(c, h, step)` are those of the Linen
cells; `nnx.RNN` carries all of a cell's state through its scan, so it needs no argument.
`linen_variables()` / `load_linen_variables()` convert from and to the Linen layer's
`{'params', 'batch_stats'}` (and `nnx.estimate_population_stats` runs the papers'
estimate on them).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from bn_rnn_jax import batch_stats
from bn_rnn_jax import cells
from bn_rnn_jax import flax_cells
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization

Array = jax.Array
LSTMCarry = flax_cells.LSTMCarry

_PARAMS = ('input_kernel', 'recurrent_kernel', 'bias', 'input_scale', 'recurrent_scale',
           'cell_scale', 'cell_bias')


class MinibatchMoments(nnx.Variable):
  """One estimate pass's minibatch moments of a site (`batch_stats.MOMENTS`)."""


class NormalizedLSTMCell(nnx.RNNCellBase):
  """An LSTM cell with each of its three sites normalised or not (`flax_cells.
  NormalizedLSTMCell` in NNX); the subclasses are the papers' presets.

  Args:
    in_features: I, the features of `x_t [batch, I]`.
    hidden_features: H.
    recurrent_norm, input_norm, cell_norm: None | 'batch' | 'layer' on W_h h, W_x x, c_t.
    max_length: T_max, the rows of the per-step statistics (`[T_max, F]` per site).
      Required with batch statistics (`flax_cells.require_max_length`), unused without.
    use_running_average: population (True, `model.eval()`) or batch statistics (False,
      `model.train()`).
    momentum, epsilon, gamma_init, forget_bias: as `RecurrentLayer`.
    recurrent_init, input_init, dtype, axis_name, batch_sums: as `RecurrentLayer`.
    rngs: `nnx.Rngs`; its `params` stream initialises the parameters.
  """
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  gamma_init: float = 0.1

  def __init__(self, in_features: int, hidden_features: int, *,
               recurrent_norm: Optional[str] = None, input_norm: Optional[str] = None,
               cell_norm: Optional[str] = None, max_length: Optional[int] = None,
               use_running_average: bool = False, momentum: float = 0.99,
               epsilon: float = normalization.DEFAULT_EPSILON,
               gamma_init: Optional[float] = None, forget_bias: float = 0.0,
               recurrent_init: str = 'orthogonal', input_init: str = 'orthogonal',
               dtype: Any = jnp.float32, axis_name: Optional[str] = None,
               batch_sums: str = 'auto',
               min_statistics_count: int = batch_stats.DEFAULT_MIN_STATISTICS_COUNT,
               rngs: nnx.Rngs):
    norms = dict(recurrent_norm=recurrent_norm or type(self).recurrent_norm,
                 input_norm=input_norm or type(self).input_norm,
                 cell_norm=cell_norm or type(self).cell_norm)
    for name, kind in norms.items():
      if kind not in cells.NORM_KINDS:
        raise ValueError(f'{name} must be one of {cells.NORM_KINDS}; got {kind!r}.')
    if min(in_features, hidden_features, 1 if max_length is None else max_length) <= 0:
      raise ValueError(f'in_features ({in_features}), hidden_features ({hidden_features}) '
                       f'and max_length ({max_length}) must be positive.')
    if input_init not in initializers.INPUT_INITS:
      raise ValueError(f'input_init must be one of {sorted(initializers.INPUT_INITS)}; got '
                       f'{input_init!r}.')
    self.in_features, self.hidden_features = in_features, hidden_features
    self.recurrent_norm = norms['recurrent_norm']
    self.input_norm = norms['input_norm']
    self.cell_norm = norms['cell_norm']
    if self._sites():
      flax_cells.require_max_length(type(self).__name__, max_length)
    self.max_length, self.momentum, self.epsilon = max_length, momentum, epsilon
    self.min_statistics_count = min_statistics_count
    self.use_running_average = use_running_average
    self.dtype, self.axis_name, self.batch_sums = dtype, axis_name, batch_sums
    self.estimating = False
    key = rngs.params()
    specs = initializers.layer_parameters(
        in_features, hidden_features, recurrent_norm=self.recurrent_norm,
        input_norm=self.input_norm, cell_norm=self.cell_norm,
        gamma_init=type(self).gamma_init if gamma_init is None else gamma_init,
        forget_bias=forget_bias, recurrent_init=recurrent_init, input_init=input_init)
    for name, (init, shape) in specs.items():
      setattr(self, name, nnx.Param(init(jax.random.fold_in(key, _PARAMS.index(name)),
                                         shape, jnp.float32)))
    self.batch_stats = nnx.data({
        site: jax.tree.map(nnx.BatchStat, normalization.init_population_stats(
            max_length, features)) for site, features in self._sites().items()})

  @property
  def num_feature_axes(self) -> int:
    return 1

  def _sites(self) -> dict[str, int]:
    return cells.batch_sites(self.hidden_features, 4, self.recurrent_norm, self.input_norm,
                             self.cell_norm)

  def _params(self) -> dict[str, Array]:
    return {name: getattr(self, name)[...] for name in _PARAMS if hasattr(self, name)}

  def linen_variables(self) -> dict[str, Any]:
    """`{'params', 'batch_stats'}` as the Linen cell and `RecurrentLayer` hold them."""
    out = {'params': self._params()}
    if self.batch_stats:
      out['batch_stats'] = jax.tree.map(lambda v: v[...], dict(self.batch_stats),
                                        is_leaf=lambda v: isinstance(v, nnx.Variable))
    return out

  def start_estimate(self) -> None:
    """Training-mode steps write this batch's moments to fresh `minibatch_moments`
    records, leaving `batch_stats` alone (`nnx.estimate_population_stats`)."""
    self.estimating = True
    self.minibatch_moments = nnx.data({
        site: MinibatchMoments(normalization.init_population_stats(self.max_length, width))
        for site, width in self._sites().items()})

  def finish_estimate(self) -> dict[str, Any]:
    """The records written since `start_estimate`, `{site: {'mean', 'var', 'count'}}`."""
    self.estimating = False
    records = {site: v.get_value() for site, v in self.minibatch_moments.items()}
    del self.minibatch_moments
    return records

  def load_linen_variables(self, variables) -> None:
    """Set the parameters (and `batch_stats`, when given) from a Linen layer's or cell's
    variables of the same sizes, e.g. a checkpoint trained with Linen."""
    for name, value in variables['params'].items():
      getattr(self, name)[...] = value
    for site, stats in variables.get('batch_stats', {}).items():
      for key, value in stats.items():
        self.batch_stats[site][key][...] = value

  def initialize_carry(self, input_shape: tuple[int, ...], rngs=None,
                       carry_init=None) -> LSTMCarry:
    """Zeros for `x_t` of shape `input_shape = [batch, features]`, at step 0."""
    del rngs, carry_init
    if len(input_shape) != 2:
      raise ValueError(f'{type(self).__name__} takes x_t [batch, features]; got input '
                       f'shape {tuple(input_shape)}.')
    if self.use_running_average and not self.estimating:
      for site, stats in self.batch_stats.items():  # concrete here, tracers in a scan
        if batch_stats.is_untrained({k: v[...] for k, v in stats.items()}) and not (
            batch_stats._UNTRAINED_ALLOWED.get()):  # pylint: disable=protected-access
          raise ValueError(
              f'{type(self).__name__} site {site!r}: use_running_average=True with '
              'population statistics no training batch reached (count 0 in every row); '
              'train or estimate them first, or call inside '
              'batch_stats.allow_untrained_statistics().')
    zeros = jnp.zeros((input_shape[0], self.hidden_features), jnp.float32)
    return LSTMCarry(zeros, zeros, jnp.zeros((input_shape[0],), jnp.int32))

  def __call__(self, carry: LSTMCarry, x: Array) -> tuple[LSTMCarry, Array]:
    """One step: `(carry, x_t [batch, I]) -> (carry, h_t [batch, H])`; h_t is 0 and the
    state unchanged on a padded step."""
    train = bool(self._sites()) and (self.estimating or not self.use_running_average)
    cfg = cells.StepConfig(
        recurrent_norm=self.recurrent_norm, input_norm=self.input_norm,
        cell_norm=self.cell_norm, train=train, epsilon=self.epsilon,
        axis_name=self.axis_name, compute_dtype=self.dtype, batch_sums=self.batch_sums)
    population = {site: {k: v[...] for k, v in stats.items()}
                  for site, stats in self.batch_stats.items()}
    carry, h, moments = flax_cells.lstm_cell_step(self._params(), cfg, carry, x, population,
                                                  self.max_length)
    t = carry.step[0] - 1
    for site, site_moments in moments.items():
      if self.estimating:
        record = self.minibatch_moments[site]
        record.set_value(flax_cells.fold_row(record.get_value(), t, site_moments, None,
                                             self.min_statistics_count))
      else:
        new = flax_cells.fold_row(population[site], t, site_moments, self.momentum,
                                  self.min_statistics_count)
        for key, value in new.items():
          self.batch_stats[site][key][...] = value
    return carry, h


class BNLSTMCell(NormalizedLSTMCell):
  """Cooijmans et al.'s BN-LSTM cell (`flax_cells.BNLSTMCell` in NNX): batch norm on
  W_h h, W_x x and c_t, per-step statistics, gamma 0.1."""
  recurrent_norm = 'batch'
  input_norm = 'batch'
  cell_norm = 'batch'


class BNInputLSTMCell(NormalizedLSTMCell):
  """Laurent et al.'s input-only BN-LSTM cell, frame-wise statistics
  (`flax_cells.BNInputLSTMCell` in NNX)."""
  input_norm = 'batch'


class LNLSTMCell(NormalizedLSTMCell):
  """Layer norm on W_h h, W_x x and c_t (`flax_cells.LNLSTMCell` in NNX), gamma 1."""
  recurrent_norm = 'layer'
  input_norm = 'layer'
  cell_norm = 'layer'
  gamma_init = 1.0
