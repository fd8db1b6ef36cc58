"""The recurrence of a `RecurrentLayer`, run by one of several execution backends behind
one signature:

    SCANS[policy.scan](policy, params, config, carry, xs, sites) -> (carry, h, moments)

  'scan'   `lax.scan` of the step (`steps.py`) and its autodiff
  'layer'  the same scan with the whole-layer backward pass (`layer_vjp.py`)
  'fused'  the fused BN-LSTM recurrences (`fused.py`: per-step kernels or persistent)

`params` are the layer's parameters (`steps.py` names), `config` its `steps.StepConfig`,
`carry` `(c, h)` or `h` `[B, H]`, `xs` the time-major inputs: `'x' [T, B, I]` or the
hoisted `'input_term' [T, B, G*H]`, optionally `'mask' [T, B, 1]` and `'rows'` (the
population rows per site, `(mean, var)` `[T, F]`: in inference, or for steps with too few
sequences in training), and `sites` the batch-normalised `batch_stats.Site`s. A backend
returns the final carry, `h [T, B, H]` (0 at padded steps) and, in training, each site's
moments `{name: (mean [T, F], var [T, F])}` (`[F]` for a site with moments over time).

`run` is the one entry point: it resolves the layer's `Execution` for the program's target
platform (`policy.target_platforms`; with several, `jax.lax.platform_dependent` keeps the
one the program is lowered for), hoists the input term where the policy says, and calls
the backend.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from bn_rnn_jax import fused
from bn_rnn_jax import layer_vjp
from bn_rnn_jax import policy as policy_lib
from bn_rnn_jax import steps

Array = jax.Array


def _loop_sites(config: steps.StepConfig, sites, xs) -> tuple[str, ...]:
  """The sites whose training moments the loop computes (not the hoisted input term)."""
  if not config.batch_statistics:
    return ()
  return tuple(s.name for s in sites if not (s.name == 'input' and 'input_term' in xs))


def _rematerialized(step, remat: str):
  """`step` under `jax.checkpoint` as `remat` says ('none': as it is)."""
  if remat == 'none':
    return step
  policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == 'dots' else None
  return jax.checkpoint(step, prevent_cse=False, policy=policy)


def _packed(outputs, names):
  """A step's outputs with its sites' moments as one `[sum 2F]` vector: one scan output
  in place of six (fewer kernels per step)."""
  flat = [v for name in names for v in outputs['moments'][name][:2]]
  return {'h': outputs['h'], 'moments': jnp.concatenate(flat) if flat else None}


def _unpacked(packed, names, sites):
  """`_packed`'s moments over all steps `[T, sum 2F]` as `{name: (mean, var)}` `[T, F]`."""
  width = {s.name: s.features for s in sites}
  moments, offset = {}, 0
  for name in names:
    f = width[name]
    moments[name] = (packed[:, offset:offset + f], packed[:, offset + f:offset + 2 * f])
    offset += 2 * f
  return moments


def _stepped_xs(xs):
  """`xs` as the steps read them: the population rows under `'stats'`."""
  xs = dict(xs)
  if 'rows' in xs:
    xs['stats'] = xs.pop('rows')
  return xs


def autodiff_scan(policy, params, config, carry, xs, sites):
  """`lax.scan` of the step, differentiated by JAX ('scan')."""
  names = _loop_sites(config, sites, xs)
  step_fn = steps.step_function(config)

  def step(carry, inputs):
    carry, outputs = step_fn(params, config, carry, inputs)
    return carry, _packed(outputs, names)
  carry, ys = jax.lax.scan(_rematerialized(step, policy.remat), carry, _stepped_xs(xs),
                           unroll=policy.unroll)
  return carry, ys['h'], _unpacked(ys['moments'], names, sites) if names else {}


def layer_backward_scan(policy, params, config, carry, xs, sites):
  """`lax.scan` of the step with the whole-layer backward pass ('layer')."""
  names = _loop_sites(config, sites, xs)
  cell_fn = steps.cell_function(config)

  def cell(pointwise_params, carry, terms, inputs):
    carry, outputs = cell_fn(pointwise_params, config, carry, terms, inputs)
    return carry, _packed(outputs, names)

  # The input and recurrent terms meet as a plain sum (no separate normalisation).
  tied = config.input_norm is None and (config.cell == 'rnn' or config.recurrent_norm is None)
  carry, ys = layer_vjp.scan_layer(
      cell, lambda p, c, inputs: steps.step_terms(p, config, c, inputs), params, carry,
      _stepped_xs(xs), compute_dtype=config.compute_dtype, mode=policy.remat,
      unroll=policy.unroll, tied_terms=tied)
  return carry, ys['h'], _unpacked(ys['moments'], names, sites) if names else {}


def fused_scan(policy, params, config, carry, xs, sites):
  """The fused BN-LSTM step over time ('fused'), on the hoisted input term."""
  fused.check_fits(config.cell, (config.recurrent_norm, config.input_norm,
                                      config.cell_norm),
                        next((k for k in ('shared', 'sequence') if any(s.kind == k for s in sites)),
                             'per_step'),
                        config.padded_statistics, config.min_step_count)
  rows = xs.get('rows')
  if rows and any(a.ndim == 3 for pair in rows.values() for a in pair):
    raise ValueError('Execution(fused_step=...) reads one statistics row per step for all '
                     "rows: give first_step as a scalar, or use fused_step='none'.")
  population = None if config.batch_statistics else {s: rows[s] for s in ('recurrent', 'cell')}
  return fused.scan(
      params, carry, xs['input_term'], xs.get('mask'), population, epsilon=config.epsilon,
      kernel=policy.fused_step, interpret=policy.interpret, block_h=policy.block_h,
      num_warps=policy.num_warps, compute_dtype=config.compute_dtype,
      axis_name=config.axis_name)


#: The execution backends by `ExecutionPolicy.scan`.
SCANS: dict[str, Callable] = {'scan': autodiff_scan, 'layer': layer_backward_scan,
                              'fused': fused_scan}


def hoisted_input(params, config: steps.StepConfig, xs, input_site):
  """`xs` with W_x x of all steps `'input_term' [T, B, G*H]` (normalised) in place of
  `'x'`, and the input site's training moments (or {})."""
  xs = dict(xs)
  rows = dict(xs.pop('rows', {}))
  z = steps.matmul(xs.pop('x'), params['input_kernel'], config.compute_dtype)
  over_time = input_site is not None and input_site.over_time
  stats = rows.pop('input', None)
  if stats is not None:  # against [T, B, F]
    stats = tuple(a if a.ndim == 3 else a[:, None] for a in stats)
  mask = None if config.padded_statistics else xs.get('mask')
  xs['input_term'], moments = steps.apply_norm(
      config.input_norm, z, params.get('input_scale'), None,
      batch_statistics=config.batch_statistics, mask=mask, stats=stats,
      reduce_axes=(0, 1) if over_time else (1,), epsilon=config.epsilon,
      axis_name=config.axis_name, min_count=config.min_step_count,
      batch_sums=config.batch_sums)
  if rows:
    xs['rows'] = rows
  return xs, {} if moments is None else {'input': moments[:2]}


def scope_name(policy: policy_lib.ExecutionPolicy) -> str:
  """The named scope a policy's recurrence runs in (it names the policy in the program's
  op names, e.g. `scan_hoisted_dots_reduce`)."""
  return '_'.join((policy.scan if policy.scan != 'fused' else f'fused_{policy.fused_step}',
                   'hoisted' if policy.hoist_input else 'instep', policy.remat,
                   policy.batch_sums))


def _run_policy(policy, params, config, carry, xs, sites):
  with jax.named_scope(scope_name(policy)):
    return _run_scoped(policy, params, config, carry, xs, sites)


def _run_scoped(policy, params, config, carry, xs, sites):
  config = dataclasses.replace(config, batch_sums=policy.batch_sums)
  moments = {}
  if policy.hoist_input:
    xs, moments = hoisted_input(params, config, xs,
                                next((s for s in sites if s.name == 'input'), None))
  carry, h, loop_moments = SCANS[policy.scan](policy, params, config, carry, xs, sites)
  return carry, h, {**moments, **loop_moments}


def policies(execution: policy_lib.Execution, config: steps.StepConfig, hidden_size: int,
             sites, batch, platforms=None) -> dict[policy_lib.ExecutionPolicy, list[str]]:
  """The distinct policies of one layer call on `platforms` (default the targets,
  `policy.target_platforms`), each with the platforms it serves. A symbolic batch
  (`jax.export`) cannot be compared with H, so `backward='auto'` is the autodiff of the
  scan there."""
  if not isinstance(batch, int):
    batch = 1
    if execution.backward == policy_lib.AUTO:
      execution = dataclasses.replace(execution, backward='scan')
  found = {}
  for platform in platforms or policy_lib.target_platforms():
    resolved = policy_lib.resolve(
        cell=config.cell, hidden_size=hidden_size, batch=batch, batch_norm=bool(sites),
        sequence_input=any(s.over_time for s in sites), execution=execution,
        platform=platform)
    found.setdefault(resolved, []).append(platform)
  return found


def run(execution: policy_lib.Execution, params, config: steps.StepConfig, carry, xs,
        sites, *, batch):
  """The layer's recurrence (the module docstring), with `execution` resolved for the
  program's target platforms (`policies`; with several, the policy of the platform it is
  lowered for); `batch` the per-device batch."""
  by_policy = policies(execution, config, params['recurrent_kernel'].shape[0], sites, batch)
  if len(by_policy) == 1:
    return _run_policy(next(iter(by_policy)), params, config, carry, xs, sites)

  def branch(policy):
    return lambda params, carry, xs: _run_policy(policy, params, config, carry, xs, sites)
  branches = {platform: branch(policy)
              for policy, platforms in by_policy.items() for platform in platforms}
  return jax.lax.platform_dependent(params, carry, xs, **branches)
