"""The products-only floor of benchmarks/rnn_speed.py against a NumPy float64 version."""

import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
import rnn_speed  # pylint: disable=g-import-not-at-top,wrong-import-position


def numpy_products_only(x, w_x, w_h):
  """Float64: forward z_t = x_t W_x + h_t W_h, h_{t+1} = z_t[:, :H]; backward
  dz_t = [dh, z_t[:, H:]], dh <- dz_t W_h^T, weight gradients summed over t."""
  hidden = w_h.shape[0]
  h = np.zeros((x.shape[0], hidden))
  hs, zs = [], []
  for t in range(x.shape[1]):
    z = x[:, t] @ w_x + h @ w_h
    hs.append(h)
    zs.append(z)
    h = z[:, :hidden]
  dh = np.zeros_like(h)
  dw_x, dw_h = np.zeros_like(w_x), np.zeros_like(w_h)
  for t in reversed(range(x.shape[1])):
    dz = np.concatenate([dh, zs[t][:, hidden:]], axis=1)
    dw_x += x[:, t].T @ dz
    dw_h += hs[t].T @ dz
    dh = dz @ w_h.T
  return dw_x, dw_h


@pytest.mark.parametrize('backward', ['scan', 'layer'])
def test_products_only_matches_numpy_float64(backward):
  shape = dict(batch=3, time=5, features=2, hidden=4, bidirectional=False, padding=0.0)
  (w_x, w_h), = rnn_speed._products_only_kernels(jax.random.key(1), shape)  # pylint: disable=protected-access
  x = np.asarray(jax.random.normal(jax.random.key(0), (3, 5, 2)))
  got = rnn_speed.products_only(x, (w_x, w_h), backward)
  want = numpy_products_only(x.astype(np.float64), np.asarray(w_x, np.float64),
                             np.asarray(w_h, np.float64))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


def test_products_only_recurrent_kernel_keeps_h_norm():
  shape = dict(batch=2, time=3, features=2, hidden=6, bidirectional=True, padding=0.0)
  kernels = rnn_speed._products_only_kernels(jax.random.key(1), shape)  # pylint: disable=protected-access
  assert len(kernels) == 2
  for _, w_h in kernels:
    block = np.asarray(w_h)[:, :6]
    np.testing.assert_allclose(block.T @ block, np.eye(6), atol=1e-5)
