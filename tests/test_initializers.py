"""Initialisers: per-gate identity / orthogonal blocks, gamma 0.1, forget-gate bias."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bn_rnn_jax import initializers
from bn_rnn_jax import variants

H, I = 5, 3


def test_identity_blocks():
  kernel = np.asarray(initializers.identity_blocks(0.5)(jax.random.key(0), (H, 4 * H)))
  np.testing.assert_array_equal(kernel, np.tile(0.5 * np.eye(H), (1, 4)))


def test_orthogonal_blocks_each_block_orthogonal_and_independent():
  kernel = np.asarray(initializers.orthogonal_blocks()(jax.random.key(1), (H, 4 * H)),
                      np.float64)
  blocks = np.split(kernel, 4, axis=1)
  for block in blocks:
    np.testing.assert_allclose(block.T @ block, np.eye(H), atol=1e-5)
    np.testing.assert_allclose(block @ block.T, np.eye(H), atol=1e-5)
  assert np.max(np.abs(blocks[0] - blocks[1])) > 0.1
  # One [H, 4H] orthogonal slab is a different thing: its square blocks are not orthogonal.
  slab = np.asarray(nn.initializers.orthogonal()(jax.random.key(1), (H, 4 * H)), np.float64)
  assert np.max(np.abs(slab[:, :H].T @ slab[:, :H] - np.eye(H))) > 0.1


def test_block_initializers_reject_non_block_shapes():
  for init in (initializers.identity_blocks(), initializers.orthogonal_blocks()):
    with pytest.raises(ValueError, match=r'\[H, G\*H\].*\(5, 7\)'):
      init(jax.random.key(0), (H, 7))
  with pytest.raises(ValueError, match="recurrent_init must be one of.*'eye'"):
    initializers.recurrent_initializer('eye')


def test_gate_bias():
  bias = np.asarray(initializers.gate_bias(4, H, 0, 1.5)(None, (4 * H,)))
  np.testing.assert_array_equal(bias, np.concatenate([np.full(H, 1.5), np.zeros(3 * H)]))
  np.testing.assert_array_equal(initializers.gate_bias(1, H, None, 1.5)(None, (H,)),
                                np.zeros(H))
  with pytest.raises(ValueError, match='bias shape'):
    initializers.gate_bias(4, H)(None, (3 * H,))


class _Layers(nn.Module):
  """The layers whose initial parameters are checked, initialised in one jit."""

  @nn.compact
  def __call__(self, x):
    run = dict(use_running_average=True, deterministic=True)
    variants.make_layer('bn_lstm', H, max_length=4, forget_bias=1.0,
                         recurrent_kernel_init=initializers.IDENTITY_BLOCKS,
                         name='bn_lstm')(x, **run)
    variants.make_layer('rnn_bn_recurrence', H, max_length=4, name='rnn')(x, **run)
    variants.make_layer('ln_lstm', H, name='ln_lstm')(x, **run)


@functools.cache
def _params():
  variables = jax.jit(_Layers().init)(jax.random.key(0), jnp.zeros((2, 3, I)))
  return jax.tree.map(np.asarray, variables['params'])


def test_layer_initial_parameters():
  params = _params()
  bn = params['bn_lstm']
  # gamma = 0.1 on every normalised site (Cooijmans sec. 4), beta_c = 0.
  for name in ('input_scale', 'recurrent_scale'):
    np.testing.assert_array_equal(bn[name], np.full(4 * H, 0.1, np.float32))
  np.testing.assert_array_equal(bn['cell_scale'], np.full(H, 0.1, np.float32))
  np.testing.assert_array_equal(bn['cell_bias'], np.zeros(H))
  # Forget gate is block 0 of (f, i, o, g).
  np.testing.assert_array_equal(bn['bias'], np.concatenate([np.ones(H), np.zeros(3 * H)]))
  np.testing.assert_array_equal(bn['recurrent_kernel'], np.tile(np.eye(H), (1, 4)))
  # W_x [I, 4H] with I < 4H: orthonormal rows.
  np.testing.assert_allclose(bn['input_kernel'] @ bn['input_kernel'].T, np.eye(I), atol=1e-5)

  rnn = params['rnn']
  np.testing.assert_array_equal(rnn['scale'], np.full(H, 0.1, np.float32))
  np.testing.assert_array_equal(rnn['bias'], np.zeros(H))
  np.testing.assert_allclose(rnn['recurrent_kernel'].T @ rnn['recurrent_kernel'], np.eye(H),
                             atol=1e-5)
  # LayerNorm baseline keeps gamma 1 (Ba et al.).
  np.testing.assert_array_equal(params['ln_lstm']['cell_scale'], np.ones(H))
  # Default recurrent init: independent orthogonal gate blocks.
  for block in np.split(params['ln_lstm']['recurrent_kernel'], 4, axis=1):
    np.testing.assert_allclose(block.T @ block, np.eye(H), atol=1e-5)


# ---------------------------------------------------------------------- identity_candidate
def test_identity_candidate_blocks():
  """The authors' released W_h: identity on the candidate block g (last of f, i, o, g),
  independent orthogonal f, i, o blocks; the tanh RNN's single block is the identity."""
  kernel = np.asarray(initializers.recurrent_initializer('identity_candidate')(
      jax.random.key(2), (H, 4 * H)), np.float64)
  blocks = np.split(kernel, 4, axis=1)
  np.testing.assert_array_equal(blocks[3], np.eye(H))
  for block in blocks[:3]:
    np.testing.assert_allclose(block.T @ block, np.eye(H), atol=1e-5)
    assert np.max(np.abs(block - np.eye(H))) > 0.1
  assert np.max(np.abs(blocks[0] - blocks[1])) > 0.1
  single = initializers.identity_candidate_blocks()(jax.random.key(2), (H, H))
  np.testing.assert_array_equal(np.asarray(single), np.eye(H))
