r"""Cooijmans et al. 2016, Fig. 1(a): gradient flow through a batch-normalised tanh RNN.

Plots ||dL/dh_t|| against t for several initial gammas, for a tanh RNN reading sequential
MNIST one pixel per step, at initialisation. The paper (sec. 4) controls "the
pre-activation variance" with gamma; the variant that does exactly that is
`rnn_bn_recurrence`, h_t = tanh(BN(W_h h_{t-1} + W_x x_t; gamma, beta)), whose
pre-activation has per-step batch variance gamma^2 (Laurent et al. eq. 17). (The BN-LSTM's
separate normalisation of the two terms would give variance 2 gamma^2 instead.)

Initialisation of W_h decides the picture. With W_h = I, the setup of the paper's sec. 5.1
(which sec. 4 refers to), a large gamma makes the gradient vanish backwards in time and a
small one keeps it nearly constant, as in the paper's figure. With an orthogonal W_h the
same network's gradient *explodes* backwards for large gamma instead (the gradient
explosion of batch-normalised deep networks at initialisation, Yang et al. 2019); the
script draws both, identity first.

The first ~100 pixels of MNIST are black for every image, so the batch variance of the
pre-activation would be zero there and its normalisation would blow up the backward pass;
as in the paper (sec. 5.1), h_0 gets Gaussian noise (`initial_state='noise'`, std 0.1).

dL/dh_t is read without touching the library: the scan here runs the library's own step
function (`steps.rnn_step`) and adds a zero perturbation e_t to each new state, so that
dL/de_t = dL/dh_t; the script checks that its scan reproduces `RecurrentLayer` exactly.

  python -m experiments.analysis.gradient_flow [--mnist_dir=...] [--output_dir=...]
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bn_rnn_jax import initializers
from bn_rnn_jax import steps
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import variants
from experiments.analysis import common

FLOOR = 1e-30  # float32 gradients underflow below ~1e-38 per entry.

_HIDDEN = flags.DEFINE_integer('gf_hidden_size', 100, 'Hidden units of the tanh RNN.')
_BATCH = flags.DEFINE_integer('gf_batch_size', 64, 'Examples per batch.')
_BATCHES = flags.DEFINE_integer('gf_num_batches', 4,
                                'Batches (and initialisations) averaged per curve.')
_INITS = flags.DEFINE_list('gf_recurrent_inits', ['identity', 'orthogonal'],
                           'W_h initialisations, one panel each (identity = paper sec. 5.1).')
_IMAGE = flags.DEFINE_integer('gf_image_size', 28, '28 = sequential MNIST (784 steps).')


@jax.jit
def _state_gradients(params, classifier, h0, x, y):
  """dL/dh_t `[T, B, H]` and the states `[T, B, H]` of the BN tanh RNN.

  params: the `RecurrentLayer` parameters; classifier: `{'kernel' [H, C], 'bias' [C]}`;
  h0: `[B, H]`; x: `[B, T, I]`; y: `[B]`. Every gamma shares this one compilation.
  """
  cfg = steps.StepConfig(recurrent_norm='batch', batch_statistics=True)

  def loss(perturbation):
    def step(h, inputs):
      h, _ = steps.rnn_step(params, cfg, h, {'x': inputs['x']})
      h = h + inputs['e']  # e_t = 0: dL/de_t is dL/dh_t.
      return h, h
    h_last, hs = jax.lax.scan(step, h0, {'x': jnp.swapaxes(x, 0, 1), 'e': perturbation})
    logits = h_last @ classifier['kernel'] + classifier['bias']
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), hs

  zeros = jnp.zeros((x.shape[1],) + h0.shape)
  return jax.grad(loss, has_aux=True)(zeros)


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
    if not np.allclose(np.asarray(layer_out), np.swapaxes(np.asarray(hs), 0, 1),
                       atol=1e-5):
      raise AssertionError('The perturbed scan does not reproduce RecurrentLayer.')
  # float64: squares of float32 gradients of 1e20 and more would overflow.
  return np.sqrt(np.sum(np.square(np.asarray(grads, np.float64)), axis=(1, 2)))


def run(output_dir: str, mnist_dir: Optional[str], gammas: Sequence[float],
        hidden_size: int = 100, batch_size: int = 64, num_batches: int = 4,
        image_size: int = 28, recurrent_inits: Sequence[str] = ('identity', 'orthogonal'),
        seed: int = 0) -> dict:
  """Computes the curves, writes `gradient_flow.{png,json}`, returns the JSON dict.

  JSON: `grad_norm[init][gamma]` = `[T]` geometric mean over batches of ||dL/dh_t||;
  `ratio_first_to_last[init][gamma]` = ||dL/dh_0|| / ||dL/dh_{T-1}||.
  """
  common.matplotlib_pyplot()   # a missing matplotlib refuses before the work
  start = time.time()
  # Only the data of this config is used (no training): batch_size=1 fits any split.
  config = common.mnist_config(mnist_dir, resolution=image_size, batch_size=1, seed=seed)
  dataset = input_pipeline.get_dataset(config)
  source = common.data_description(config, dataset)
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
      logging.info('W_h=%s gamma=%g: |dL/dh_0|=%.3g |dL/dh_T|=%.3g', init, gamma,
                   curves[init][gamma][0], curves[init][gamma][-1])

  plt = common.matplotlib_pyplot()
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
  common.save_outputs(output_dir, 'gradient_flow', fig, result)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  paper = common.PAPER_SCALE.value
  run(common.OUTPUT_DIR.value, common.MNIST_DIR.value, common.parse_gammas(common.GAMMAS.value),
      hidden_size=_HIDDEN.value, batch_size=100 if paper else _BATCH.value,
      num_batches=20 if paper else _BATCHES.value, image_size=_IMAGE.value,
      recurrent_inits=_INITS.value, seed=common.SEED.value)


if __name__ == '__main__':
  app.run(main)
