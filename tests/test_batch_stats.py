"""`batch_stats.py`: the one statistics-site implementation, as `MaskedBatchNorm` uses it
against the float64 reference, and its misuse checks.

Misuse of the statistics is an error, as in `flax.linen.BatchNorm`:

1. `use_running_average=False` with neither `batch_stats` nor `minibatch_moments`
   mutable would update nothing: raised, eagerly and under `jax.jit` (the check reads
   the apply's arguments, not values).
2. `use_running_average=True` on statistics no training batch reached (count 0) would
   normalise with mean 0 / variance 1: raised at once when the statistics are concrete
   values, and when the computation runs under `jax.jit` with the statistics as
   arguments (tracers); `untrained_sites` names the sites beforehand, and
   `allow_untrained_statistics` opts out.
3. Batch statistics over one row (a batch of 1 on one device, as under `jax.vmap` without
   an axis name) would normalise to a constant: raised naming `axis_name`, and the named
   vmapped axis gives the whole batch's moments.
Both for `RecurrentLayer` and `MaskedBatchNorm` (the one statistics-site implementation).
The first evaluation with population statistics after a training pass, in a process that
made no estimate pass, warns once (`RunningAverageWarning`).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from bn_rnn_jax import batch_stats
from bn_rnn_jax import checks
from bn_rnn_jax import population
from bn_rnn_jax import stack
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T, I, H = 4, 5, 3, 6
X = np.random.default_rng(0).normal(size=(B, T, I)).astype(np.float32)
MASK = helpers.prefix_mask([5, 3, 4, 2], T)


def _modules():
  """(name, module, args): a batch-normalised layer, a stack of them, a MaskedBatchNorm."""
  return [
      ('layer', variants.make_layer('bn_lstm', H, max_length=T), (X, MASK)),
      ('stack', stack.StackedRNN(variants.make_layer('bn_input_only', H, max_length=T),
                                 num_layers=2), (X, MASK)),
      ('masked_batch_norm', batch_stats.MaskedBatchNorm(max_length=T), (X, MASK)),
  ]


MODULES = {name: (module, args) for name, module, args in _modules()}


def _outputs(module):
  """The call keywords that ask `module` for its outputs alone (a layer or a stack)."""
  return {} if isinstance(module, batch_stats.MaskedBatchNorm) else {'return_carry': False}


def _mode(module, use_running_average: bool) -> dict:
  """The call's flags: a MaskedBatchNorm draws no noise, so it takes no `deterministic`."""
  if isinstance(module, batch_stats.MaskedBatchNorm):
    return {'use_running_average': use_running_average}
  return {'use_running_average': use_running_average, 'deterministic': use_running_average}


@pytest.fixture(params=helpers.core_cases(sorted(MODULES), core=['masked_batch_norm']))
def case(request):
  module, args = MODULES[request.param]
  return module, args, module.init(jax.random.key(0), *args, **_mode(module, True))


def test_train_without_mutable_batch_stats_raises(case):
  module, args, variables = case
  message = r"use_running_average=False needs mutable=\['batch_stats'\]"
  with pytest.raises(ValueError, match=message) as error:
    module.apply(variables, *args, **_mode(module, False))
  assert '\n' not in str(error.value)
  with pytest.raises(ValueError, match=message):  # the same under jit (a static check)
    jax.jit(lambda v, x, m: module.apply(v, x, m, **_mode(module, False)))(variables, *args)
  with pytest.raises(ValueError, match=message):  # another collection is no substitute
    module.apply(variables, *args, **_mode(module, False),
                 mutable=['intermediates'])


def test_train_with_mutable_batch_stats_updates_them(case):
  module, args, variables = case
  _, updated = module.apply(variables, *args, **_mode(module, False),
                            mutable=['batch_stats'], **_outputs(module))
  counts = [np.asarray(leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(updated['batch_stats'])[0]
            if path[-1].key == 'count']
  # Step 0's row took the moments of every sequence of the batch.
  assert counts and all(c[0] == args[0].shape[0] for c in counts)


def test_the_estimate_pass_needs_only_the_moments_collection(case):
  """The papers' estimate runs use_running_average=False with only `minibatch_moments`
  mutable: the explicit opt-out of check 1, and it leaves the running averages alone."""
  module, args, variables = case
  _, mutated = module.apply(variables, *args, **_mode(module, False),
                            mutable=[batch_stats.MOMENTS], **_outputs(module))
  assert set(mutated) == {batch_stats.MOMENTS}
  estimate = population.estimate_population_stats(module, variables, [args, args])
  assert not batch_stats.untrained_sites(estimate)


def test_eval_of_untrained_statistics_raises(case):
  module, args, variables = case
  with pytest.raises(ValueError, match='use_running_average=True with population '
                                       'statistics no training '
                                       r'batch reached \(count 0') as error:
    module.apply(variables, *args, **_mode(module, True))
  assert '\n' not in str(error.value)
  assert "site '" in str(error.value)
  with pytest.raises(ValueError, match='no training batch reached'):
    # Variables closed over by a jitted function are concrete when it is traced.
    jax.jit(lambda x, m: module.apply(variables, x, m, **_mode(module, True)))(*args)
  # Variables passed to it are traced: the statistics normalise every valid step to NaN
  # (padding stays 0), and a checked evaluation (`checks.checkify`) names the site.
  out = np.asarray(_evaluate(module)(variables, *args))
  valid = np.broadcast_to(np.asarray(MASK)[..., None] > 0, out.shape)
  assert np.all(np.isnan(out[valid]))
  error, _ = jax.jit(checks.checkify(
      lambda v, x, m: module.apply(v, x, m, **_mode(module, True), **_outputs(module))))(
          variables, *args)
  with pytest.raises(checkify.JaxRuntimeError, match="site '.*no training batch reached"):
    error.throw()


def _evaluate(module):
  """A jitted evaluation taking the variables as an argument."""
  return jax.jit(lambda v, x, m: module.apply(v, x, m, **_mode(module, True), **_outputs(module)))


def test_untrained_sites_names_them_before_a_jitted_evaluation(case):
  module, args, variables = case
  untrained = batch_stats.untrained_sites(variables['batch_stats'])
  assert untrained and all(isinstance(path, str) for path in untrained)
  _, updated = module.apply(variables, *args, **_mode(module, False),
                            mutable=['batch_stats'], **_outputs(module))
  assert batch_stats.untrained_sites(updated['batch_stats']) == []


def test_opting_out_evaluates_with_mean_0_variance_1(case):
  module, args, variables = case
  with batch_stats.allow_untrained_statistics():
    out = module.apply(variables, *args, **_mode(module, True),
                       **_outputs(module))
    jitted = jax.block_until_ready(_evaluate(module)(variables, *args))
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves((out, jitted)))
  with pytest.raises(ValueError, match='no training batch reached'):  # scoped to the block
    module.apply(variables, *args, **_mode(module, True))


def test_message_names_the_site_of_a_nested_layer():
  module, args = MODULES['stack']
  variables = module.init(jax.random.key(0), *args, **_mode(module, True))
  with pytest.raises(ValueError, match="RecurrentLayer 'layer_0' site 'input'"):
    module.apply(variables, *args, **_mode(module, True))


def test_trained_statistics_evaluate_without_error(case):
  module, args, variables = case
  _, updated = module.apply(variables, *args, **_mode(module, False),
                            mutable=['batch_stats'], **_outputs(module))
  out = module.apply({**variables, **updated}, *args, **_mode(module, True), **_outputs(module))
  jitted = jax.block_until_ready(_evaluate(module)({**variables, **updated}, *args))
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves((out, jitted)))


def test_layers_without_batch_statistics_need_neither():
  """A layer-normalised LSTM has no statistics: training and inference apply without a
  mutable collection and compute the same function."""
  layer = variants.make_layer('ln_lstm', H)
  variables = layer.init(jax.random.key(0), X, use_running_average=True, deterministic=True)
  assert set(variables) == {'params'}
  trained = layer.apply(variables, jnp.asarray(X), use_running_average=False,
                        deterministic=False, return_carry=True)
  inferred = layer.apply(variables, jnp.asarray(X), use_running_average=True,
                         deterministic=True, return_carry=True)
  helpers.assert_trees_equal(trained, inferred)


# ----------------------------------------------------------------------------- MaskedBatchNorm
def _trained_norm(statistics, x, mask):
  """A MaskedBatchNorm's output in training, and its variables after that batch."""
  norm = batch_stats.MaskedBatchNorm(statistics=statistics, max_length=T, momentum=0.5)
  variables = norm.init(jax.random.key(0), x, mask, use_running_average=True)
  rng = np.random.default_rng(1)
  params = {'scale': rng.uniform(0.5, 1.5, x.shape[-1]), 'bias': rng.normal(size=x.shape[-1])}
  variables = {**variables, 'params': helpers.float32(params)}
  y, updated = norm.apply(variables, x, mask, use_running_average=False,
                          mutable=['batch_stats'])
  return norm, params, y, {**variables, **updated}


def test_masked_batch_norm_per_step_matches_the_reference():
  """Per-step moments of the valid rows; the running average's first update takes them;
  inference past the last trained row reuses it, and rows below `min_row_support` read
  the steady state."""
  x = np.where(MASK[..., None] > 0, X, 1e3)                          # junk in the padding
  norm, params, y, variables = _trained_norm('per_step', x, MASK)
  moments = [ref.masked_moments(x[:, t], MASK[:, t] > 0) for t in range(T)]
  for t, (mean, var, _) in enumerate(moments):
    helpers.assert_close(np.asarray(y)[MASK[:, t] > 0, t],
                         ref.normalize(x[MASK[:, t] > 0, t], mean, var, params['scale'],
                                       params['bias']), rtol=1e-4, what=f'step {t}')
  record = ref.minibatch_record(moments, False, T)
  stats = helpers.float64(variables['batch_stats']['stats'])
  for key in ('mean', 'var', 'count'):
    helpers.assert_close(stats[key], record[key], rtol=1e-5, what=key)
  longer = np.concatenate([x, x[:, :3]], axis=1)                      # 8 steps, T_max 5
  out = norm.apply(variables, longer, None, use_running_average=True)
  mean, var = ref.population_lookup(stats, 8)
  helpers.assert_close(out, ref.normalize(longer, mean, var, params['scale'], params['bias']),
                       rtol=1e-4)
  # Row 4 rests on one sequence of four: below half the support, the steady state.
  out = norm.clone(min_row_support=0.5).apply(variables, longer, None,
                                              use_running_average=True)
  mean, var = ref.population_lookup(stats, 8, 0.5)
  assert not np.allclose(mean[4:], stats['mean'][4])
  helpers.assert_close(out, ref.normalize(longer, mean, var, params['scale'], params['bias']),
                       rtol=1e-4)


def test_masked_batch_norm_sequence_wise_and_flat_use_one_row():
  x = np.where(MASK[..., None] > 0, X, 1e3)
  _, params, y, variables = _trained_norm('sequence', x, MASK)
  mean, var, _ = ref.masked_moments(x.reshape(B * T, I), MASK.reshape(-1) > 0)
  valid = MASK > 0
  helpers.assert_close(np.asarray(y)[valid],
                       ref.normalize(x[valid], mean, var, params['scale'], params['bias']),
                       rtol=1e-4)
  helpers.assert_close(variables['batch_stats']['stats']['mean'], mean[None], rtol=1e-5)
  flat = X[:, 0]                                                       # [B, F]: one row
  _, params, y, variables = _trained_norm('per_step', flat, None)
  mean, var, _ = ref.masked_moments(flat, np.ones(B, bool))
  helpers.assert_close(y, ref.normalize(flat, mean, var, params['scale'], params['bias']),
                       rtol=1e-4)
  assert variables['batch_stats']['stats']['count'].shape == (1,)


def test_statistics_vocabulary_is_checked_and_sets_the_rows():
  batch_stats.check_statistics('shared')
  with pytest.raises(ValueError, match="statistics must be one of .*; got 'frame'"):
    batch_stats.check_statistics('frame')
  sites = {'input': 1, 'recurrent': 1, 'cell': 1}
  assert [site.rows for statistics in batch_stats.STATISTICS
          for site in batch_stats.layer_sites(sites, statistics, 7)] == [7, 7, 7, 1, 7, 7,
                                                                          1, 1, 1]
  with pytest.raises(ValueError, match="MaskedBatchNorm.statistics must be 'per_step' or "
                     "'sequence'; got 'shared'"):
    batch_stats.MaskedBatchNorm(statistics='shared').init(jax.random.key(0), X, MASK,
                                                          use_running_average=True)


# ----------------------------------------------------------------------------- one row
@pytest.mark.parametrize('name', ['layer', 'masked_batch_norm'])
def test_batch_statistics_over_one_row_name_axis_name(name):
  """A batch of one on one device (as under `jax.vmap` without an axis name) is refused
  in one line naming axis_name, in training and in the estimate's pass; init is not."""
  module, (x, mask) = MODULES[name]
  variables = module.init(jax.random.key(0), x[:1], mask[:1], **_mode(module, False))
  for mutable in (['batch_stats'], [batch_stats.MOMENTS]):
    with pytest.raises(ValueError, match='batch of 1 with axis_name=None') as error:
      module.apply(variables, x[:1], mask[:1], **_mode(module, False), mutable=mutable)
    assert '\n' not in str(error.value) and 'jax.vmap' in str(error.value)


def test_vmap_with_the_axis_named_equals_the_whole_batch():
  """The fix the message names: the vmapped axis named and given to the layer gives the
  whole batch's moments (outputs and running average)."""
  layer = variants.make_layer('bn_lstm', H, max_length=T)
  named = variants.make_layer('bn_lstm', H, max_length=T, axis_name='batch')
  variables = layer.init(jax.random.key(0), X, MASK, use_running_average=True,
                         deterministic=True)
  train = lambda module: lambda x, m: module.apply(
      variables, x[None], m[None], use_running_average=False, deterministic=True,
      mutable=['batch_stats'])
  (y, updated) = jax.vmap(train(named), axis_name='batch')(X, MASK)
  want_y, want = layer.apply(variables, X, MASK, use_running_average=False,
                             deterministic=True, mutable=['batch_stats'])
  helpers.assert_close(np.asarray(y)[:, 0], want_y, what='outputs')
  for got, expected in zip(jax.tree.leaves(updated), jax.tree.leaves(want)):
    helpers.assert_close(np.asarray(got)[0], expected, what='running average')


# ----------------------------------------------------------------------------- the warning
def _fresh_process(monkeypatch):
  """A process that has traced no training, estimate or evaluation yet."""
  # pylint: disable-next=protected-access
  monkeypatch.setattr(batch_stats, '_PROCESS', batch_stats._Process())


def _trained_layer():
  layer = variants.make_layer('bn_lstm', H, max_length=T)
  variables = layer.init(jax.random.key(0), X, MASK, use_running_average=True,
                         deterministic=True)
  _, updated = layer.apply(variables, X, MASK, use_running_average=False,
                           deterministic=False, mutable=['batch_stats'])
  return layer, {**variables, **updated}


def _evaluation_warnings(layer, variables):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    layer.apply(variables, X, MASK, use_running_average=True, deterministic=True)
  return [w for w in caught if issubclass(w.category, batch_stats.RunningAverageWarning)]


def test_evaluation_after_training_without_an_estimate_warns_once(monkeypatch):
  _fresh_process(monkeypatch)
  layer, variables = _trained_layer()
  first = _evaluation_warnings(layer, variables)
  assert len(first) == 1
  text = str(first[0].message)
  assert '\n' not in text and 'estimate_population_stats' in text
  assert "RecurrentLayer site 'recurrent'" in text
  assert _evaluation_warnings(layer, variables) == []   # once a process


def test_evaluation_after_an_estimate_or_without_training_is_quiet(monkeypatch):
  _fresh_process(monkeypatch)
  layer, variables = _trained_layer()
  stats = population.estimate_population_stats(layer, variables, [(X, MASK)])
  assert _evaluation_warnings(layer, {**variables, 'batch_stats': stats}) == []
  _fresh_process(monkeypatch)
  assert _evaluation_warnings(layer, variables) == []   # statistics trained elsewhere
