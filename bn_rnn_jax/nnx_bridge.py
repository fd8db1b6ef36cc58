"""Any module of this library as a Flax NNX module, and the papers' estimate in NNX.

`FromLinen(module, *example_args, rngs=...)` is a `flax.nnx.bridge.ToNNX` of a layer,
stack or model whose variables are the Linen ones by name (`nnx.Param`; `nnx.BatchStat`
for the statistics); a call runs the Linen module's `apply` on them. It adds
`model.train()` / `model.eval()` (batch or population statistics, as `nnx.BatchNorm`),
`estimate_population_stats(model, batches)` (every wrapped module's estimate in place) and
`step` (one step at a time). Misuse is caught as in Linen (`batch_stats.py`). The layer
guide (docs/guide/layers.md, "Flax NNX") trains a classifier with it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import jax
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables

from bn_rnn_jax import batch_stats
from bn_rnn_jax import modes
from bn_rnn_jax import population

#: The rng streams the library's modules read in training (h0 noise, dropout).
RNG_STREAMS = ('noise', 'dropout')


class MinibatchMoments(nnx.Variable):
  """One estimate pass's minibatch moments of a wrapped module (`batch_stats.MOMENTS`)."""


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _assign(variables, values) -> None:
  """Set each `nnx.Variable` of `variables` to the matching leaf of `values` (`values`
  may hold a part of the tree: its leaves name the variables set)."""
  if _is_variable(values):
    variables.set_value(values.get_value())
  elif isinstance(values, Mapping):
    for key, value in values.items():
      _assign(variables[key], value)
  else:
    variables.set_value(values)


class FromLinen(bridge.ToNNX):
  """`module` (e.g. `make_layer('bn_lstm', 100, max_length=784)`) as an NNX module,
  initialised from an example call (`*example_args`, `**example_kwargs`, as Linen's
  `init`); the `params` stream of `rngs` initialises it, its `noise` and `dropout` streams
  feed training. `use_running_average` (`model.train()` / `model.eval()`) picks batch
  statistics, folded into the `nnx.BatchStat` variables, or population statistics. Called
  with the Linen module's arguments without the flags."""

  def __init__(self, module: nn.Module, *example_args, rngs: nnx.Rngs, **example_kwargs):
    super().__init__(module, rngs=rngs)
    keys = {'params': rngs.params(), **{name: rngs[name]() for name in RNG_STREAMS}}
    variables = module.init(keys, *example_args, **modes.flags(module, modes.EVAL),
                            **example_kwargs)
    for name, value in bridge_variables.linen_vars_to_nnx_attrs(variables).items():
      setattr(self, name, value)
    self.use_running_average = False
    self._estimating = False

  def _nnx_attributes(self) -> dict[str, Any]:
    """The attributes that hold the Linen variables (not the module, flags or sizes)."""
    return {name: value for name, value in vars(self).items()
            if not name.startswith(('to_nnx__', '_pytree__', '_'))
            and name != 'minibatch_moments'
            and any(_is_variable(leaf) for leaf in jax.tree.leaves(value, is_leaf=_is_variable))}

  def linen_variables(self) -> dict[str, Any]:
    """`{'params', 'batch_stats'}` as plain arrays, for the Linen module's `apply`."""
    variables = bridge_variables.nnx_attrs_to_linen_vars(self._nnx_attributes())
    return {'params': variables.get('params', {}),
            'batch_stats': variables.get('batch_stats', {})}

  def load_linen_variables(self, variables) -> None:
    """Set the parameters (and `batch_stats`, when given) from a Linen variables dict of
    the same module, e.g. a checkpoint trained with Linen."""
    _assign(self._nnx_attributes(), bridge_variables.linen_vars_to_nnx_attrs(
        {k: v for k, v in variables.items() if k in ('params', 'batch_stats')}))

  def __call__(self, *args, **kwargs):
    return self.apply_linen(self.to_nnx__module, *args, **kwargs)

  def apply_linen(self, module: nn.Module, *args, scope: Optional[str] = None, **kwargs):
    """Apply `module` (the wrapped one, or a Linen module holding it as the child `scope`,
    such as `flax_cells.RNN(cell)`) to these variables in this wrapper's mode, keeping
    what it updates: the Linen call behind `__call__`."""
    # The bridge's own call reads every attribute as a variable, `use_running_average`
    # (which `model.train()` / `eval()` set) included: the Linen module is applied here.
    variables = self.linen_variables()
    if scope:
      variables = {k: {scope: v} for k, v in variables.items()}
    if self.use_running_average and not self._estimating:
      return module.apply(variables, *args, **modes.flags(module, modes.EVAL), **kwargs)
    if self._estimating:  # the papers' estimate: batch statistics and h0 noise, no dropout
      collection, mode = batch_stats.MOMENTS, modes.BATCH_STATISTICS
      rngs = {'noise': self.to_nnx__rngs['noise']()}
    else:
      collection, mode = 'batch_stats', modes.TRAIN
      rngs = {name: self.to_nnx__rngs[name]() for name in RNG_STREAMS}
    outputs, mutated = module.apply(variables, *args, **modes.flags(module, mode), rngs=rngs,
                                    mutable=[collection], **kwargs)
    if scope:
      mutated = {k: v.get(scope, {}) for k, v in mutated.items()}
    if self._estimating:
      self.minibatch_moments = MinibatchMoments(mutated.get(collection, {}))
    elif collection in mutated:
      self.load_linen_variables(mutated)
    return outputs

  def step(self, *args, **kwargs):
    """The Linen module's `step` (one inference step with the population rows of that
    step): `(carry, x_t, t)` -> `(carry, output_t)`."""
    return self.to_nnx__module.apply(self.linen_variables(), *args, method='step', **kwargs)


def _wrapped(model: nnx.Module) -> dict[str, FromLinen]:
  """`{path: module}` of every `FromLinen` in `model` (itself included)."""
  return {'/'.join(map(str, path)): node for path, node in nnx.iter_graph(model)
          if isinstance(node, FromLinen)}


@nnx.jit
def _minibatch_moments(model: nnx.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
  """`{path: MOMENTS collection}` of one training-mode pass of `model(*args, **kwargs)`."""
  model.set_attributes(FromLinen, _estimating=True, raise_if_not_found=False)
  try:
    model(*args, **kwargs)
  finally:
    model.set_attributes(FromLinen, _estimating=False, raise_if_not_found=False)
  records = {}
  for path, module in _wrapped(model).items():
    if hasattr(module, 'minibatch_moments'):  # not when `model` did not call it
      records[path] = module.minibatch_moments.get_value()
      del module.minibatch_moments
  return records


def estimate_population_stats(model: nnx.Module, batches: Iterable[Any]) -> None:
  """The papers' estimate (`population.estimate_population_stats`) for every `FromLinen`
  in `model` (the NNX cells among them), in place: the wrapped modules write only their
  minibatch moments on each batch (other NNX modules run in the mode they are in), then
  each gets their average per row. Compiled once per model and batch shape."""
  called = model.to_nnx__module if isinstance(model, FromLinen) else model
  found = population.records(batches, called,
                             lambda i, args, kwargs: _minibatch_moments(model, args, kwargs))
  estimate = population.average_minibatch_moments(found)
  wrapped = _wrapped(model)
  done = population.complete([(path, estimate.get(path),
                               module.linen_variables()['batch_stats'])
                              for path, module in wrapped.items()])
  for module, stats in zip(wrapped.values(), done):
    if stats:
      module.load_linen_variables({'batch_stats': stats})
