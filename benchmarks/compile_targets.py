"""What the offline compile checks build, and for which target, without the target's
hardware: the BN-LSTM layer's execution forms (a table, one entry per form), traced for
the target (`policy.targets`: the layer resolves its policy for it), compile-only
devices for an H100 and for TPU topologies, and the programs (the layer's and Flax's
LSTM's forward+backward) as jitted functions of abstract arguments.

`gpu_compile.py` and `tpu_compile.py` compile these programs; the CUDA cross-lowering
test (`tests/test_fused_step.py`) lowers under `cuda_lowering()`. Nothing here allocates
on a device: arguments are `jax.ShapeDtypeStruct`s, parameters come from
`jax.eval_shape` of the layer's `init`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import bn_rnn_jax as br
import rnn_speed  # pylint: disable=g-bad-import-order
# pylint: enable=wrong-import-position

HERE = os.path.dirname(os.path.abspath(__file__))
#: XLA's GPU target description of an H100 SXM (sm_90a), in the fields every XLA since
#: jax 0.10 knows: what XLA's GPU compiler needs to compile for it with no device.
H100_TARGET_CONFIG = os.path.join(HERE, 'h100_sxm.txtpb')
H100_KIND = 'NVIDIA H100 80GB HBM3'
H100_CORES = 132
#: The shapes compiled (`rnn_speed.SHAPES`): (a) sequential MNIST, (c) character PTB.
SHAPES = ('a', 'c')
DTYPES = rnn_speed.DTYPES


@dataclasses.dataclass(frozen=True)
class Form:
  """One way to run the `bn_lstm` layer: `Execution` settings, the platforms and shapes
  it is compiled for, and whose policy resolves the settings left 'auto' (None: the
  target platform's, as the layer resolves them under `policy.targets`; 'cpu': the
  CPU's, given explicitly, to compile it for the target beside the target's own)."""
  settings: Mapping[str, Any]
  platforms: tuple[str, ...]
  policy_of: Optional[str] = None
  shapes: tuple[str, ...] = SHAPES


#: The layer's execution forms, by name. A new form (a `fused_step` value, Pallas block
#: settings) is one entry; a form this version's `Execution` refuses is skipped, saying so.
FORMS = {
    'default': Form({}, ('gpu', 'tpu')),
    'cpu_policy': Form({}, ('tpu',), policy_of='cpu'),
    # What storing every step's intermediates would cost, beside the policy's choice.
    'remat_none': Form({'remat': 'none'}, ('tpu',)),
    'fused_xla': Form({'fused_step': 'xla'}, ('gpu',)),
    'fused_pallas': Form({'fused_step': 'pallas'}, ('gpu',)),
    # One program holds the whole recurrence: H up to `persistent.MAX_HIDDEN` (256).
    'persistent': Form({'fused_step': 'persistent'}, ('gpu',), shapes=('a', 'b')),
}
#: Flax's `nn.RNN(nn.OptimizedLSTMCell)` (`rnn_speed.FlaxLSTM`), compiled beside the forms.
FLAX = 'flax_lstm'


def form_unavailable(name: str) -> Optional[str]:
  """None where this version's `Execution` takes the form's settings; else one line."""
  try:
    br.Execution(**FORMS[name].settings)
  except (TypeError, ValueError) as e:
    return f'{name}: skipped, this version has no such form ({str(e).splitlines()[0]})'
  return None


def _layer_facts(shape: str) -> dict:
  s = rnn_speed.SHAPES[shape]
  return dict(cell='lstm', hidden_size=s['hidden'], batch=s['batch'], batch_norm=True,
              sequence_input=False)


def execution(name: str, shape: str) -> br.Execution:
  """The `Execution` the layer of form `name` is given at `shape`: the form's settings,
  and for a form of another platform's policy (`policy_of`), that policy's choices."""
  form = FORMS[name]
  if form.policy_of is None:
    return br.Execution(**form.settings)
  resolved = br.policy.resolve(**_layer_facts(shape), platform=form.policy_of,
                               execution=br.Execution(**form.settings))
  return br.Execution(**{**form.settings,
                         **{key: getattr(resolved, key) for key in
                            ('hoist_input', 'remat', 'backward', 'batch_sums')}})


def resolved_policy(name: str, shape: str, target: str) -> dict:
  """The policy the layer of form `name` runs with at `shape` when traced for `target`
  (`policy.resolve`, what the layer calls), as a dict for the results."""
  return dataclasses.asdict(br.policy.resolve(
      **_layer_facts(shape), platform=target, execution=execution(name, shape)))


def cuda_lowering():
  """A context to lower for CUDA on a machine without a GPU. jax >= 0.11's Pallas Triton
  lowering asks the current device for its kind; an abstract H100 answers (with
  `AxisType.Auto`: the default, Explicit, fails in its reduce lowering). jax 0.10
  assumes sm_90 and ignores it."""
  device = jax.sharding.AbstractDevice(device_kind=H100_KIND, num_cores=H100_CORES,
                                       platform='gpu')
  mesh = jax.sharding.AbstractMesh((1,), ('x',), axis_types=(jax.sharding.AxisType.Auto,),
                                   abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)


def h100_device():
  """A compile-only H100 (XLA's GPU compiler from the CUDA plugin; no GPU needed)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  with open(H100_TARGET_CONFIG) as f:
    config = f.read()
  return topologies.get_topology_desc(platform='cuda', topology='1x1x1',
                                      target_config=config).devices[0]


def tpu_devices(topology: str) -> list:
  """The compile-only devices of a TPU topology, e.g. 'v5e:2x2' (libtpu; no TPU needed)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return list(topologies.get_topology_desc(platform='tpu', topology_name=topology).devices)


def _loss(apply: Callable) -> Callable:
  """`(params, batch_stats, x) -> mean squared output`, as every `rnn_speed.py` row."""
  def loss(params, batch_stats, x):
    y = apply(params, batch_stats, x)
    return jnp.mean(jnp.square(y.astype(jnp.float32)))
  return loss


def program(name: str, shape: str, dtype: str, target: str):
  """`(fn, args)`: the jitted forward+backward (`value_and_grad` w.r.t. the parameters)
  of the form `name` (or `FLAX`) at `shape` in compute dtype `dtype`, to be traced for
  `target` (`lower`), and its abstract arguments `(params, batch_stats, x)` (no
  sharding)."""
  s = rnn_speed.SHAPES[shape]
  x = jax.ShapeDtypeStruct((s['batch'], s['time'], s['features']), jnp.float32)
  key = jax.random.key(0)
  if name == FLAX:
    model = rnn_speed.FlaxLSTM(s['hidden'], dtype=DTYPES[dtype])
    variables = jax.eval_shape(model.init, key, x)
    apply = lambda params, _, x: model.apply({'params': params}, x)
  else:
    layer = br.make_layer('bn_lstm', s['hidden'], max_length=s['time'], dtype=DTYPES[dtype],
                          execution=execution(name, shape))
    mode = dict(use_running_average=False, deterministic=False)
    with br.policy.targets(target):
      variables = jax.eval_shape(lambda k, x: layer.init(k, x, **mode), key, x)

    def apply(params, batch_stats, x):
      y, _ = layer.apply({'params': params, 'batch_stats': batch_stats}, x, **mode,
                         mutable=['batch_stats'])
      return y
  step = jax.value_and_grad(_loss(apply))
  step.__name__ = f'{name}_{shape}_{dtype}'
  return jax.jit(step), (variables['params'], variables.get('batch_stats', {}), x)


def placed(tree, sharding):
  """`tree`'s shapes and dtypes as `ShapeDtypeStruct`s placed by `sharding`."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                      tree)


def lower(fn, args, target: str):
  """`fn` traced on `args` and lowered for `target` ('gpu' or 'tpu'): traced under
  `policy.targets(target)`, so the layer resolves its 'auto' choices (and runs its Pallas
  kernels compiled, not interpreted) for the target, not for this host."""
  on_gpu = cuda_lowering() if target == 'gpu' else contextlib.nullcontext()
  with br.policy.targets(target), on_gpu:
    traced = fn.trace(*args)
    return traced.lower(lowering_platforms=('cuda',)) if target == 'gpu' else traced.lower()
