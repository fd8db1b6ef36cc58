"""`sequence.py`: reversing each sequence's valid part, the prefix-mask check, and the
per-example keys and dropout masks that make N devices draw what one device draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import sequence
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T = 4, 5
MASK = helpers.prefix_mask((5, 2, 4, 5), T, np.float64)
DEVICES = 8


def test_reverse_valid_reverses_only_the_valid_prefix():
  x = np.arange(B * T * 2, dtype=np.float32).reshape(B, T, 2)
  once = np.asarray(sequence.reverse_valid(jnp.asarray(x), jnp.asarray(MASK)))
  np.testing.assert_array_equal(once, ref.reverse_each(x, MASK))
  # Row 1 has length 2: its two valid steps swap, its padding stays in place.
  np.testing.assert_array_equal(once[1, :, 0], x[1, [1, 0, 2, 3, 4], 0])
  twice = np.asarray(sequence.reverse_valid(jnp.asarray(once), jnp.asarray(MASK)))
  np.testing.assert_array_equal(twice, x)
  no_mask = np.asarray(sequence.reverse_valid(jnp.asarray(x), None))
  np.testing.assert_array_equal(no_mask, x[:, ::-1])


def test_mask_with_holes_is_a_clear_error():
  x = jnp.ones((2, 4, 3))
  holes = jnp.array([[1, 0, 1, 0], [1, 1, 0, 0]], jnp.float32)
  with pytest.raises(ValueError, match='mask row 0 has a valid step at t=2 after padding'):
    sequence.reverse_valid(x, holes)
  layer = variants.make_layer('lstm', 4)
  with pytest.raises(ValueError, match='mask row 0 has a valid step at t=2 after padding'):
    layer.init(jax.random.key(0), x, holes, use_running_average=True, deterministic=True)
  # Under jit the mask has no values to check: a traced mask passes.
  jax.jit(sequence.check_mask_prefix)(holes)


@pytest.mark.parametrize('value', [0.5, 2.0, -1.0, float('nan')])
def test_mask_value_other_than_zero_or_one_is_one_line_naming_it(value):
  x = jnp.ones((2, 4, 3))
  mask = np.ones((2, 4), np.float32)
  mask[1, 2] = value
  expected = f'mask[1, 2] holds {value!r}; a mask is 0 (padding) or 1 (a valid step).'
  with pytest.raises(ValueError) as error:
    sequence.reverse_valid(x, mask)
  assert helpers.one_line(error) == expected
  with pytest.raises(ValueError) as error:
    variants.make_layer('lstm', 4).init(jax.random.key(0), x, mask, use_running_average=True,
                                        deterministic=True)
  assert helpers.one_line(error) == expected
  jax.jit(sequence.check_mask_prefix)(mask)  # traced: not checked (documented)


def test_negative_time_index_is_one_line():
  layer = variants.make_layer('lstm', 4)
  x = jnp.ones((2, 3, 3))
  variables = layer.init(jax.random.key(0), x, use_running_average=True, deterministic=True)
  with pytest.raises(ValueError) as error:
    layer.apply(variables, x, use_running_average=True, deterministic=True, first_step=-2)
  assert helpers.one_line(error) == ('first_step (the time index of inputs[:, 0]) must be '
                                     '>= 0; got -2.')
  with pytest.raises(ValueError) as error:
    layer.apply(variables, None, x[:, 0], jnp.int32(-1), method='step')
  assert helpers.one_line(error) == ('RecurrentLayer.step: t (the time index of x) must be '
                                     '>= 0; got -1.')
  carry, h = layer.apply(variables, None, x[:, 0], 0, method='step')  # t = 0 is fine
  assert h.shape == (2, 4) and carry is not None


def _split(fn, batch):
  """`fn(axis_name)` on 8 devices, each holding `batch / 8` rows: `[batch, ...]`."""
  mapped = jax.pmap(lambda _: fn(batch // DEVICES, 'batch'), axis_name='batch')
  out = mapped(np.zeros(DEVICES))
  return np.asarray(out).reshape((batch,) + out.shape[2:])


def test_per_example_keys_fold_in_the_global_row():
  key = jax.random.key(3)
  data = lambda keys: np.asarray(jax.random.key_data(keys))
  want = np.stack([np.asarray(jax.random.key_data(jax.random.fold_in(key, row)))
                   for row in range(16)])
  np.testing.assert_array_equal(data(sequence.per_example_keys(key, 16, None)), want)
  split = _split(lambda b, axis: jax.random.key_data(sequence.per_example_keys(key, b, axis)),
                 16)
  np.testing.assert_array_equal(split, want)


def test_example_dropout_draws_the_same_masks_on_eight_devices():
  x = np.ones((16, 40), np.float32)
  key = jax.random.key(4)
  one = np.asarray(sequence.example_dropout(jnp.asarray(x), 0.25, key, None))
  eight = _split(lambda b, axis: sequence.example_dropout(
      jnp.asarray(x[:b]), 0.25, key, axis), 16)
  np.testing.assert_array_equal(eight, one)
  # Inverted dropout: kept entries scaled by 1 / (1 - rate), about a quarter dropped.
  assert set(np.unique(one)) == {0.0, np.float32(1 / 0.75)}
  assert 0.15 < np.mean(one == 0.0) < 0.35
  # Rows draw different masks.
  assert len({row.tobytes() for row in one}) == 16
