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
from bn_rnn_jax import fused_step
from bn_rnn_jax import initializers
from bn_rnn_jax import layer_vjp
from bn_rnn_jax import modes
from bn_rnn_jax import normalization
from bn_rnn_jax import policy as policy_lib
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

  def execution_policy(self, batch, backend: Optional[str] = None
                       ) -> policy_lib.ExecutionPolicy:
    """How this layer runs on `backend` (default the current one) for a per-device `batch`
    (`policy.resolve` of `execution`); a symbolic batch (`jax.export`) cannot be compared
    with H, so `backward='auto'` is the autodiff of the scan there."""
    execution = self.execution
    if not isinstance(batch, int):
      batch = 1
      if execution.backward == policy_lib.AUTO:
        execution = dataclasses.replace(execution, backward='scan')
    return policy_lib.resolve(
        cell=self.cell, hidden_size=self.hidden_size, batch=batch,
        batch_norm=bool(self._batch_sites()), sequence_input=self._sequence_input(),
        execution=execution, backend=backend)

  def _sequence_input(self) -> bool:
    """Whether the input term is batch-normalised with sequence-wise statistics."""
    return self.input_norm == 'batch' and batch_stats.sequence_wise_input(self.statistics)

  def _max_length(self, length: int) -> int:
    """T_max: `max_length`, or the rows the statistics were made with (`length`, the
    input's, when they are being made)."""
    return batch_stats.statistics_length(self, self.max_length, self._per_step_sites(),
                                         length)

  def _per_step_sites(self) -> list[str]:
    """The batch-norm sites that keep one population row per step."""
    return [site for site in self._batch_sites()
            if batch_stats.per_step_rows(site, self.statistics)]

  def _batch_sites(self) -> dict[str, int]:
    """`{site: features}` of the batch-normalised terms (`steps.batch_sites`)."""
    return steps.batch_sites(self.hidden_size, _GATES[self.cell], self.recurrent_norm,
                             self.input_norm, self.cell_norm)

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
        the other one (`modes.py`): training passes both False, evaluation both True.
      initial_carry: optional state to start from (e.g. carried across truncated-BPTT
        segments): `(c, h)` for the LSTM, `h` for the RNN, each `[batch, hidden]`.
      first_step: the time index of `inputs[:, 0]` in the sequence (a continuation of a
        sequence run in pieces): an int, an int scalar array, or a `[batch]` vector of
        each row's step. Step t of row b uses the statistics row `first_step[b] + t`.
        In training the rows valid at `inputs[:, 0]` must share it (their moments pool
        per step), and the rows must exist (`normalization.check_rows`).
      return_carry: False: return the outputs; True: `(final_carry, outputs)`, as
        `nn.RNN`.

    Returns:
      `outputs [batch, time, hidden]` (zeros at padded steps), or `(final_carry,
      outputs)` with `return_carry=True`: the state after each sequence's last valid
      step, `(c, h)` (LSTM) or `h` (RNN), each `[batch, hidden]`.
    """
    self._validate(inputs, mask)
    mode = modes.resolve(use_running_average, deterministic)
    batch_statistics = mode.batch_statistics
    sequence.check_time_index(first_step, 'first_step (the time index of inputs[:, 0])')
    if mask is not None:
      # Padding is inert: whatever it holds (junk, inf, NaN) is replaced by zeros before
      # any product or moment; `where`, since NaN * 0 is NaN.
      inputs = jnp.where(mask[..., None] > 0, inputs, jnp.zeros_like(inputs))
    batch, length, input_size = inputs.shape
    run = self.execution_policy(batch)
    sites = self._batch_sites()
    max_length = self._max_length(length)
    if batch_statistics:
      full_count = self._sequences(first_step, mask, batch, length)
      first_step = sequence.common_step(first_step, mask)
    if batch_statistics and self._per_step_sites():
      normalization.check_rows(first_step, length, max_length)
    fused = self.execution.fused_step != 'none'
    if fused:
      self._check_fused(first_step)
      run = dataclasses.replace(run, hoist_input=True)
    stats = {site: batch_stats.site_variable(
        self, site, batch_stats.num_rows(site, self.statistics, max_length), features,
        batch_statistics=batch_statistics) for site, features in sites.items()}
    params = self._params(input_size)
    # The state is float32, or float64 when the inputs or weights are (under x64).
    state_dtype = jnp.promote_types(
        jnp.result_type(inputs, params['recurrent_kernel']), jnp.float32)
    # The estimate's pass records the moments training normalises with: h0 noise too.
    estimating = (batch_statistics and not self.is_initializing()
                  and self.is_mutable_collection(batch_stats.MOMENTS))
    quiet_h0 = mode.deterministic and not estimating
    carry = (self.initial_carry(batch, quiet_h0, state_dtype) if initial_carry is None
             else initial_carry)

    time_major = jnp.swapaxes(inputs, 0, 1)                                 # [T, B, I]
    mask_tm = None if mask is None else jnp.swapaxes(mask, 0, 1)[..., None].astype(
        jnp.float32)                                                        # [T, B, 1]
    cfg = steps.StepConfig(
        recurrent_norm=self.recurrent_norm, input_norm=self.input_norm,
        cell_norm=self.cell_norm, batch_statistics=batch_statistics, epsilon=self.epsilon,
        axis_name=self.axis_name, compute_dtype=self.dtype,
        padded_statistics=self.padded_statistics, min_step_count=self.min_step_count,
        batch_sums=run.batch_sums)
    xs = {} if mask_tm is None else {'mask': mask_tm}
    rows = self._step_rows(stats, length, batch_statistics, first_step)
    moments = {}
    if run.hoist_input:
      xs['input_term'], input_moments = self._hoisted_input_term(
          params, cfg, time_major, mask_tm, rows.pop('input', None))
      if input_moments is not None:
        moments['input'] = self._valid_counts(input_moments, batch, length, mask_tm)
    else:
      xs['x'] = time_major
    if rows:
      xs['stats'] = rows
    loop_sites = (tuple(site for site in sites if site not in moments) if batch_statistics
                  else ())
    if fused:
      final_carry, ys = self._fused_scan(params, carry, xs, mask_tm, rows, batch_statistics)
    elif run.backward == 'layer':
      final_carry, ys = self._scan_with_layer_backward(params, cfg, carry, xs, loop_sites,
                                                       run.remat, self.execution.unroll)
    else:
      step = functools.partial(
          steps.lstm_step if self.cell == 'lstm' else steps.rnn_step, params, cfg)
      step = steps.rematerialized(steps.pack_moments(step, loop_sites), run.remat)
      final_carry, ys = jax.lax.scan(step, carry, xs, unroll=self.execution.unroll)

    if batch_statistics and sites and not self.is_initializing():
      counts = self._step_counts(batch, length, mask_tm)
      moments.update(ys['moments'] if fused else
                     steps.unpack_moments(ys['moments'], loop_sites, sites, counts))
      self._record_moments(stats, moments, first_step, full_count)
    outputs = jnp.swapaxes(ys['h'], 0, 1)
    if self.dtype is not None:
      outputs = outputs.astype(self.dtype)
    return (final_carry, outputs) if return_carry else outputs

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

  def _check_fused(self, first_step) -> None:
    """One line for a layer `fused_step` does not cover (`policy.Execution.fused_step`)."""
    name = self.execution.fused_step
    bn_lstm = (self.cell == 'lstm' and self.recurrent_norm == self.input_norm ==
               self.cell_norm == 'batch')
    why = ('it runs the BN-LSTM (cell lstm, batch norm on all three sites)' if not bn_lstm
           else "it keeps per-step statistics ('per_step')" if self.statistics != 'per_step'
           else 'it computes its moments on one device (no axis_name)' if self.axis_name
           else 'it counts valid entries only (padded_statistics=False)'
           if self.padded_statistics
           else 'it does not fall back on population rows (min_step_count=1)'
           if self.min_step_count > 1
           else 'it reads one statistics row per step for all rows (first_step a scalar)'
           if getattr(first_step, 'ndim', 0) else None)
    if why:
      raise ValueError(f"Execution(fused_step={name!r}) does not fit this layer: {why}; "
                       "use fused_step='none'.")

  def _fused_scan(self, params, carry, xs, mask_tm, rows, batch_statistics: bool):
    """The recurrence by `fused_step.fused_bn_lstm_scan` (on the hoisted input term):
    `(final carry, {'h': [T, B, H], 'moments': {site: (mean, var, count)}})`."""
    population = None
    if not batch_statistics:
      population = {site: rows[site] for site in ('recurrent', 'cell')}
    final_carry, h, moments = fused_step.fused_bn_lstm_scan(
        params, carry, xs['input_term'], mask_tm, population=population,
        epsilon=self.epsilon, kernel=self.execution.fused_step,
        interpret=jax.default_backend() == 'cpu', compute_dtype=self.dtype)
    return final_carry, {'h': h, 'moments': moments}

  def _scan_with_layer_backward(self, params, cfg, carry, xs, loop_sites, remat: str,
                                unroll: int):
    """`lax.scan` of the step with the whole-layer backward pass (`layer_vjp`)."""
    cell_fn = steps.lstm_cell if self.cell == 'lstm' else steps.rnn_cell

    def cell(pointwise_params, carry, terms, inputs):
      carry, outputs = cell_fn(pointwise_params, cfg, carry, terms, inputs)
      return carry, steps.packed_outputs(outputs, loop_sites)

    def terms_fn(params, carry, inputs):
      return steps.step_terms(params, cfg, carry, inputs)

    # The input and recurrent terms meet as a plain sum (no separate normalisation).
    tied = self.input_norm is None and (self.cell == 'rnn' or self.recurrent_norm is None)
    return layer_vjp.scan_layer(cell, terms_fn, params, carry, xs, compute_dtype=self.dtype,
                                mode=remat, unroll=unroll, tied_terms=tied)

  def _step_counts(self, batch: int, length: int, mask_tm: Optional[Array]) -> Array:
    """`[T]` global number of valid sequences at each step."""
    if mask_tm is None:
      count = jnp.full((length,), batch, jnp.float32)
    else:
      count = jnp.sum(mask_tm[..., 0], axis=1)
    return count if self.axis_name is None else jax.lax.psum(count, self.axis_name)

  def _valid_counts(self, moments, batch: int, length: int, mask_tm: Optional[Array]):
    """With `padded_statistics` the moments' counts include padding; the record must
    still mark as seen only the steps some sequence reached."""
    if not self.padded_statistics or mask_tm is None:
      return moments
    counts = self._step_counts(batch, length, mask_tm)
    sequence_wise = batch_stats.sequence_wise_input(self.statistics)
    return moments[:2] + (jnp.sum(counts) if sequence_wise else counts,)

  def _hoisted_input_term(self, params, cfg: steps.StepConfig, time_major, mask_tm,
                          input_rows):
    """W_x x for all steps `[T, B, G*H]` and its normalisation, outside the scan.

    `input_rows`: `(mean, var)` `[T, F]` population rows of the input site (see
    `_step_rows`), or None."""
    z = steps.matmul(time_major, params['input_kernel'], self.dtype)
    reduce_axes = (0, 1) if batch_stats.sequence_wise_input(self.statistics) else (1,)
    stats = None if input_rows is None else tuple(
        a if a.ndim == 3 else a[:, None, :] for a in input_rows)
    return steps.apply_norm(
        self.input_norm, z, params.get('input_scale'), None,
        batch_statistics=cfg.batch_statistics,
        mask=None if self.padded_statistics else mask_tm,
        stats=stats, reduce_axes=reduce_axes, epsilon=self.epsilon,
        axis_name=self.axis_name, min_count=self.min_step_count, batch_sums=cfg.batch_sums)

  def _per_step_training_statistics(self, site: str) -> bool:
    """Whether a site's training moments are per step (all but sequence-wise input)."""
    return site != 'input' or not batch_stats.sequence_wise_input(self.statistics)

  def _step_rows(self, stats, length: int, batch_statistics: bool,
                 first_step=0) -> dict[str, tuple[Array, Array]]:
    """`{site: (mean [T, F], var [T, F])}`: the population rows handed to the steps
    (from `first_step` on). In inference every batch-norm site normalises with them; in
    training (only with `min_step_count > 1`) the per-step sites use them at steps with
    too few valid sequences."""
    if batch_statistics and self.min_step_count <= 1:
      return {}
    return {site: batch_stats.population_rows(stats[site].value, length, first_step,
                                              self.min_row_support)
            for site in stats
            if not batch_statistics or self._per_step_training_statistics(site)}

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

  def _record_moments(self, stats, moments, first_step, full_count) -> None:
    """Fold this minibatch's moments into the population statistics (`batch_stats`);
    per-step rows from `first_step` on."""
    for site, (mean, var, count) in moments.items():
      first_row = 0
      # Steps that fell back on the population rows trained with no moments of theirs.
      guard = self.min_step_count if self._per_step_training_statistics(site) else 1
      min_count = 1   # the fewest sequences a recorded row rests on
      if stats[site].value['count'].shape[0] == 1 and mean.ndim == 2:
        # Shared over time: average the per-step moments, weighting steps by valid count.
        count = jnp.broadcast_to(jnp.where(count >= guard, count, 0.0), mean.shape[:1])
        total = jnp.sum(count)
        weights = (count / jnp.maximum(total, 1.0))[:, None]
        mean = jnp.sum(mean * weights, axis=0)
        var = jnp.sum(var * weights, axis=0)
        count = total
      elif mean.ndim == 2:
        count = jnp.broadcast_to(count, mean.shape[:1])
        # Rows too few sequences supported are recorded thin
        # (`normalization.minibatch_moments_record`).
        min_count = guard
        first_row = first_step
      batch_stats.record(self, stats[site], site, mean, var, count, self.momentum, min_count,
                         first_row, full_count)

