"""One step at a time (`RecurrentLayer.step`, `StackedRNN.step`, `LanguageModel.step`).

Stepping t = 0, 1, ... through a sequence must give what applying the whole sequence
gives (outputs and final carry), with the population row `min(t, last trained row)` at
each step, for every variant, with and without masks, and past the trained length. The
stepped outputs are also checked against the float64 reference (`tests/reference.py`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import normalization
from bn_rnn_jax import stack
from bn_rnn_jax import variants
import helpers
import reference as ref

B, I, H = 4, 3, 5
T_TRAIN, T_EVAL, MAX_LEN = 4, 7, 6   # evaluation runs past the last trained row (3)
TRAIN_LENGTHS, EVAL_LENGTHS = (4, 2, 3, 4), (7, 3, 5, 6)
# float32 stepped vs whole: the same operations in another program (a scan of 1 step per
# call instead of 7), so equal up to rounding.
STEP_RTOL, STEP_ATOL = 1e-5, 1e-6


def _data(seed, length, lengths, masked):
  x = np.random.default_rng(seed).normal(size=(B, length, I)).astype(np.float32)
  return x, (helpers.prefix_mask(lengths, length) if masked else None)


def _trained(module, train_args, seed=0):
  """Variables after two training batches (so the running averages are not fresh)."""
  variables = module.init(jax.random.key(seed), *train_args, use_running_average=True,
                          deterministic=True)
  apply = jax.jit(lambda v, *args: module.apply(v, *args, use_running_average=False,
                                                deterministic=False, mutable=['batch_stats'],
                                                return_carry=True)[1])
  for _ in range(2):
    variables = {**variables, **apply(variables, *train_args)}
  return variables


def _step_through(module, variables, inputs, mask):
  """A jitted `step` called for t = 0 .. T-1 (t traced): `(carry, outputs [B, T, ...])`."""
  step = jax.jit(lambda v, c, x, t, m: module.apply(v, c, x, t, m, method='step'))
  carry, outputs = None, []
  for t in range(inputs.shape[1]):
    m = None if mask is None else mask[:, t]
    carry, out = step(variables, carry, inputs[:, t], jnp.int32(t), m)
    outputs.append(np.asarray(out))
  return carry, np.stack(outputs, axis=1)


def _assert_step_equals_whole(stepped, whole):
  (step_carry, step_out), (whole_carry, whole_out) = stepped, whole
  np.testing.assert_allclose(step_out, np.asarray(whole_out), rtol=STEP_RTOL, atol=STEP_ATOL)
  for got, want in zip(jax.tree.leaves(step_carry), jax.tree.leaves(whole_carry), strict=True):
    np.testing.assert_allclose(got, want, rtol=STEP_RTOL, atol=STEP_ATOL)


@pytest.mark.parametrize('variant,masked', helpers.core_cases(
    [(v, masked) for masked in (False, True) for v in sorted(variants.VARIANTS)],
    core=[('bn_lstm', True), ('bn_input_only_seq', False)],
    ids=lambda case: f"{case[0]}-{'masked' if case[1] else 'unmasked'}"))
def test_layer_step_equals_the_whole_sequence(variant, masked):
  layer = variants.make_layer(variant, H, max_length=MAX_LEN)
  x_train, mask_train = _data(0, T_TRAIN, TRAIN_LENGTHS, masked)
  variables = _trained(layer, (x_train, mask_train))
  x, mask = _data(1, T_EVAL, EVAL_LENGTHS, masked)
  whole = jax.jit(lambda v, x, m: layer.apply(v, x, m, use_running_average=True,
                                              deterministic=True, return_carry=True))(
      variables, x, mask)
  stepped = _step_through(layer, variables, x, mask)
  _assert_step_equals_whole(stepped, whole)

  # And both are the float64 reference with rows min(t, 3).
  stats = jax.tree.map(np.asarray, variables.get('batch_stats', {}))
  population = {site: ref.population_lookup(stats[site], T_EVAL,
                                        normalization.DEFAULT_MIN_ROW_SUPPORT)
                for site in ref.batch_sites(variant)}
  params = jax.tree.map(np.asarray, variables['params'])
  want_carry, want_out, _ = ref.run_layer(params, x, mask, variant, train=False,
                                          population=population)
  scale = max(float(np.abs(want_out).max()), 1e-3)
  np.testing.assert_allclose(stepped[1], want_out, rtol=1e-4, atol=1e-4 * scale)
  for got, want in zip(jax.tree.leaves(stepped[0]), jax.tree.leaves(want_carry), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize('variant', helpers.core_cases(['bn_lstm', 'rnn_bn_recurrence'],
                                                       core=['rnn_bn_recurrence']))
def test_stack_step_equals_the_whole_sequence(variant):
  rnn = stack.StackedRNN(variants.make_layer(variant, H, max_length=MAX_LEN), num_layers=2)
  x_train, mask_train = _data(2, T_TRAIN, TRAIN_LENGTHS, True)
  variables = _trained(rnn, (x_train, mask_train))
  x, mask = _data(3, T_EVAL, EVAL_LENGTHS, True)
  whole = jax.jit(lambda v, x, m: rnn.apply(v, x, m, use_running_average=True,
                                            deterministic=True, return_carry=True))(
      variables, x, mask)
  _assert_step_equals_whole(_step_through(rnn, variables, x, mask), whole)


@pytest.mark.slow
def test_language_model_steps_in_a_scan_equal_the_whole_sequence():
  """The sampler's form: `step` inside `lax.scan`, the step index a traced counter."""
  model = models.LanguageModel(7, variants.make_layer('bn_lstm', H, max_length=MAX_LEN),
                               num_layers=2)
  rng = np.random.default_rng(4)
  tokens_train = rng.integers(0, 7, size=(B, T_TRAIN)).astype(np.int32)
  variables = _trained(model, (tokens_train, None))
  tokens = rng.integers(0, 7, size=(B, T_EVAL)).astype(np.int32)

  @jax.jit
  def stepped(v, tokens):
    carries, first = model.apply(v, None, tokens[:, 0], 0, method='step')
    def body(carries, inputs):
      t, token = inputs
      return model.apply(v, carries, token, t, method='step')
    carries, rest = jax.lax.scan(body, carries, (jnp.arange(1, T_EVAL), tokens[:, 1:].T))
    return carries, jnp.concatenate([first[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)

  whole = jax.jit(lambda v, t: model.apply(v, t, None, use_running_average=True,
                                           deterministic=True, return_carry=True))(
      variables, tokens)
  _assert_step_equals_whole(stepped(variables, tokens), whole)


def test_bidirectional_layers_refuse_to_step():
  rnn = stack.StackedRNN(variants.make_layer('bn_lstm', H, max_length=MAX_LEN),
                         bidirectional=True)
  x, _ = _data(5, T_TRAIN, TRAIN_LENGTHS, False)
  variables = _trained(rnn, (x, None))
  with pytest.raises(ValueError, match='bidirectional layer cannot run one step at a time'):
    rnn.apply(variables, None, x[:, 0], 0, method='step')
  layer = stack.Bidirectional(variants.make_layer('lstm', H), variants.make_layer('lstm', H))
  layer_variables = layer.init(jax.random.key(0), x, use_running_average=True,
                               deterministic=True)
  with pytest.raises(ValueError, match='bidirectional layer cannot run one step at a time'):
    layer.apply(layer_variables, None, x[:, 0], 0, method='step')


def test_training_from_first_step_records_its_rows():
  """A training call continuing a sequence at `first_step` records the statistics rows
  from that step on, and rows past max_length are an error (one line)."""
  layer = variants.make_layer('bn_lstm', H, max_length=MAX_LEN)
  x, _ = _data(6, T_TRAIN, TRAIN_LENGTHS, False)
  variables = layer.init(jax.random.key(0), x, use_running_average=True, deterministic=True)
  _, whole = layer.apply(variables, x, use_running_average=False, deterministic=True,
                         mutable=['batch_stats'])
  _, tail = layer.apply(variables, x[:, 2:], use_running_average=False, deterministic=True,
                        first_step=2, mutable=['batch_stats'])
  counts = tail['batch_stats']['cell']['count']
  np.testing.assert_array_equal(counts[:2], 0.0)
  want = whole['batch_stats']['cell']['count']
  np.testing.assert_array_equal(counts[2:T_TRAIN], want[2:T_TRAIN])
  with pytest.raises(ValueError, match=f'max_length={MAX_LEN}') as error:
    layer.apply(variables, x, use_running_average=False, deterministic=True,
                first_step=MAX_LEN - T_TRAIN + 1, mutable=['batch_stats'])
  helpers.one_line(error)