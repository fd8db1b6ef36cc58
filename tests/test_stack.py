"""`stack.py`: `StackedRNN` (depth, dropout, bidirectional, templates, the flags) and
`Bidirectional` against the float64 reference (`tests/reference.py`). Stepping a stack one
step at a time is in `test_one_step_at_a_time.py`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import bn_rnn_jax as br
from bn_rnn_jax import stack
from bn_rnn_jax import variants
import helpers
import reference

B, T, I, H = 4, 6, 3, 5   # `helpers.uneven_batch`
_DATA = helpers.uneven_batch(features=I)


@pytest.fixture(scope='module')
def data():
  return _DATA


def test_stack_equals_reference_layers_in_sequence(data):
  """Two stacked bn_lstm layers (no dropout) = the reference run twice, output to input."""
  x, mask = data
  rnn = br.StackedRNN(br.make_layer('bn_lstm', H, max_length=T), num_layers=2)
  variables = rnn.init(jax.random.key(0), x, mask, use_running_average=False,
                       deterministic=False)
  (carries, out), _ = rnn.apply(variables, x, mask, use_running_average=False,
                                deterministic=False, mutable=['batch_stats'],
                                return_carry=True)
  params = helpers.float64(variables['params'])
  hidden = np.asarray(x, np.float64)
  for index in range(2):
    carry, hidden, _ = reference.run_layer(params[f'layer_{index}'], hidden, mask, 'bn_lstm')
    np.testing.assert_allclose(np.asarray(carries[index][1]), carry[1], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out), hidden, rtol=1e-4, atol=1e-5)


def _return_carry_modules():
  """(name, module, args): every module whose call takes `return_carry`."""
  layer = lambda: variants.make_layer('bn_lstm', H, max_length=T)
  x, mask = _DATA
  tokens = np.arange(B * T).reshape(B, T) % 7
  return [('layer', layer(), (x, mask)),
          ('bidirectional', stack.Bidirectional(layer(), layer()), (x, mask)),
          ('stack', br.StackedRNN(layer(), num_layers=2), (x, mask)),
          ('language_model', br.LanguageModel(7, layer()), (tokens, mask))]


@pytest.mark.parametrize('name,module,args', _return_carry_modules(),
                         ids=lambda v: v if isinstance(v, str) else '')
def test_a_call_returns_the_outputs_or_with_return_carry_the_carry_too(name, module, args):
  """As `nn.RNN`: the outputs by default, `(carry, outputs)` with `return_carry=True`."""
  variables = module.init(jax.random.key(0), *args, use_running_average=True,
                          deterministic=True)
  run = lambda **kw: module.apply(variables, *args, use_running_average=False,
                                  deterministic=False, mutable=['batch_stats'], **kw)[0]
  outputs = run()
  carry, same = run(return_carry=True)
  assert isinstance(outputs, jax.Array) and outputs.shape[:2] == (B, T), name
  helpers.assert_trees_equal(same, outputs)
  assert jax.tree.leaves(carry), name


@pytest.mark.slow
def test_stack_dropout_is_active_only_in_training(data):
  x, mask = data
  rnn = br.StackedRNN(br.make_layer('lstm', H), num_layers=2, dropout_rate=0.5)
  variables = rnn.init(jax.random.key(0), x, mask, use_running_average=True,
                       deterministic=True)
  run = functools.partial(rnn.apply, variables, x, mask)
  eval_a = run(use_running_average=True, deterministic=True)
  eval_b = run(use_running_average=True, deterministic=True)
  np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))
  train_a = run(use_running_average=False, deterministic=False,
                rngs={'dropout': jax.random.key(1)})
  train_b = run(use_running_average=False, deterministic=False,
                rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(np.asarray(train_a), np.asarray(train_b))
  # The output dropout zeroes about half of the valid entries.
  valid = np.broadcast_to(mask[..., None] > 0, train_a.shape)
  zero_fraction = np.mean(np.asarray(train_a)[valid] == 0.0)
  assert 0.3 < zero_fraction < 0.7


@pytest.mark.slow
def test_bidirectional_stack_shapes_and_halves(data):
  x, mask = data
  rnn = br.StackedRNN(br.make_layer('bn_input_only_seq', H), num_layers=2,
                      bidirectional=True)
  variables = rnn.init(jax.random.key(0), x, mask, use_running_average=False,
                       deterministic=False)
  (carries, out), _ = rnn.apply(variables, x, mask, use_running_average=False,
                                deterministic=False, mutable=['batch_stats'],
                                return_carry=True)
  assert out.shape == (B, T, 2 * H)
  assert len(carries) == 2 and len(carries[0]) == 2  # (forward, backward) per layer
  # Padded steps output zeros in both halves.
  np.testing.assert_array_equal(np.asarray(out)[mask == 0], 0.0)


def test_stack_rejects_carries_when_bidirectional(data):
  x, mask = data
  rnn = br.StackedRNN(br.make_layer('lstm', H), bidirectional=True)
  with pytest.raises(ValueError, match='initial_carries'):
    rnn.init(jax.random.key(0), x, mask, use_running_average=True, deterministic=True,
             initial_carries=[None])


# ----------------------------------------------------------------------------- templates
class GRULayer(nn.Module):
  """A layer of one's own: Flax's GRU cell under `nn.RNN`, called as a `RecurrentLayer`
  is (the mask as sequence lengths; it keeps no statistics and draws no noise)."""
  features: int

  @nn.compact
  def __call__(self, x, mask=None, *, use_running_average, deterministic,
               return_carry=False):
    del use_running_average, deterministic
    lengths = None if mask is None else jnp.sum(mask, axis=1).astype(jnp.int32)
    return nn.RNN(nn.GRUCell(self.features))(x, seq_lengths=lengths,
                                             return_carry=return_carry)


def test_a_template_of_ones_own_is_cloned_per_layer(data):
  """`StackedRNN(GRULayer(H), ...)`: each layer a clone of the template, named `layer_i`,
  fed the previous one's outputs; bidirectional stacks and the models take it too."""
  x, mask = data
  rnn = br.StackedRNN(GRULayer(H), num_layers=2)
  variables = rnn.init(jax.random.key(0), x, mask, use_running_average=True,
                       deterministic=True)
  assert sorted(variables) == ['params'] and sorted(variables['params']) == [
      'layer_0', 'layer_1']
  carries, out = rnn.apply(variables, x, mask, use_running_average=True, deterministic=True,
                           return_carry=True)
  hidden = x
  for index in range(2):
    carry, hidden = GRULayer(H).apply(
        {'params': variables['params'][f'layer_{index}']}, hidden, mask,
        use_running_average=True, deterministic=True, return_carry=True)
    np.testing.assert_array_equal(np.asarray(carries[index]), np.asarray(carry))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(hidden))

  both = br.StackedRNN(GRULayer(H), bidirectional=True)
  out = both.apply(both.init(jax.random.key(0), x, mask, use_running_average=True,
                             deterministic=True),
                   x, mask, use_running_average=True, deterministic=True)
  assert out.shape == (B, T, 2 * H)
  classifier = br.SequenceClassifier(3, GRULayer(H))
  logits = classifier.apply(classifier.init(jax.random.key(0), x, mask,
                                            use_running_average=True, deterministic=True),
                            x, mask, use_running_average=True, deterministic=True)
  assert logits.shape == (B, 3)


def test_a_template_that_is_no_module_is_a_one_line_error(data):
  x, mask = data
  for layer in ('bn_lstm', 3):
    with pytest.raises(ValueError, match='StackedRNN.layer is a template layer') as error:
      br.StackedRNN(layer).init(jax.random.key(0), x, mask, use_running_average=True,
                                deterministic=True)
    assert helpers.one_line(error).endswith(f'got {layer!r}.')


def test_the_flags_are_fields_or_call_arguments(data):
  """Flax's two flags as fields of the model (`nn.merge_param`'s rule: one or the other)
  give what the call's arguments give; a flag given neither way follows the other one."""
  x, mask = data
  rnn = br.StackedRNN(br.make_layer('bn_lstm', H, max_length=T), num_layers=2,
                      dropout_rate=0.5)
  variables = rnn.init(jax.random.key(0), x, mask, use_running_average=True)
  train = lambda rnn, **flags: rnn.apply(variables, x, mask, mutable=['batch_stats'],
                                         rngs={'dropout': jax.random.key(1)}, **flags)
  by_call = train(rnn, use_running_average=False, deterministic=False)
  helpers.assert_trees_equal(train(rnn.clone(use_running_average=False),
                                   deterministic=False), by_call)
  helpers.assert_trees_equal(train(rnn.clone(use_running_average=False)), by_call)
  quiet = train(rnn, use_running_average=False, deterministic=True)
  assert not np.allclose(quiet[0], by_call[0])  # dropout is on in `by_call`
  with pytest.raises(ValueError, match='use_running_average was given both as a field and '
                     'in the call') as error:
    rnn.clone(use_running_average=True).apply(variables, x, mask, use_running_average=False)
  helpers.one_line(error)
  with pytest.raises(TypeError, match='Say how StackedRNN runs'):
    rnn.apply(variables, x, mask)


# ----------------------------------------------------------------------------- Bidirectional
# Uneven lengths with large junk in the padded positions.
BI_B, BI_T, BI_I, BI_H, BI_MAX_LEN = 4, 5, 3, 4, 7
BI_MASK = helpers.prefix_mask((5, 2, 4, 5), BI_T, np.float64)
_rng = np.random.default_rng(0)
BI_X = np.where(BI_MASK[..., None] > 0, _rng.normal(size=(BI_B, BI_T, BI_I)),
                30.0 * _rng.normal(size=(BI_B, BI_T, BI_I)))


def test_bidirectional_backward_half_reverses_each_sequence():
  """BN-e** (Cooijmans sec. 5.4): the backward layer sees each sequence's valid part
  reversed with the padding left at the end, so its per-step statistics are those of the
  reference run on the individually reversed batch."""
  variant = 'bn_lstm'
  make = lambda: variants.make_layer(variant, BI_H, max_length=BI_MAX_LEN, momentum=0.9)
  layer = stack.Bidirectional(make(), make())
  assert_close = functools.partial(helpers.assert_close, rtol=1e-4)
  shapes = jax.eval_shape(lambda: layer.init(jax.random.key(0), jnp.zeros(BI_X.shape),
                                             use_running_average=True, deterministic=True))
  rng = np.random.default_rng(11)
  params = {half: reference.random_params(
      {k: v.shape for k, v in shapes['params'][half].items()}, rng)
            for half in ('forward_layer', 'backward_layer')}
  stats = jax.tree.map(lambda s: np.zeros(s.shape), shapes['batch_stats'])
  ((fwd_carry, bwd_carry), out), new = jax.jit(functools.partial(
      layer.apply, use_running_average=False, deterministic=False, mutable=['batch_stats'],
      return_carry=True))(
          {'params': helpers.float32(params), 'batch_stats': helpers.float32(stats)},
          helpers.float32(BI_X), helpers.float32(BI_MASK))

  want_fwd_carry, want_fwd, _ = reference.run_layer(params['forward_layer'], BI_X, BI_MASK, variant)
  want_bwd_carry, bwd_rev, bwd_moments = reference.run_layer(
      params['backward_layer'], reference.reverse_each(BI_X, BI_MASK), BI_MASK, variant)
  want_bwd = reference.reverse_each(bwd_rev, BI_MASK)
  assert_close(out[..., :BI_H], want_fwd, what='forward half')
  assert_close(out[..., BI_H:], want_bwd, what='backward half')
  for got, want in ((fwd_carry, want_fwd_carry), (bwd_carry, want_bwd_carry)):
    for g, w in zip(jax.tree.leaves(helpers.float64(got)), jax.tree.leaves(want)):
      assert_close(g, w, what='final carry')
  # The backward layer's statistics are those of the individually reversed sequences.
  for site, steps in bwd_moments.items():
    record = reference.minibatch_record(steps, False, BI_MAX_LEN)
    assert_close(new['batch_stats']['backward_layer'][site]['mean'], record['mean'])

  # Reversing the padded tensor as a whole (padding moved to the front) is a different
  # function: guard against the test passing for the wrong reason.
  _, naive, _ = reference.run_layer(params['backward_layer'], BI_X[:, ::-1], BI_MASK[:, ::-1],
                                    variant)
  assert np.max(np.abs(naive[:, ::-1] - np.asarray(out[..., BI_H:]))) > 1e-2
