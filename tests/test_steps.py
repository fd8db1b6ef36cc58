"""`steps.py`: one recurrent step against one step of the float64 reference.

`lstm_step` and `rnn_step` are called directly (no layer, no scan) with a random carry, a
batch whose last rows are padding, and random parameters; the new carry, the outputs and
the batch moments each normalisation site returns must be those of `reference.run_layer`
on a one-step sequence, in training (batch statistics, with and without the population
fallback of `min_step_count`) and in inference (population rows given per step).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import steps
import helpers
import reference as ref

B, I, H = 6, 3, 4
VALID = np.array([1, 1, 1, 1, 0, 0], np.float64)   # the last two rows are padding
# The variants whose sites are all normalised in the step (per-step statistics).
STEP_VARIANTS = ('lstm', 'bn_lstm', 'bn_input_only', 'ln_lstm', 'rnn', 'rnn_bn_input',
                 'rnn_bn_recurrence')


def _step_config(variant, **fields):
  s = ref.spec(variant)
  return steps.StepConfig(recurrent_norm=s['recurrent'], input_norm=s['input'],
                          cell_norm=s['cell_site'], **fields)


def _params(variant, seed=0):
  """Random float64 parameters in the layout of `cells`' module docstring."""
  s = ref.spec(variant)
  width = 4 * H if s['cell'] == 'lstm' else H
  shapes = {'input_kernel': (I, width), 'recurrent_kernel': (H, width), 'bias': (width,)}
  if s['input']:
    shapes['input_scale'] = (width,)
  if s['recurrent'] and s['cell'] == 'lstm':
    shapes['recurrent_scale'] = (width,)
  if s['recurrent'] and s['cell'] == 'rnn':
    shapes['scale'] = (H,)
  if s['cell_site']:
    shapes['cell_scale'] = shapes['cell_bias'] = (H,)
  return ref.random_params(shapes, np.random.default_rng(seed))


def _step_data(variant, seed=1):
  """`(carry, x [B, I])`: a random carry (c, h) or h, and random inputs."""
  rng = np.random.default_rng(seed)
  carry = (rng.normal(size=(B, H)), rng.normal(size=(B, H)))
  if ref.spec(variant)['cell'] == 'rnn':
    carry = carry[1]
  return carry, rng.normal(size=(B, I))


def _step(variant, cfg, params, carry, inputs):
  step = steps.lstm_step if ref.spec(variant)['cell'] == 'lstm' else steps.rnn_step
  return jax.jit(lambda p, c, i: step(p, cfg, c, i))(
      helpers.float32(params), helpers.float32(carry), helpers.float32(inputs))


def _reference_step(variant, params, carry, x, valid, **kwargs):
  """`(carry, h [B, H], {site: (mean, var, count)})` of a one-step reference run."""
  new_carry, out, moments = ref.run_layer(params, x[:, None], valid[:, None], variant,
                                          initial_carry=carry, **kwargs)
  return new_carry, out[:, 0], {site: rows[0] for site, rows in moments.items()}


def _assert_step_matches(got, want):
  (carry, outputs), (want_carry, want_h, want_moments) = got, want
  for g, w in zip(jax.tree.leaves(carry), jax.tree.leaves(want_carry), strict=True):
    helpers.assert_close(g, w, rtol=1e-5, what='new carry')
  helpers.assert_close(outputs['h'], want_h, rtol=1e-5, what='h')
  assert set(outputs['moments']) == set(want_moments)
  for site, (mean, var, count) in want_moments.items():
    got_mean, got_var, got_count = outputs['moments'][site]
    helpers.assert_close(got_mean, mean, rtol=1e-5, what=f'{site} mean')
    helpers.assert_close(got_var, var, rtol=1e-5, what=f'{site} var')
    assert float(np.squeeze(got_count)) == count


@pytest.mark.parametrize('variant', STEP_VARIANTS)
def test_training_step_matches_the_reference(variant):
  params = _params(variant)
  carry, x = _step_data(variant)
  got = _step(variant, _step_config(variant), params, carry,
              {'x': x, 'mask': VALID[:, None]})
  want = _reference_step(variant, params, carry, x, VALID)
  _assert_step_matches(got, want)
  # Padded rows keep their state and output zeros.
  for g, old in zip(jax.tree.leaves(got[0]), jax.tree.leaves(carry)):
    np.testing.assert_array_equal(np.asarray(g)[VALID == 0], np.float32(old)[VALID == 0])
  assert not np.asarray(got[1]['h'])[VALID == 0].any()


@pytest.mark.parametrize('variant', ['bn_lstm', 'bn_input_only', 'rnn_bn_input',
                                     'rnn_bn_recurrence'])
def test_inference_step_uses_the_given_population_rows(variant):
  params = _params(variant, seed=2)
  carry, x = _step_data(variant, seed=3)
  rng = np.random.default_rng(4)
  width = 4 * H if ref.spec(variant)['cell'] == 'lstm' else H
  population = {site: (rng.normal(size=H if site == 'cell' else width),
                       rng.uniform(0.5, 2.0, H if site == 'cell' else width))
                for site in ref.batch_sites(variant)}
  got = _step(variant, _step_config(variant, batch_statistics=False), params, carry,
              {'x': x, 'mask': VALID[:, None], 'stats': population})
  want = _reference_step(variant, params, carry, x, VALID, train=False,
                         population={site: (m[None], v[None])
                                     for site, (m, v) in population.items()})
  _assert_step_matches(got, want)


def test_step_with_few_valid_rows_normalises_with_the_population_rows():
  """`min_step_count=3` with 2 valid rows: every site uses the given rows, not its own
  moments, and still reports the moments it saw."""
  variant = 'bn_lstm'
  params = _params(variant, seed=5)
  carry, x = _step_data(variant, seed=6)
  valid = np.array([1, 1, 0, 0, 0, 0], np.float64)
  rng = np.random.default_rng(7)
  rows = {site: (rng.normal(size=H if site == 'cell' else 4 * H),
                 rng.uniform(0.5, 2.0, H if site == 'cell' else 4 * H))
          for site in ('input', 'recurrent', 'cell')}
  cfg = _step_config(variant, min_step_count=3)
  got = _step(variant, cfg, params, carry, {'x': x, 'mask': valid[:, None], 'stats': rows})
  want = _reference_step(variant, params, carry, x, valid, min_step_count=3,
                         fallback={site: (m[None], v[None]) for site, (m, v) in rows.items()})
  _assert_step_matches(got, want)
  # With enough valid rows the same call normalises with the batch's own moments.
  unguarded = _reference_step(variant, params, carry, x, valid)
  assert np.max(np.abs(np.asarray(got[1]['h']) - unguarded[1])) > 1e-3


def test_hoisted_input_term_is_used_as_given():
  """With `'input_term'` (normalised outside the step) the step adds it as it is and
  reports no input moments (the hoisted projection records them)."""
  variant = 'bn_lstm'
  params = _params(variant, seed=8)
  carry, x = _step_data(variant, seed=9)
  mean, var, _ = ref.masked_moments(x @ params['input_kernel'], VALID > 0)
  input_term = ref.normalize(x @ params['input_kernel'], mean, var, params['input_scale'])
  got = _step(variant, _step_config(variant), params, carry,
              {'input_term': input_term, 'mask': VALID[:, None]})
  want_carry, want_h, want_moments = _reference_step(variant, params, carry, x, VALID)
  del want_moments['input']
  _assert_step_matches(got, (want_carry, want_h, want_moments))


def test_padded_statistics_count_the_padded_rows_in_the_moments():
  variant = 'bn_lstm'
  params = _params(variant, seed=10)
  carry, x = _step_data(variant, seed=11)
  got = _step(variant, _step_config(variant, padded_statistics=True), params, carry,
              {'x': x, 'mask': VALID[:, None]})
  # The moments (and the valid rows' outputs) are those of the batch without a mask ...
  all_rows = _reference_step(variant, params, carry, x, np.ones(B))
  for site, (mean, var, count) in all_rows[2].items():
    helpers.assert_close(got[1]['moments'][site][0], mean, rtol=1e-5, what=site)
    helpers.assert_close(got[1]['moments'][site][1], var, rtol=1e-5, what=site)
  valid = VALID > 0
  helpers.assert_close(np.asarray(got[1]['h'])[valid], all_rows[1][valid], rtol=1e-5)
  # ... but the padded rows still keep their state and output zeros.
  assert not np.asarray(got[1]['h'])[~valid].any()
  np.testing.assert_array_equal(np.asarray(got[0][1])[~valid], np.float32(carry[1])[~valid])


def test_unknown_normalisation_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown normalisation 'group'"):
    steps.apply_norm('group', jnp.zeros((2, 3)), None, None, batch_statistics=True,
                     epsilon=1e-5)


def test_matmul_follows_float64_operands():
  with jax.enable_x64(True):
    a64, k64 = jnp.ones((2, 3), jnp.float64), jnp.ones((3, 4), jnp.float64)
    assert steps.matmul(a64, k64, jnp.float32).dtype == jnp.float64
    assert steps.matmul(a64.astype(jnp.float32), k64.astype(jnp.float32),
                        jnp.float32).dtype == jnp.float32
    # A narrower compute dtype is kept; the result is float32 or wider.
    assert steps.matmul(a64, k64, jnp.bfloat16).dtype == jnp.float64


def test_bfloat16_matmul_returns_float32_close_to_the_product():
  rng = np.random.default_rng(12)
  x, kernel = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
  got = steps.matmul(jnp.float32(x), jnp.float32(kernel), jnp.bfloat16)
  assert got.dtype == jnp.float32
  # bfloat16 operands keep 8 significant bits: ~0.4 % each, summed over 7 products.
  np.testing.assert_allclose(np.asarray(got), x @ kernel, rtol=0, atol=0.05)
  assert not np.allclose(np.asarray(got), x @ kernel, rtol=0, atol=1e-6)
