"""Any module of this library as a Flax NNX module, and the papers' estimate in NNX.

`FromLinen(module, *example_args, rngs=...)` makes any module of this library (a
`RecurrentLayer`, a `StackedRNN`, a model) an NNX module: a `flax.nnx.bridge.ToNNX`, whose
variables are the Linen ones by name (`nnx.Param`, and `nnx.BatchStat` for the population
statistics: per site the same `{'mean': [R, F], 'var': [R, F], 'count': [R]}` rows as the
Linen `batch_stats`); a call runs the Linen module's own `apply` on them, so the numerics
are the same cells and statistics. What it adds to the bridge:

  model.train() / model.eval()   batch statistics (folding them into the `BatchStat`
                                 running average) / population statistics, through
                                 `use_running_average` as in `nnx.BatchNorm`;
  estimate_population_stats(model, batches)
                                 the papers' estimate in one call: every wrapped module
                                 (the NNX cells of `nnx_cells.py` among them) gets the
                                 average of its minibatch moments over the batches,
                                 computed with the current parameters;
  wrapped.step(carry, x_t, t)    one step at a time (`RecurrentLayer.step`,
                                 `StackedRNN.step`, `LanguageModel.step`).

Misuse is caught as in Linen (`batch_stats.py`): evaluating statistics that no training
batch reached raises, at once in an eager call and when the computation runs under
`nnx.jit` (`batch_stats.allow_untrained_statistics()` opts out).

Recipe: the sequential-MNIST BN-LSTM classifier (Linen:
`models.SequenceClassifier(10, make_layer('bn_lstm', 100, max_length=784))`; the layer
guide, docs/guide/layers.md, runs a small one), with `tx = optax.adam(1e-3)`,
`cross_entropy(logits, labels)` the mean softmax cross-entropy and `batches` a list of
`(x [batch, 784, 1], labels [batch])`:

  from flax import nnx
  import bn_rnn_jax as br
  from bn_rnn_jax import nnx_bridge

  class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      layer = br.make_layer('bn_lstm', 100, max_length=784)
      self.rnn = nnx_bridge.FromLinen(layer, jnp.zeros((1, 784, 1)), rngs=rngs)
      self.head = nnx.Linear(100, 10, rngs=rngs)

    def __call__(self, x, mask=None):               # x [batch, time, 1]
      (_, h), _ = self.rnn(x, mask, return_carry=True)
      return self.head(h)                           # [batch, 10]

  model = Classifier(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, x, labels):
    grads = nnx.grad(lambda model: cross_entropy(model(x), labels))(model)
    optimizer.update(model, grads)

  model.train()
  for x, labels in batches:
    train_step(model, optimizer, x, labels)
  nnx_bridge.estimate_population_stats(model, [(x,) for x, _ in batches])
  model.eval()
  logits = model(x_valid)

`tests/test_nnx.py` trains this classifier (smaller) from Linen and from NNX from the same
initial values and finds the same parameters, statistics and evaluation outputs.
"""

from __future__ import annotations

import warnings
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
  """A module of this library as an NNX module: a `flax.nnx.bridge.ToNNX` (its variables
  and rngs), initialised from an example call, with `use_running_average` and
  `deterministic` driven by `model.train()` / `model.eval()`.

  Args:
    module: the Linen module (e.g. `make_layer('bn_lstm', 100, max_length=784)`).
    *example_args: arguments of an example call, for the shapes of its variables (as
      Linen's `init`, e.g. `jnp.zeros((1, T, I))`).
    **example_kwargs: keyword arguments of that call.
    rngs: `nnx.Rngs`; its `params` (or default) stream initialises the parameters, and
      its `noise` and `dropout` streams feed h0 noise and dropout in training.

  Attributes:
    (the bridge's) the Linen variables by name, `params` leaves as `nnx.Param` and
      `batch_stats` leaves as `nnx.BatchStat`; `linen_variables()` gives them back as
      the Linen `{'params', 'batch_stats'}`.
    use_running_average: False (`model.train()`): batch statistics, folded into the
      `nnx.BatchStat`s; True (`model.eval()`): population statistics.

  Call: the Linen module's arguments without the two flags (e.g. a layer's `(inputs
  [B, T, I], mask [B, T] | None, initial_carry=None)`), and its outputs.
  """

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
    nest = (lambda tree: {k: {scope: v} for k, v in tree.items()}) if scope else (lambda t: t)
    variables = nest(self.linen_variables())
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
  """The papers' population statistics for every `FromLinen` in `model` (the NNX cells
  among them), in place.

  Runs `model` on each batch of `batches` (training data: a tuple of positional
  arguments, or a mapping of keyword arguments, e.g. `{'inputs': x, 'seq_lengths':
  lengths}` for an `nnx_cells.RNN`) with the wrapped modules in training mode writing
  only their minibatch moments (parameters and statistics untouched; other NNX modules,
  e.g. `nnx.Dropout`, run in the mode they are in), then sets each wrapped module's
  `batch_stats` to the average of its moments per row
  (`population.average_minibatch_moments`, as the Linen
  `population.estimate_population_stats`). Compiled once per model and batch shape.

  Give the batches the lengths or mask the model trains with: a batch whose inputs look
  zero-padded and that passes neither warns (`population.padding_without_lengths`). A
  concrete `mask` or `seq_lengths` argument of the model's call (of the wrapped Linen
  module's, for a `FromLinen`) is checked as the layer checks it before the pass is
  traced, and a batch whose moments are NaN or inf is refused, as in Linen (one-line
  ValueErrors). A site no batch reached (a module the call does not run), or reached only
  with empty or all-padding batches, is set to count 0, with a warning naming it, and
  evaluation refuses it.
  """
  records, padded = [], None
  called = model.to_nnx__module if isinstance(model, FromLinen) else model
  for i, batch in enumerate(batches):
    args, kwargs = population.call_arguments(batch)
    population.check_concrete_batch(called, args, kwargs,
                                    f'estimate_population_stats: batch {i}')
    padded = padded or population.padding_warning('estimate_population_stats', batch)
    records.append(_minibatch_moments(model, args, kwargs))
  if not records:
    raise ValueError('estimate_population_stats needs at least one batch.')
  nonfinite = population.nonfinite_moments(records)
  if nonfinite:
    raise population.nonfinite_error('estimate_population_stats', nonfinite)
  if padded:
    warnings.warn(padded, stacklevel=2)
  estimate = population.average_minibatch_moments(records)
  unreached, empty = [], []
  for path, module in _wrapped(model).items():
    stats, missing = population.with_every_site(
        estimate.get(path), module.linen_variables()['batch_stats'])
    unreached += [f'{path}/{site}' if path else site for site in missing]
    empty += [f'{path}/{site}' if path else site
              for site in batch_stats.untrained_sites(stats) if site not in missing]
    if stats:
      module.load_linen_variables({'batch_stats': stats})
  if unreached:
    warnings.warn(population.unreached_warning('estimate_population_stats', unreached),
                  stacklevel=2)
  if empty:
    warnings.warn(population.empty_sites_warning('estimate_population_stats', empty),
                  stacklevel=2)
