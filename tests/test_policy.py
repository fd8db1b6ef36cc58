"""What an accelerator runs, checked on CPU: every execution policy computes what the
CPU's computes.

`policy.resolve` picks four choices per layer call (see `bn_rnn_jax/policy.py`; its
rules are tested first). At the shape used here (B=4, H=32: H >= 8 B, so LSTMs take the
whole-layer backward pass) the CPU's choices are: input term in the step, remat 'full',
backward 'layer' (LSTMs; the tanh RNN 'scan') and batch sums by contraction with ones.
The opposite of each (hoisted input term, remat 'none', the autodiff of the scan,
reductions) is forced alone below; GPUs and TPUs resolve these batch-normalised layers
to the opposite with remat 'dots'. The tests take the CPU's choices (forced, so that
they hold on any backend: on a GPU the same tests compare the two programs there) and
force each opposite choice alone, and the accelerators' four together (what `resolve`
gives for 'gpu' and 'tpu', checked too), on every batch-normalised
variant (per-step, sequence-wise and shared statistics; a mask with uneven lengths and
junk in the padding), and compare with the CPU's own policy: outputs, final state,
gradients (parameters and inputs), the `batch_stats` update and the minibatch moments.
A choice that is already the CPU's for a variant is not a separate case (sequence-wise
input statistics always hoist; the tanh RNN always takes the autodiff of the scan).

The CPU's policy is also compared with the float64 NumPy reference (`tests/reference.py`,
gradients by central finite differences) at float32's tolerance (as
`tests/test_recurrent.py`): the policies agree with each other, and so with the maths.
The default run forces every choice on the per-step BN-LSTM (the core tier one on the
tanh RNN too); the exhaustive tier on every variant, each also against the reference
(every variant's CPU policy against it at H=4: tests/test_recurrent.py).

Tolerances between policies. Both sides are float32 programs of the same function; they
differ only in the order of float32 sums (a batched product against one per step, a
reduction against a contraction, weight gradients summed in one product against step by
step), each sum off by a few units of float32's rounding (1.2e-7 relative); recomputing
('full') against storing ('none') gave identical bits here. The largest differences,
measured relative to each array's largest magnitude: outputs, state and statistics
2.8e-6, gradients 1.2e-5. Tolerances: 2e-5 and 1e-4, relative to the array's largest
magnitude; counts must be equal. Every step keeps at least three valid rows: at a step
with two, batch norm is ill-conditioned (the two normalised values are +-1 whatever the
inputs, and its backward divides by their difference), which amplified the same rounding
differences to 2.5e-4 on the gradients (`tests/test_recurrent.py` covers such steps at
H=4, `min_step_count` guards them in training). Against the reference the largest
differences were 2.5e-6 (values) and 4.5e-5 (gradients), within test_recurrent's 1e-4
and 2e-4.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import policy
from bn_rnn_jax import scans
from bn_rnn_jax.training import train
from bn_rnn_jax import variants
import helpers
import reference as ref
import training_fixtures as fx

B, T, I, H = 4, 5, 3, 32
MAX_LEN = 7
MOMENTUM = 0.9
LENGTHS = (5, 3, 5, 5)   # uneven: the last two steps have three valid rows
GARBAGE = 30.0

# Outputs, state, statistics / gradients: see the module docstring.
RTOL_VALUES = 2e-5
RTOL_GRADS = 1e-4
# Against the float64 reference (float32 rounding and finite differences).
RTOL_REF_VALUES = 1e-4
RTOL_REF_GRADS = 2e-4

# What the accelerators resolve these batch-normalised layers to.
OPPOSITE = {'hoist_input': True, 'remat': 'none', 'backward': 'scan', 'batch_sums': 'reduce'}
GPU = TPU = {**OPPOSITE, 'remat': 'dots'}
# Each opposite choice alone, then the accelerators' four together.
FORCED = {**{name: {name: value} for name, value in OPPOSITE.items()}, 'gpu': GPU}
ACCELERATORS = {'gpu': GPU, 'tpu': TPU}
BATCH_VARIANTS = tuple(v for v in variants.VARIANTS if ref.batch_sites(v))


def _inputs():
  rng = np.random.default_rng(0)
  mask = helpers.prefix_mask(LENGTHS, T, np.float64)
  x = rng.normal(size=(B, T, I))
  return np.where(mask[..., None] > 0, x, GARBAGE * rng.normal(size=x.shape)), mask


X, MASK = _inputs()
_rng = np.random.default_rng(1)
W_OUT = _rng.normal(size=(B, T, H))
W_CARRY = _rng.normal(size=(2, B, H))


def _layer(variant, forced=()):
  return variants.make_layer(variant, H, max_length=MAX_LEN, momentum=MOMENTUM,
                             **helpers.with_execution(dict(forced)))


def _resolve(variant, platform, **fields):
  return policy.resolve(cell=ref.spec(variant)['cell'], hidden_size=H, batch=B,
                        batch_norm=True,
                        sequence_input=ref.spec(variant)['input_stats'] == 'sequence',
                        platform=platform, execution=policy.Execution(**fields))


def _cpu_fields(variant) -> dict:
  """The CPU's choices for `variant` at this shape, as layer fields."""
  return {name: getattr(_resolve(variant, 'cpu'), name) for name in OPPOSITE}


@functools.cache
def _params(variant):
  """Random float64 parameters in the layer's layout, and fresh statistics."""
  params, stats = helpers.reference_params(_layer(variant), (B, T, I),
                                           BATCH_VARIANTS.index(variant) + 20)
  fresh = {site: ref.init_population(*s['mean'].shape) for site, s in stats.items()}
  return params, fresh


def _policy_of(variant, forced=()):
  return _layer(variant, {**_cpu_fields(variant), **dict(forced)}).execution_policy(B)


@functools.cache
def run(variant, forced=()):
  """One jitted training pass of the layer with the CPU's choices, overridden by
  `forced`: carry, outputs, new `batch_stats`, minibatch moments and gradients w.r.t.
  parameters and inputs."""
  layer = _layer(variant, {**_cpu_fields(variant), **dict(forced)})
  params, fresh = _params(variant)

  def loss(p, x, stats):
    (carry, out), new = layer.apply({'params': p, 'batch_stats': stats}, x,
                                    helpers.float32(MASK), use_running_average=False,
                                    deterministic=False,
                                    mutable=['batch_stats', 'minibatch_moments'],
                                    return_carry=True)
    value = jnp.sum(out * helpers.float32(W_OUT))
    for leaf, w in zip(jax.tree.leaves(carry), helpers.float32(W_CARRY)):
      value = value + jnp.sum(leaf * w)
    return value, (carry, out, new)

  (_, (carry, out, new)), (g_params, g_x) = jax.jit(
      jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
          *helpers.float32((params, X, fresh)))
  return dict(carry=helpers.float64(jax.tree.leaves(carry)), out=np.asarray(out, np.float64),
              stats=helpers.float64(new['batch_stats']),
              moments=helpers.float64(new['minibatch_moments']),
              g_params=helpers.float64(g_params), g_x=np.asarray(g_x, np.float64))


@functools.cache
def reference(variant):
  """The float64 reference's outputs, carry, statistics and finite-difference gradients."""
  params, fresh = _params(variant)

  def ref_loss(arrays):
    p = {k: v for k, v in arrays.items() if k != '__x'}
    carry, out, _ = ref.run_layer(p, arrays['__x'], MASK, variant)
    return np.sum(out * W_OUT) + sum(np.sum(leaf * w) for leaf, w in
                                     zip(jax.tree.leaves(carry), W_CARRY))

  carry, out, moments = ref.run_layer(params, X, MASK, variant)
  grads = ref.numerical_grad(ref_loss, {**params, '__x': X})
  records = {site: ref.minibatch_record(moments[site], shared, 1 if shared else MAX_LEN)
             for site, shared in ref.batch_sites(variant).items()}
  stats = {site: ref.ema_update(fresh[site], record, MOMENTUM)
           for site, record in records.items()}
  return dict(carry=jax.tree.leaves(carry), out=out, stats=stats, moments=records,
              g_x=grads.pop('__x'), g_params=grads)


def assert_same_training_pass(got, want, rtol_values, rtol_grads):
  """Outputs, carry, statistics (counts exactly) and gradients of two training passes."""
  helpers.assert_close(got['out'], want['out'], rtol_values, 'outputs')
  for g, w in zip(got['carry'], want['carry']):
    helpers.assert_close(g, w, rtol_values, 'final carry')
  for collection in ('stats', 'moments'):
    assert set(got[collection]) == set(want[collection]), collection
    for site in want[collection]:
      np.testing.assert_array_equal(got[collection][site]['count'],
                                    want[collection][site]['count'])
      for key in ('mean', 'var'):
        helpers.assert_close(got[collection][site][key], want[collection][site][key],
                             rtol_values, f'{collection} {site} {key}')
  assert set(got['g_params']) == set(want['g_params'])
  for name, g in got['g_params'].items():
    helpers.assert_close(g, want['g_params'][name], rtol_grads, f'd loss / d {name}')
  helpers.assert_close(got['g_x'], want['g_x'], rtol_grads, 'd loss / d x')


def _cases():
  """(variant, forced choice name) where forcing changes the CPU's policy."""
  return [(variant, name) for variant in BATCH_VARIANTS for name, forced in FORCED.items()
          if _policy_of(variant, tuple(forced.items())) != _policy_of(variant)]


# ----------------------------------------------------------------------------- the table

Policy = policy.ExecutionPolicy
# (cell, hidden, per-device batch, batch_norm, sequence_input): shapes on both sides of the
# CPU's measured thresholds (policy.py), for the rules that hold whatever their values.
SHAPES = tuple((cell, hidden, batch, batch_norm, sequence_input)
               for cell in ('lstm', 'rnn') for hidden, batch in ((100, 64), (1000, 8))
               for batch_norm in (True, False) for sequence_input in (False, True))


@pytest.mark.parametrize('platform', ['cpu', 'gpu', 'tpu'])
def test_resolve_follows_the_rules(platform):
  """Every backend: sequence-wise input statistics hoist the input term. GPU and TPU:
  hoisted, the scan's autodiff (GPU: the whole-layer pass for LSTMs without batch norm),
  reductions; remat 'dots' for batch-normalised layers on a GPU, else 'none'. CPU: the
  measured choices (policy.py), each one of the allowed values."""
  for cell, hidden, batch, batch_norm, sequence_input in SHAPES:
    got = policy.resolve(cell=cell, hidden_size=hidden, batch=batch, batch_norm=batch_norm,
                         sequence_input=sequence_input, execution=policy.Execution(),
                         platform=platform)
    case = (platform, cell, hidden, batch, batch_norm, sequence_input)
    if sequence_input:
      assert got.hoist_input, case
    if platform == 'cpu':
      assert got.remat in ('none', 'dots', 'full') and got.backward in ('scan', 'layer'), case
      assert got.batch_sums == 'contraction', case
      continue
    gpu = Policy(True, 'dots' if batch_norm else 'none',
                 'layer' if cell == 'lstm' and not batch_norm else 'scan', 'reduce')
    tpu = Policy(True, 'dots' if batch_norm else 'none', 'scan', 'reduce')
    assert got == {'gpu': gpu, 'tpu': tpu}[platform], case


@pytest.mark.parametrize('platform', ['cpu', 'gpu', 'tpu'])
def test_resolve_keeps_forced_choices_and_refuses_bad_ones(platform):
  common = dict(cell='lstm', hidden_size=1000, batch=8, batch_norm=True, platform=platform)
  for fields in ({'hoist_input': False, 'remat': 'dots', 'backward': 'layer',
                  'batch_sums': 'contraction'},
                 {'hoist_input': True, 'remat': 'none', 'backward': 'scan',
                  'batch_sums': 'reduce'}):
    assert policy.resolve(sequence_input=False, **common,
                          execution=policy.Execution(**fields)) == Policy(**fields)
  for name, bad in (('remat', 'sometimes'), ('backward', 'both'), ('batch_sums', 'sum'),
                    ('hoist_input', 'yes')):
    with pytest.raises(ValueError, match=name):
      policy.resolve(sequence_input=False, **common,
                     execution=policy.Execution(**{name: bad}))
  with pytest.raises(ValueError, match='hoist_input=False cannot hold'):
    policy.resolve(sequence_input=True, **common,
                   execution=policy.Execution(hoist_input=False))
  for kernel in ('pallas', 'persistent'):   # Triton kernels: GPUs, and interpreted on CPU
    execution = policy.Execution(fused_step=kernel)
    if platform == 'tpu':
      with pytest.raises(ValueError, match='a TPU target has none') as error:
        policy.resolve(sequence_input=False, **common, execution=execution)
      helpers.one_line(error)
    else:
      assert policy.resolve(sequence_input=False, **common,
                            execution=execution).fused_step == kernel


def test_execution_values_are_checked_in_one_line():
  for name, bad in (('hoist_input', None), ('remat', 'sometimes'), ('unroll', 0),
                    ('backward', 'both'), ('batch_sums', 'sum')):
    with pytest.raises(ValueError, match=f'{name} must be') as error:
      policy.Execution(**{name: bad})
    assert repr(bad) in helpers.one_line(error)


def test_config_keys_become_the_execution_value():
  config = fx.tiny_config('bn_lstm', **{'model.remat': 'dots', 'model.unroll': 2,
                                        'model.hoist_input': True})
  options = train.layer_fields(config, 5)
  assert options['execution'] == policy.Execution(hoist_input=True, remat='dots', unroll=2)
  assert not set(options) & set(policy.EXECUTION_FIELDS)


def _lowered_training_pass(platform: str) -> str:
  """The lstm layer's training gradient, traced here and lowered for `platform` (the
  three platforms resolve a plain LSTM to three policies)."""
  layer = _layer('lstm')

  def loss(variables, x, mask):
    out, _ = layer.apply(variables, x, mask, use_running_average=False, deterministic=False,
                         mutable=['batch_stats'], rngs={'noise': jax.random.key(0)})
    return jnp.sum(out)
  variables = layer.init(jax.random.key(0), *helpers.float32((X, MASK)),
                         use_running_average=True, deterministic=True)
  return jax.jit(jax.grad(loss)).trace(variables, *helpers.float32((X, MASK))).lower(
      lowering_platforms=(platform,)).as_text(debug_info=True)


def test_programs_run_the_policy_of_their_target_platforms():
  """Traced on this machine for another target (`policy.targets`), the layer's training
  pass holds that platform's policy and no other (each policy runs in a named scope of
  its own); with several targets, the one of the platform it is lowered for."""
  names = {p: scans.scope_name(_layer('lstm').execution_policy(B, p))
           for p in ('cpu', 'cuda', 'tpu')}
  assert len(set(names.values())) == 3, names
  found = lambda text: [p for p, name in names.items() if name in text]
  assert policy.target_platforms() == (policy.platform_name(jax.default_backend()),)
  with policy.targets('tpu'):
    assert found(_lowered_training_pass('tpu')) == ['tpu']
  with policy.targets('cpu', 'cuda', 'tpu'):
    for platform in ('cpu', 'cuda'):
      assert found(_lowered_training_pass(platform)) == [platform]


def test_cpu_policy_at_this_shape_differs_from_the_accelerators():
  """The shape makes every choice differ from the accelerators' where it can; on a CPU
  the layers' own 'auto' resolves to it."""
  for variant in BATCH_VARIANTS:
    sequence_input = ref.spec(variant)['input_stats'] == 'sequence'
    lstm = ref.spec(variant)['cell'] == 'lstm'
    cpu = Policy(hoist_input=sequence_input, remat='full',
                 backward='layer' if lstm else 'scan', batch_sums='contraction')
    assert _resolve(variant, 'cpu') == _policy_of(variant) == cpu, variant
    assert _layer(variant).execution_policy(B, 'cpu') == cpu, variant


@pytest.mark.parametrize('platform', ['gpu', 'tpu'])
@pytest.mark.parametrize('variant', BATCH_VARIANTS)
def test_forced_accelerator_policy_is_what_accelerators_resolve(variant, platform):
  forced = tuple(ACCELERATORS[platform].items())
  assert _resolve(variant, platform) == _policy_of(variant, forced)


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize('variant,choice', helpers.core_cases(
    _cases(), core=[('bn_lstm', 'gpu'), ('rnn_bn_recurrence', 'remat')],
    also=[case for case in _cases()
          if case[0] == 'bn_lstm']))
def test_forced_choice_matches_cpu_policy(variant, choice):
  got = run(variant, tuple(FORCED[choice].items()))
  assert_same_training_pass(got, run(variant), RTOL_VALUES, RTOL_GRADS)


@pytest.mark.parametrize('variant,choice', helpers.core_cases(
    [(variant, choice) for variant in BATCH_VARIANTS for choice in ('cpu', *FORCED)],
    core=[('bn_lstm', 'cpu')]))
def test_each_policy_matches_the_float64_reference(variant, choice):
  forced = () if choice == 'cpu' else tuple(FORCED[choice].items())
  got = run(variant, forced)
  want = reference(variant)
  assert_same_training_pass(got, want, RTOL_REF_VALUES, RTOL_REF_GRADS)
  assert np.all(got['out'][MASK == 0] == 0.0), 'padded outputs must be exactly 0'
  assert np.all(got['g_x'][MASK == 0] == 0.0), 'padded inputs must get no gradient'


# ----------------------------------------------------------------------------- trainer


def _trainer_config(forced: dict):
  """A tiny bn_lstm run on 1 device (B=4, H=32, SGD), `config.model` fields `forced`."""
  return fx.tiny_config('bn_lstm', **{
      'model.hidden_size': H, 'train.batch_size': B, 'eval.batch_size': B,
      'train.num_devices': 1, 'optimizer.name': 'sgd', 'optimizer.momentum': 0.0,
      'optimizer.learning_rate': 0.1,
      **{f'model.{name}': value for name, value in forced.items()}})


def _trainer_step(forced: dict):
  config = _trainer_config({**_cpu_fields('bn_lstm'), **forced})
  dataset = fx.synthetic_dataset(config)
  options = train.layer_fields(config, dataset.train_length)
  resolved = variants.make_layer('bn_lstm', H, **options).execution_policy(B)
  return resolved, fx.one_step(config, dataset, num_devices=1)


# The GPU policy against the CPU's, layer by layer: test_forced_choice_matches_cpu_policy.
@pytest.mark.parametrize('forced', helpers.core_cases(['gpu', 'persistent'], core=[],
                                                      also=['persistent']))
def test_trainer_step_with_the_accelerator_policy_matches_the_cpu_policy(forced):
  """The config fields reach the layers, and one training step (SGD, so that the update
  is the gradient times the learning rate) plus a validation pass with population
  statistics give what the CPU's policy gives: with the GPU's policy, and with the
  persistent kernel (the trainer's layers have a device axis of one device)."""
  fields = GPU if forced == 'gpu' else {'fused_step': 'persistent', 'hoist_input': True}
  policy_cpu, (init_cpu, cpu, metrics_cpu, valid_cpu) = _trainer_step({})
  policy_acc, (init_acc, acc, metrics_acc, valid_acc) = _trainer_step(fields)
  assert policy_cpu == policy.ExecutionPolicy(False, 'full', 'layer', 'contraction')
  assert policy_acc.scan == ('scan' if forced == 'gpu' else 'fused')
  for a, b in zip(jax.tree.leaves(init_acc.params), jax.tree.leaves(init_cpu.params)):
    np.testing.assert_array_equal(a, b)
  for name, before, after_acc, after_cpu in zip(
      [str(p) for p, _ in jax.tree_util.tree_flatten_with_path(init_cpu.params)[0]],
      jax.tree.leaves(init_cpu.params), jax.tree.leaves(acc.params),
      jax.tree.leaves(cpu.params)):
    step_acc = np.asarray(after_acc, np.float64) - np.asarray(before, np.float64)
    step_cpu = np.asarray(after_cpu, np.float64) - np.asarray(before, np.float64)
    assert np.any(step_cpu != 0.0), name
    helpers.assert_close(step_acc, step_cpu, RTOL_GRADS, f'update of {name}')
  for a, b in zip(jax.tree.leaves(acc.batch_stats), jax.tree.leaves(cpu.batch_stats)):
    helpers.assert_close(a, b, RTOL_VALUES, 'batch_stats')
  for name in metrics_cpu:
    helpers.assert_close(metrics_acc[name], metrics_cpu[name], RTOL_VALUES, name)
  for name in valid_cpu:
    helpers.assert_close(valid_acc[name], valid_cpu[name], RTOL_VALUES, f'valid {name}')
