"""Why the papers start gamma at 0.1, redrawn with the library's own pieces: gradient
flow through a batch-normalised tanh RNN at initialisation (Cooijmans Fig. 1a), the
expected tanh derivative under Gaussian input (Fig. 1b), and the BN-LSTM's sensitivity
to its initial gamma (Fig. 6). Each writes `<kind>.{json,png}`: the plotted numbers and
the figure.

Gradient flow: ||dL/dh_t|| of `rnn_bn_recurrence`, h_t = tanh(BN(W_h h_{t-1} + W_x x_t)),
whose pre-activation has batch variance gamma^2 (Laurent eq. 17), reading MNIST one pixel
per step, with h_0 noise as in Cooijmans sec. 5.1 (the first rows of MNIST are black).
dL/dh_t is read without touching the library: the scan runs the library's own step
(`steps.rnn_step`) and adds a zero perturbation e_t to each new state, so that dL/de_t
= dL/dh_t; the scan is checked against `RecurrentLayer`.
"""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bn_rnn_jax import initializers
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import steps
from bn_rnn_jax import variants
from bn_rnn_jax.training import loop
from experiments import rendering
from experiments.analysis.lib import outputs
from experiments.analysis.lib import training
from experiments.campaign.columns import smooth

FLOOR = 1e-30  # float32 gradients underflow below ~1e-38 per entry.
#: Cooijmans et al. appendix D's grid of initial gammas.
GAMMAS = (0.1, 0.3, 0.5, 0.7, 1.0)


def check_gammas(gammas: Sequence[float]) -> list[float]:
  gammas = [float(g) for g in gammas]
  if not gammas or any(g <= 0 for g in gammas):
    raise ValueError(f'gammas must be positive numbers; got {gammas}.')
  return gammas


# ---------------------------------------------------------------------- gradient flow (1a)
#: The step of `rnn_bn_recurrence` in training: h_t = tanh(BN(W_h h + W_x x)).
_STEP = steps.StepConfig(recurrent_norm='batch', batch_statistics=True)


@jax.jit
def _state_gradients(params, classifier, h0, x, y):
  """dL/dh_t `[T, B, H]` and the states `[T, B, H]` of the BN tanh RNN.

  params: the `RecurrentLayer` parameters; classifier: `{'kernel' [H, C], 'bias' [C]}`;
  h0: `[B, H]`; x: `[B, T, I]`; y: `[B]`. Every gamma shares this one compilation.
  """

  def loss(perturbation):
    def step(h, inputs):
      h, _ = steps.rnn_step(params, _STEP, h, {'x': inputs['x']})
      h = h + inputs['e']  # e_t = 0: dL/de_t is dL/dh_t.
      return h, h
    h_last, hs = jax.lax.scan(step, h0, {'x': jnp.swapaxes(x, 0, 1), 'e': perturbation})
    logits = h_last @ classifier['kernel'] + classifier['bias']
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), hs

  zeros = jnp.zeros((x.shape[1],) + h0.shape)
  return jax.grad(loss, has_aux=True)(zeros)


@jax.jit
def _one_steps(params, h0, x, states):
  """h_t from the given h_{t-1} (h0, then `states[:, t-1]`), `[B, T, H]`: the loss's step."""
  previous = jnp.concatenate([h0[:, None], states[:, :-1]], axis=1)
  step = lambda h, x_t: steps.rnn_step(params, _STEP, h, {'x': x_t})[0]
  return jax.vmap(step, in_axes=1, out_axes=1)(previous, x)


def gradient_norms(gamma: float, x: np.ndarray, y: np.ndarray, hidden_size: int,
                   seed: int, recurrent_init: str = 'identity', num_classes: int = 10,
                   check_layer: bool = False) -> np.ndarray:
  """||dL/dh_t||_F over the batch, `[T]`, for one initialisation and one batch.

  x: `[B, T, I]`, y: `[B]`. L is the mean cross-entropy of a softmax classifier on h_T.
  check_layer: also assert that the scan here reproduces `RecurrentLayer`'s outputs.
  """
  batch, length, _ = x.shape
  layer = variants.make_layer(
      'rnn_bn_recurrence', hidden_size, scale_init=initializers.Constant(gamma),
      max_length=length, initial_state='noise',
      recurrent_kernel_init=initializers.recurrent_initializer(recurrent_init))
  if layer.epsilon != steps.StepConfig().epsilon:
    raise ValueError('The layer and the step here must share epsilon.')
  key_layer, key_out, key_noise = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jnp.asarray(x)
  params = layer.init({'params': key_layer}, x, use_running_average=True,
                      deterministic=True)['params']
  classifier = {
      'kernel': jax.nn.initializers.lecun_normal()(key_out, (hidden_size, num_classes)),
      'bias': jnp.zeros((num_classes,)),
  }
  h0 = layer.initial_state_noise * jax.random.normal(key_noise, (batch, hidden_size))
  grads, hs = _state_gradients(params, classifier, h0, x, jnp.asarray(y))
  if check_layer:
    layer_out, _ = layer.apply({'params': params}, x, use_running_average=False,
                               deterministic=False, initial_carry=h0,
                               mutable=['batch_stats'])
    # Step by step from the layer's own states: at gammas where the RNN is chaotic, float32
    # rounding differences of two whole-sequence scans grow to O(0.1) by t = 200.
    if not np.allclose(np.asarray(layer_out), np.asarray(_one_steps(params, h0, x, layer_out)),
                       atol=1e-5):
      raise AssertionError('The perturbed scan\'s step does not reproduce RecurrentLayer.')
  # float64: squares of float32 gradients of 1e20 and more would overflow.
  return np.sqrt(np.sum(np.square(np.asarray(grads, np.float64)), axis=(1, 2)))


def gradient_flow(output_dir: str = outputs.FIGURES,
                  mnist_dir: Optional[str] = training.data_dir('mnist'),
                  gammas: Sequence[float] = GAMMAS, hidden_size: int = 100,
                  batch_size: int = 64, num_batches: int = 4, image_size: int = 28,
                  recurrent_inits: Sequence[str] = ('identity', 'orthogonal'),
                  seed: int = 0, paper_scale: bool = False) -> dict:
  """`gradient_flow.{png,json}`: `grad_norm[init][gamma]` = `[T]` geometric mean over
  batches of ||dL/dh_t||; `ratio_first_to_last[init][gamma]` = ||dL/dh_0|| / ||dL/dh_{T-1}||.

  Args:
    output_dir: where the JSON and PNG go.
    mnist_dir: the MNIST IDX files (scikit-learn's 8x8 digits where they are absent).
    gammas: the initial gammas, one curve each.
    hidden_size: units of the tanh RNN.
    batch_size: examples per batch.
    num_batches: batches (and initialisations) averaged per curve.
    image_size: 28 (784 steps) or 14.
    recurrent_inits: W_h initialisations, one panel each (identity: the paper's sec. 5.1).
    seed: the random seed.
    paper_scale: the paper's batch of 100, 20 batches per curve.
  """
  plt = outputs.pyplot()
  gammas = check_gammas(gammas)
  batch_size, num_batches = (100, 20) if paper_scale else (batch_size, num_batches)
  start = time.time()
  # Only the data of this config is used (no training): batch_size=1 fits any split.
  config = training.mnist_config(mnist_dir, resolution=image_size, batch_size=1, seed=seed)
  dataset = input_pipeline.get_dataset(config)
  source = training.data_description(config, dataset)
  # The first training images in order (the same for every gamma and initialisation).
  x, y = dataset.splits['train']['inputs'], dataset.splits['train']['labels']
  if x.shape[0] < batch_size * num_batches:
    raise ValueError(f'{source}: {x.shape[0]} training examples, fewer than '
                     f'{batch_size} x {num_batches}.')
  length = x.shape[1]
  curves = {}
  for init in recurrent_inits:
    curves[init] = {}
    for gamma in gammas:
      norms = [gradient_norms(gamma, x[b * batch_size:(b + 1) * batch_size],
                              y[b * batch_size:(b + 1) * batch_size], hidden_size,
                              seed + b, init, check_layer=(b == 0))
               for b in range(num_batches)]
      # Geometric mean over batches: the curves span tens of orders of magnitude. Norms
      # under FLOOR are float32 underflow (0 or denormal) and are clipped to it.
      curves[init][gamma] = np.exp(np.mean(np.log(np.maximum(norms, FLOOR)), axis=0))

  fig, axes = plt.subplots(1, len(recurrent_inits), figsize=(5.5 * len(recurrent_inits), 4),
                           squeeze=False)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(gammas)))
  for ax, init in zip(axes[0], recurrent_inits):
    for color, gamma in zip(colors, gammas):
      ax.semilogy(np.arange(length), curves[init][gamma], color=color,
                  label=f'gamma={gamma:g}')
    ax.set_ylim(bottom=FLOOR / 10)
    ax.set_xlabel('t')
    ax.set_ylabel('||dloss / dh_t||')
    ax.set_title(f'W_h {init}' + (' (paper sec. 5.1)' if init == 'identity' else ''))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  fig.suptitle('Gradient flow in a BN tanh RNN at initialisation (Cooijmans Fig. 1a); '
               f'norms < {FLOOR:g} (float32 underflow) clipped\n{source}', fontsize=9,
               y=1.04)
  result = {
      'figure': 'Cooijmans et al. 2016 Fig. 1(a)',
      'model': 'rnn_bn_recurrence: h_t = tanh(BN(W_h h + W_x x; gamma, beta)), '
               'h_0 ~ N(0, 0.1^2), softmax on h_T, at initialisation',
      'data': source,
      'hidden_size': hidden_size, 'batch_size': batch_size, 'num_batches': num_batches,
      'gammas': list(gammas),
      'recurrent_inits': list(recurrent_inits),
      'grad_norm': {i: {f'{g:g}': curves[i][g] for g in gammas} for i in recurrent_inits},
      'ratio_first_to_last': {
          i: {f'{g:g}': float(curves[i][g][0] / curves[i][g][-1]) for g in gammas}
          for i in recurrent_inits},
      'floor': FLOOR,
      'seconds': time.time() - start,
  }
  return outputs.save(output_dir, 'gradient_flow', 'gradient_flow', result, fig)


def render_gradient_flow(g: dict, source: str) -> str:
  name = os.path.basename(source)
  return (f'{name}: |dL/dh_0| / |dL/dh_T| ' + '; '.join(
      f'W_h {init}: ' + ', '.join(f'gamma {k} {v:.2g}' for k, v in ratios.items())
      for init, ratios in g['ratio_first_to_last'].items()))


# ---------------------------------------------------------------------- tanh derivative (1b)
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


def tanh_derivative(output_dir: str = outputs.FIGURES, num_stds: int = 51,
                    max_std: float = 1.0, samples: int = 100_000, nodes: int = 80,
                    seed: int = 0, paper_scale: bool = False) -> dict:
  """`tanh_derivative.{png,json}`: E[tanh'(x)] for x ~ N(0, s^2), s from 0 to `max_std`,
  by Monte Carlo (mean, standard error, quartiles) and by Gauss-Hermite quadrature (exact
  to float64 rounding with 80 nodes).

  Args:
    output_dir: where the JSON and PNG go.
    num_stds: standard deviations in [0, max_std].
    max_std: the largest standard deviation.
    samples: Monte Carlo samples per standard deviation.
    nodes: Gauss-Hermite nodes.
    seed: the random seed.
    paper_scale: a million samples per standard deviation.
  """
  samples = 1_000_000 if paper_scale else samples
  if num_stds < 2 or max_std <= 0 or samples < 10 or nodes < 2:
    raise ValueError(f'Need num_stds >= 2, max_std > 0, samples >= 10, nodes >= 2; got '
                     f'{num_stds}, {max_std}, {samples}, {nodes}.')
  plt = outputs.pyplot()
  start = time.time()
  stds = np.linspace(0.0, max_std, num_stds)
  draws = derivative_samples(stds, samples, seed)
  mc_mean = draws.mean(-1)
  mc_stderr = draws.std(-1) / np.sqrt(samples)
  q25, q50, q75 = np.percentile(draws, [25, 50, 75], axis=-1)
  quad = expected_derivative_quadrature(stds, nodes)
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
  return outputs.save(output_dir, 'tanh_derivative', 'tanh_derivative', result, fig)


def render_tanh_derivative(t: dict, source: str) -> str:
  name = os.path.basename(source)
  diff = max(abs(a - b) for a, b in zip(t['mc_mean'], t['quadrature']))
  return (f"{name}: E tanh'(x) at s={t['stds'][-1]:g}: {t['quadrature'][-1]:.4f}; max "
          f'|Monte Carlo - quadrature| {diff:.4f}')


# ---------------------------------------------------------------------- gamma sensitivity (6)
def _curves(trainer, gammas: Sequence[float], num_steps: int, num_evals: int) -> dict:
  """Training history per gamma, every gamma from the same seed and data order (gamma
  only matters at initialisation: one trainer, one compiled step for all)."""
  return {f'{gamma:g}': training.fit(trainer, training.initial_state(trainer, gamma_init=gamma),
                                     num_steps, max(1, num_steps // num_evals))[1]
          for gamma in gammas}


def mnist_curves(mnist_dir: Optional[str], gammas: Sequence[float], *, image_size: int,
                 permute: bool, hidden_size: int, batch_size: int, num_steps: int,
                 num_evals: int, eval_examples: int, learning_rate: float = 1e-3,
                 seed: int = 0) -> dict:
  """Training loss and validation accuracy per gamma on sequential (p)MNIST."""
  config = training.mnist_config(
      mnist_dir, resolution=image_size, permutation_seed=92916 if permute else None,
      hidden_size=hidden_size, batch_size=batch_size, learning_rate=learning_rate,
      eval_examples=eval_examples, population_batches=8, seed=seed, variant='bn_lstm',
      recurrent_init='identity', initial_state='noise', gamma_init=gammas[0])
  trainer = loop.Trainer(config)
  return {'data': training.data_description(config, trainer.dataset), 'permuted': permute,
          'length': trainer.dataset.train_length, 'hidden_size': hidden_size,
          'batch_size': batch_size, 'steps': num_steps,
          'optimizer': f'RMSProp lr={learning_rate:g} momentum 0.9, clip 1',
          'curves': _curves(trainer, gammas, num_steps, num_evals)}


def ptb_curves(ptb_dir: str, gammas: Sequence[float], *, hidden_size: int, batch_size: int,
               length: int, num_steps: int, num_evals: int, eval_batches: int,
               learning_rate: float = 2e-3, seed: int = 0) -> dict:
  """Training loss and validation bits per character per gamma on character-level PTB."""
  config = training.ptb_config(ptb_dir, hidden_size=hidden_size, batch_size=batch_size,
                               length=length, learning_rate=learning_rate,
                               eval_batches=eval_batches, population_batches=4, seed=seed,
                               variant='bn_lstm', gamma_init=gammas[0])
  trainer = loop.Trainer(config)
  return {'data': training.data_description(config, trainer.dataset), 'length': length,
          'hidden_size': hidden_size, 'batch_size': batch_size, 'steps': num_steps,
          'optimizer': f'Adam lr={learning_rate:g}, clip 1',
          'curves': _curves(trainer, gammas, num_steps, num_evals)}


def gamma_sensitivity(output_dir: str = outputs.FIGURES,
                      mnist_dir: Optional[str] = training.data_dir('mnist'),
                      ptb_dir: Optional[str] = training.data_dir('ptb'),
                      gammas: Sequence[float] = GAMMAS, tasks: Sequence[str] = ('mnist', 'ptb'),
                      image_size: int = 14, permute: bool = True, mnist_hidden: int = 64,
                      ptb_hidden: int = 128, mnist_steps: int = 300, ptb_steps: int = 200,
                      num_evals: int = 5, eval_examples: int = 512, seed: int = 0,
                      paper_scale: bool = False, replot: bool = False) -> dict:
  """`gamma_sensitivity.{png,json}`: `tasks[task]['curves'][gamma]`, the training history
  of a BN-LSTM per initial gamma (`training.fit`; the metric is accuracy on MNIST, bits
  per character on PTB), every gamma from the same seed and data order.

  Args:
    output_dir: where the JSON and PNG go.
    mnist_dir: the MNIST IDX files (scikit-learn's 8x8 digits where they are absent).
    ptb_dir: the character-level PTB files.
    gammas: the initial gammas, one curve each.
    tasks: mnist and/or ptb.
    image_size: MNIST image side (28 or 14).
    permute: MNIST's pixels in a fixed random order (pMNIST).
    mnist_hidden: BN-LSTM units on MNIST.
    ptb_hidden: BN-LSTM units on PTB.
    mnist_steps: training steps on MNIST.
    ptb_steps: training steps on PTB.
    num_evals: validation points per curve.
    eval_examples: MNIST validation images per evaluation.
    seed: the random seed.
    paper_scale: the paper's sizes and budgets (pMNIST 784 steps and 100 units, PTB 1000
      units, 50k steps each: hours; use an accelerator).
    replot: only redraw the PNG from the JSON in `output_dir`.
  """
  if replot:
    result = rendering.load(os.path.join(output_dir, 'gamma_sensitivity.json'))
    return outputs.save(output_dir, 'gamma_sensitivity', 'gamma_sensitivity', result,
                        gamma_figure(result))
  unknown = set(tasks) - {'mnist', 'ptb'}
  if unknown or not tasks:
    raise ValueError(f"tasks must be among 'mnist', 'ptb'; got {list(tasks)}.")
  outputs.pyplot()
  gammas = check_gammas(gammas)
  start = time.time()
  if paper_scale:
    mnist = dict(image_size=28, permute=permute, hidden_size=100, batch_size=64,
                 num_steps=50_000, num_evals=50, eval_examples=5000)
    ptb = dict(hidden_size=1000, batch_size=64, length=100, num_steps=50_000, num_evals=50,
               eval_batches=60)
  else:
    mnist = dict(image_size=image_size, permute=permute, hidden_size=mnist_hidden,
                 batch_size=64, num_steps=mnist_steps, num_evals=num_evals,
                 eval_examples=eval_examples)
    ptb = dict(hidden_size=ptb_hidden, batch_size=32, length=100, num_steps=ptb_steps,
               num_evals=num_evals, eval_batches=8)
  results = {}
  if 'mnist' in tasks:
    results['mnist'] = mnist_curves(mnist_dir, gammas, seed=seed, **mnist)
  if 'ptb' in tasks:
    results['ptb'] = ptb_curves(ptb_dir, gammas, seed=seed, **ptb)

  result = {'figure': 'Cooijmans et al. 2016 Fig. 6', 'gammas': list(gammas),
            'tasks': results, 'seconds': time.time() - start}
  return outputs.save(output_dir, 'gamma_sensitivity', 'gamma_sensitivity', result,
                      gamma_figure(result))


def gamma_figure(result: dict):
  """The figure of a `gamma_sensitivity` result (its JSON redraws it)."""
  gammas = result['gammas']
  plt = outputs.pyplot()
  tasks = result['tasks']
  fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.6 * len(tasks)), squeeze=False)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(gammas)))
  labels = {'mnist': ('training cross-entropy', 'validation accuracy'),
            'ptb': ('training bits/char', 'validation bits/char')}
  for row, (task, res) in zip(axes, tasks.items()):
    for color, gamma in zip(colors, gammas):
      h = res['curves'][f'{gamma:g}']
      train = np.asarray(h['train_loss'])
      if task == 'ptb':
        train = train / np.log(2.0)
      row[0].plot(h['step'], smooth(train, 20), color=color, label=f'gamma={gamma:g}')
      row[1].plot(h['eval_step'], [e['metric'] for e in h['eval']], 'o-', color=color,
                  label=f'gamma={gamma:g}')
    for ax, label in zip(row, labels[task]):
      ax.set_xlabel('training step')
      ax.set_ylabel(label)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
    name = 'pMNIST (pixels permuted)' if res.get('permuted') else task.upper()
    row[0].set_title(f"{name}: {res['data']}", fontsize=8)
    row[1].set_title(f"BN-LSTM {res['hidden_size']} units, T={res['length']}, "
                     f"{res['optimizer']}", fontsize=8)
  fig.suptitle('Sensitivity to the initial gamma (Cooijmans Fig. 6)', fontsize=10)
  fig.tight_layout()
  return fig


def render_gamma_sensitivity(s: dict, source: str) -> str:
  name = os.path.basename(source)
  lines = []
  for task, res in s['tasks'].items():
    finals = {k: h['eval'][-1]['metric'] for k, h in res['curves'].items()}
    firsts = {k: h['eval'][0]['metric'] for k, h in res['curves'].items()}
    lines.append(f"{name} {task} ({res['steps']} steps): final valid " +
                 ', '.join(f'gamma {k} {v:.3f}' for k, v in finals.items()) +
                 '; first eval ' + ', '.join(f'{k} {v:.3f}' for k, v in firsts.items()))
  return '\n'.join(lines)


RENDERERS = {'gradient_flow': render_gradient_flow, 'tanh_derivative': render_tanh_derivative,
             'gamma_sensitivity': render_gamma_sensitivity}
