"""The recurrent layer: one scanned layer for every variant of both papers.

`RecurrentLayer`'s fields pick the cell (`'lstm'` or `'rnn'`) and which terms are
normalised; `variants.VARIANTS` names the combinations the papers study and
`variants.make_layer` builds them. Stacks and bidirectional layers are in `stack.py`.

Shapes: inputs `[batch, time, features]`, mask `[batch, time]` (1 = valid, valid steps
first), outputs `[batch, time, hidden]`.

Each step is a pure function of `steps.py`. In training the scan returns the per-step
batch moments, and the layer folds them into the `batch_stats` collection once, after the
scan (`batch_stats.record`); in inference it gathers each step's population rows and
feeds them to the scan as inputs. Nothing in the loop updates a `[T_max, F]` array, and
nothing in it differs between one device and many but a psum (`axis_name`).
`RecurrentLayer.step` runs one step at a time, with the population rows of that step.

A call returns the outputs, or `(carry, outputs)` with `return_carry=True`, as
`flax.linen.RNN`; how it runs (hoisted input term, remat, backward pass, batch sums,
unroll) is one value, `execution` (`policy.Execution`).
"""

from __future__ import annotations

import dataclasses
import functools
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


class RecurrentLayer(nn.Module):
  """One recurrent layer over `[batch, time, features]`, scanned with `lax.scan`.

  Its fields are the model (`hidden_size` to `initial_state_noise`: the cell, its
  normalised sites, how statistics are kept over time, and the initialisers), how the
  statistics are kept and read as `nn.BatchNorm`'s are (`momentum`, `epsilon` and the
  rules for padding and thin rows: `padded_statistics`, `min_step_count`,
  `min_row_support`), and where it runs (`dtype`, `axis_name`, `execution`).

  Attributes:
    hidden_size: H.
    cell: 'lstm' (gates f, i, o, g) or 'rnn' (tanh).
    recurrent_norm: None | 'batch' | 'layer' on W_h h (on W_h h + W_x x for 'rnn').
    input_norm: None | 'batch' | 'layer' on W_x x.
    cell_norm: None | 'batch' | 'layer' on c_t before the output tanh ('lstm' only).
    statistics: how the batch-normalised sites keep statistics (`batch_stats.STATISTICS`):
      'per_step' (separate statistics per time step: Cooijmans et al., Laurent's
      frame-wise), 'sequence' (the input term over batch and valid steps, Laurent eq.
      20-21; the recurrent and cell terms per step) or 'shared' (one population row per
      site: Cooijmans' ablation).
    max_length: T_max, the rows of per-step statistics (`[T_max, F]` per site). None:
      the time length of the input they are made for, `init`'s. A row of a BN-LSTM
      holds 18 H floats (mean and variance of 9 H features): 1000 rows at H=1000 are
      18M floats, against 4.2M parameters. Training on a longer sequence is an error
      (`normalization.check_length`); inference past the longest trained length reuses
      its last row.
    scale_init: initialiser of every normalisation's gamma (`initializers.Constant(0.1)`,
      Cooijmans sec. 4).
    forget_bias: initial bias of the forget gate.
    recurrent_kernel_init: W_h's initialiser `[H, G*H]`: per-gate-block orthogonal by
      default; the papers' presets by name in `initializers.RECURRENT_INITS`.
    kernel_init: W_x's initialiser `[I, G*H]` (`initializers.INPUT_INITS`).
    initial_state: 'zeros', 'learned', or 'noise' (zeros plus N(0, initial_state_noise^2)
      on h_0, from the 'noise' rng stream, wherever batch statistics become population
      statistics: in training and in the estimate's pass (`MOMENTS` mutable), never at
      evaluation. It keeps the batch variances off zero while the inputs are constant,
      e.g. black rows of MNIST; the estimate draws it too, so that those rows' population
      variances are the ones training normalised with, not round-off that inference
      would divide by sqrt(epsilon)).
    initial_state_noise: standard deviation of that noise.
    momentum: running-average momentum of the population statistics.
    epsilon: variance epsilon.
    padded_statistics: count padded entries in the batch moments, as the implementation
      of Cooijmans et al. sec. 5.4 did (zero-padded batches; their BN-LSTM and
      BN-everywhere readers), which biases mean and variance toward the padding. Off by
      default: moments count valid entries only. Either way the state ignores padding,
      and population rows that no sequence reached are not written.
    min_step_count: the fewest valid sequences (in the global batch) that per-step batch
      moments may average over. A training step with fewer is normalised with the
      population statistics of its row instead, looked up as in inference, with no
      gradient through them; that step's moments are not written to the population
      statistics. 1 (the default) never falls back. With masked per-step statistics and
      uneven lengths, the last steps of a batch can hold two or three sequences; rows
      that coincide there (a repeated question) have zero variance, and the batch-norm
      backward multiplies the gradient by gamma / sqrt(epsilon) (about 32) at each such
      step. Sequence-wise statistics are not affected. Needs `padded_statistics=False`.
    min_row_support: at inference, the rows of per-step population statistics after the
      last one that at least this fraction of the best-supported row's sequences reached
      are replaced by the steady state: the moments of the rows from half that row's
      step to it, pooled (`normalization.steady_tail`). With variable lengths those
      rows rest on a few sequences, and every longer step reuses the last of them. 0
      keeps every row (the papers' rule: the last row reached serves every later step);
      fixed lengths are not affected.
    dtype: the dtype of the matmuls and of the outputs, as Flax's `dtype` (e.g.
      jnp.bfloat16); None: float32, or float64 with float64 inputs or weights under x64.
      The state and the statistics stay float32 (or float64).
    axis_name: device axis name (pmap / shard_map) for cross-device batch moments.
    execution: how the layer runs, never what it computes (`policy.Execution`: hoisted
      input term, remat, backward pass, batch sums, unroll; 'auto' = the backend's
      choice, `policy.resolve`).
  """
  hidden_size: int
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
  axis_name: Optional[str] = None
  execution: policy_lib.Execution = policy_lib.Execution()

  # ------------------------------------------------------------------ configuration
  def _validate(self, inputs: Array, mask: Optional[Array]) -> None:
    if self.cell not in _GATES:
      raise ValueError(f'cell must be one of {sorted(_GATES)}; got {self.cell!r}.')
    for site, kind in (('recurrent_norm', self.recurrent_norm),
                       ('input_norm', self.input_norm), ('cell_norm', self.cell_norm)):
      if kind not in steps.NORM_KINDS:
        raise ValueError(f'{site} must be one of {steps.NORM_KINDS}; got {kind!r}.')
    if self.cell == 'rnn' and self.cell_norm is not None:
      raise ValueError('cell_norm applies to the LSTM cell only (cell="rnn" has no c_t).')
    batch_stats.check_statistics(self.statistics)
    if self.initial_state not in _INITIAL_STATES:
      raise ValueError(f'initial_state must be one of {_INITIAL_STATES}; got '
                       f'{self.initial_state!r}.')
    if self.hidden_size <= 0 or (self.max_length is not None and self.max_length <= 0):
      raise ValueError(f'hidden_size ({self.hidden_size}) and max_length '
                       f'({self.max_length}) must be positive.')
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f'momentum must be in [0, 1); got {self.momentum}.')
    if inputs.ndim != 3:
      raise ValueError('RecurrentLayer expects inputs [batch, time, features]; got shape '
                       f'{inputs.shape}.')
    if mask is not None and mask.shape != inputs.shape[:2]:
      raise ValueError(f'mask must be [batch, time] = {inputs.shape[:2]}; got {mask.shape}.')
    sequence.check_mask_prefix(mask)
    if self.min_step_count < 1:
      raise ValueError(f'min_step_count must be at least 1; got {self.min_step_count}.')
    if not 0.0 <= self.min_row_support <= 1.0:
      raise ValueError(f'min_row_support must be in [0, 1]; got {self.min_row_support}.')
    if self.min_step_count > 1 and self.padded_statistics:
      raise ValueError('min_step_count guards masked per-step statistics; with '
                       'padded_statistics=True every step averages the whole batch.')

  def _sites(self, length: int, bound: bool = True) -> tuple[batch_stats.Site, ...]:
    """The batch-normalised sites, with T_max from `max_length`, the statistics made
    already (a bound layer) or `length`."""
    features = steps.batch_sites(self.hidden_size, _GATES[self.cell], self.recurrent_norm,
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
    (policy,) = scans.policies(self.execution, self._config(True), self.hidden_size, sites,
                               batch, (policy_lib.platform_name(platform),))
    return policy

  # ------------------------------------------------------------------ parameters
  def _params(self, input_size: int) -> dict[str, Array]:
    specs = initializers.layer_parameters(
        input_size, self.hidden_size, cell=self.cell, recurrent_norm=self.recurrent_norm,
        input_norm=self.input_norm, cell_norm=self.cell_norm, scale_init=self.scale_init,
        forget_bias=self.forget_bias, recurrent_kernel_init=self.recurrent_kernel_init,
        kernel_init=self.kernel_init)
    return {name: self.param(name, init, shape) for name, (init, shape) in specs.items()}

  def initial_carry(self, batch_size: int, deterministic: bool, dtype=jnp.float32):
    """Zeros, a learned vector, or zeros plus Gaussian noise on h_0 (unless
    `deterministic`: the zeros inference starts from).

    `dtype`: of the state (float32, or float64 for a float64 layer under x64)."""
    shape = (batch_size, self.hidden_size)
    h = jnp.zeros(shape, dtype)
    c = jnp.zeros(shape, dtype)
    if self.initial_state == 'learned':
      h = h + self.param('initial_hidden', nn.initializers.zeros, (self.hidden_size,))
      if self.cell == 'lstm':
        c = c + self.param('initial_cell', nn.initializers.zeros, (self.hidden_size,))
    elif self.initial_state == 'noise' and not deterministic:
      # One key per global example: N devices draw what 1 draws.
      keys = sequence.per_example_keys(self.make_rng('noise'), batch_size, self.axis_name)
      noise = jax.vmap(lambda k: jax.random.normal(k, (self.hidden_size,), dtype))(keys)
      h = h + self.initial_state_noise * noise
    return (c, h) if self.cell == 'lstm' else h

  # ------------------------------------------------------------------ forward
  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *,
               use_running_average: Optional[bool] = None,
               deterministic: Optional[bool] = None, initial_carry=None, first_step=0,
               return_carry: bool = False):
    """Run the layer.

    Args:
      inputs: `[batch, time, features]`.
      mask: `[batch, time]`, 1 on valid steps (a prefix of each row), 0 on padding.
        Padded steps keep the state, output zeros and never count in statistics.
      use_running_average: population statistics (trained ones: see `batch_stats.py`)
        or, when False, batch statistics (and their running average; `apply` needs
        `mutable=['batch_stats']`), as `nn.BatchNorm`.
      deterministic: no h0 noise (the zeros inference starts from), as `nn.Dropout`;
        the estimate's pass draws it even so (`initial_state`). A flag not given follows
        the other one (`modes.py`).
      initial_carry: the state to start from, `(c, h)` (LSTM) or `h` (RNN), each
        `[batch, hidden]`; its statistics rows start at `first_step`.
      first_step: the time index of `inputs[:, 0]` in the sequence (an int, an int scalar
        array, or a `[batch]` vector of each row's step): step t of row b reads statistics
        row `first_step[b] + t`. In training the rows valid at `inputs[:, 0]` must share
        it, and its rows must exist (`normalization.check_rows`).
      return_carry: return `(final_carry, outputs)`, as `nn.RNN`.

    Returns:
      `outputs [batch, time, hidden]` (zeros at padded steps), or `(final_carry,
      outputs)`: the state after each row's last valid step.
    """
    self._validate(inputs, mask)
    mode = modes.resolve(use_running_average, deterministic)
    training, (batch, length, _) = mode.batch_statistics, inputs.shape
    sites = self._sites(length)
    full_count = (self._sequences(first_step, mask, batch, length) if training else None)
    first_step, ok = self._first_step(first_step, mask, training, sites, length)
    if mask is not None:  # padding is inert, whatever it holds (NaN * 0 is NaN: `where`)
      inputs = jnp.where(mask[..., None] > 0, inputs, jnp.zeros_like(inputs))
    params = self._params(inputs.shape[-1])
    stats = {s.name: batch_stats.site_variable(self, s, batch_statistics=training)
             for s in sites}
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
                                                first_step, self.min_row_support)
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
    """One inference step, `layer.apply(variables, carry, x_t, t, method='step')`:
    `(carry, x_t [batch, features], t)` -> `(carry, h_t [batch, hidden])`, normalised
    with the population row `min(t, last trained row)`. `carry` as `initial_carry` (None:
    the initial state); `t` an int or a traced int scalar; `mask` `[batch]`, 0 keeps a
    row's state. Stepping t = 0, 1, ... equals `__call__` on the whole sequence."""
    if x.ndim != 2:
      raise ValueError(f'RecurrentLayer.step expects x [batch, features]; got {x.shape}.')
    sequence.check_time_index(t, 'RecurrentLayer.step: t (the time index of x)')
    carry, outputs = self(x[:, None], None if mask is None else mask[:, None],
                          **modes.EVAL.kwargs(), initial_carry=carry, first_step=t,
                          return_carry=True)
    return carry, outputs[:, 0]

  def _sequences(self, first_step, mask: Optional[Array], batch: int, length: int):
    """The global number of the batch's sequences, the base of the running average's
    row weights (`normalization.update_running_stats`): the rows that have a valid step
    in this call or before it (`first_step` > 0), so that a sequence run in pieces
    weights its rows as one call does. None (the record's largest count, the same
    number) for a call that starts every row at step 0."""
    if sequence.starts_at_zero(first_step):
      return None
    valid = (jnp.full((batch,), length, jnp.int32) if mask is None
             else jnp.sum(mask > 0, axis=1))
    rows = jnp.sum((jnp.broadcast_to(first_step, (batch,)) + valid > 0).astype(jnp.float32))
    return rows if self.axis_name is None else jax.lax.psum(rows, self.axis_name)
