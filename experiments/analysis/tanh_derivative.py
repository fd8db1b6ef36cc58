r"""Cooijmans et al. 2016, Fig. 1(b): the expected derivative of tanh under Gaussian input.

For x ~ N(0, s^2) with s from 0 to 1, E[tanh'(x)] = E[1 - tanh(x)^2], computed two ways:
  * Monte Carlo, as in the paper: samples per s, with the median and interquartile range
    of tanh'(x) (the paper shows the empirical distribution of the derivative);
  * Gauss-Hermite quadrature: E[f(x)] = pi^{-1/2} sum_k w_k f(sqrt(2) s u_k), which is
    exact to float64 rounding here with 80 nodes (tanh' is smooth and decays like e^{-2|x|}).
Small s keeps x near the origin, where tanh' = 1; at s = 1 the mean drops to about 0.61:
a BN pre-activation normalised to unit variance starts in the saturating regime, the
paper's argument for initialising gamma at 0.1 (sec. 4).

  python -m experiments.analysis.tanh_derivative [--output_dir=...]
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import numpy as np

from experiments.analysis import common

_POINTS = flags.DEFINE_integer('td_num_stds', 51, 'Standard deviations in [0, max_std].')
_MAX_STD = flags.DEFINE_float('td_max_std', 1.0, 'Largest standard deviation.')
_SAMPLES = flags.DEFINE_integer('td_samples', 100_000, 'Monte Carlo samples per std.')
_NODES = flags.DEFINE_integer('td_quadrature_nodes', 80, 'Gauss-Hermite nodes.')


def tanh_prime(x: np.ndarray) -> np.ndarray:
  return 1.0 - np.tanh(x) ** 2


def expected_derivative_quadrature(stds: np.ndarray, nodes: int = 80) -> np.ndarray:
  """E[tanh'(x)], x ~ N(0, s^2), by Gauss-Hermite quadrature; `stds [S]` -> `[S]`."""
  u, w = np.polynomial.hermite.hermgauss(nodes)
  stds = np.asarray(stds, np.float64)
  return (tanh_prime(np.sqrt(2.0) * stds[:, None] * u[None, :]) * w).sum(-1) / np.sqrt(np.pi)


def derivative_samples(stds: np.ndarray, samples: int, seed: int = 0) -> np.ndarray:
  """tanh'(x) for `samples` draws of x ~ N(0, s^2) per std: `[S, samples]`."""
  rng = np.random.default_rng(seed)
  z = rng.standard_normal((len(stds), samples))
  return tanh_prime(np.asarray(stds, np.float64)[:, None] * z)


def run(output_dir: str, num_stds: int = 51, max_std: float = 1.0, samples: int = 100_000,
        nodes: int = 80, seed: int = 0) -> dict:
  """Writes `tanh_derivative.{png,json}`; returns the JSON dict."""
  if num_stds < 2 or max_std <= 0 or samples < 10 or nodes < 2:
    raise ValueError(f'Need num_stds >= 2, max_std > 0, samples >= 10, nodes >= 2; got '
                     f'{num_stds}, {max_std}, {samples}, {nodes}.')
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  stds = np.linspace(0.0, max_std, num_stds)
  draws = derivative_samples(stds, samples, seed)
  mc_mean = draws.mean(-1)
  mc_stderr = draws.std(-1) / np.sqrt(samples)
  q25, q50, q75 = np.percentile(draws, [25, 50, 75], axis=-1)
  quad = expected_derivative_quadrature(stds, nodes)

  plt = common.matplotlib_pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.fill_between(stds, q25, q75, color='C0', alpha=0.25, label='MC interquartile range')
  ax.plot(stds, q50, color='C0', lw=1, ls=':', label='MC median')
  ax.plot(stds, mc_mean, color='C0', lw=2, label=f'MC mean ({samples} samples)')
  ax.plot(stds, quad, color='C3', lw=1, ls='--', label=f'Gauss-Hermite ({nodes} nodes)')
  ax.set_xlabel('standard deviation of the input')
  ax.set_ylabel("tanh'(x), x ~ N(0, std^2)")
  ax.set_title("Expected tanh derivative (Cooijmans Fig. 1b)", fontsize=10)
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=8, loc='lower left')
  ax.grid(alpha=0.3)
  result = {
      'figure': 'Cooijmans et al. 2016 Fig. 1(b)',
      'stds': stds,
      'mc_mean': mc_mean,
      'mc_stderr': mc_stderr,
      'mc_q25': q25, 'mc_median': q50, 'mc_q75': q75,
      'quadrature': quad,
      'samples': samples, 'nodes': nodes,
      'max_abs_mc_minus_quadrature': float(np.max(np.abs(mc_mean - quad))),
      'seconds': time.time() - start,
  }
  common.save_outputs(output_dir, 'tanh_derivative', fig, result)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  paper = common.PAPER_SCALE.value
  run(common.OUTPUT_DIR.value, num_stds=_POINTS.value, max_std=_MAX_STD.value,
      samples=1_000_000 if paper else _SAMPLES.value, nodes=_NODES.value,
      seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
