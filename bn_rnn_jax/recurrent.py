"""The recurrent layer: one scanned layer for every variant of both papers.

`RecurrentLayer`'s fields pick the cell and which terms are normalised
(`variants.make_layer` builds the papers' combinations). Shapes: inputs `[batch, time,
features]`, mask `[batch, time]` (1 valid, valid steps first), outputs `[batch, time,
hidden]`. In training the scan returns the per-step batch moments, folded into
`batch_stats` once after it; in inference each step's population rows are scan inputs
(docs/design.md, decision 1). How the recurrence runs is `scans.run`'s: the layer asks no
backend questions.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from bn_rnn_jax import batch_stats
from bn_rnn_jax import checks
from bn_rnn_jax import initializers
from bn_rnn_jax import modes
from bn_rnn_jax import normalization
from bn_rnn_jax import policy as policy_lib
from bn_rnn_jax import scans
from bn_rnn_jax import sequence
from bn_rnn_jax import steps

Array = jax.Array

_GATES = {'lstm': 4, 'rnn': 1}
_INITIAL_STATES = ('zeros', 'learned', 'noise')


def _warn_if_padded(inputs: Array) -> None:
  """Training inputs that look zero-padded, with no mask: a warning, since zeros at the
  ends can be data."""
  found = sequence.trailing_zero_padding(inputs)
  if found:
    warnings.warn(f'RecurrentLayer: training {found}: the padding counts in the batch '
                  'statistics as data; pass the mask (a layer) or seq_lengths (RNN).',
                  stacklevel=3)


class RecurrentLayer(nn.Module):
  """One recurrent layer over `[batch, time, features]` (docs/guide/layers.md).

  Attributes:
    features: H, the hidden size.
    cell: 'lstm' (gates f, i, o, g) or 'rnn' (tanh).
    recurrent_norm: None | 'batch' | 'layer' on W_h h (on W_h h + W_x x for 'rnn').
    input_norm: None | 'batch' | 'layer' on W_x x.
    cell_norm: None | 'batch' | 'layer' on c_t before the output tanh ('lstm' only).
    statistics: 'per_step', 'sequence' or 'shared' (`batch_stats.STATISTICS`).
    max_length: T_max, the rows of per-step statistics; None: `init`'s time length.
      Training longer is an error; inference past the last trained row reuses it.
    scale_init: every normalisation's gamma initialiser (0.1, Cooijmans sec. 4).
    forget_bias: initial bias of the forget gate.
    recurrent_kernel_init: W_h's `[H, G*H]` initialiser (`initializers.RECURRENT_INITS`).
    kernel_init: W_x's `[I, G*H]` initialiser (`initializers.INPUT_INITS`).
    initial_state: 'zeros', 'learned', or 'noise': zeros plus N(0, initial_state_noise^2)
      on h_0 (the 'noise' rng) wherever batch statistics are made: training and the
      estimate's pass, never evaluation.
    initial_state_noise: its standard deviation.
    momentum: the running average's momentum.
    epsilon: variance epsilon.
    padded_statistics: padded entries count in the batch moments (Cooijmans sec. 5.4's
      implementation); the state ignores padding either way.
    min_step_count: a training step whose batch moments rest on fewer valid sequences is
      normalised with its population row (no gradient) and not recorded.
    min_row_support: inference reads the steady state past the last row at least this
      fraction of the best row's sequences reached (`normalization.steady_tail`).
    dtype: of the matmuls and outputs; the state and statistics stay float32 or wider.
    param_dtype: of the parameters (as Flax's layers; float32 also under x64).
    axis_name: the device axis of cross-device batch moments.
    execution: how the layer runs, never what it computes (`policy.Execution`).
    use_running_average, deterministic: Flax's two flags (`modes.py`), here or in the
      call.
  """
  features: int
  cell: str = 'lstm'
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  statistics: str = 'per_step'
  max_length: Optional[int] = None
  scale_init: initializers.Initializer = initializers.Constant(0.1)
  forget_bias: float = 0.0
  recurrent_kernel_init: initializers.Initializer = initializers.ORTHOGONAL_BLOCKS
  kernel_init: initializers.Initializer = initializers.ORTHOGONAL
  initial_state: str = 'zeros'
  initial_state_noise: float = 0.1
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  padded_statistics: bool = False
  min_step_count: int = 1
  min_row_support: float = normalization.DEFAULT_MIN_ROW_SUPPORT
  dtype: Optional[Any] = None
  param_dtype: Any = jnp.float32
  axis_name: Optional[str] = None
  execution: policy_lib.Execution = policy_lib.Execution()
  use_running_average: Optional[bool] = None
  deterministic: Optional[bool] = None

  # ------------------------------------------------------------------ configuration
  def _validate(self, inputs: Array, mask: Optional[Array], initial_carry) -> None:
    """One line for a field or an argument the layer cannot run with."""
    norms = {'recurrent_norm': self.recurrent_norm, 'input_norm': self.input_norm,
             'cell_norm': self.cell_norm}
    batch_stats.check_statistics(self.statistics)
    for ok, message in (
        (self.cell in _GATES, f'cell must be one of {sorted(_GATES)}; got {self.cell!r}.'),
        *((kind in steps.NORM_KINDS, f'{site} must be one of {steps.NORM_KINDS}; got '
           f'{kind!r}.') for site, kind in norms.items()),
        (self.cell == 'lstm' or self.cell_norm is None,
         'cell_norm applies to the LSTM cell only (cell="rnn" has no c_t).'),
        (self.initial_state in _INITIAL_STATES, f'initial_state must be one of '
         f'{_INITIAL_STATES}; got {self.initial_state!r}.'),
        (self.features > 0 and (self.max_length or 1) > 0, f'features ({self.features}) '
         f'and max_length ({self.max_length}) must be positive.'),
        (0.0 <= self.momentum < 1.0, f'momentum must be in [0, 1); got {self.momentum}.'),
        (self.min_step_count >= 1, f'min_step_count must be at least 1; got '
         f'{self.min_step_count}.'),
        (0.0 <= self.min_row_support <= 1.0, f'min_row_support must be in [0, 1]; got '
         f'{self.min_row_support}.'),
        (self.min_step_count == 1 or not self.padded_statistics, 'min_step_count guards '
         'masked per-step statistics; with padded_statistics=True every step averages the '
         'whole batch.'),
        (inputs.ndim == 3, 'RecurrentLayer expects inputs [batch, time, features]; got '
         f'shape {inputs.shape}.'),
        (mask is None or mask.shape == inputs.shape[:2], f'mask must be [batch, time] = '
         f'{inputs.shape[:2]}; got {None if mask is None else mask.shape}.')):
      if not ok:
        raise ValueError(message)
    sequence.check_mask_prefix(mask)
    if initial_carry is not None:
      want = (inputs.shape[0], self.features)
      shapes = [tuple(jnp.shape(a)) for a in jax.tree.leaves(initial_carry)]
      if shapes != [want] * (2 if self.cell == 'lstm' else 1):
        raise ValueError(f"initial_carry must be {'(c, h), each' if self.cell == 'lstm' else 'h'}"
                         f' [batch, features] = {want}; got shapes {shapes}.')

  def _sites(self, length: int, bound: bool = True) -> tuple[batch_stats.Site, ...]:
    """The batch-normalised sites, with T_max from `max_length`, the statistics made
    already (a bound layer) or `length`."""
    features = steps.batch_sites(self.features, _GATES[self.cell], self.recurrent_norm,
                                 self.input_norm, self.cell_norm)
    per_step = [n for n in features if batch_stats.site_kind(n, self.statistics) == 'per_step']
    max_length = (batch_stats.statistics_length(self, self.max_length, per_step, length)
                  if bound else self.max_length or length)
    return batch_stats.layer_sites(features, self.statistics, max_length)

  def _config(self, batch_statistics: bool) -> steps.StepConfig:
    return steps.StepConfig(
        cell=self.cell, recurrent_norm=self.recurrent_norm, input_norm=self.input_norm,
        cell_norm=self.cell_norm, batch_statistics=batch_statistics, epsilon=self.epsilon,
        axis_name=self.axis_name, compute_dtype=self.dtype,
        padded_statistics=self.padded_statistics, min_step_count=self.min_step_count)

  def execution_policy(self, batch, platform: Optional[str] = None
                       ) -> policy_lib.ExecutionPolicy:
    """How this layer runs on `platform` (default the first target,
    `policy.target_platforms`) for a per-device `batch` (`scans.policies`)."""
    platform = platform or policy_lib.target_platforms()[0]
    sites = self._sites(1, bound=False)
    (policy,) = scans.policies(self.execution, self._config(True), self.features, sites,
                               batch, (policy_lib.platform_name(platform),))
    return policy

  # ------------------------------------------------------------------ parameters
  def _params(self, input_size: int) -> dict[str, Array]:
    specs = initializers.layer_parameters(
        input_size, self.features, cell=self.cell, recurrent_norm=self.recurrent_norm,
        input_norm=self.input_norm, cell_norm=self.cell_norm, scale_init=self.scale_init,
        forget_bias=self.forget_bias, recurrent_kernel_init=self.recurrent_kernel_init,
        kernel_init=self.kernel_init)
    return {name: self.param(name, init, shape, self.param_dtype)
            for name, (init, shape) in specs.items()}

  def initial_carry(self, batch_size: int, deterministic: bool, dtype=jnp.float32):
    """Zeros, a learned vector, or zeros plus Gaussian noise on h_0 (unless
    `deterministic`), in `dtype`."""
    shape = (batch_size, self.features)
    h = jnp.zeros(shape, dtype)
    c = jnp.zeros(shape, dtype)
    if self.initial_state == 'learned':
      learned = lambda name: self.param(name, nn.initializers.zeros, (self.features,),
                                        self.param_dtype)
      h = h + learned('initial_hidden')
      if self.cell == 'lstm':
        c = c + learned('initial_cell')
    elif self.initial_state == 'noise' and not deterministic:
      # One key per global example: N devices draw what 1 draws.
      keys = sequence.per_example_keys(self.make_rng('noise'), batch_size, self.axis_name)
      noise = jax.vmap(lambda k: jax.random.normal(k, (self.features,), dtype))(keys)
      h = h + self.initial_state_noise * noise
    return (c, h) if self.cell == 'lstm' else h

  # ------------------------------------------------------------------ forward
  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None, deterministic: Optional[bool] = None,
               initial_carry=None, first_step=0, return_carry: bool = False):
    """`outputs [batch, time, hidden]` (0 at padded steps), or with `return_carry`
    `(final_carry, outputs)`, the state after each row's last valid step. `mask [batch,
    time]`: padded steps keep the state and count in no statistic. `initial_carry`: `(c,
    h)` (LSTM) or `h` (RNN) `[batch, hidden]`. `first_step`: the step of `inputs[:, 0]`
    (an int, a scalar array, or `[batch]`), whose statistics row step t reads; in
    training the rows valid at `inputs[:, 0]` share it."""
    self._validate(inputs, mask, initial_carry)
    mode = modes.resolve(self, use_running_average, deterministic)
    training, (batch, length, _) = mode.batch_statistics, inputs.shape
    sites = self._sites(length)
    full_count = self._sequences(first_step, mask, batch, length) if training else None
    first_step, ok = self._first_step(first_step, mask, training, sites, length)
    if training and mask is None:
      _warn_if_padded(inputs)
    if mask is not None:  # padding is inert, whatever it holds (NaN * 0 is NaN: `where`)
      inputs = jnp.where(mask[..., None] > 0, inputs, jnp.zeros_like(inputs))
    params = self._params(inputs.shape[-1])
    stats = {s.name: batch_stats.site_variable(self, s, batch_statistics=training)
             for s in sites}
    if training:
      batch_stats.check_batch_rows(self, sites, batch, self.axis_name)
    if initial_carry is None:
      initial_carry = self.initial_carry(batch, self._quiet_h0(mode), jnp.promote_types(
          jnp.result_type(inputs, params['recurrent_kernel']), jnp.float32))
    xs = {'x': jnp.swapaxes(inputs, 0, 1)}
    if mask is not None:
      xs['mask'] = jnp.swapaxes(mask, 0, 1)[..., None].astype(jnp.float32)
    if not training or self.min_step_count > 1:
      xs['rows'] = self._rows(stats, sites, training, length, first_step)
    carry, h, moments = scans.run(self.execution, params, self._config(training),
                                  initial_carry, xs, sites, batch=batch)
    if training and sites and not self.is_initializing():
      counts = sequence.valid_counts(xs.get('mask'), batch, length, self.axis_name)
      self._record(stats, sites, moments, counts, first_step, full_count)
    carry, outputs = checks.poison((carry, jnp.swapaxes(h, 0, 1)), ok)
    outputs = outputs.astype(self.dtype or h.dtype)
    return (carry, outputs) if return_carry else outputs

  def _quiet_h0(self, mode: modes.Mode) -> bool:
    """No h0 noise: deterministic calls, except the estimate's pass (`MOMENTS` mutable),
    which records the moments training normalises with."""
    estimating = (mode.batch_statistics and not self.is_initializing()
                  and self.is_mutable_collection(batch_stats.MOMENTS))
    return mode.deterministic and not estimating

  def _first_step(self, first_step, mask, training: bool, sites, length: int):
    """`first_step`, checked, and whether the traced checks passed (`checks.check`); in
    training the batch's one first step, whose rows must exist."""
    sequence.check_time_index(first_step, 'first_step (the time index of inputs[:, 0])')
    if not training:
      return first_step, True
    first_step, ok = sequence.common_step(first_step, mask)
    for s in sites:
      if s.kind == 'per_step':
        return first_step, ok & normalization.check_rows(first_step, length, s.rows)
    return first_step, ok

  def _rows(self, stats, sites, training: bool, length: int, first_step):
    """`{site: (mean, var)}` `[T, F]` (`[T, B, F]` for a `[batch]` `first_step`): the
    population rows the steps read (in training only the sites with per-step moments, at
    steps with fewer than `min_step_count` sequences)."""
    return {s.name: batch_stats.population_rows(self, s, stats[s.name].value, length,
                                                first_step, self.min_row_support,
                                                training=training)
            for s in sites if not (training and s.over_time)}

  def _record(self, stats, sites, moments, counts, first_step, full_count) -> None:
    """Fold this call's moments into the population statistics (`batch_stats.record`);
    `counts [T]`: the valid sequences of each step."""
    for s in sites:
      mean, var = moments[s.name]
      batch_stats.record(self, stats[s.name], s, mean, var,
                         jnp.sum(counts) if s.over_time else counts, momentum=self.momentum,
                         min_count=self.min_step_count, first_row=first_step,
                         full_count=full_count)

  def step(self, carry, x: Array, t, mask: Optional[Array] = None):
    """One inference step (`method='step'`): `(carry | None, x_t [batch, features], t)` ->
    `(carry, h_t [batch, hidden])` with population row `min(t, last trained row)`;
    stepping t = 0, 1, ... equals `__call__` on the whole sequence."""
    if x.ndim != 2:
      raise ValueError(f'RecurrentLayer.step expects x [batch, features]; got {x.shape}.')
    sequence.check_time_index(t, 'RecurrentLayer.step: t (the time index of x)')
    carry, outputs = self(x[:, None], None if mask is None else mask[:, None],
                          **modes.EVAL.kwargs(), initial_carry=carry, first_step=t,
                          return_carry=True)
    return carry, outputs[:, 0]

  def _sequences(self, first_step, mask: Optional[Array], batch: int, length: int):
    """The global number of sequences with a valid step in this call or before it, the
    running average's full count for a sequence run in pieces (None from step 0)."""
    if sequence.starts_at_zero(first_step):
      return None
    valid = (jnp.full((batch,), length, jnp.int32) if mask is None
             else jnp.sum(mask > 0, axis=1))
    rows = jnp.sum((jnp.broadcast_to(first_step, (batch,)) + valid > 0).astype(jnp.float32))
    return rows if self.axis_name is None else jax.lax.psum(rows, self.axis_name)
