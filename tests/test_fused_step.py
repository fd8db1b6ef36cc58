"""`fused_step.py`: the fused BN-LSTM step (Pallas kernels run in Pallas's interpreter, and
the same step functions as plain JAX) against the float64 reference (`reference.py`):
outputs, final state, per-step moments, every gradient (central finite differences),
inference with population rows; the same through `RecurrentLayer(execution=
Execution(fused_step=...))`, the statistics it records included. The Pallas kernels
lowered for CUDA from this CPU machine: `test_compile_targets.py`.

Shapes are tiny and deliberately not powers of two (B=5, H=6, I=3, T=6), with uneven
lengths and junk in the padded positions; `block_h=4` splits the hidden units over two
Pallas programs (H padded to 8, the batch to 8).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import fused
from bn_rnn_jax import fused_step
from bn_rnn_jax import policy
from bn_rnn_jax import variants
import helpers
import reference as ref

B, T, I, H = 5, 6, 3, 6
LENGTHS = (6, 4, 2, 5, 6)      # uneven; the last step has two valid rows
BLOCK_H = 4
GARBAGE = 30.0                 # scale of the junk in padded positions
KERNELS = ('pallas', 'xla', 'persistent')
SITES = ('input', 'recurrent', 'cell')

_rng = np.random.default_rng(0)
MASK = helpers.prefix_mask(LENGTHS, T, np.float64)
X = np.where(MASK[..., None] > 0, _rng.normal(size=(B, T, I)),
             GARBAGE * _rng.normal(size=(B, T, I)))
CARRY0 = (_rng.normal(size=(B, H)), _rng.normal(size=(B, H)))   # (c0, h0)
W_OUT = _rng.normal(size=(B, T, H))        # loss weights on the outputs
W_CARRY = _rng.normal(size=(2, B, H))      # loss weights on the final (c, h)
PARAMS = ref.random_params(
    {'input_kernel': (I, 4 * H), 'recurrent_kernel': (H, 4 * H), 'bias': (4 * H,),
     'input_scale': (4 * H,), 'recurrent_scale': (4 * H,), 'cell_scale': (H,),
     'cell_bias': (H,)}, np.random.default_rng(1))
# Population rows of every step (inference): means around 0, variances around 1.
_widths = {'input': 4 * H, 'recurrent': 4 * H, 'cell': H}
POPULATION = {site: (_rng.normal(0.0, 0.5, (T, f)), _rng.uniform(0.5, 1.5, (T, f)))
              for site, f in _widths.items()}

# float32 against float64 at tests/test_recurrent.py's tolerances.
assert_close = functools.partial(helpers.assert_close, rtol=1e-4)
GRAD_RTOL = 2e-4


def _split(arrays):
  params = {k: v for k, v in arrays.items() if not k.startswith('__')}
  return params, arrays['__x'], (arrays['__c0'], arrays['__h0'])


def _loss_terms(carry, out):
  return jnp.sum(out * W_OUT) + jnp.sum(carry[0] * W_CARRY[0]) + jnp.sum(
      carry[1] * W_CARRY[1])


def _layer(kernel):
  return variants.make_layer('bn_lstm', H, max_length=T, execution=policy.Execution(
      fused_step=kernel, block_h=None if kernel == 'xla' else BLOCK_H))


@functools.cache
def fused_run(kernel, inference=False):
  """Through `RecurrentLayer(execution=Execution(fused_step=kernel))`: loss, gradients
  w.r.t. params, x and the initial carry, carry, outputs and (training) the moments of
  every step as `(mean, var, count)` per site."""
  if inference:
    stats = {site: {'mean': mean, 'var': var, 'count': np.ones(T)}
             for site, (mean, var) in POPULATION.items()}
  else:
    stats = {site: ref.init_population(T, f) for site, f in _widths.items()}

  def loss(arrays, mask):
    params, x, carry0 = _split(arrays)
    (carry, out), new = _layer(kernel).apply(
        {'params': params, 'batch_stats': helpers.float32(stats)}, x, mask,
        use_running_average=inference, deterministic=True, initial_carry=carry0,
        mutable=[] if inference else ['minibatch_moments'], return_carry=True)
    moments = {site: (r['mean'], r['var'], r['count'])
               for site, r in new.get('minibatch_moments', {}).items()}
    return _loss_terms(carry, out), (carry, out, moments)

  arrays = {**PARAMS, '__x': X, '__c0': CARRY0[0], '__h0': CARRY0[1]}
  (_, (carry, out, moments)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      *helpers.float32((arrays, MASK)))
  return helpers.float64(dict(carry=carry, out=out, moments=moments, grads=grads))


@functools.cache
def reference_run(inference=False):
  """The reference's forward values and central finite differences of the same loss."""
  kw = dict(train=False, population=POPULATION) if inference else {}

  def loss(arrays):
    params, x, carry0 = _split(arrays)
    carry, out, _ = ref.run_layer(params, x, MASK, 'bn_lstm', initial_carry=carry0, **kw)
    return np.sum(out * W_OUT) + np.sum(carry[0] * W_CARRY[0]) + np.sum(carry[1] * W_CARRY[1])

  carry, out, moments = ref.run_layer(PARAMS, X, MASK, 'bn_lstm', initial_carry=CARRY0, **kw)
  arrays = {**PARAMS, '__x': X, '__c0': CARRY0[0], '__h0': CARRY0[1]}
  return dict(carry=carry, out=out, moments=moments, grads=ref.numerical_grad(loss, arrays))


def _check_forward(got, want):
  assert_close(got['out'], want['out'], what='outputs')
  assert np.all(got['out'][MASK == 0] == 0.0), 'padded outputs must be exactly 0'
  assert_close(got['carry'][0], want['carry'][0], what='final c')
  assert_close(got['carry'][1], want['carry'][1], what='final h')


def _check_gradients(got, want):
  assert set(got['grads']) == set(want['grads'])
  for name, g in got['grads'].items():
    assert_close(g, want['grads'][name], rtol=GRAD_RTOL, what=f'd loss / d {name}')
  assert np.all(got['grads']['__x'][MASK == 0] == 0.0), 'padded inputs get no gradient'


# The 'xla' kernel's forward and gradients are also checked through the layer below.
@pytest.mark.parametrize('kernel', helpers.core_cases(KERNELS, core=['pallas', 'persistent']))
def test_forward_and_moments_match_the_reference(kernel):
  """Outputs (0 on padded steps), the final state of rows of every length, and each
  step's mean and variance over the valid rows of the three sites, with their counts."""
  got, want = fused_run(kernel), reference_run()
  _check_forward(got, want)
  for site in SITES:
    mean, var, count = got['moments'][site]
    assert_close(mean, np.stack([m[0] for m in want['moments'][site]]), what=f'{site} mean')
    assert_close(var, np.stack([m[1] for m in want['moments'][site]]), what=f'{site} var')
    np.testing.assert_array_equal(count, [m[2] for m in want['moments'][site]])


@pytest.mark.parametrize('kernel', helpers.core_cases(KERNELS, core=['pallas', 'persistent']))
def test_gradients_match_finite_differences(kernel):
  """Every parameter's gradient, the input's and the initial state's, through the
  custom_vjp (reverse scan of the backward kernel, dW_h after the loop) and the hoisted
  input term's batch norm."""
  _check_gradients(fused_run(kernel), reference_run())


@pytest.mark.parametrize('kernel', helpers.core_cases(KERNELS, core=['persistent']))
def test_inference_with_population_rows_matches_the_reference(kernel):
  """Each step normalised with its given population rows (no batch moments): outputs,
  final state and gradients."""
  got, want = fused_run(kernel, inference=True), reference_run(inference=True)
  _check_forward(got, want)
  assert got['moments'] == {}
  _check_gradients(got, want)


@pytest.mark.parametrize('steps', [T - 1, T])
def test_persistent_state_slots_match_the_reference(steps):
  """The persistent programs keep the state, and its cotangents, in two slots that take
  turns (the forward pass alone, with no gradient to take, and the backward pass): the
  outputs, the final state and the initial state's gradient after an odd and an even
  number of steps."""
  stats = {site: ref.init_population(T, f) for site, f in _widths.items()}
  x, mask = X[:, :steps], MASK[:, :steps]

  def run(carry0):
    return _layer('persistent').apply(
        {'params': PARAMS, 'batch_stats': stats}, x, mask, use_running_average=False,
        initial_carry=carry0, mutable=['minibatch_moments'], return_carry=True)[0]

  def loss(carry, out):   # numpy's or jax's arrays
    return (out * W_OUT[:, :steps]).sum() + (carry[0] * carry[1]).sum()

  carry, out = helpers.float64(jax.jit(run)(helpers.float32(CARRY0)))
  want_carry, want_out, _ = ref.run_layer(PARAMS, x, mask, 'bn_lstm', initial_carry=CARRY0)
  assert_close(out, want_out, what='outputs')
  assert_close(carry[0], want_carry[0], what='final c')
  assert_close(carry[1], want_carry[1], what='final h')
  got = helpers.float64(jax.jit(jax.grad(lambda c: loss(*run(c))))(helpers.float32(CARRY0)))
  want = ref.numerical_grad(
      lambda a: loss(*ref.run_layer(PARAMS, x, mask, 'bn_lstm',
                                    initial_carry=(a['c0'], a['h0']))[:2]),
      {'c0': CARRY0[0], 'h0': CARRY0[1]})
  assert_close(got[0], want['c0'], rtol=GRAD_RTOL, what='d loss / d c0')
  assert_close(got[1], want['h0'], rtol=GRAD_RTOL, what='d loss / d h0')


@pytest.mark.parametrize('kernel', helpers.core_cases(KERNELS, core=['pallas'],
                                                      also=['xla', 'persistent']))
def test_the_layer_records_what_training_normalised_with(kernel):
  """The moments the fused layer records (the `minibatch_moments` record of each site,
  padded steps excluded from the counts) are the reference's."""
  got, want = fused_run(kernel), reference_run()
  for site in SITES:
    record = ref.minibatch_record(want['moments'][site], False, T)
    for key, value in zip(('mean', 'var', 'count'), got['moments'][site]):
      assert_close(value, record[key], what=f'{site} {key}')


def test_layers_it_does_not_cover_are_refused_in_one_line():
  x = jnp.ones((B, T, I))
  for variant, fields, why in (('ln_lstm', {}, "norms \\('layer'"),
                               ('bn_lstm', {'statistics': 'shared'}, "statistics='shared'"),
                               ('bn_lstm', {'min_step_count': 2}, 'min_step_count=2')):
    layer = variants.make_layer(variant, H, max_length=T, **fields,
                                execution=policy.Execution(fused_step='xla'))
    with pytest.raises(ValueError, match=f"runs the BN-LSTM only.*{why}") as error:
      layer.init(jax.random.key(0), x, use_running_average=True)
    helpers.one_line(error)


def test_layout_pads_to_powers_of_two():
  """The Pallas layout: the batch to a power of two, H to a multiple of the block; the
  persistent program's tiles at least 16 on a side and at most 1024 elements (what its
  registers hold without spilling); the pure-JAX path pads nothing."""
  assert fused.layout(B, H, block_h=BLOCK_H) == fused_step.Layout(8, 8, 4)
  assert fused.layout(64, 100) == fused_step.Layout(64, 128, 32)
  assert fused.layout(64, 1000) == fused_step.Layout(64, 1024, 32)
  assert fused.layout(64, 100, 'persistent') == fused_step.Layout(64, 112, 16)
  assert fused.layout(B, 240, 'persistent') == fused_step.Layout(16, 256, 64)
  assert fused.layout(B, H, 'persistent') == fused_step.Layout(16, 16, 16)
  assert fused.layout(B, H, 'xla') == fused_step.Layout(B, H, H)
  with pytest.raises(ValueError, match='power of two'):
    fused.layout(B, H, block_h=6)
  with pytest.raises(ValueError, match='kernel must be one of'):
    fused.layout(B, H, 'cuda')


def test_kernels_refuse_what_they_cannot_hold_in_one_line():
  """The persistent program holds H <= 256; no kernel shares moments across devices (a
  device axis of one device is fine: the trainer's)."""
  layer = variants.make_layer('bn_lstm', 300, max_length=T,
                              execution=policy.Execution(fused_step='persistent'))
  with pytest.raises(ValueError, match='holds H <= 256 in one program; H=300') as error:
    layer.init(jax.random.key(0), jnp.ones((B, T, I)), use_running_average=True)
  helpers.one_line(error)
  layer = variants.make_layer('bn_lstm', H, max_length=T, axis_name='batch',
                              execution=policy.Execution(fused_step='persistent'))
  variables = layer.init(jax.random.key(0), jnp.ones((2, T, I)), use_running_average=True)
  train = jax.pmap(lambda x: layer.apply(variables, x, use_running_average=False,
                                         mutable=['batch_stats'])[0], axis_name='batch')
  with pytest.raises(ValueError, match="axis 'batch' holds 2: use fused_step='xla'") as error:
    train(jnp.ones((2, 2, T, I)))
  helpers.one_line(error)
