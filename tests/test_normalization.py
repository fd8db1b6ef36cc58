"""`normalization.py` against the float64 reference: masked moments, batch norm and its
closed-form backward pass, layer norm, and the running averages and population rows of
the statistics (their average over batches is `test_population.py`'s)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import normalization
import helpers
from helpers import assert_close
import reference as ref

B, T, F = 6, 4, 5
LENGTHS = np.array([4, 1, 3, 4, 2, 1])         # the last two steps have 3 and 2 valid rows
MASK = helpers.prefix_mask(LENGTHS, T, np.float64)


def _data(seed=0, loc=0.0, std=1.0):
  rng = np.random.default_rng(seed)
  x = rng.normal(loc, std, size=(B, T, F))
  return np.where(MASK[..., None] > 0, x, 1e3 * rng.normal(size=x.shape))  # junk padding


# ----------------------------------------------------------------------------- moments


@pytest.mark.parametrize('shape,reduce_axes', [((64, 800), (0,)), ((64, 2, 400), (0,)),
                                               ((B, T, F), (0, 1)), ((B, T, F), (1,))])
def test_batch_sum_is_the_sum_over_the_reduced_axes(shape, reduce_axes):
  # On CPU it is a contraction with ones (the shapes include the large blocks where
  # that path matters); it must still be the plain float32 sum.
  x = np.random.default_rng(1).normal(size=shape)
  got = normalization.batch_sum(jnp.float32(x), reduce_axes)
  assert_close(got, np.sum(x, axis=reduce_axes))
  assert got.dtype == jnp.float32


def test_batch_moments_unmasked():
  x = _data()[:, 0]
  mean, var, count = normalization.batch_moments(jnp.float32(x))
  want_mean, want_var, want_count = ref.masked_moments(x, np.ones(B, bool))
  assert_close(mean, want_mean)
  assert_close(var, want_var)
  assert float(count) == want_count == B


def test_batch_moments_masked_per_step_and_sequence():
  x = _data(1)
  mean, var, count = normalization.batch_moments(jnp.float32(x), jnp.float32(MASK[..., None]),
                                                 reduce_axes=(0,))
  assert mean.shape == var.shape == (T, F) and count.shape == (T,)
  for t in range(T):
    want = ref.masked_moments(x[:, t], MASK[:, t] > 0)
    assert_close(mean[t], want[0], what=f'mean {t}')
    assert_close(var[t], want[1], what=f'var {t}')
    assert float(count[t]) == want[2]
  mean, var, count = normalization.batch_moments(jnp.float32(x), jnp.float32(MASK[..., None]),
                                                 reduce_axes=(0, 1))
  want = ref.masked_moments(x.reshape(B * T, F), MASK.reshape(-1) > 0)
  assert_close(mean, want[0])
  assert_close(var, want[1])
  assert float(count) == want[2] == MASK.sum()


def test_batch_moments_all_padding_is_finite():
  """A step no sequence reaches: count 0 and finite (0, 0) moments, never NaN."""
  x = jnp.float32(_data(2)[:, 0])
  mean, var, count = normalization.batch_moments(x, jnp.zeros((B, 1)))
  assert float(count) == 0.0
  np.testing.assert_array_equal(mean, np.zeros(F))
  np.testing.assert_array_equal(var, np.zeros(F))


def test_batch_moments_large_mean_keeps_variance():
  """|mean| >> std: a one-pass E[x^2] - E[x]^2 in float32 would lose the variance."""
  x = _data(3, loc=1e4, std=1.0)[:, 0]
  _, var, _ = normalization.batch_moments(jnp.float32(x))
  _, want_var, _ = ref.masked_moments(np.float32(x).astype(np.float64), np.ones(B, bool))
  assert_close(var, want_var, rtol=1e-3)


# ----------------------------------------------------------------------------- batch norm


@pytest.mark.parametrize('reduce_axes', [(0,), (0, 1)])
def test_batch_norm_forward_and_gradient(reduce_axes):
  """y and the moments, and d/d(x, scale, bias) of a loss that uses y, mean and var (so
  every cotangent of the custom VJP is exercised), against finite differences in float64."""
  rng = np.random.default_rng(4)
  x = _data(5)
  scale = rng.uniform(0.5, 1.5, F)
  bias = rng.normal(size=F)
  w = rng.normal(size=(B, T, F)) * MASK[..., None]   # padded outputs are not used
  stat_shape = (T, F) if reduce_axes == (0,) else (F,)
  w_mean, w_var = rng.normal(size=stat_shape), rng.normal(size=stat_shape)

  def ref_forward(x, scale, bias):
    if reduce_axes == (0,):
      stats = [ref.masked_moments(x[:, t], MASK[:, t] > 0) for t in range(T)]
      mean = np.stack([s[0] for s in stats])
      var = np.stack([s[1] for s in stats])
      y = ref.normalize(x, mean[None], var[None], scale, bias)
    else:
      mean, var, _ = ref.masked_moments(x.reshape(B * T, F), MASK.reshape(-1) > 0)
      y = ref.normalize(x, mean, var, scale, bias)
    return y, mean, var

  def ref_loss(a):
    y, mean, var = ref_forward(a['x'], a['scale'], a['bias'])
    return np.sum(y * w) + np.sum(mean * w_mean) + np.sum(var * w_var)

  def loss(x, scale, bias):
    y, mean, var, _ = normalization.batch_norm(x, scale, bias, mask=jnp.float32(MASK[..., None]),
                                               reduce_axes=reduce_axes)
    return jnp.sum(y * w) + jnp.sum(mean * w_mean) + jnp.sum(var * w_var), (y, mean, var)

  (value, (y, mean, var)), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2), has_aux=True))(jnp.float32(x), jnp.float32(scale),
                                              jnp.float32(bias))
  want_y, want_mean, want_var = ref_forward(x, scale, bias)
  assert_close(np.asarray(y) * MASK[..., None], want_y * MASK[..., None], rtol=1e-4)
  assert_close(mean, want_mean)
  assert_close(var, want_var, rtol=1e-4)
  want = ref.numerical_grad(ref_loss, {'x': x, 'scale': scale, 'bias': bias}, step=1e-5)
  for got, name in zip(grads, ('x', 'scale', 'bias')):
    assert_close(np.asarray(got) * (MASK[..., None] if name == 'x' else 1.0),
           want[name] * (MASK[..., None] if name == 'x' else 1.0), rtol=1e-4, what=name)
  assert np.all(np.asarray(grads[0])[MASK == 0] == 0.0), 'padding must get no gradient'


@pytest.mark.parametrize('value', [0.5, 2.0])
def test_a_concrete_mask_other_than_zero_or_one_is_one_line_naming_it(value):
  x = jnp.asarray(_data(), jnp.float32)
  mask = MASK[..., None].astype(np.float32)   # [B, T, 1]: row 3 is valid at every step
  mask[3, 2, 0] = value
  expected = f'mask[3, 2, 0] holds {value!r}; a mask is 0 (padding) or 1 (a valid step).'
  for call in (lambda m: normalization.batch_moments(x, m, (0, 1)),
               lambda m: normalization.batch_norm(x, mask=m, reduce_axes=(0, 1))):
    with pytest.raises(ValueError) as error:
      call(mask)
    assert helpers.one_line(error) == expected
    with pytest.raises(ValueError) as error:
      call(jnp.asarray(mask))
    assert helpers.one_line(error) == expected
  jax.jit(lambda m: normalization.batch_moments(x, m, (0, 1)))(mask)  # traced: unchecked


def test_batch_norm_rejects_the_feature_axis():
  with pytest.raises(ValueError, match='feature axis'):
    normalization.batch_norm(jnp.zeros((B, F)), reduce_axes=(1,))
  # A per-example scale spans the reduced batch axis: the backward pass's shared sums
  # (sum(scale * dy) = scale * sum(dy)) would be wrong, so it is refused.
  with pytest.raises(ValueError, match=r'scale of shape \(4, 3\) spans a reduced axis'):
    normalization.batch_norm(jnp.zeros((4, 3)), jnp.ones((4, 3)), reduce_axes=(0,))


def test_layer_norm_and_normalize():
  x = _data(6)[:, 0]
  rng = np.random.default_rng(7)
  scale, bias = rng.uniform(0.5, 1.5, F), rng.normal(size=F)
  assert_close(normalization.layer_norm(jnp.float32(x), jnp.float32(scale), jnp.float32(bias)),
         ref.layer_norm(x, scale, bias), rtol=1e-4)
  mean, var = rng.normal(size=F), rng.uniform(0.5, 2.0, F)
  assert_close(normalization.normalize(jnp.float32(x), mean, var, scale, bias, epsilon=1e-3),
         ref.normalize(x, mean, var, scale, bias, eps=1e-3), rtol=1e-5)


# ----------------------------------------------------------------------------- population


def _record(rng, rows, seen):
  return {'mean': rng.normal(size=(rows, F)), 'var': rng.uniform(0.1, 2.0, (rows, F)),
          'count': np.asarray(seen, np.float64)}


def test_update_running_stats():
  """Count-weighted EMA on supported rows (a row the whole batch reached moves by
  1 - momentum, one that 2 of 8 reached a quarter of that); a row's first update takes
  the batch value; unreached and thin rows (negative counts) are left unchanged."""
  rng = np.random.default_rng(8)
  stats = ref.init_population(4, F)
  momentum = 0.8
  for seen in ([8, 2, 0, 0], [8, 8, 3, 0], [8, 0, -1, -1]):
    record = _record(rng, 4, seen)
    got = jax.tree.map(np.asarray, normalization.update_running_stats(
        jax.tree.map(jnp.float32, stats), jax.tree.map(jnp.float32, record), momentum))
    want = ref.ema_update(stats, record, momentum)
    for key in ('mean', 'var', 'count'):
      assert_close(got[key], want[key], what=key)
    before, stats = stats, want
  np.testing.assert_array_equal(stats['count'], [24, 10, 3, 0])
  np.testing.assert_array_equal(stats['mean'][3], np.zeros(F))   # never supported
  np.testing.assert_array_equal(stats['var'][3], np.ones(F))
  np.testing.assert_array_equal(stats['mean'][2], before['mean'][2])  # thin: untouched
  # The second update: row 0 (8 of 8) moved by 0.2, row 2 (3 of 8) took its first value.
  first = ref.ema_update(ref.init_population(4, F), _record(np.random.default_rng(8), 4,
                                                            [8, 2, 0, 0]), momentum)
  assert first['count'][1] == 2 and np.allclose(first['mean'][1], _record(
      np.random.default_rng(8), 4, [8, 2, 0, 0])['mean'][1])


def test_minibatch_moments_record():
  """Rows carry their valid counts (the weights of the averages); rows below min_count
  are thin: fresh values and minus their count; padding-only rows and rows past T 0."""
  rng = np.random.default_rng(9)
  mean, var = rng.normal(size=(4, F)), rng.uniform(0.1, 2.0, (4, F))
  count = np.array([4.0, 3.0, 1.0, 0.0])           # the last step only saw padding
  for min_count in (1, 2):
    got = jax.tree.map(np.asarray, normalization.minibatch_moments_record(
        jnp.float32(mean), jnp.float32(var), jnp.float32(count), 6, min_count))
    want = ref.minibatch_record([(mean[t], var[t], count[t]) for t in range(4)], False, 6,
                                min_count)
    for key in ('mean', 'var', 'count'):
      assert_close(got[key], want[key], what=key)
  np.testing.assert_array_equal(got['count'], [4, 3, -1, 0, 0, 0])
  np.testing.assert_array_equal(got['var'][2], np.ones(F))
  shared = normalization.minibatch_moments_record(jnp.float32(mean[0]), jnp.float32(var[0]),
                                                  jnp.float32(7.0), 1)
  np.testing.assert_array_equal(shared['count'], [7.0])
  with pytest.raises(ValueError, match='4 time steps.*max_length=2'):
    normalization.minibatch_moments_record(mean, var, count, 2)


@pytest.mark.parametrize('seen_rows,length', [(3, 8), (5, 5), (5, 9), (0, 4), (2, 1)])
def test_population_rows(seen_rows, length):
  """Step t reads row min(t, last seen row), also past the number of rows."""
  rng = np.random.default_rng(11)
  stats = {'mean': rng.normal(size=(5, F)), 'var': rng.uniform(0.1, 2.0, (5, F)),
           'count': np.array([3.0] * seen_rows + [0.0] * (5 - seen_rows))}
  mean, var = normalization.population_rows(jax.tree.map(jnp.float32, stats), length)
  want_mean, want_var = ref.population_lookup(stats, length)
  assert_close(mean, want_mean)
  assert_close(var, want_var)


@pytest.mark.parametrize('counts,min_support', [
    ([64, 60, 40, 20, 6, 2, 1, 0], 0.5),    # thin tail, an unreached row
    ([64, 60, 40, 20, 6, 2, 1, 0], 0.05),
    ([8, 8, 8, 8, 8, 8, 8, 8], 0.5),        # fixed lengths: every row kept
    ([0, 0, 0, 0, 0, 0, 0, 0], 0.5),        # untrained: nothing to pool
])
def test_population_rows_with_a_steady_tail(counts, min_support):
  """Rows after the last well-supported one take the pooled moments of its window (law
  of total variance), and steps past them read them too."""
  rng = np.random.default_rng(12)
  stats = {'mean': rng.normal(size=(8, F)), 'var': rng.uniform(0.1, 2.0, (8, F)),
           'count': np.array(counts, np.float64)}
  mean, var = normalization.population_rows(jax.tree.map(jnp.float32, stats), 11,
                                            min_support=min_support)
  want_mean, want_var = ref.population_lookup(stats, 11, min_support=min_support)
  assert_close(mean, want_mean)
  assert_close(var, want_var)
  if len(set(counts)) > 1:    # the tail differs from the rows it replaced
    assert not np.allclose(np.asarray(var)[7], stats['var'][6])


def test_check_length():
  normalization.check_length(5, 5)
  with pytest.raises(ValueError, match='6 time steps.*max_length=5'):
    normalization.check_length(6, 5)
