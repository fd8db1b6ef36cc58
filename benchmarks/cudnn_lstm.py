"""cuDNN's LSTM through `jax.experimental.rnn`: the anchor row of `rnn_speed.py` on GPUs.

`jax.experimental.rnn.lstm` runs cuDNN's RNN kernels (a custom call with its own
backward) on CUDA devices. Its LSTM is PyTorch's: gates (i, f, g, o), two biases, every
weight of every direction in one flat float32 vector: per direction `W_ih [4H, I]`,
`W_hh [4H, H]`, then the biases `b_ih`, `b_hh [4H]` of all directions. Inputs are
batch-first `[batch, time, features]` with `[batch]` int32 lengths. Float32 only: the
op has no bfloat16. It lets cuDNN use TF32 unless the matmul precision is 'highest'
(`JAX_DEFAULT_MATMUL_PRECISION`), as XLA's float32 products on the same GPU do.

Only CUDA has the kernels: elsewhere `unavailable_reason()` says so in one line and the
benchmark skips the row. `reference_outputs` runs JAX's pure-JAX version of the same
LSTM (`rnn.lstm_ref`, any backend) on the same weights: the benchmark records the
largest difference from it, so a row is known to time a working LSTM.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import rnn

NAME = 'cudnn_lstm'


def num_params(input_size: int, hidden: int, bidirectional: bool) -> int:
  """The flat weight vector's length: per direction `W_ih [4H, I]`, `W_hh [4H, H]`,
  `b_ih [4H]`, `b_hh [4H]`."""
  return (2 if bidirectional else 1) * 4 * hidden * (input_size + hidden + 2)


def _initial_state(batch: int, hidden: int, bidirectional: bool):
  zeros = jnp.zeros((2 if bidirectional else 1, batch, hidden), jnp.float32)
  return zeros, zeros


def init_weights(key, input_size: int, hidden: int, bidirectional: bool) -> jax.Array:
  """Flat weights, U(-1/sqrt(H), 1/sqrt(H)) (`rnn.init_lstm_weight`), checked against
  `num_params`."""
  weights = rnn.init_lstm_weight(key, input_size, hidden, 1, bidirectional)
  expected = num_params(input_size, hidden, bidirectional)
  if weights.shape != (expected,):
    raise ValueError(f'jax.experimental.rnn made {weights.shape} weights for I{input_size} '
                     f'H{hidden}; the layout described in cudnn_lstm.py has {expected}.')
  return weights


def outputs(x, weights, lengths, hidden: int, bidirectional: bool) -> jax.Array:
  """cuDNN's `[batch, time, directions * hidden]` outputs (CUDA only)."""
  h0, c0 = _initial_state(x.shape[0], hidden, bidirectional)
  y, _, _ = rnn.lstm(x, h0, c0, weights, seq_lengths=lengths, input_size=x.shape[-1],
                     hidden_size=hidden, num_layers=1, dropout=0.0,
                     bidirectional=bidirectional)
  return y


def reference_outputs(x, weights, lengths, hidden: int, bidirectional: bool) -> jax.Array:
  """The same LSTM in plain JAX (`rnn.lstm_ref`, any backend), zeros past each length."""
  h0, c0 = _initial_state(x.shape[0], hidden, bidirectional)
  w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(weights, x.shape[-1], hidden, 1,
                                                   bidirectional)
  y, _, _ = rnn.lstm_ref(x, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, x.shape[-1], hidden,
                         1, 0.0, bidirectional)
  return y


def build(x, lengths, hidden: int, bidirectional: bool):
  """A jitted `weights -> (loss, d loss / d weights)` (loss: the mean of the squared
  outputs, as every row of the benchmark) and its weights."""
  weights = init_weights(jax.random.key(1), x.shape[-1], hidden, bidirectional)

  def loss_fn(w):
    return jnp.mean(jnp.square(outputs(x, w, lengths, hidden, bidirectional)))
  return jax.jit(jax.value_and_grad(loss_fn)), weights


def max_abs_diff_to_reference(x, weights, lengths, hidden: int, bidirectional: bool) -> float:
  """max |cuDNN - lstm_ref| over the valid steps of the outputs."""
  valid = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
  got = jax.jit(outputs, static_argnums=(3, 4))(x, weights, lengths, hidden, bidirectional)
  want = reference_outputs(x, weights, lengths, hidden, bidirectional)
  return float(jnp.max(jnp.where(valid, jnp.abs(got - want), 0.0)))


def unavailable_reason() -> Optional[str]:
  """None where cuDNN's LSTM runs here; else one line saying why the row is skipped."""
  backend = jax.default_backend()
  if backend != 'gpu':
    return f'{NAME}: skipped, the {backend!r} backend has no cuDNN.'
  x = jnp.ones((2, 3, 2), jnp.float32)
  lengths = jnp.full((2,), 3, jnp.int32)
  try:
    step, weights = build(x, lengths, 4, False)
    jax.block_until_ready(step(weights))
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [''])[0][:200]
    return f'{NAME}: skipped, a 2x3x4 cuDNN LSTM failed here ({type(e).__name__}: {first}).'
  return None
