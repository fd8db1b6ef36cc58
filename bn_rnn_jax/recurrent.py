"""Recurrent layers scanned over time with per-step batch statistics.

`RecurrentLayer` is the one scanned layer. Its fields pick the cell (`'lstm'` or `'rnn'`)
and which terms are normalised; `VARIANTS` names the combinations the papers study:

  lstm                 plain LSTM
  bn_lstm              Cooijmans et al.: BN on W_h h, W_x x and c_t, per-step statistics
  bn_lstm_shared       the same with statistics shared over time (their ablation)
  bn_input_only        Laurent et al.: BN on W_x x only, frame-wise (per-step) statistics
  bn_input_only_seq    Laurent et al.: BN on W_x x only, sequence-wise (batch and time)
  ln_lstm              LayerNorm-LSTM (Ba et al. 2016) on the same three sites
  rnn                  tanh RNN
  rnn_bn_input         tanh RNN with BN on W_x x (Laurent eq. 18)
  rnn_bn_recurrence    tanh RNN with BN(W_h h + W_x x) (Laurent eq. 17, appendix A)

Shapes: inputs `[batch, time, features]`, mask `[batch, time]` (1 = valid, valid steps
first), outputs `[batch, time, hidden]`.

Statistics live in the `batch_stats` collection, one entry per normalisation site
(`'recurrent'`, `'input'`, `'cell'`), each `{'mean': [R, F], 'var': [R, F], 'count': [R]}`
with R = `max_length` rows (per-step statistics) or 1 (shared over time / sequence-wise).
In training the scan returns the per-step batch moments, and the layer folds them into
the running average once, after the scan (DESIGN.md decision 1). When the collection
`batch_moments` is mutable, the layer also writes this minibatch's moments there, in the
same layout, for the papers' population estimate (`normalization.average_moment_records`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bn_rnn_jax import cells
from bn_rnn_jax import initializers
from bn_rnn_jax import layer_vjp
from bn_rnn_jax import normalization

Array = jax.Array

VARIANTS: dict[str, dict[str, Any]] = {
    'lstm': dict(cell='lstm'),
    'bn_lstm': dict(cell='lstm', recurrent_norm='batch', input_norm='batch',
                    cell_norm='batch'),
    'bn_lstm_shared': dict(cell='lstm', recurrent_norm='batch', input_norm='batch',
                           cell_norm='batch', stats_per_step=False,
                           input_statistics='sequence'),
    'bn_input_only': dict(cell='lstm', input_norm='batch'),
    'bn_input_only_seq': dict(cell='lstm', input_norm='batch', input_statistics='sequence'),
    'ln_lstm': dict(cell='lstm', recurrent_norm='layer', input_norm='layer',
                    cell_norm='layer', gamma_init=1.0),
    'rnn': dict(cell='rnn'),
    'rnn_bn_input': dict(cell='rnn', input_norm='batch'),
    'rnn_bn_recurrence': dict(cell='rnn', recurrent_norm='batch'),
}

_GATES = {'lstm': 4, 'rnn': 1}
_INPUT_INITS = {'orthogonal': nn.initializers.orthogonal(),
                'glorot_uniform': nn.initializers.glorot_uniform()}

# `remat="auto"` on CPU: the largest hidden size whose batch-normalised layers recompute
# the whole step in the backward pass (see `RecurrentLayer._remat_mode`).
_FULL_REMAT_MAX_HIDDEN = 128
# `backward="auto"` on CPU: LSTM layers take the whole-layer backward pass when the hidden
# size is at least this many times the (per-device) batch (see `_layer_backward`).
_LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE = 8


def reverse_valid(x: Array, mask: Optional[Array]) -> Array:
  """Reverse each sequence's valid prefix in time, leaving its padding where it is.

  x: `[batch, time, ...]`; mask: `[batch, time]` with the valid steps first. Step t < L_b
  of sequence b goes to L_b - 1 - t; padded steps stay put. Applying it twice is the
  identity, so the same call maps a backward layer's outputs back to input order.
  """
  check_mask_prefix(mask)
  batch, time = x.shape[:2]
  steps = jnp.arange(time)[None, :]
  if mask is None:
    index = jnp.broadcast_to(time - 1 - steps, (batch, time))
  else:
    lengths = jnp.sum(mask > 0, axis=1, keepdims=True)
    index = jnp.where(steps < lengths, lengths - 1 - steps, steps)
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def check_mask_prefix(mask) -> None:
  """Raise if a concrete `[batch, time]` mask has a valid step after a padded one.

  Layers and `reverse_valid` assume each row's valid steps come first (padding at the
  end); a mask with holes would be silently mis-reversed. Traced masks (under jit or
  pmap) have no values to check and pass: the input pipelines build prefix masks.
  """
  if mask is None or isinstance(mask, jax.core.Tracer):
    return
  valid = np.asarray(mask) > 0
  holes = np.nonzero(valid[:, 1:] & ~valid[:, :-1])
  if holes[0].size:
    row, step = int(holes[0][0]), int(holes[1][0]) + 1
    raise ValueError(f'mask row {row} has a valid step at t={step} after padding; valid '
                     'steps must come first in each row (padding at the end).')


def global_rows(batch: int, axis_name: Optional[str]) -> Array:
  """`[batch]` global indices of this device's rows: `axis_index * batch + row`.

  Per-example randomness (DESIGN.md decision 8) folds these into the step's key, so that
  row r of the global batch draws the same noise on 1 device or on N.
  """
  rows = jnp.arange(batch)
  if axis_name is None:
    return rows
  return jax.lax.axis_index(axis_name) * batch + rows


def per_example_keys(key: Array, batch: int, axis_name: Optional[str]) -> Array:
  """`[batch]` keys, `fold_in(key, global row)` (see `global_rows`)."""
  return jax.vmap(lambda row: jax.random.fold_in(key, row))(global_rows(batch, axis_name))


def example_dropout(x: Array, rate: float, key: Array, axis_name: Optional[str]) -> Array:
  """Inverted dropout on `[batch, ...]` with each row's mask drawn from its own key
  (`per_example_keys`): the same masks on any number of devices."""
  keys = per_example_keys(key, x.shape[0], axis_name)
  keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[1:]))(keys)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class RecurrentLayer(nn.Module):
  """One recurrent layer over `[batch, time, features]`, scanned with `lax.scan`.

  Attributes:
    hidden_size: H.
    cell: 'lstm' (gates f, i, o, g) or 'rnn' (tanh).
    recurrent_norm: None | 'batch' | 'layer' on W_h h (on W_h h + W_x x for 'rnn').
    input_norm: None | 'batch' | 'layer' on W_x x.
    cell_norm: None | 'batch' | 'layer' on c_t before the output tanh ('lstm' only).
    stats_per_step: separate statistics per time step (True, Cooijmans) or one set shared
      over time for the recurrent and cell terms (their ablation).
    input_statistics: 'frame' (per step over the batch) or 'sequence' (over batch and
      time, padding excluded: Laurent eq. 20-21). 'sequence' hoists the input term.
    max_length: T_max, the rows of per-step statistics. Training on a longer sequence is
      an error; inference past the longest trained length reuses its last row.
    momentum: running-average momentum of the population statistics.
    epsilon: variance epsilon.
    gamma_init: initial gamma of every normalisation (0.1, Cooijmans sec. 4).
    forget_bias: initial bias of the forget gate.
    recurrent_init: 'orthogonal', 'identity' (per gate block), 'identity_candidate'
      (identity on the candidate block only; `initializers.py`) or 'glorot_uniform'.
    input_init: W_x's initialiser: 'orthogonal' or 'glorot_uniform' (Laurent et al.).
    initial_state: 'zeros', 'learned', or 'noise' (zeros plus N(0, initial_state_noise^2)
      on h_0 in training, from the 'noise' rng stream: it keeps the recurrent term's batch
      variance off zero while the inputs are constant, e.g. black rows of MNIST).
    initial_state_noise: standard deviation of that noise.
    hoist_input: compute W_x x (and its normalisation) for all steps before the scan
      (one large matmul) instead of inside the step. None = auto: hoisted when required
      ('sequence' statistics) or when the input is wide enough for the big matmul to pay
      (see `benchmarks/rnn_speed.py`).
    remat: what the backward pass recomputes instead of storing per step
      (`jax.checkpoint` of the step): 'none'; 'dots' (store only matmul outputs,
      recompute the pointwise math and normalisations); 'full' (store only the carry:
      least memory, for long sequences); 'auto' = on CPU for layers with batch norm,
      'full' up to hidden size 128 and 'dots' above (measured with
      benchmarks/rnn_speed.py; `_remat_mode` gives the numbers), else 'none'. True and
      False mean 'full' and 'none'. With `backward='layer'` the same names say what its
      forward scan stores (`layer_vjp`), with the same 'auto'.
    unroll: steps per scan iteration (`lax.scan(unroll=)`).
    backward: how the gradient of the scan is formed. 'scan': the autodiff of `lax.scan`
      (weight gradients summed step by step, T small products). 'layer': the whole-layer
      backward pass of `layer_vjp` (a reverse scan of the per-step cotangents only, then
      one `[H, B*T] x [B*T, G*H]` product for W_h and one for W_x); `remat` then says
      what its forward scan stores, and it keeps those cotangents (more memory). 'auto':
      on CPU, 'layer' for LSTM layers whose hidden size is at least 8x the batch (the
      per-device batch under pmap), where it was faster (`_layer_backward`), else
      'scan'; 'scan' on accelerators (not measured). Both compute the same gradients;
      'layer' defines no forward-mode derivative (`jax.jvp`, `jax.hessian`): pass
      'scan' for those.
    dtype: compute dtype of the matmuls (e.g. jnp.bfloat16); statistics stay float32.
    axis_name: pmap axis name for cross-device batch moments.
    padded_statistics: count padded entries in the batch moments, as the implementation
      of Cooijmans et al. sec. 5.4 did (zero-padded batches; their BN-LSTM and
      BN-everywhere readers), which biases mean and variance toward the padding. Off by
      default: moments count valid entries only. Either way the state ignores padding,
      and population rows that no sequence reached are not written.
    min_step_count: the fewest valid sequences (in the global batch) that per-step batch
      moments may average over. A training step with fewer is normalised with the
      population statistics of its row instead, looked up as in inference (rows past the
      last one trained with enough sequences reuse it), with no gradient through them;
      that step's moments are not written to the population statistics. 1 (the default)
      never falls back. With masked per-step statistics and uneven lengths, the last
      steps of a batch can hold two or three sequences; rows that coincide there (a
      repeated question) have zero variance, and the batch-norm backward multiplies the
      gradient by gamma / sqrt(epsilon) (about 32) at each such step: the Attentive
      Reader's BN-e* stopped on a non-finite gradient that way (README). Sequence-wise
      statistics are not affected. Needs `padded_statistics=False`.
  """
  hidden_size: int
  cell: str = 'lstm'
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  stats_per_step: bool = True
  input_statistics: str = 'frame'
  max_length: int = 1000
  momentum: float = 0.99
  epsilon: float = normalization.DEFAULT_EPSILON
  gamma_init: float = 0.1
  forget_bias: float = 0.0
  recurrent_init: str = 'orthogonal'
  input_init: str = 'orthogonal'
  initial_state: str = 'zeros'
  initial_state_noise: float = 0.1
  hoist_input: Optional[bool] = None
  remat: Any = 'auto'
  unroll: int = 1
  backward: str = 'auto'
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None
  padded_statistics: bool = False
  min_step_count: int = 1

  # ------------------------------------------------------------------ configuration
  def _validate(self, inputs: Array, mask: Optional[Array]) -> None:
    if self.cell not in _GATES:
      raise ValueError(f'cell must be one of {sorted(_GATES)}; got {self.cell!r}.')
    for site, kind in (('recurrent_norm', self.recurrent_norm),
                       ('input_norm', self.input_norm), ('cell_norm', self.cell_norm)):
      if kind not in cells.NORM_KINDS:
        raise ValueError(f'{site} must be one of {cells.NORM_KINDS}; got {kind!r}.')
    if self.cell == 'rnn' and self.cell_norm is not None:
      raise ValueError('cell_norm applies to the LSTM cell only (cell="rnn" has no c_t).')
    if self.input_statistics not in ('frame', 'sequence'):
      raise ValueError("input_statistics must be 'frame' or 'sequence'; got "
                       f'{self.input_statistics!r}.')
    if self.initial_state not in ('zeros', 'learned', 'noise'):
      raise ValueError("initial_state must be 'zeros', 'learned' or 'noise'; got "
                       f'{self.initial_state!r}.')
    if self.input_init not in _INPUT_INITS:
      raise ValueError(f'input_init must be one of {sorted(_INPUT_INITS)}; got '
                       f'{self.input_init!r}.')
    if self.hidden_size <= 0 or self.max_length <= 0:
      raise ValueError(f'hidden_size ({self.hidden_size}) and max_length '
                       f'({self.max_length}) must be positive.')
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f'momentum must be in [0, 1); got {self.momentum}.')
    if inputs.ndim != 3:
      raise ValueError('RecurrentLayer expects inputs [batch, time, features]; got shape '
                       f'{inputs.shape}.')
    if mask is not None and mask.shape != inputs.shape[:2]:
      raise ValueError(f'mask must be [batch, time] = {inputs.shape[:2]}; got {mask.shape}.')
    check_mask_prefix(mask)
    if self.min_step_count < 1:
      raise ValueError(f'min_step_count must be at least 1; got {self.min_step_count}.')
    if self.min_step_count > 1 and self.padded_statistics:
      raise ValueError('min_step_count guards masked per-step statistics; with '
                       'padded_statistics=True every step averages the whole batch.')
    if self.backward not in ('auto', 'scan', 'layer'):
      raise ValueError("backward must be 'auto', 'scan' or 'layer'; got "
                       f'{self.backward!r}.')

  def _hoisted(self, input_size: int) -> bool:
    if self.input_norm == 'batch' and self.input_statistics == 'sequence':
      return True
    if self.hoist_input is not None:
      return self.hoist_input
    # On CPU a wide hoisted projection costs memory traffic that an in-step matmul
    # avoids; see DESIGN.md decision 2 and benchmarks/rnn_speed.py.
    return jax.default_backend() != 'cpu'

  def _rematerialized(self, step):
    mode = self._remat_mode()
    if mode == 'none':
      return step
    policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable
              if mode == 'dots' else None)
    return jax.checkpoint(step, prevent_cse=False, policy=policy)

  # ------------------------------------------------------------------ whole-layer backward
  def _remat_mode(self) -> str:
    """'none', 'dots' or 'full', with 'auto' resolved (the same rule for both backward
    passes).

    On CPU, a layer with batch norm stores less: at H <= 128 only the carry ('full':
    recomputing the step costs one more `[B, H] x [H, G*H]` product, cheaper there than
    storing and reloading the pointwise intermediates: faster at H100), above it the
    matmul outputs (faster at H240 and H1000). `benchmarks/rnn_speed.py` measures both
    at those three sizes (README Speed); the bound sits between the first two, where
    nothing was measured. Elsewhere 'none'.
    """
    mode = {True: 'full', False: 'none'}.get(self.remat, self.remat)
    if mode == 'auto':
      if jax.default_backend() != 'cpu' or not self._batch_sites():
        mode = 'none'
      else:
        mode = 'full' if self.hidden_size <= _FULL_REMAT_MAX_HIDDEN else 'dots'
    if mode not in ('none', 'dots', 'full'):
      raise ValueError("remat must be 'auto', 'none', 'dots', 'full' or a bool; got "
                       f'{self.remat!r}.')
    return mode

  def _layer_backward(self, batch: int) -> bool:
    """`backward`, with 'auto' resolved for a `batch` of this size (per device).

    On CPU, an LSTM layer takes the whole-layer pass when `hidden_size >= 8 * batch`.
    The autodiff of the scan adds `h^T dz` into the `[H, 4H]` weight gradient at every
    step: per step it reads and writes that accumulator (and the input kernel's), while
    the whole-layer pass stores and rereads `[B, 4H]` cotangents instead, so it gains as
    H / B grows. `benchmarks/rnn_speed.py` (README Speed) measured it: at (c) (B64,
    H1000) and (d) (B32, H650) it is the faster one; at (a) (B64, H100) and at (b) (B40,
    H240, bidirectional and masked) it is slower. The bound 8 sits above (b) (H / B = 6);
    in one-off runs on unidirectional shapes the whole-layer pass was ahead from smaller
    ratios too, by less. The tanh RNN cell and accelerators were not measured and keep
    the autodiff path.
    """
    if self.backward != 'auto':
      return self.backward == 'layer'
    return (jax.default_backend() == 'cpu' and self.cell == 'lstm'
            and self.hidden_size >= _LAYER_BACKWARD_MIN_HIDDEN_PER_EXAMPLE * batch)

  def _scan_with_layer_backward(self, params, cfg, carry, xs, loop_sites):
    """`lax.scan` of the step with the whole-layer backward pass (`layer_vjp`)."""
    cell_fn = cells.lstm_cell if self.cell == 'lstm' else cells.rnn_cell

    def cell(pointwise_params, carry, terms, inputs):
      carry, outputs = cell_fn(pointwise_params, cfg, carry, terms, inputs)
      return carry, _packed_outputs(outputs, loop_sites)

    def terms_fn(params, carry, inputs):
      return cells.step_terms(params, cfg, carry, inputs)

    mode = self._remat_mode()
    # The input and recurrent terms meet as a plain sum (no separate normalisation).
    tied = self.input_norm is None and (self.cell == 'rnn' or self.recurrent_norm is None)
    return layer_vjp.scan_layer(cell, terms_fn, params, carry, xs, compute_dtype=self.dtype,
                                mode=mode, unroll=self.unroll, tied_terms=tied)

  def _rows(self, site: str) -> int:
    if site == 'input':
      return self.max_length if self.input_statistics == 'frame' else 1
    return self.max_length if self.stats_per_step else 1

  def _batch_sites(self) -> tuple[str, ...]:
    kinds = {'recurrent': self.recurrent_norm, 'input': self.input_norm,
             'cell': self.cell_norm}
    return tuple(site for site, kind in kinds.items() if kind == 'batch')

  def _site_features(self, site: str) -> int:
    return self.hidden_size if site == 'cell' else _GATES[self.cell] * self.hidden_size

  # ------------------------------------------------------------------ parameters
  def _params(self, input_size: int) -> dict[str, Array]:
    gates = _GATES[self.cell]
    width = gates * self.hidden_size
    gamma = nn.initializers.constant(self.gamma_init)
    params = {
        'input_kernel': self.param('input_kernel', _INPUT_INITS[self.input_init],
                                   (input_size, width)),
        'recurrent_kernel': self.param(
            'recurrent_kernel', initializers.recurrent_initializer(self.recurrent_init),
            (self.hidden_size, width)),
        'bias': self.param('bias', initializers.gate_bias(
            gates, self.hidden_size, 0 if self.cell == 'lstm' else None, self.forget_bias),
            (width,)),
    }
    if self.input_norm is not None:
      params['input_scale'] = self.param('input_scale', gamma, (width,))
    if self.recurrent_norm is not None:
      name = 'recurrent_scale' if self.cell == 'lstm' else 'scale'
      params[name] = self.param(name, gamma, (width,))
    if self.cell_norm is not None:
      params['cell_scale'] = self.param('cell_scale', gamma, (self.hidden_size,))
      params['cell_bias'] = self.param('cell_bias', nn.initializers.zeros,
                                       (self.hidden_size,))
    return params

  def initial_carry(self, batch_size: int, train: bool, dtype=jnp.float32):
    """Zeros, a learned vector, or zeros plus Gaussian noise on h_0 (training only).

    `dtype`: of the state (float32, or float64 for a float64 layer under x64)."""
    shape = (batch_size, self.hidden_size)
    h = jnp.zeros(shape, dtype)
    c = jnp.zeros(shape, dtype)
    if self.initial_state == 'learned':
      h = h + self.param('initial_hidden', nn.initializers.zeros, (self.hidden_size,))
      if self.cell == 'lstm':
        c = c + self.param('initial_cell', nn.initializers.zeros, (self.hidden_size,))
    elif self.initial_state == 'noise' and train:
      # One key per global example (DESIGN.md decision 8): N devices draw what 1 draws.
      keys = per_example_keys(self.make_rng('noise'), batch_size, self.axis_name)
      noise = jax.vmap(lambda k: jax.random.normal(k, (self.hidden_size,), dtype))(keys)
      h = h + self.initial_state_noise * noise
    return (c, h) if self.cell == 'lstm' else h

  # ------------------------------------------------------------------ forward
  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool,
               initial_carry=None):
    """Run the layer.

    Args:
      inputs: `[batch, time, features]`.
      mask: `[batch, time]`, 1 on valid steps (a prefix of each row), 0 on padding.
        Padded steps keep the state, output zeros and never count in statistics.
      train: batch statistics (and their running average) or population statistics.
      initial_carry: optional state to start from (e.g. carried across truncated-BPTT
        segments): `(c, h)` for the LSTM, `h` for the RNN, each `[batch, hidden]`.

    Returns:
      `(final_carry, outputs)`: the state after each sequence's last valid step, and
      `[batch, time, hidden]` outputs (zeros at padded steps).
    """
    self._validate(inputs, mask)
    if mask is not None:
      # Padding is inert (DESIGN.md decision 10): whatever it holds (junk, inf, NaN) is
      # replaced by zeros before any product or moment; `where`, since NaN * 0 is NaN.
      inputs = jnp.where(mask[..., None] > 0, inputs, jnp.zeros_like(inputs))
    batch, length, input_size = inputs.shape
    sites = self._batch_sites()
    if train and sites:
      normalization.check_length(length, self.max_length)
    stats = {site: self.variable('batch_stats', site, normalization.init_population_stats,
                                 self._rows(site), self._site_features(site))
             for site in sites}
    params = self._params(input_size)
    # The state is float32, or float64 when the inputs or weights are (under x64).
    state_dtype = jnp.promote_types(
        jnp.result_type(inputs, params['recurrent_kernel']), jnp.float32)
    carry = (self.initial_carry(batch, train, state_dtype) if initial_carry is None
             else initial_carry)

    time_major = jnp.swapaxes(inputs, 0, 1)                                 # [T, B, I]
    mask_tm = None if mask is None else jnp.swapaxes(mask, 0, 1)[..., None].astype(
        jnp.float32)                                                        # [T, B, 1]
    cfg = cells.StepConfig(
        recurrent_norm=self.recurrent_norm, input_norm=self.input_norm,
        cell_norm=self.cell_norm, train=train, epsilon=self.epsilon,
        axis_name=self.axis_name, compute_dtype=self.dtype,
        padded_statistics=self.padded_statistics, min_step_count=self.min_step_count)
    xs = {} if mask_tm is None else {'mask': mask_tm}
    rows = self._step_rows(stats, length, train)
    moments = {}
    if self._hoisted(input_size):
      xs['input_term'], input_moments = self._hoisted_input_term(
          params, time_major, mask_tm, train, rows.pop('input', None))
      if input_moments is not None:
        moments['input'] = self._valid_counts(input_moments, batch, length, mask_tm)
    else:
      xs['x'] = time_major
    if rows:
      xs['stats'] = rows
    loop_sites = tuple(site for site in sites if site not in moments) if train else ()
    if self._layer_backward(batch):
      final_carry, ys = self._scan_with_layer_backward(params, cfg, carry, xs, loop_sites)
    else:
      step = functools.partial(
          cells.lstm_step if self.cell == 'lstm' else cells.rnn_step, params, cfg)
      step = _pack_moments(step, loop_sites)
      step = self._rematerialized(step)
      final_carry, ys = jax.lax.scan(step, carry, xs, unroll=self.unroll)

    if train and sites and not self.is_initializing():
      counts = self._step_counts(batch, length, mask_tm)
      moments.update(_unpack_moments(ys['moments'], loop_sites, self._site_features, counts))
      self._record_moments(stats, moments)
    return final_carry, jnp.swapaxes(ys['h'], 0, 1)

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
    return moments[:2] + (counts if self.input_statistics == 'frame' else jnp.sum(counts),)

  def _hoisted_input_term(self, params, time_major, mask_tm, train, input_rows):
    """W_x x for all steps `[T, B, G*H]` and its normalisation, outside the scan.

    `input_rows`: `(mean, var)` `[T, F]` population rows of the input site (see
    `_step_rows`), or None."""
    z = cells.matmul(time_major, params['input_kernel'], self.dtype)
    reduce_axes = (1,) if self.input_statistics == 'frame' else (0, 1)
    stats = None if input_rows is None else tuple(a[:, None, :] for a in input_rows)
    y, moments = cells.apply_norm(
        self.input_norm, z, params.get('input_scale'), None, train=train,
        mask=None if self.padded_statistics else mask_tm,
        stats=stats, reduce_axes=reduce_axes, epsilon=self.epsilon,
        axis_name=self.axis_name, min_count=self.min_step_count)
    return y, moments

  def _per_step_training_statistics(self, site: str) -> bool:
    """Whether a site's training moments are per step (all but sequence-wise input)."""
    return site != 'input' or self.input_statistics == 'frame'

  def _step_rows(self, stats, length: int, train: bool) -> dict[str, tuple[Array, Array]]:
    """`{site: (mean [T, F], var [T, F])}`: the population rows handed to the steps. In
    inference every batch-norm site normalises with them; in training (only with
    `min_step_count > 1`) the per-step sites use them at steps with too few valid
    sequences."""
    if train and self.min_step_count <= 1:
      return {}
    return {site: self._population_rows(stats[site].value, site, length)
            for site in stats if not train or self._per_step_training_statistics(site)}

  def _population_rows(self, site_stats, site: str, length: int):
    """`[T, F]` population mean and var for each step (one row broadcast if shared)."""
    if self._rows(site) == 1:
      mean, var = site_stats['mean'][0], site_stats['var'][0]
      return (jnp.broadcast_to(mean, (length,) + mean.shape),
              jnp.broadcast_to(var, (length,) + var.shape))
    return normalization.population_rows(site_stats, length)

  def _record_moments(self, stats, moments) -> None:
    """Fold this minibatch's moments into the running averages (and `batch_moments`)."""
    for site, (mean, var, count) in moments.items():
      mean, var, count = jax.lax.stop_gradient((mean, var, count))
      if self.min_step_count > 1 and self._per_step_training_statistics(site):
        # Steps that fell back on the population rows trained with no moments of theirs.
        count = jnp.where(count >= self.min_step_count, count, 0.0)
      if self._rows(site) == 1 and mean.ndim == 2:
        # Shared over time: average the per-step moments, weighting steps by valid count.
        count = jnp.broadcast_to(count, mean.shape[:1])
        total = jnp.sum(count)
        weights = (count / jnp.maximum(total, 1.0))[:, None]
        mean = jnp.sum(mean * weights, axis=0)
        var = jnp.sum(var * weights, axis=0)
        count = total
      elif mean.ndim == 2:
        count = jnp.broadcast_to(count, mean.shape[:1])
      record = normalization.minibatch_moments_record(mean, var, count, self._rows(site))
      if self.is_mutable_collection('batch_stats'):
        stats[site].value = normalization.update_running_stats(
            stats[site].value, record, self.momentum)
      if self.is_mutable_collection('batch_moments'):
        self.put_variable('batch_moments', site, record)


def _pack_moments(step, sites: tuple[str, ...]):
  """Wrap a step so that it emits its sites' moments as one flat `[sum 2F]` vector.

  One scan output instead of six stacked arrays (and no per-step counts, which the layer
  derives from the mask) trims the kernels each scanned step runs.
  """
  def packed(carry, inputs):
    carry, outputs = step(carry, inputs)
    return carry, _packed_outputs(outputs, sites)
  return packed


def _packed_outputs(outputs, sites: tuple[str, ...]):
  """A step's outputs with its sites' moments packed as in `_pack_moments`."""
  flat = [v for site in sites for v in outputs['moments'][site][:2]]
  return {'h': outputs['h'], 'moments': jnp.concatenate(flat) if flat else None}


def _unpack_moments(packed: Optional[Array], sites: tuple[str, ...], features, counts):
  """Inverse of `_pack_moments` over all steps: `{site: (mean [T, F], var [T, F], count [T])}`."""
  moments, offset = {}, 0
  for site in sites:
    width = features(site)
    mean = packed[:, offset:offset + width]
    var = packed[:, offset + width:offset + 2 * width]
    moments[site] = (mean, var, counts)
    offset += 2 * width
  return moments


class _ByIdentity:
  """A static jit argument for a module whose fields cannot be hashed (a dict of layer
  options): compiled code is then reused for this very object only."""

  def __init__(self, module: nn.Module):
    self.module = module

  def __hash__(self):
    return id(self.module)

  def __eq__(self, other):
    return isinstance(other, _ByIdentity) and other.module is self.module


def _static_module(module: nn.Module):
  try:
    hash(module)
    return module
  except TypeError:
    return _ByIdentity(module)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _minibatch_moments(static_model, variables, args, rng, rng_names):
  model = static_model.module if isinstance(static_model, _ByIdentity) else static_model
  rngs = {name: rng for name in rng_names} if rng is not None else None
  _, mutated = model.apply(variables, *args, train=True, mutable=['batch_moments'],
                           rngs=rngs)
  return mutated.get('batch_moments', {})


def estimate_population_stats(model: nn.Module, variables, batches,
                              rng: Optional[jax.Array] = None,
                              rng_names: Sequence[str] = ('noise', 'dropout')):
  """The papers' population statistics: minibatch moments averaged over training batches.

  The one implementation of the estimate for single-device use (notebooks, your own
  loops, the figure scripts); the trainer runs the same average pmapped
  (`train.Trainer.population_stats`). Runs `model.apply(variables, *args, train=True,
  mutable=['batch_moments'])` for each `args` tuple of `batches` with the current
  parameters (the running averages are left alone) and averages the moments each step's
  row received (Cooijmans et al. sec. 3). Compiled once per model and batch shape.

  The batches need not be of the training size. Larger ones estimate the statistics of
  sites downstream of other normalised terms (the cell, upper layers) for the
  population-mode network better: on 784-step MNIST early in training, 10 batches of
  100 gave 0.20 validation accuracy and 2 batches of 1,000 gave 0.34 (README,
  `experiments/analysis/estimate_batch_size.py`).

  Args:
    model: a module built from `RecurrentLayer`s (a layer, a stack or a model).
    variables: its `{'params', 'batch_stats'}`.
    batches: iterable of argument tuples, e.g. `[(x, mask), ...]` of training data.
    rng: key for the model's randomness in training mode (h0 noise, dropout); batch `i`
      uses `jax.random.fold_in(rng, i)` for every stream in `rng_names`. Required when
      the model draws noise; None otherwise.
    rng_names: the rng streams the model reads.

  Returns:
    A `batch_stats` tree to evaluate with: `{**variables, 'batch_stats': result}`.
  """
  static_model, records = _static_module(model), []
  for index, args in enumerate(batches):
    batch_rng = None if rng is None else jax.random.fold_in(rng, index)
    records.append(_minibatch_moments(static_model, variables, tuple(args), batch_rng,
                                      tuple(rng_names)))
  if not records:
    raise ValueError('estimate_population_stats needs at least one batch.')
  return _population_estimate(tuple(records))


_population_estimate = jax.jit(normalization.population_estimate)


def make_layer(variant: str, hidden_size: int, **overrides) -> RecurrentLayer:
  """A `RecurrentLayer` preset from `VARIANTS`, with any field overridden."""
  if variant not in VARIANTS:
    raise ValueError(f'Unknown RNN variant {variant!r}; choose one of {sorted(VARIANTS)}.')
  fields = {**VARIANTS[variant], **overrides}
  unknown = set(fields) - {f.name for f in dataclasses.fields(RecurrentLayer)}
  if unknown:
    raise ValueError(f'Unknown RecurrentLayer fields {sorted(unknown)}.')
  return RecurrentLayer(hidden_size=hidden_size, **fields)


class Bidirectional(nn.Module):
  """Runs `forward_layer` in time order and `backward_layer` on each sequence's reversed
  valid part (padding stays at the end, as BN-e** needs); concatenates their outputs.

  Returns `((forward_carry, backward_carry), [batch, time, 2 * hidden])`.
  """
  forward_layer: nn.Module
  backward_layer: nn.Module

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool):
    forward_carry, forward_out = self.forward_layer(inputs, mask, train=train)
    backward_carry, backward_out = self.backward_layer(
        reverse_valid(inputs, mask), mask, train=train)
    outputs = jnp.concatenate([forward_out, reverse_valid(backward_out, mask)], axis=-1)
    return (forward_carry, backward_carry), outputs


class StackedRNN(nn.Module):
  """`num_layers` recurrent layers with Zaremba-style dropout on the non-recurrent
  connections (each layer's input and the stack's output).

  Attributes:
    variant: a name from `VARIANTS`.
    hidden_size: units per layer (per direction).
    num_layers: depth.
    dropout_rate: dropout between layers, before the first and after the last.
    bidirectional: wrap each layer in `Bidirectional`.
    layer_options: `RecurrentLayer` field overrides (max_length, gamma_init, ...).

  Call: `(inputs [B, T, I], mask [B, T] | None, train=..., initial_carries=None)` ->
  `(final_carries: list per layer, outputs [B, T, H or 2H])`.
  """
  variant: str
  hidden_size: int
  num_layers: int = 1
  dropout_rate: float = 0.0
  bidirectional: bool = False
  layer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @nn.compact
  def __call__(self, inputs: Array, mask: Optional[Array] = None, *, train: bool,
               initial_carries: Optional[Sequence[Any]] = None):
    if self.num_layers <= 0:
      raise ValueError(f'num_layers must be positive; got {self.num_layers}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'dropout_rate must be in [0, 1); got {self.dropout_rate}.')
    if initial_carries is not None and self.bidirectional:
      raise ValueError('initial_carries are for unidirectional stacks (carried state).')
    options = dict(self.layer_options)
    carries = []
    x = inputs
    for index in range(self.num_layers):
      x = self._dropout(x, train, options.get('axis_name'))
      if self.bidirectional:
        layer = Bidirectional(make_layer(self.variant, self.hidden_size, **options),
                              make_layer(self.variant, self.hidden_size, **options),
                              name=f'layer_{index}')
        carry, x = layer(x, mask, train=train)
      else:
        layer = make_layer(self.variant, self.hidden_size, **options, name=f'layer_{index}')
        start = None if initial_carries is None else initial_carries[index]
        carry, x = layer(x, mask, train=train, initial_carry=start)
      carries.append(carry)
    x = self._dropout(x, train, options.get('axis_name'))
    return carries, x

  def _dropout(self, x: Array, train: bool, axis_name: Optional[str]) -> Array:
    """Dropout with per-example masks (`example_dropout`), in training only."""
    if not train or self.dropout_rate == 0.0:
      return x
    return example_dropout(x, self.dropout_rate, self.make_rng('dropout'), axis_name)
