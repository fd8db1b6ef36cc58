"""Misuse of the statistics is an error, as in `flax.linen.BatchNorm` (`batch_stats.py`).

1. `train=True` with neither `batch_stats` nor `minibatch_moments` mutable would update
   nothing: raised, eagerly and under `jax.jit` (the check reads the apply's arguments,
   not values).
2. `train=False` on statistics no training batch reached (count 0) would normalise with
   mean 0 / variance 1: raised when the statistics are concrete values; under `jax.jit`
   with the statistics as arguments they are tracers, and `untrained_sites` names the
   sites before jitting.
Both for `RecurrentLayer` and `MaskedBatchNorm` (the one statistics-site implementation).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import batch_stats
from bn_rnn_jax import population
from bn_rnn_jax import stack
from bn_rnn_jax import variants

B, T, I, H = 4, 5, 3, 6
X = np.random.default_rng(0).normal(size=(B, T, I)).astype(np.float32)
MASK = (np.arange(T)[None, :] < np.array([5, 3, 4, 2])[:, None]).astype(np.float32)


def _modules():
  """(name, module, args): a batch-normalised layer, a stack of them, a MaskedBatchNorm."""
  return [
      ('layer', variants.make_layer('bn_lstm', H, max_length=T), (X, MASK)),
      ('stack', stack.StackedRNN(variant='bn_input_only', hidden_size=H, num_layers=2,
                                 layer_options=dict(max_length=T)), (X, MASK)),
      ('masked_batch_norm', batch_stats.MaskedBatchNorm(max_length=T), (X, MASK)),
  ]


MODULES = {name: (module, args) for name, module, args in _modules()}


@pytest.fixture(params=sorted(MODULES))
def case(request):
  module, args = MODULES[request.param]
  return module, args, module.init(jax.random.key(0), *args, train=False)


def test_train_without_mutable_batch_stats_raises(case):
  module, args, variables = case
  message = r"train=True needs mutable=\['batch_stats'\]"
  with pytest.raises(ValueError, match=message) as error:
    module.apply(variables, *args, train=True)
  assert '\n' not in str(error.value)
  with pytest.raises(ValueError, match=message):  # the same under jit (a static check)
    jax.jit(lambda v, x, m: module.apply(v, x, m, train=True))(variables, *args)
  with pytest.raises(ValueError, match=message):  # another collection is no substitute
    module.apply(variables, *args, train=True, mutable=['intermediates'])


def test_train_with_mutable_batch_stats_updates_them(case):
  module, args, variables = case
  _, updated = module.apply(variables, *args, train=True, mutable=['batch_stats'])
  counts = [np.asarray(leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(updated['batch_stats'])[0]
            if path[-1].key == 'count']
  assert counts and all(c[0] == 1.0 for c in counts)


def test_the_estimate_pass_needs_only_the_moments_collection(case):
  """The papers' estimate runs train=True with only `minibatch_moments` mutable: the
  explicit opt-out of check 1, and it leaves the running averages alone."""
  module, args, variables = case
  _, mutated = module.apply(variables, *args, train=True,
                            mutable=[batch_stats.MOMENTS])
  assert set(mutated) == {batch_stats.MOMENTS}
  estimate = population.estimate_population_stats(module, variables, [args, args])
  assert not batch_stats.untrained_sites(estimate)


def test_eval_of_untrained_statistics_raises(case):
  module, args, variables = case
  with pytest.raises(ValueError, match='train=False with population statistics no training '
                                       r'batch reached \(count 0') as error:
    module.apply(variables, *args, train=False)
  assert '\n' not in str(error.value)
  assert "site '" in str(error.value)
  with pytest.raises(ValueError, match='no training batch reached'):
    # Variables closed over by a jitted function are concrete when it is traced.
    jax.jit(lambda x, m: module.apply(variables, x, m, train=False))(*args)


def test_untrained_sites_names_them_before_a_jitted_evaluation(case):
  module, args, variables = case
  untrained = batch_stats.untrained_sites(variables['batch_stats'])
  assert untrained and all(isinstance(path, str) for path in untrained)
  _, updated = module.apply(variables, *args, train=True, mutable=['batch_stats'])
  assert batch_stats.untrained_sites(updated['batch_stats']) == []


def test_opting_out_evaluates_with_mean_0_variance_1(case):
  module, args, variables = case
  with batch_stats.allow_untrained_statistics():
    out = module.apply(variables, *args, train=False)
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(out))
  with pytest.raises(ValueError, match='no training batch reached'):  # scoped to the block
    module.apply(variables, *args, train=False)


def test_message_names_the_site_of_a_nested_layer():
  module, args = MODULES['stack']
  variables = module.init(jax.random.key(0), *args, train=False)
  with pytest.raises(ValueError, match="RecurrentLayer 'layer_0' site 'input'"):
    module.apply(variables, *args, train=False)


def test_trained_statistics_evaluate_without_error(case):
  module, args, variables = case
  _, updated = module.apply(variables, *args, train=True, mutable=['batch_stats'])
  out = module.apply({**variables, **updated}, *args, train=False)
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(out))


def test_layers_without_batch_statistics_need_neither():
  layer = variants.make_layer('ln_lstm', H)
  variables = layer.init(jax.random.key(0), X, train=False)
  layer.apply(variables, jnp.asarray(X), train=True)
  layer.apply(variables, jnp.asarray(X), train=False)
