"""`flax_cells.py` and `nnx_cells.py` against the properties of Flax's own recurrent
tests (Linen `nn.RNN` / `nn.Bidirectional`, NNX `nnx.RNN` / `nnx.Bidirectional`), with the
batch-normalised cells in place of Flax's LSTM cells.

Each property runs in Linen and in NNX through one small adapter per API (`LinenModel`,
`NNXModel`: a cell with its variables, a call of `RNN`, one step of the cell). Flax's
tests run their cells without statistics; here the numerics run in training, where the
batch statistics make the rows of a batch depend on each other at each step. So a cell
stepped by hand steps the whole batch with each step's mask, and is compared with `RNN`
on the outputs, the final carry (`LSTMCarry(c, h, step)`) and the `batch_stats` written,
from statistics one batch has already written (so that the new batch moves a running
average, each row by its valid count, rather than being taken outright). Where Flax compares one row run alone with the same row inside a batch, the comparison
is made in evaluation, with population statistics from one training batch: in training
a one-row batch normalises with its own statistics (a variance of 0).

Beyond Flax's properties: a sequence run in chunks (rows at different steps in
evaluation), a `lax.scan` of one's own, a cell stepped inside another RNN's cell, and the
errors for training chunks past `max_length` or with rows at different steps (eager and
under `jit`).

Shapes are tiny (B=3, T=6, I=5, H=4) and comparisons float32 against float32 at rtol
1e-5. The adapters' `RNN` calls and steps are jitted, one compilation per configuration
shared by the tests (`jit=False`: eagerly); `Bidirectional` and the scans run eagerly.
"""

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from flax import linen as nn
from flax import nnx

from bn_rnn_jax import checks
from bn_rnn_jax import flax_cells
from bn_rnn_jax import nnx_cells
from bn_rnn_jax import policy
import helpers

B, T, I, H = 3, 6, 5, 4
MAX_LEN = T
LENGTHS = np.array([6, 3, 5])
X = np.random.default_rng(0).normal(size=(B, T, I)).astype(np.float32)
# The batch that trains the population statistics of the tests that evaluate.
X_TRAIN = np.random.default_rng(1).normal(size=(B, T, I)).astype(np.float32)
RTOL, ATOL = 1e-5, 1e-6
# Batches of other sizes run other float32 kernels (a batch of one a matrix-vector
# product), whose round-off differs by processor and grows over the steps; a row that
# leaked into another's statistics would differ by orders of magnitude more.
BATCH_SIZE_RTOL, BATCH_SIZE_ATOL = 1e-4, 1e-5

LINEN_CELLS = {'bn_lstm': flax_cells.BNLSTMCell, 'bn_input_only': flax_cells.BNInputLSTMCell,
               'ln_lstm': flax_cells.LNLSTMCell}
NNX_CELLS = {'bn_lstm': nnx_cells.BNLSTMCell, 'bn_input_only': nnx_cells.BNInputLSTMCell,
             'ln_lstm': nnx_cells.LNLSTMCell}
APIS = ['linen', 'nnx']
# The NNX cells wrap the Linen ones (`nnx_bridge.FromLinen`): a property of the call runs
# on Linen in the default tier and on NNX too with --exhaustive (test_nnx.py and the NNX
# API's tests below run the NNX cells by default). A property another default-tier test
# proves (parameter shapes: test_flax_cells; unroll: test_layer_vjp; stepping without
# lengths: stepping with them) runs with --exhaustive only.
LINEN_FIRST = helpers.core_cases(APIS, core=['linen'])


def close(got, want):
  helpers.assert_trees_close(got, want, rtol=RTOL, atol=ATOL)


def close_across_batch_sizes(got, want):
  helpers.assert_trees_close(got, want, rtol=BATCH_SIZE_RTOL, atol=BATCH_SIZE_ATOL)


def numpy(tree):
  return jax.tree.map(np.asarray, tree)


def rows(tree, index):
  """Every leaf of a carry (or outputs) at batch `index`."""
  return jax.tree.map(lambda a: np.asarray(a)[index], tree)


def mask_of(lengths, length=T):
  """`[*lengths.shape, length]` float32, 1 on each row's first `lengths` steps."""
  lengths = np.asarray(lengths)
  return (np.arange(length) < lengths[..., None]).astype(np.float32)


def reverse_valid(x, lengths):
  """Each row's first `lengths[b]` steps reversed, padding left in place."""
  out = np.array(x)
  for row, length in enumerate(lengths):
    out[row, :length] = out[row, :length][::-1]
  return out


def perturbed(params, seed):
  """The initial parameters plus noise, so that no term of the step is trivial (zero
  biases, gamma 0.1 everywhere)."""
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(100 + seed)
  return jax.tree.unflatten(tree, [
      jnp.asarray(p + 0.3 * rng.normal(size=p.shape), p.dtype) for p in leaves])


# ----------------------------------------------------------------------------- adapters
def _split(kwargs):
  """Call arguments as (static: the flags, hashable; arrays: the rest)."""
  static = tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, bool)))
  return static, {k: v for k, v in kwargs.items() if not isinstance(v, bool)}


def _variables(params, stats, name=None):
  wrap = (lambda tree: {name: tree}) if name else (lambda tree: tree)
  return {'params': wrap(params), **({'batch_stats': wrap(stats)} if stats else {})}


def _apply(module, train, params, stats, *args, name=None, **kwargs):
  """`module.apply` on a cell's variables (under `name`): `(outputs, new stats)`."""
  variables = _variables(params, stats, name)
  if not train:
    return module.apply(variables, *args, **kwargs), stats
  out, new = module.apply(variables, *args, mutable=['batch_stats'], **kwargs)
  new = new.get('batch_stats', {})
  return out, new.get(name, {}) if name else new


@functools.cache
def _linen_rnn(cell, rnn_fields, static, jit):
  module = flax_cells.RNN(cell, **dict(rnn_fields))
  train = not cell.use_running_average

  def call(params, stats, x, arrays):
    return _apply(module, train, params, stats, x, name='cell', **dict(static), **arrays)
  if jit == 'checked':  # the library's checks of traced values on (`checks.checkify`)
    checked = jax.jit(checks.checkify(call))

    def run(*args):
      error, out = checked(*args)
      error.throw()
      return out
    return run
  return jax.jit(call) if jit else call


@functools.cache
def _linen_step(cell):
  return jax.jit(functools.partial(_apply, cell, not cell.use_running_average))


@functools.cache
def _nnx_rnn(rnn_fields, static, jit):
  def call(module, x, arrays):
    return nnx_cells.RNN(module, **dict(rnn_fields))(x, **dict(static), **arrays)
  return nnx.jit(call) if jit else call


_nnx_step = nnx.jit(lambda module, carry, x_t, mask_t: module(carry, x_t, mask_t))


class LinenModel:
  """A Linen cell and its variables; training calls update `stats`."""
  api = 'linen'

  def __init__(self, kind='bn_lstm', seed=0, **fields):
    self.cls, self.fields = LINEN_CELLS[kind], fields
    cell = self.cell(train=False)
    variables = cell.init(jax.random.key(seed), cell.initialize_carry(None, (1, I)),
                          jnp.zeros((1, I)))
    self.params = perturbed(variables['params'], seed)
    self.stats = variables.get('batch_stats', {})

  def cell(self, train):
    return self.cls(H, max_length=MAX_LEN, use_running_average=not train, **self.fields)

  def copy(self):
    return copy.copy(self)

  def rnn(self, x, *, train, fields=None, jit=True, **kwargs):
    """`RNN(cell, **fields)(x, **kwargs)`, as numpy arrays."""
    static, arrays = _split(kwargs)
    run = _linen_rnn(self.cell(train), tuple(sorted((fields or {}).items())), static, jit)
    out, self.stats = run(self.params, self.stats, x, arrays)
    return numpy(out)

  def step(self, carry, x_t, mask_t, *, train):
    out, self.stats = _linen_step(self.cell(train))(self.params, self.stats, carry, x_t,
                                                    mask_t)
    return numpy(out)

  def initialize_carry(self, input_shape):
    return self.cell(False).initialize_carry(None, input_shape)

  def param_shapes(self):
    return jax.tree.map(jnp.shape, self.params)

  def stats_shapes(self):
    return jax.tree.map(jnp.shape, self.stats)


class NNXModel:
  """An NNX cell (`nnx_cells`), its variables in place."""
  api = 'nnx'

  def __init__(self, kind='bn_lstm', seed=0, **fields):
    self.module = NNX_CELLS[kind](I, H, max_length=MAX_LEN, rngs=nnx.Rngs(seed), **fields)
    self.module.load_linen_variables(
        {'params': perturbed(self.module.linen_variables()['params'], seed)})

  @property
  def params(self):
    return self.module.linen_variables()['params']

  @property
  def stats(self):
    return self.module.linen_variables()['batch_stats']

  def copy(self):
    other = copy.copy(self)
    other.module = nnx.clone(self.module)
    return other

  def mode(self, train):
    if train:
      self.module.train()
    else:
      self.module.eval()

  def rnn(self, x, *, train, fields=None, jit=True, **kwargs):
    self.mode(train)
    static, arrays = _split(kwargs)
    run = _nnx_rnn(tuple(sorted((fields or {}).items())), static, jit)
    return numpy(run(self.module, x, arrays))

  def step(self, carry, x_t, mask_t, *, train):
    self.mode(train)
    return numpy(_nnx_step(self.module, carry, x_t, mask_t))

  def initialize_carry(self, input_shape, **kwargs):
    return self.module.initialize_carry(input_shape, **kwargs)

  def param_shapes(self):
    return {name: getattr(self.module, name).shape for name in self.params}

  def stats_shapes(self):
    return {site: jax.tree.map(jnp.shape, getattr(self.module, site)) for site in self.stats}


def make(api, kind='bn_lstm', seed=0, **fields):
  return {'linen': LinenModel, 'nnx': NNXModel}[api](kind, seed, **fields)


def trained(api, kind='bn_lstm', seed=0, **fields):
  """A model whose statistics one training batch (every row full length) has written:
  population statistics for the tests that evaluate, and for the tests that train a
  running average that the next batch moves by its rows' valid counts (a row's first
  batch is taken outright)."""
  model = make(api, kind, seed, **fields)
  model.rnn(X_TRAIN, train=True, return_carry=True)
  return model


def step_by_hand(model, x, lengths=None, *, train, carry=None):
  """The cell called at each step of `x [B, T, I]` with that step's mask: the final
  carry, the outputs `[B, T, H]` and the carry after every step."""
  mask = mask_of(np.full(x.shape[0], x.shape[1]) if lengths is None else lengths,
                 x.shape[1])
  carry = model.initialize_carry(x[:, 0].shape) if carry is None else carry
  outputs, carries = [], []
  for t in range(x.shape[1]):
    carry, h = model.step(carry, x[:, t], mask[:, t], train=train)
    outputs.append(h)
    carries.append(carry)
  return carry, np.stack(outputs, 1), carries


def bidirectional(forward, backward, x, *, train, **fields):
  """`nn.Bidirectional` / `nnx.Bidirectional(RNN(forward cell), RNN(backward cell),
  **fields)(x, seq_lengths=LENGTHS)` (one cell for both when `forward is backward`),
  eagerly; the statistics written back to the models."""
  if forward.api == 'nnx':
    forward.mode(train)
    backward.mode(train)
    module = nnx.Bidirectional(nnx_cells.RNN(forward.module), nnx_cells.RNN(backward.module),
                               **fields)
    return numpy(module(x, seq_lengths=LENGTHS))
  shared = forward is backward
  fwd_cell = forward.cell(train)
  module = nn.Bidirectional(flax_cells.RNN(fwd_cell),
                            flax_cells.RNN(fwd_cell if shared else backward.cell(train)),
                            **fields)
  models = {'forward_rnn': forward, **({} if shared else {'backward_rnn': backward})}
  variables = {'params': {n: {'cell': m.params} for n, m in models.items()},
               'batch_stats': {n: {'cell': m.stats} for n, m in models.items()}}
  out, new = module.apply(variables, x, seq_lengths=LENGTHS, mutable=['batch_stats'])
  for n, m in models.items():
    m.stats = new['batch_stats'][n]['cell']
  return numpy(out)


# ----------------------------------------------------------------------------- Flax's RNN tests
@pytest.mark.exhaustive
@pytest.mark.parametrize('api', APIS)
def test_forward_shapes_and_parameter_shapes(api):
  """`RNN(cell)` with `return_carry`: outputs `[B, T, H]`, the carry's c and h `[B, H]`
  and step `[B]` (= T); the parameters and per-step statistics in the layer's layout."""
  model = make(api)
  carry, ys = model.rnn(X, train=True, return_carry=True)
  assert ys.shape == (B, T, H)
  assert isinstance(carry, flax_cells.LSTMCarry)
  c, h = carry
  assert c.shape == h.shape == (B, H)
  np.testing.assert_array_equal(carry.step, [T] * B)
  assert model.param_shapes() == {
      'input_kernel': (I, 4 * H), 'recurrent_kernel': (H, 4 * H), 'bias': (4 * H,),
      'input_scale': (4 * H,), 'recurrent_scale': (4 * H,), 'cell_scale': (H,),
      'cell_bias': (H,)}
  assert model.stats_shapes() == {
      site: {'mean': (MAX_LEN, f), 'var': (MAX_LEN, f), 'count': (MAX_LEN,)}
      for site, f in (('recurrent', 4 * H), ('input', 4 * H), ('cell', H))}
  assert np.all(np.asarray(model.stats['cell']['count']) > 0)


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_multiple_batch_dims(api):
  """Inputs `[2, 3, T, I]` with `seq_lengths [2, 3]`: outputs `[2, 3, T, H]`, a carry per
  row, and the outputs, carry and statistics of the batch flattened to 6 rows."""
  x = np.random.default_rng(2).normal(size=(2, 3, T, I)).astype(np.float32)
  lengths = np.array([[6, 3, 5], [1, 6, 2]])
  model = trained(api)
  flat = model.copy()
  carry, ys = model.rnn(x, train=True, seq_lengths=lengths, return_carry=True)
  assert ys.shape == (2, 3, T, H) and carry.c.shape == carry.h.shape == (2, 3, H)
  np.testing.assert_array_equal(carry.step, lengths)
  want_carry, want = flat.rnn(x.reshape(6, T, I), train=True,
                              seq_lengths=lengths.reshape(6), return_carry=True)
  close(ys.reshape(6, T, H), want)
  close(jax.tree.map(lambda a: a.reshape((6,) + a.shape[2:]), carry), want_carry)
  close(model.stats, flat.stats)


@pytest.mark.exhaustive
@pytest.mark.parametrize('api', APIS)
def test_unroll(api):
  """`Execution(unroll=2)` on the cell (`nn.RNN`'s `unroll`): outputs `[B, T, H]`, and
  the outputs, carry and statistics of unroll 1, with uneven lengths."""
  plain = trained(api)
  unrolled = make(api, execution=policy.Execution(unroll=2))
  if api == 'linen':
    unrolled.stats = plain.stats
  else:
    unrolled.module.load_linen_variables({'batch_stats': plain.stats})
  got = unrolled.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  assert got[1].shape == (B, T, H)
  close(got, plain.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True))
  close(unrolled.stats, plain.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_time_major(api):
  """`time_major=True`: inputs and outputs `[T, B, ...]`, a carry `[B, H]` that is not
  zero, and the batch-major run's outputs, carry and statistics."""
  model = trained(api)
  batch_major = model.copy()
  carry, ys = model.rnn(X.swapaxes(0, 1), train=True, seq_lengths=LENGTHS,
                        fields=dict(time_major=True, return_carry=True))
  assert ys.shape == (T, B, H)
  for leaf in (carry.c, carry.h):
    assert leaf.shape == (B, H) and not np.allclose(leaf, 0.0)
  want_carry, want = batch_major.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  close(ys.swapaxes(0, 1), want)
  close(carry, want_carry)
  close(model.stats, batch_major.stats)


@pytest.mark.exhaustive
@pytest.mark.parametrize('api', APIS)
def test_stepped_by_hand_equals_rnn(api):
  """The cell called at each step (a mask of ones) gives `RNN`'s outputs step by step,
  its final carry and the same statistics (training)."""
  model = trained(api)
  by_hand = model.copy()
  want_carry, want = model.rnn(X, train=True, return_carry=True)
  carry, ys, _ = step_by_hand(by_hand, X, train=True)
  for t in range(T):
    close(ys[:, t], want[:, t])
  close(carry, want_carry)
  close(by_hand.stats, model.stats)


@pytest.mark.parametrize('api,kind', helpers.core_cases(
    [('linen', 'bn_lstm'), ('nnx', 'bn_lstm'), ('linen', 'bn_input_only'), ('nnx', 'ln_lstm')],
    core=[('linen', 'bn_lstm')]))
def test_stepped_by_hand_with_seq_lengths(api, kind):
  """With `seq_lengths`, the cell stepped with each step's mask: the outputs (0 on
  padding), each row's final carry = the hand-stepped carry after that row's last valid
  step, and the same statistics (training)."""
  model = trained(api, kind)
  by_hand = model.copy()
  want_carry, want = model.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  _, ys, carries = step_by_hand(by_hand, X, LENGTHS, train=True)
  close(ys, want)
  assert np.all(want[mask_of(LENGTHS) == 0] == 0.0)
  for row, length in enumerate(LENGTHS):
    close(rows(carries[length - 1], row), rows(want_carry, row))
  np.testing.assert_array_equal(want_carry.step, LENGTHS)
  close(by_hand.stats, model.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_single_example_batches_in_evaluation(api):
  """Each row stepped alone, as a batch of one, gives its row of the batch's `RNN`
  outputs and carry. Evaluated with population statistics (one training batch first):
  in training a one-row batch would normalise with its own statistics."""
  model = trained(api)
  want_carry, want = model.rnn(X, train=False, return_carry=True)
  for row in range(B):
    carry, ys, _ = step_by_hand(model, X[row:row + 1], train=False)
    close_across_batch_sizes(ys[0], want[row])
    close_across_batch_sizes(carry, rows(want_carry, slice(row, row + 1)))


@pytest.mark.exhaustive
@pytest.mark.parametrize('api', APIS)
def test_variable_batch_size(api):
  """One `RNN` evaluates batches of 1, 2 and 3 rows, each row as in the whole batch
  (population statistics)."""
  model = trained(api)
  _, full = model.rnn(X, train=False, return_carry=True)
  for size in (1, 2):
    _, out = model.rnn(X[:size], train=False, return_carry=True)
    assert out.shape == (size, T, H)
    close_across_batch_sizes(out, full[:size])


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_flax_rnn_evaluates_the_cell(api):
  """Flax's own `nn.RNN` / `nnx.RNN` (no mask reaches the cell) evaluates the cell as
  `RNN` does: the outputs of the valid steps and each row's last valid carry."""
  model = trained(api)
  want_carry, want = model.rnn(X, train=False, seq_lengths=LENGTHS, return_carry=True)
  if api == 'linen':
    flax_rnn = nn.RNN(model.cell(train=False), return_carry=True,
                      variable_broadcast=['params', 'batch_stats'])
    carry, ys = flax_rnn.apply(_variables(model.params, model.stats, 'cell'), X,
                               seq_lengths=LENGTHS)
  else:
    carry, ys = nnx.RNN(model.module, return_carry=True)(X, seq_lengths=LENGTHS)
  close(np.asarray(ys) * mask_of(LENGTHS)[..., None], want)
  close(carry, want_carry)


@pytest.mark.parametrize('api', LINEN_FIRST)
@pytest.mark.parametrize('keep_order', helpers.core_cases([False, True], core=[True]))
def test_reverse(api, keep_order):
  """`reverse=True` runs each row's valid steps backwards: the cell stepped by hand over
  the reversed valid steps gives the outputs in reversed order (in input order with
  `keep_order`), the carry and the statistics (training)."""
  model = trained(api)
  by_hand = model.copy()
  want_carry, want = model.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True,
                               fields=dict(reverse=True, keep_order=keep_order))
  carry, ys, _ = step_by_hand(by_hand, reverse_valid(X, LENGTHS), LENGTHS, train=True)
  close(reverse_valid(ys, LENGTHS) if keep_order else ys, want)
  close(carry, want_carry)
  close(by_hand.stats, model.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
@pytest.mark.parametrize('case', helpers.core_cases(
    ['plain', 'shared_cell', 'merge_fn', 'return_carry'], core=['shared_cell', 'return_carry']))
def test_bidirectional(api, case):
  """`nn.Bidirectional` / `nnx.Bidirectional` of two `RNN`s with `seq_lengths`: the
  forward run and the reversed run (`keep_order`) merged (concatenated, or by
  `merge_fn`), with each direction's statistics; a shared cell serves both directions,
  its statistics updated by the forward run, then the backward one; `return_carry` gives
  both carries, each row at its length (training)."""
  forward = trained(api, seed=1)
  backward = forward if case == 'shared_cell' else trained(api, seed=2)
  ref_f = forward.copy()
  ref_b = ref_f if case == 'shared_cell' else backward.copy()
  fields = {'merge_fn': lambda a, b: a + b} if case == 'merge_fn' else {}
  if case == 'return_carry':
    fields['return_carry'] = True
  out = bidirectional(forward, backward, X, train=True, **fields)
  carry_f, want_f = ref_f.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  carry_b, want_b = ref_b.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True,
                              fields=dict(reverse=True, keep_order=True))
  if case == 'return_carry':
    (got_f, got_b), out = out
    close((got_f, got_b), (carry_f, carry_b))
    for carry in (got_f, got_b):
      assert carry.c.shape == carry.h.shape == (B, H)
      np.testing.assert_array_equal(carry.step, LENGTHS)
  if case == 'merge_fn':
    assert out.shape == (B, T, H)
    close(out, want_f + want_b)
  else:
    assert out.shape == (B, T, 2 * H)
    close(out, np.concatenate([want_f, want_b], -1))
  close(forward.stats, ref_f.stats)
  close(backward.stats, ref_b.stats)


# ----------------------------------------------------------------------------- scans
@pytest.mark.exhaustive
def test_nn_scan_of_the_cell_equals_rnn():
  """`nn.scan` of the Linen cell class (params broadcast, `batch_stats` carried) over the
  time axis with each step's mask: `RNN`'s outputs, carry and statistics (training)."""
  model = trained('linen')
  scanned = nn.scan(flax_cells.BNLSTMCell, variable_broadcast='params',
                    variable_carry='batch_stats', split_rngs={'params': False},
                    in_axes=1, out_axes=1)(H, max_length=MAX_LEN, use_running_average=False)
  (carry, ys), new = scanned.apply(_variables(model.params, model.stats),
                                   scanned.initialize_carry(None, (B, I)), X,
                                   mask_of(LENGTHS), mutable=['batch_stats'])
  want_carry, want = model.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  close(ys, want)
  close(carry, want_carry)
  close(new['batch_stats'], model.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
@pytest.mark.parametrize('lengths', [
    pytest.param(LENGTHS, id='6-3-5'),
    pytest.param(np.array([0, 3, 6]), id='0-3-6')])
def test_scan_by_hand_equals_rnn(api, lengths):
  """A scan of one's own over the cell with each step's mask, uneven lengths (Linen:
  `jax.lax.scan` of `cell.apply` carrying the statistics; NNX: `nnx.scan` carrying the
  cell): `RNN(cell)(x, seq_lengths=...)`'s outputs, carry and statistics (training),
  a row of length 0 among them."""
  model = trained(api)
  by_hand = model.copy()
  want_carry, want = model.rnn(X, train=True, seq_lengths=lengths, return_carry=True)
  carry0 = by_hand.initialize_carry((B, I))
  xs, masks = X.swapaxes(0, 1), mask_of(lengths).swapaxes(0, 1)
  if api == 'linen':
    cell = by_hand.cell(train=True)

    def body(state, inputs):
      carry, stats = state
      (carry, h), new = cell.apply({'params': by_hand.params, 'batch_stats': stats}, carry,
                                   *inputs, mutable=['batch_stats'])
      return (carry, new['batch_stats']), h

    (carry, by_hand.stats), ys = jax.lax.scan(body, (carry0, by_hand.stats), (xs, masks))
  else:
    by_hand.mode(train=True)

    @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
    def run(state, x_t, mask_t):
      cell, carry = state
      carry, h = cell(carry, x_t, mask_t)
      return (cell, carry), h

    (_, carry), ys = run((by_hand.module, carry0), xs, masks)
  close(np.asarray(ys).swapaxes(0, 1), want)
  close(carry, want_carry)
  close(by_hand.stats, model.stats)


# ----------------------------------------------------------------------------- chunks
@pytest.mark.parametrize('api', LINEN_FIRST)
@pytest.mark.parametrize('train', [True, False], ids=['training', 'evaluation'])
def test_chunked_calls_equal_one_call(api, train):
  """`RNN` on x[:, :3], then on x[:, 3:] from the first call's carry with `seq_lengths`
  relative to the second call, equals one call on the whole sequence with the total
  lengths: outputs of the valid steps (0 on padding), the final carry (its `step`
  included) and, in training from fresh statistics, the statistics (each row's first
  batch, taken outright)."""
  model = make(api) if train else trained(api)
  chunked = model.copy()
  want_carry, want = model.rnn(X, train=train, seq_lengths=LENGTHS, return_carry=True)
  first, second = np.minimum(LENGTHS, 3), np.maximum(LENGTHS - 3, 0)
  carry, ys1 = chunked.rnn(X[:, :3], train=train, seq_lengths=first, return_carry=True)
  carry, ys2 = chunked.rnn(X[:, 3:], train=train, initial_carry=carry, seq_lengths=second,
                           return_carry=True)
  close(np.concatenate([ys1, ys2], 1), want)
  close(carry, want_carry)
  np.testing.assert_array_equal(carry.step, LENGTHS)
  close(chunked.stats, model.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_chunked_training_moves_the_running_average_as_one_call(api):
  """From trained statistics, the two chunks of `test_chunked_calls_equal_one_call` move
  the running average as one call on the whole sequence does (each row by its valid
  count over the batch's 3 sequences)."""
  model = trained(api)
  chunked = model.copy()
  model.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  first, second = np.minimum(LENGTHS, 3), np.maximum(LENGTHS - 3, 0)
  carry, _ = chunked.rnn(X[:, :3], train=True, seq_lengths=first, return_carry=True)
  chunked.rnn(X[:, 3:], train=True, initial_carry=carry, seq_lengths=second,
              return_carry=True)
  close(chunked.stats, model.stats)


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_chunked_evaluation_rows_at_different_steps(api):
  """In evaluation a second chunk may find its rows at different steps (the first
  chunk's lengths 3, 1, 2): each row normalises with its own statistics rows, so each
  row's outputs and final carry are those of the row run alone on its valid steps."""
  model = trained(api)
  first, second = np.array([3, 1, 2]), np.array([3, 2, 0])
  carry1, ys1 = model.rnn(X[:, :3], train=False, seq_lengths=first, return_carry=True)
  np.testing.assert_array_equal(carry1.step, first)
  carry, ys2 = model.rnn(X[:, 3:], train=False, initial_carry=carry1, seq_lengths=second,
                         return_carry=True)
  np.testing.assert_array_equal(carry.step, first + second)
  for row, (l1, l2) in enumerate(zip(first, second)):
    alone = np.zeros((1, T, I), np.float32)
    alone[0, :l1 + l2] = np.concatenate([X[row, :l1], X[row, 3:3 + l2]])
    want_carry, want = model.rnn(alone, train=False, seq_lengths=np.array([l1 + l2]),
                                 return_carry=True)
    close(ys1[row, :l1], want[0, :l1])
    close(ys2[row, :l2], want[0, l1:l1 + l2])
    close(rows(carry, row), rows(want_carry, 0))


@pytest.mark.parametrize('api', LINEN_FIRST)
def test_training_past_max_length_across_chunks_is_an_error(api):
  """A training chunk that would take the carried step past `max_length` (6) raises: a
  one-line ValueError eagerly, and under `jit` (the carry an argument, its step traced)
  a runtime error naming max_length when the batch runs. The chunk before it, ending at
  max_length, trains."""
  model = make(api)
  ones = np.full(B, 3)
  carry, _ = model.rnn(X[:, :3], train=True, seq_lengths=ones, return_carry=True)
  carry, _ = model.rnn(X[:, 3:], train=True, initial_carry=carry, seq_lengths=ones,
                       return_carry=True)
  np.testing.assert_array_equal(carry.step, [MAX_LEN] * B)
  past = dict(train=True, initial_carry=carry, seq_lengths=np.ones(B, np.int64),
              return_carry=True)
  with pytest.raises(ValueError, match='max_length=6') as error:
    model.copy().rnn(X[:, :3], jit=False, **past)
  helpers.one_line(error)
  assert 'initial_carry=carry.state' in str(error.value)  # what truncated backprop passes
  # Jitted, the carry's step is traced: the chunk's carry and outputs are NaN, and a
  # checked run (`checks.checkify`) raises the same line.
  carry, out = model.copy().rnn(X[:, :3], **past)
  assert np.isnan(out).all() and np.isnan(carry.h).all()
  if api == 'linen':
    with pytest.raises(checkify.JaxRuntimeError, match='max_length=6'):
      model.copy().rnn(X[:, :3], jit='checked', **past)


@pytest.mark.parametrize('jit', [False, True, 'checked'], ids=['eager', 'jit', 'checked'])
def test_training_rows_at_different_steps_is_an_error(jit):
  """A training chunk whose valid rows start at different steps (the first chunk's
  lengths 3, 1, 2) cannot pool one step's batch moments: an error eagerly and in a
  checked run, NaN outputs under `jit` (the carry an argument), as past max_length."""
  model = make('linen')
  carry, _ = model.rnn(X[:, :3], train=True, seq_lengths=np.array([3, 1, 2]),
                       return_carry=True)
  run = lambda: model.rnn(X[:, 3:], train=True, initial_carry=carry,
                          seq_lengths=np.array([3, 2, 1]), return_carry=True, jit=jit)
  if jit is True:
    assert np.isnan(run()[1]).all()
    return
  with pytest.raises((ValueError, checkify.JaxRuntimeError), match='different steps'):
    run()


# ----------------------------------------------------------------------------- nesting
class Outer(nn.RNNCellBase):
  """An outer cell whose step encodes a sub-sequence `[B, S, I]` with an inner
  `RNN(BNLSTMCell)` (the last input channel flags the sub-sequence's valid steps: its
  lengths), then updates a tanh state from the inner last h; outputs the inner outputs."""

  @nn.compact
  def __call__(self, carry, x_t):
    lengths = jnp.sum(x_t[..., -1], -1).astype(jnp.int32)
    inner = flax_cells.RNN(flax_cells.BNLSTMCell(H, max_length=MAX_LEN,
                                                 use_running_average=False, name='inner'),
                           return_carry=True)
    inner_carry, ys = inner(x_t[..., :-1], seq_lengths=lengths)
    carry = jnp.tanh(nn.Dense(H, name='outer')(jnp.concatenate([carry, inner_carry.h], -1)))
    return carry, ys

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    return jnp.zeros(input_shape[:-2] + (H,))

  @property
  def num_feature_axes(self):
    return 2


def test_cell_inside_another_rnns_cell_keeps_its_own_lengths():
  """A hierarchical encoder: `nn.RNN` (with its own `seq_lengths`) of an outer cell that
  runs an inner `RNN(BNLSTMCell)` over each step's sub-sequence with the sub-sequence's
  lengths. The inner outputs and statistics are those of the inner `RNN` run alone on
  each step's sub-sequences in turn: the outer call's lengths do not reach it (training)."""
  steps = 4
  x = np.random.default_rng(3).normal(size=(B, steps, T, I)).astype(np.float32)
  inner_lengths = np.array([[6, 2, 4, 1], [3, 6, 5, 6], [1, 4, 6, 2]])
  inputs = np.concatenate([x, mask_of(inner_lengths)[..., None]], -1)
  outer = Outer()
  init = outer.init(jax.random.key(0), outer.initialize_carry(None, inputs[:, 0].shape),
                    inputs[:, 0])
  params = perturbed(init['params'], 4)
  (_, ys), new = nn.RNN(Outer(), variable_carry='batch_stats', return_carry=True).apply(
      _variables(params, init['batch_stats'], 'cell'), inputs,
      seq_lengths=np.array([4, 2, 1]), mutable=['batch_stats'])
  assert ys.shape == (B, steps, T, H)

  inner = make('linen')
  inner.params, inner.stats = params['inner'], init['batch_stats']['inner']
  for t in range(steps):
    close(ys[:, t], inner.rnn(x[:, t], train=True, seq_lengths=inner_lengths[:, t]))
  close(new['batch_stats']['cell']['inner'], inner.stats)


# ----------------------------------------------------------------------------- carries
@pytest.mark.parametrize('api', LINEN_FIRST)
def test_initial_carry(api):
  """`RNN(x, initial_carry=carry)` starts every row from that carry (NNX: the cell's
  `initialize_carry(carry_init=ones)`), as the cell stepped by hand from it does; Flax's
  `(c, h)` is the same carry at step 0 (training)."""
  model = trained(api)
  if api == 'nnx':
    start = model.initialize_carry((B, I), rngs=nnx.Rngs(carry=0),
                                   carry_init=nnx.initializers.ones)
  else:
    rng = np.random.default_rng(5)
    c0, h0 = (rng.normal(size=(B, H)).astype(np.float32) for _ in range(2))
    start = flax_cells.LSTMCarry(c0, h0, np.zeros(B, np.int32))
  as_tuple, by_hand = model.copy(), model.copy()
  want = model.rnn(X, train=True, seq_lengths=LENGTHS, initial_carry=start,
                   return_carry=True)
  close(as_tuple.rnn(X, train=True, seq_lengths=LENGTHS, initial_carry=tuple(start),
                     return_carry=True), want)
  carry, ys, _ = step_by_hand(by_hand, X, LENGTHS, train=True, carry=start)
  close((carry, ys), want)
  close(by_hand.stats, model.stats)


def test_nnx_initialize_carry_with_carry_init():
  """`initialize_carry(input_shape, rngs=, carry_init=)`: c and h `[*batch, H]` drawn by
  `carry_init` from the rngs' carry stream (ones: all ones; a random initializer: the
  same for the same seed), step 0; zeros without `carry_init`."""
  cell = nnx_cells.BNLSTMCell(I, H, max_length=MAX_LEN, rngs=nnx.Rngs(0))
  carry = cell.initialize_carry((1, I), rngs=nnx.Rngs(carry=0),
                                carry_init=nnx.initializers.ones)
  c, h = carry
  assert c.shape == h.shape == (1, H)
  assert np.all(np.asarray(c) == 1.0) and np.all(np.asarray(h) == 1.0)
  np.testing.assert_array_equal(carry.step, [0])
  draw = lambda seed: cell.initialize_carry((2, 3, I), rngs=nnx.Rngs(carry=seed),
                                            carry_init=nnx.initializers.normal(1.0))
  assert draw(0).c.shape == (2, 3, H) and draw(0).step.shape == (2, 3)
  close(draw(0), draw(0))
  assert not np.allclose(draw(0).h, draw(1).h)
  zeros = cell.initialize_carry((2, I))
  assert not np.any(np.asarray(zeros.c)) and not np.any(np.asarray(zeros.h))


# ----------------------------------------------------------------------------- NNX and Linen
def test_nnx_rnn_equals_linen_rnn():
  """The NNX cell given the Linen cell's variables: the same `RNN` outputs, carry and
  statistics (training, uneven lengths)."""
  linen, native = trained('linen'), make('nnx')
  native.module.load_linen_variables({'params': linen.params, 'batch_stats': linen.stats})
  want = linen.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True)
  close(native.rnn(X, train=True, seq_lengths=LENGTHS, return_carry=True), want)
  close(native.stats, linen.stats)
