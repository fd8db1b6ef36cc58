"""The papers' LSTM cells for Flax's own wrappers: `nn.RNN`, `nn.Bidirectional`.

A cell is one step, `cell(carry, x_t) -> (carry, h_t)` with `x_t [batch, features]`, as
`flax.linen.RNNCellBase` asks; `nn.RNN` scans it over `[batch, time, features]`:

  BNLSTMCell          BN on W_h h, W_x x and c_t, per-step statistics (Cooijmans et al.;
                      `make_layer('bn_lstm')`)
  BNInputLSTMCell     BN on W_x x only, frame-wise (per-step) statistics (Laurent et al.
                      eq. 18; `make_layer('bn_input_only')`)
  LNLSTMCell          layer norm on the same three sites as BNLSTMCell (`'ln_lstm'`)

The carry is `LSTMCarry(c, h, step)`: the state `[batch, H]` and the step counter
`[batch]` (int32) that picks the statistics row of each step. The parameters and the
`batch_stats` entries (`{site: {'mean': [T_max, F], 'var': [T_max, F], 'count': [T_max]}}`)
have the names and shapes of the matching `RecurrentLayer`, and the step is its step
function (`cells.lstm_step`): the same numerics, one step at a time.

Statistics under `nn.RNN`. A scan sees a variable collection only when told how:
training writes each step's row (the collection is carried from step to step),
evaluation only reads it (broadcast). `scan_collections(module)` gives the arguments for
the collections `module`'s apply may write:

  nn.RNN(BNLSTMCell(H, max_length=T, use_running_average=not train),
         **scan_collections(self))

A cell that cannot reach its statistics, or has to record them where it cannot, raises.

Padding. Called by `nn.RNN(...)(x, seq_lengths=lengths)` (also inside `nn.Bidirectional`,
whose reversed pass keeps the padding at the end), a cell reads `seq_lengths` from that
call: step t of row b is valid while `t < lengths[b]`. Padded steps keep the state,
output zeros and never count in a statistic, as the layer's mask does. Called in any
other way, every step is valid.

Sequence-wise statistics (Laurent eq. 20-21, `'bn_input_only_seq'`) and statistics
shared over time reduce over the whole sequence before the first step; no cell sees
that, so they exist only as layers (`RecurrentLayer`, `make_layer`).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import cells
from bn_rnn_jax import initializers
from bn_rnn_jax import normalization

Array = jax.Array

#: The collections a cell's statistics live in: the running averages and the minibatch
#: moments of the population estimate pass (`population.minibatch_moments`).
STATISTICS_COLLECTIONS = ('batch_stats', batch_stats.MOMENTS)


class LSTMCarry(NamedTuple):
  """An LSTM cell's carry: `c`, `h` `[batch, H]` and `step` `[batch]` (int32), the index of
  the next step (all rows step together; `nn.RNN`'s last carry with `seq_lengths` holds
  each row's length there)."""
  c: Array
  h: Array
  step: Array


def scan_collections(module: nn.Module) -> dict[str, Any]:
  """`nn.RNN`'s `variable_carry` and `variable_broadcast` for the cells of this module,
  called inside `module`'s compact method (or setup): the statistics collections its
  apply may write are carried through the scan, the rest are broadcast (read-only)."""
  carry = tuple(c for c in STATISTICS_COLLECTIONS if module.is_mutable_collection(c))
  broadcast = ('params',) + tuple(c for c in STATISTICS_COLLECTIONS if c not in carry)
  return dict(variable_carry=carry or False, variable_broadcast=broadcast)


def _rnn_call_codes():
  """The code of `nn.RNN.__call__` and `nnx.RNN.__call__` (the scans that run cells)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  return tuple(inspect.unwrap(rnn.__call__).__code__ for rnn in (nn.RNN, nnx.RNN))


_RNN_CALLS = _rnn_call_codes()


def enclosing_rnn_call() -> Optional[dict[str, Any]]:
  """The arguments of the innermost `nn.RNN` / `nnx.RNN` call on the call stack (the scan
  a step is traced in): `inputs`, `time_axis`, `seq_lengths`, ...; None outside one."""
  frame = inspect.currentframe()
  try:
    while frame is not None:
      if frame.f_code in _RNN_CALLS:
        return frame.f_locals
      frame = frame.f_back
    return None
  finally:
    del frame


def require_max_length(cell: str, max_length: Optional[int]) -> None:
  """A one-line error naming `cell` when `max_length` is None: a cell with
  batch-normalised sites makes its statistics before it sees a sequence (a layer sizes
  them from `init`'s input instead)."""
  if max_length is None:
    raise ValueError(f'{cell} keeps per-step batch statistics, made before it sees a '
                     'sequence: pass max_length=T_max, the longest training sequence.')


def lstm_cell_step(params: dict[str, Array], cfg: cells.StepConfig, carry: LSTMCarry,
                   x: Array, population: dict[str, Any], max_length: int):
  """One step of a cell, its mask from the enclosing `nn.RNN` / `nnx.RNN` call.

  Args:
    params: the layer's parameters (`cells.py`).
    cfg: the step's settings; `cfg.train` batch (True) or population statistics.
    carry: `LSTMCarry`, `[batch, H]` state and `[batch]` step counter.
    x: `[batch, features]`.
    population: `{site: {'mean': [R, F], 'var': [R, F], 'count': [R]}}` of every batch
      norm site, read in inference (row `min(t, last trained row)`).
    max_length: R; training on more steps than rows is an error.

  Returns:
    `(carry, h [batch, H], moments)`: h 0 and the state kept on padded steps; in training
    `{site: (mean [F], var [F], count, full)}` of the step (count 0 past `max_length`;
    full: the sequences of the batch, the count of a step they all reach).
  """
  if x.ndim != 2:
    raise ValueError(f'A cell takes x_t [batch, features]; got shape {x.shape}.')
  c, h, step = carry
  rnn_call = enclosing_rnn_call()
  lengths = None if rnn_call is None else rnn_call['seq_lengths']
  batch_norm = 'batch' in (cfg.recurrent_norm, cfg.input_norm, cfg.cell_norm)
  if rnn_call is not None and cfg.train and batch_norm:
    normalization.check_length(rnn_call['inputs'].shape[rnn_call['time_axis']], max_length)
  inputs = {}
  if lengths is not None:
    inputs['mask'] = (step < jnp.asarray(lengths))[:, None].astype(jnp.float32)
    # Padding is inert: whatever it holds (NaN, inf) never reaches a product.
    x = jnp.where(inputs['mask'] > 0, x, jnp.zeros_like(x))
  t = step[0]
  if not cfg.train and batch_norm:
    inputs['stats'] = {site: tuple(a[0] for a in batch_stats.population_rows(value, 1, t))
                       for site, value in population.items()}
  inputs['x'] = x
  (c_new, h_new), outputs = cells.lstm_step(params, cfg, (c, h), inputs)
  full = jnp.float32(x.shape[0]) if lengths is None else jnp.sum(
      (jnp.asarray(lengths) > 0).astype(jnp.float32))
  if cfg.axis_name is not None:
    full = jax.lax.psum(full, cfg.axis_name)
  moments = {site: (mean, var, jnp.where(t < max_length, count, 0.0), full)
             for site, (mean, var, count) in outputs['moments'].items()}
  return (LSTMCarry(c_new.astype(c.dtype), h_new.astype(h.dtype), step + 1),
          outputs['h'].astype(h.dtype), moments)


def fold_row(stats, t, moments, momentum: Optional[float], min_count: float = 1):
  """`stats` (`{'mean': [R, F], 'var': [R, F], 'count': [R]}`) with step t's `moments`
  `(mean [F], var [F], count, full)` folded into row t as `batch_stats.record` folds all
  rows: the running average (`momentum`; the row weighted by count / full), or, with
  momentum None, the minibatch record; a row fewer than `min_count` sequences reached
  is thin (`normalization.minibatch_moments_record`)."""
  t = jnp.asarray(t)
  mean, var, count, full = moments
  row = normalization.minibatch_moments_record(mean, var, count, 1, min_count)
  old = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, t, 1), stats)
  new = row if momentum is None else normalization.update_running_stats(
      old, row, momentum, full_count=full)
  return jax.tree.map(lambda a, r: jax.lax.dynamic_update_slice_in_dim(a, r.astype(a.dtype),
                                                                       t, 0), stats, new)


class NormalizedLSTMCell(nn.RNNCellBase):
  """An LSTM cell with each of its three sites normalised or not; the subclasses below are
  the papers' presets. One step of `RecurrentLayer` (cell 'lstm', statistics 'per_step').

  Attributes:
    features: H, the hidden size.
    recurrent_norm, input_norm, cell_norm: None | 'batch' | 'layer' on W_h h, W_x x, c_t.
    max_length: T_max, the rows of the per-step statistics (`[T_max, F]` per site);
      inference past the last trained row reuses it. Required with batch statistics
      (`require_max_length`), unused without.
    use_running_average: population statistics (True) or batch statistics, folded into
      the running average (False), as in `nn.BatchNorm`; a field, or a call argument
      where the cell is called directly (`nn.RNN` passes none).
    momentum, epsilon, gamma_init, forget_bias, min_statistics_count: as
      `RecurrentLayer`.
    recurrent_init, input_init, dtype, axis_name, batch_sums: as `RecurrentLayer`.
  """
  features: int
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  max_length: Optional[int] = None
  use_running_average: Optional[bool] = None
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  gamma_init: float = 0.1
  forget_bias: float = 0.0
  recurrent_init: str = 'orthogonal'
  input_init: str = 'orthogonal'
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None
  batch_sums: str = 'auto'
  min_statistics_count: int = batch_stats.DEFAULT_MIN_STATISTICS_COUNT

  @property
  def num_feature_axes(self) -> int:
    return 1

  def _sites(self) -> dict[str, int]:
    """`{site: features}` of the batch-normalised sites."""
    return cells.batch_sites(self.features, 4, self.recurrent_norm, self.input_norm,
                             self.cell_norm)

  def _validate(self) -> None:
    for name in ('recurrent_norm', 'input_norm', 'cell_norm'):
      if getattr(self, name) not in cells.NORM_KINDS:
        raise ValueError(f'{name} must be one of {cells.NORM_KINDS}; got '
                         f'{getattr(self, name)!r}.')
    if self._sites():
      require_max_length(type(self).__name__, self.max_length)
    if self.features <= 0 or (self.max_length is not None and self.max_length <= 0):
      raise ValueError(f'features ({self.features}) and max_length ({self.max_length}) '
                       'must be positive.')
    if self.input_init not in initializers.INPUT_INITS:
      raise ValueError(f'input_init must be one of {sorted(initializers.INPUT_INITS)}; got '
                       f'{self.input_init!r}.')

  @nn.nowrap
  def _fresh(self, collection: str):
    return {site: self.variable(collection, site, normalization.init_population_stats,
                                self.max_length, width)
            for site, width in self._sites().items()}

  def setup(self):
    # The statistics exist before `nn.RNN`'s scan (`initialize_carry` reaches them), so
    # that the scan carries them from its first step.
    self._validate()
    reachable = self.is_mutable_collection('batch_stats') or any(
        self.has_variable('batch_stats', site) for site in self._sites())
    self.stats = self._fresh('batch_stats') if reachable else {}
    record = (not self.is_initializing() and self._sites()
              and self.is_mutable_collection(batch_stats.MOMENTS))
    self.moments = self._fresh(batch_stats.MOMENTS) if record else {}

  @nn.nowrap
  def initialize_carry(self, rng, input_shape: tuple[int, ...]) -> LSTMCarry:
    """Zeros for `x_t` of shape `input_shape = [batch, features]`, at step 0."""
    del rng
    if len(input_shape) != 2:
      raise ValueError(f'{type(self).__name__} takes x_t [batch, features]; got input '
                       f'shape {tuple(input_shape)}.')
    if self.scope is not None:
      # `self.stats` runs setup: the statistics exist before a scan starts. They are
      # checked here, where their values are concrete (a scan's steps see tracers).
      stats = self.stats
      if self.use_running_average and not self.is_initializing():
        for site, variable in stats.items():
          batch_stats._check_trained(self, site, variable.value)  # pylint: disable=protected-access
    zeros = jnp.zeros((input_shape[0], self.features), jnp.float32)
    return LSTMCarry(zeros, zeros, jnp.zeros((input_shape[0],), jnp.int32))

  def _params(self, input_size: int) -> dict[str, Array]:
    specs = initializers.layer_parameters(
        input_size, self.features, recurrent_norm=self.recurrent_norm,
        input_norm=self.input_norm, cell_norm=self.cell_norm, gamma_init=self.gamma_init,
        forget_bias=self.forget_bias, recurrent_init=self.recurrent_init,
        input_init=self.input_init)
    return {name: self.param(name, init, shape) for name, (init, shape) in specs.items()}

  def _check_statistics(self, train: bool) -> None:
    """The statistics must be reachable here, and writable in training (a scan sees a
    collection only when told)."""
    name = type(self).__name__
    if not self._sites():
      return
    if not self.stats and not self.moments:
      raise ValueError(
          f"{name}: its batch_stats are out of reach; under nn.RNN pass "
          f"**bn_rnn_jax.flax_cells.scan_collections(module) (training: variable_carry="
          f"'batch_stats'; evaluation: variable_broadcast=('params', 'batch_stats')).")
    if self.is_initializing():
      return
    if train and not (self.is_mutable_collection('batch_stats') or self.moments):
      raise ValueError(
          f"{name}: use_running_average=False must record its statistics: apply with "
          f"mutable=['batch_stats'], and under nn.RNN carry them "
          f"(**bn_rnn_jax.flax_cells.scan_collections(module), i.e. variable_carry="
          f"'batch_stats'); else they would silently not be updated.")
    if not train:
      for site, variable in self.stats.items():
        batch_stats._check_trained(self, site, variable.value)  # pylint: disable=protected-access

  @nn.compact
  def __call__(self, carry: LSTMCarry, x: Array,
               use_running_average: Optional[bool] = None) -> tuple[LSTMCarry, Array]:
    """One step: `(carry, x_t [batch, features]) -> (carry, h_t [batch, H])`; h_t is 0 and
    the state unchanged on a padded step."""
    train = bool(self._sites()) and not nn.merge_param(
        'use_running_average', self.use_running_average, use_running_average)
    self._check_statistics(train)
    params = self._params(x.shape[-1])
    cfg = cells.StepConfig(
        recurrent_norm=self.recurrent_norm, input_norm=self.input_norm,
        cell_norm=self.cell_norm, train=train, epsilon=self.epsilon,
        axis_name=self.axis_name, compute_dtype=self.dtype, batch_sums=self.batch_sums)
    population = {site: v.value for site, v in self.stats.items()}
    carry, h, moments = lstm_cell_step(params, cfg, carry, x, population,
                                       self.max_length)
    if train and not self.is_initializing():
      for site, site_moments in moments.items():
        if site in self.stats and self.is_mutable_collection('batch_stats'):
          self.stats[site].value = fold_row(self.stats[site].value, carry.step[0] - 1,
                                            site_moments, self.momentum,
                                            self.min_statistics_count)
        if site in self.moments:
          self.moments[site].value = fold_row(self.moments[site].value, carry.step[0] - 1,
                                              site_moments, None, self.min_statistics_count)
    return carry, h


class BNLSTMCell(NormalizedLSTMCell):
  """The BN-LSTM cell of Cooijmans et al. (eq. 14-16): batch norm on W_h h, W_x x and c_t
  with per-step statistics, gamma 0.1 (`make_layer('bn_lstm')`, one step)."""
  recurrent_norm: Optional[str] = 'batch'
  input_norm: Optional[str] = 'batch'
  cell_norm: Optional[str] = 'batch'


class BNInputLSTMCell(NormalizedLSTMCell):
  """Laurent et al.'s LSTM with batch norm on the input term only, frame-wise (per-step)
  statistics (eq. 18; `make_layer('bn_input_only')`, one step)."""
  input_norm: Optional[str] = 'batch'


class LNLSTMCell(NormalizedLSTMCell):
  """Layer norm on W_h h, W_x x and c_t (Ba et al. 2016; `make_layer('ln_lstm')`, one
  step); no statistics, so `use_running_average` is not needed."""
  recurrent_norm: Optional[str] = 'layer'
  input_norm: Optional[str] = 'layer'
  cell_norm: Optional[str] = 'layer'
  gamma_init: float = 1.0
