"""`layer_vjp.scan_layer`, called directly on the cells of `steps.py`, against the float64
reference: its forward values and its whole-layer backward pass (every remat mode, the
tied-terms product, a hoisted input term, unrolled scans), with reference gradients by
central finite differences of `reference.run_layer`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import steps
from bn_rnn_jax import layer_vjp
import helpers
import reference as ref

B, T, I, H = 4, 4, 2, 3
LENGTHS = (4, 2, 3, 4)
MASK = helpers.prefix_mask(LENGTHS, T, np.float64)
_rng = np.random.default_rng(0)
X = _rng.normal(size=(B, T, I))
CARRY0 = (_rng.normal(size=(B, H)), _rng.normal(size=(B, H)))   # (c0, h0)
W_OUT = _rng.normal(size=(B, T, H))
W_CARRY = _rng.normal(size=(2, B, H))


def _variant_setup(variant):
  """`(StepConfig, random float64 params, tied_terms)` as `RecurrentLayer` would use."""
  s = ref.spec(variant)
  gates = 4 if s['cell'] == 'lstm' else 1
  shapes = {'input_kernel': (I, gates * H), 'recurrent_kernel': (H, gates * H),
            'bias': (gates * H,)}
  if s['input']:
    shapes['input_scale'] = (gates * H,)
  if s['recurrent']:
    shapes['recurrent_scale' if gates == 4 else 'scale'] = (gates * H,)
  if s['cell_site']:
    shapes['cell_scale'] = shapes['cell_bias'] = (H,)
  params = ref.random_params(shapes, np.random.default_rng(len(variant)))
  cfg = steps.StepConfig(recurrent_norm=s['recurrent'], input_norm=s['input'],
                         cell_norm=s['cell_site'])
  tied = s['input'] is None and (s['cell'] == 'rnn' or s['recurrent'] is None)
  return cfg, params, tied


def _initial_carry(variant):
  return CARRY0 if ref.spec(variant)['cell'] == 'lstm' else CARRY0[1]


@functools.cache
def _reference(variant):
  """Reference loss gradients w.r.t. the parameters, the inputs and the initial carry."""
  _, params, _ = _variant_setup(variant)
  lstm = ref.spec(variant)['cell'] == 'lstm'

  def loss(a):
    p = {k: v for k, v in a.items() if not k.startswith('__')}
    carry0 = (a['__c0'], a['__h0']) if lstm else a['__h0']
    carry, out, _ = ref.run_layer(p, a['__x'], MASK, variant, initial_carry=carry0)
    value = np.sum(out * W_OUT)
    for leaf, w in zip(jax.tree.leaves(carry), W_CARRY):
      value += np.sum(leaf * w)
    return value

  arrays = {**params, '__x': X, '__h0': CARRY0[1]}
  if lstm:
    arrays['__c0'] = CARRY0[0]
  carry, out, moments = ref.run_layer(params, X, MASK, variant,
                                      initial_carry=_initial_carry(variant))
  return carry, out, moments, ref.numerical_grad(loss, arrays)


def _scan_layer_gradients(variant, mode, *, hoisted=False, unroll=1):
  """`scan_layer`'s outputs and the gradients of the weighted loss (float32)."""
  cfg, params, tied = _variant_setup(variant)
  step_cell = steps.lstm_cell if ref.spec(variant)['cell'] == 'lstm' else steps.rnn_cell
  cell = lambda p, carry, terms, inputs: step_cell(p, cfg, carry, terms, inputs)
  terms_fn = lambda p, carry, inputs: steps.step_terms(p, cfg, carry, inputs)
  mask_tm = jnp.float32(MASK.T[..., None])                              # [T, B, 1]

  def loss(params, x, carry0):
    x_tm = jnp.swapaxes(x, 0, 1)                                          # [T, B, I]
    if hoisted:  # the input term projected outside the scan (no input norm here)
      xs = {'input_term': x_tm @ params['input_kernel'], 'mask': mask_tm}
    else:
      xs = {'x': x_tm, 'mask': mask_tm}
    carry, outputs = layer_vjp.scan_layer(cell, terms_fn, params, carry0, xs,
                                          compute_dtype=jnp.float32, mode=mode,
                                          unroll=unroll, tied_terms=tied)
    value = jnp.sum(jnp.swapaxes(outputs['h'], 0, 1) * W_OUT)
    for leaf, w in zip(jax.tree.leaves(carry), W_CARRY):
      value = value + jnp.sum(leaf * w)
    return value, (carry, outputs)

  grad_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  (_, (carry, outputs)), grads = grad_fn(helpers.float32(params), jnp.float32(X),
                                         helpers.float32(_initial_carry(variant)))
  return carry, outputs, grads


def _assert_gradients_match(grads, want, lstm):
  g_params, g_x, g_carry = helpers.float64(grads)
  for name, g in g_params.items():
    helpers.assert_close(g, want[name], rtol=2e-4, what=f'd loss / d {name}')
  helpers.assert_close(g_x, want['__x'], rtol=2e-4, what='d loss / d x')
  g_c0, g_h0 = g_carry if lstm else (None, g_carry)
  helpers.assert_close(g_h0, want['__h0'], rtol=2e-4, what='d loss / d h0')
  if lstm:
    helpers.assert_close(g_c0, want['__c0'], rtol=2e-4, what='d loss / d c0')


@pytest.mark.parametrize('variant,mode', helpers.core_cases(
    [(variant, mode) for mode in layer_vjp.MODES
     for variant in ('bn_lstm', 'lstm', 'rnn_bn_recurrence')],
    core=[('bn_lstm', 'none'), ('lstm', 'full')]))
def test_forward_and_gradients_match_the_reference(variant, mode):
  """bn_lstm: separate input and recurrent cotangents; lstm and the appendix-A tanh RNN:
  tied terms (one product for both kernels)."""
  want_carry, want_out, want_moments, want_grads = _reference(variant)
  carry, outputs, grads = _scan_layer_gradients(variant, mode)
  for g, w in zip(jax.tree.leaves(carry), jax.tree.leaves(want_carry), strict=True):
    helpers.assert_close(g, w, rtol=1e-4, what='final carry')
  helpers.assert_close(np.swapaxes(outputs['h'], 0, 1), want_out, rtol=1e-4, what='outputs')
  assert set(outputs['moments']) == set(want_moments)
  for site, per_step in want_moments.items():
    for t, (mean, _, count) in enumerate(per_step):
      helpers.assert_close(outputs['moments'][site][0][t], mean, rtol=1e-4,
                           what=f'{site} mean {t}')
      assert float(np.squeeze(outputs['moments'][site][2][t])) == count
  _assert_gradients_match(grads, want_grads, ref.spec(variant)['cell'] == 'lstm')


def test_hoisted_input_term_gets_its_cotangent_and_no_kernel_gradient():
  """A hoisted input term: `scan_layer` returns its cotangent and leaves W_x's gradient
  to the projection outside (autodiff), which gives the reference's gradient in total."""
  *_, want_grads = _reference('lstm')
  _, _, grads = _scan_layer_gradients('lstm', 'dots', hoisted=True)
  _assert_gradients_match(grads, want_grads, lstm=True)


@pytest.mark.slow
def test_unrolled_scans_compute_the_same_gradients():
  *_, want_grads = _reference('bn_lstm')
  _, _, grads = _scan_layer_gradients('bn_lstm', 'full', unroll=2)
  _assert_gradients_match(grads, want_grads, lstm=True)


def test_unknown_mode_is_a_clear_error():
  _, params, _ = _variant_setup('lstm')
  with pytest.raises(ValueError, match="mode must be one of .*'sometimes'"):
    layer_vjp.scan_layer(lambda *a: None, lambda *a: None, params, CARRY0,
                         {'x': np.zeros((T, B, I))}, compute_dtype=jnp.float32,
                         mode='sometimes')
