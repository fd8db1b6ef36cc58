"""Recurrent step functions: pure `(params, carry, step_inputs) -> (carry, step_outputs)`.

A step never touches the `batch_stats` collection: in training it returns the batch
moments it used, in inference it receives its step's population rows as inputs.

Gate order is `(f, i, o, g)` (Cooijmans et al. eq. 6): forget, input, output, candidate.
A gated pre-activation `[B, 4H]` is the concatenation of the four `[B, H]` gate blocks.

Parameter names (in the layer's `param_dtype`, float32 by default):
  input_kernel      [I, G*H]   W_x
  recurrent_kernel  [H, G*H]   W_h
  bias              [G*H]      b (also the shift of an input-only normalisation)
  input_scale       [G*H]      gamma_x     (input term normalised)
  recurrent_scale   [G*H]      gamma_h     (recurrent term normalised)
  cell_scale, cell_bias [H]    gamma_c, beta_c (LSTM cell normalised)
  scale             [H]        gamma of tanh-RNN BN inside the recurrence (bias = beta)
with G = 4 for the LSTM and 1 for the tanh RNN.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from bn_rnn_jax import normalization

Array = jax.Array
Params = dict[str, Array]

#: A normalisation site is one of these (None = not normalised):
NORM_KINDS = (None, 'batch', 'layer')


def batch_sites(hidden_size: int, gates: int, recurrent_norm: Optional[str],
                input_norm: Optional[str], cell_norm: Optional[str]) -> dict[str, int]:
  """`{site: features}` of the batch-normalised terms, in the order recurrent, input,
  cell: `G*H` for W_h h and W_x x, H for the cell c_t."""
  width = {'recurrent': gates * hidden_size, 'input': gates * hidden_size,
           'cell': hidden_size}
  kinds = {'recurrent': recurrent_norm, 'input': input_norm, 'cell': cell_norm}
  return {site: width[site] for site, kind in kinds.items() if kind == 'batch'}


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static settings of a step (hashable): the `RecurrentLayer` fields of the same names,
  `cell` ('lstm' or 'rnn'), `batch_statistics` (else the population rows given per step),
  `compute_dtype` (the matmuls'; `matmul`) and `batch_sums` (`normalization.batch_sum`)."""
  cell: str = 'lstm'
  recurrent_norm: Optional[str] = None
  input_norm: Optional[str] = None
  cell_norm: Optional[str] = None
  batch_statistics: bool = True
  epsilon: float = normalization.DEFAULT_EPSILON
  axis_name: Optional[str] = None
  compute_dtype: Any = None
  padded_statistics: bool = False
  min_step_count: int = 1
  batch_sums: str = 'reduce'


def matmul(a: Array, b: Array, compute_dtype, contract=None) -> Array:
  """`a . b` over `contract` (`(a_axes, b_axes)`; default a's last axis with b's first) in
  `compute_dtype` (None: the operands', at least float32), returned in at least float32
  (float64 for float64 operands)."""
  wide = jnp.promote_types(jnp.result_type(a, b), jnp.float32)
  compute_dtype = wide if compute_dtype is None else compute_dtype
  contract = ((a.ndim - 1,), (0,)) if contract is None else contract
  out = jax.lax.dot_general(a.astype(compute_dtype), b.astype(compute_dtype),
                            (contract, ((), ())), preferred_element_type=wide)
  return out.astype(wide)


def apply_norm(kind: Optional[str], z: Array, scale: Optional[Array], bias: Optional[Array],
               *, batch_statistics: bool, mask: Optional[Array] = None, stats=None,
               reduce_axes=(0,), epsilon: float, axis_name: Optional[str] = None,
               min_count: int = 1, batch_sums: str = 'reduce'):
  """`(y, moments)`: `z [..., F]` normalised by `kind` (None, 'batch', 'layer'), and a
  training batch norm's `(mean, var, count)` (else None). Inference reads `stats = (mean,
  var)`; in training they replace the moments of statistics with fewer than `min_count`
  valid entries (no gradient into them)."""
  if kind is None:
    return normalization.affine(z, scale, bias), None
  if kind == 'layer':
    return normalization.layer_norm(z, scale, bias, epsilon), None
  if kind != 'batch':
    raise ValueError(f'Unknown normalisation {kind!r}; expected one of {NORM_KINDS}.')
  if batch_statistics:
    y, mean, var, count = normalization.batch_norm(
        z, scale, bias, mask=mask, reduce_axes=reduce_axes, axis_name=axis_name,
        epsilon=epsilon, batch_sums=batch_sums)
    if stats is not None:
      few = jnp.expand_dims(count < min_count, tuple(sorted(
          a % z.ndim for a in reduce_axes)))[..., None]
      population_mean, population_var = jax.lax.stop_gradient(stats)
      y = jnp.where(few, normalization.normalize(z, population_mean, population_var, scale,
                                                 bias, epsilon), y)
    # The moments feed only the population statistics: no cotangents to carry.
    return y, jax.lax.stop_gradient((mean, var, count))
  mean, var = stats
  return normalization.normalize(z, mean, var, scale, bias, epsilon), None


def _keep_padded(mask: Optional[Array], new: Array, old: Array) -> Array:
  """Padded steps (mask 0) keep the previous state."""
  return new if mask is None else jnp.where(mask > 0, new, old)


def _outputs(mask: Optional[Array], h: Array, moments: dict[str, Any]) -> dict[str, Any]:
  """A step's outputs: `h` (0 on padded rows) and the moments of its batch norms."""
  h = h if mask is None else jnp.where(mask > 0, h, jnp.zeros_like(h))
  return {'h': h, 'moments': {site: m for site, m in moments.items() if m is not None}}


def step_terms(params: Params, cfg: StepConfig, carry, inputs: dict[str, Any]):
  """The matmuls of one step: `{'recurrent': W_h h_{t-1} [B, G*H]}` and `'input': W_x x_t`,
  or the hoisted `'input_term'` as given. The rest of the step (`lstm_cell`, `rnn_cell`)
  is pointwise; `layer_vjp` differentiates it apart from the matmuls."""
  h_prev = carry[1] if isinstance(carry, tuple) else carry
  terms = {'recurrent': matmul(h_prev, params['recurrent_kernel'], cfg.compute_dtype)}
  if 'input_term' in inputs:
    terms['input_term'] = inputs['input_term']
  else:
    terms['input'] = matmul(inputs['x'], params['input_kernel'], cfg.compute_dtype)
  return terms


def _norm(cfg: StepConfig, kind: Optional[str], z: Array, scale, bias, mask, stats):
  """`apply_norm` with `cfg`'s settings; padded entries count in the batch moments under
  `cfg.padded_statistics`."""
  return apply_norm(kind, z, scale, bias, batch_statistics=cfg.batch_statistics,
                    mask=None if cfg.padded_statistics else mask, stats=stats,
                    epsilon=cfg.epsilon, axis_name=cfg.axis_name,
                    min_count=cfg.min_step_count, batch_sums=cfg.batch_sums)


def _input_term(params: Params, cfg: StepConfig, terms: dict[str, Array], mask, stats):
  """The (normalised) input term of one step and its batch moments (or None)."""
  if 'input_term' in terms:
    return terms['input_term'], None
  return _norm(cfg, cfg.input_norm, terms['input'], params.get('input_scale'), None, mask,
               stats.get('input'))


def _fuse_batch_norms(cfg: StepConfig, terms) -> bool:
  return (cfg.batch_statistics and 'input' in terms and cfg.input_norm == 'batch'
          and cfg.recurrent_norm == 'batch')


@jax.custom_vjp
def _add_halves(y: Array) -> Array:
  """`y[..., :F] + y[..., F:]` for `y [..., 2F]`, its backward pass one concatenation."""
  half = y.shape[-1] // 2
  return y[..., :half] + y[..., half:]


_add_halves.defvjp(lambda y: (_add_halves(y), None),
                   lambda _, g: (jnp.concatenate([g, g], axis=-1),))


def _fused_batch_norm_terms(params: Params, cfg: StepConfig, terms, mask, stats):
  """BN(W_x x) + BN(W_h h) as one batch norm of their `[B, 2 * 4H]` concatenation: each
  column keeps its own statistics and gamma, and the step launches half the kernels."""
  z = jnp.concatenate([terms['input'], terms['recurrent']], axis=-1)
  scale = jnp.concatenate([params['input_scale'], params['recurrent_scale']])
  rows = None
  if 'input' in stats:  # population rows for steps with too few valid rows
    rows = tuple(jnp.concatenate(pair) for pair in zip(stats['input'], stats['recurrent']))
  y, (mean, var, count) = _norm(cfg, 'batch', z, scale, None, mask, rows)
  width = terms['input'].shape[-1]
  moments = {'input': (mean[:width], var[:width], count),
             'recurrent': (mean[width:], var[width:], count)}
  return _add_halves(y), moments


def lstm_step(params: Params, cfg: StepConfig, carry: tuple[Array, Array],
              inputs: dict[str, Any]):
  """One LSTM / BN-LSTM / LN-LSTM step (Cooijmans et al. eq. 6-8 and 14-16), each N the
  identity, a batch norm or a layer norm as `cfg` says:

    gates = N_h(W_h h_{t-1}; gamma_h) + N_x(W_x x_t; gamma_x) + b
    c_t   = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t   = sigmoid(o) * tanh(N_c(c_t; gamma_c, beta_c))

  `carry` `(c, h)` `[B, H]`; `inputs`: `'x' [B, I]` or `'input_term' [B, 4H]`, optionally
  `'mask' [B, 1]` and `'stats'` (`{site: (mean [F], var [F])}`, this step's population
  rows). Returns the new carry (padded rows keep theirs) and `{'h': [B, H] (0 on padded
  rows), 'moments': {site: (mean, var, count)}}`."""
  return lstm_cell(params, cfg, carry, step_terms(params, cfg, carry, inputs), inputs)


def lstm_cell(params: Params, cfg: StepConfig, carry: tuple[Array, Array],
              terms: dict[str, Array], inputs: dict[str, Any]):
  """`lstm_step` after its matmuls (`terms` of `step_terms`)."""
  c_prev, h_prev = carry
  mask, stats = inputs.get('mask'), inputs.get('stats', {})
  if _fuse_batch_norms(cfg, terms):
    gates, moments = _fused_batch_norm_terms(params, cfg, terms, mask, stats)
    gates = gates + params['bias']
  else:
    input_term, input_moments = _input_term(params, cfg, terms, mask, stats)
    recurrent_term, recurrent_moments = _norm(
        cfg, cfg.recurrent_norm, terms['recurrent'], params.get('recurrent_scale'), None,
        mask, stats.get('recurrent'))
    moments = {'input': input_moments, 'recurrent': recurrent_moments}
    gates = recurrent_term + input_term + params['bias']
  f, i, o, g = jnp.split(gates, 4, axis=-1)
  c = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
  c_out, moments['cell'] = _norm(cfg, cfg.cell_norm, c, params.get('cell_scale'),
                                 params.get('cell_bias'), mask, stats.get('cell'))
  h = jax.nn.sigmoid(o) * jnp.tanh(c_out)
  new_carry = (_keep_padded(mask, c, c_prev), _keep_padded(mask, h, h_prev))
  return new_carry, _outputs(mask, h, moments)


def rnn_step(params: Params, cfg: StepConfig, carry: Array, inputs: dict[str, Any]):
  """One tanh-RNN step (Laurent et al.): `h_t = tanh(W_h h_{t-1} + N_x(W_x x_t) + b)`
  (eq. 18), or with `cfg.recurrent_norm` the sum normalised, `tanh(BN(W_h h_{t-1} +
  W_x x_t; gamma, beta))` (eq. 17, App. A). As `lstm_step`, with carry `h [B, H]`."""
  return rnn_cell(params, cfg, carry, step_terms(params, cfg, carry, inputs), inputs)


def rnn_cell(params: Params, cfg: StepConfig, carry: Array, terms: dict[str, Array],
             inputs: dict[str, Any]):
  """`rnn_step` after its matmuls (see `lstm_cell`)."""
  mask, stats = inputs.get('mask'), inputs.get('stats', {})
  input_term, input_moments = _input_term(params, cfg, terms, mask, stats)
  pre, recurrent_moments = terms['recurrent'] + input_term, None
  if cfg.recurrent_norm is None:
    pre = pre + params['bias']
  else:
    pre, recurrent_moments = _norm(cfg, cfg.recurrent_norm, pre, params['scale'],
                                   params['bias'], mask, stats.get('recurrent'))
  h = jnp.tanh(pre)
  moments = {'input': input_moments, 'recurrent': recurrent_moments}
  return _keep_padded(mask, h, carry), _outputs(mask, h, moments)


def step_function(cfg: StepConfig):
  """The step of `cfg.cell`: `lstm_step` or `rnn_step`."""
  return lstm_step if cfg.cell == 'lstm' else rnn_step


def cell_function(cfg: StepConfig):
  """The step of `cfg.cell` after its matmuls: `lstm_cell` or `rnn_cell`."""
  return lstm_cell if cfg.cell == 'lstm' else rnn_cell
