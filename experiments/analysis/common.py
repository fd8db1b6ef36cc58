"""Shared pieces of the figure scripts: data readers, a small trainer, outputs.

The scripts in this folder redraw the papers' figures on a 2-core CPU in minutes. They
need a few things the library proper leaves to `bn_rnn_jax/train.py` and
`bn_rnn_jax/input_pipeline.py`; this module keeps the minimum of them in one place:

* offline data through the project's readers (`bn_rnn_jax.input_pipeline`): real MNIST
  from IDX .gz files, mean-pooled and flattened into pixel sequences, with scikit-learn's
  8x8 digits as the fallback when the files are absent; character-level PTB.
* `Trainer`: a jitted optax step over a Flax model whose `batch_stats` collection is
  mutable, and the papers' population estimate (average of minibatch moments over a pass
  of training batches, Cooijmans et al. sec. 3) used for every evaluation here.
* `save_outputs`: one PNG and one JSON of the plotted numbers per figure.

Flags shared by every script are defined here once, so that the scripts can be imported
together (by the tests) without absl's duplicate-flag error.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bn_rnn_jax import recurrent
from bn_rnn_jax.input_pipeline import mnist as mnist_pipeline
from bn_rnn_jax.input_pipeline import text as text_pipeline

Array = jax.Array
_HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))
# The shared data folder of this workplace sits next to the repository (../shared/data).
DEFAULT_DATA_ROOT = os.path.join(os.path.dirname(REPO_ROOT), 'shared', 'data')
DEFAULT_OUTPUT_DIR = os.path.join(REPO_ROOT, 'experiments', 'results', 'figures')

OUTPUT_DIR = flags.DEFINE_string('output_dir', DEFAULT_OUTPUT_DIR,
                                 'Where the PNG and JSON of the figure are written.')
MNIST_DIR = flags.DEFINE_string(
    'mnist_dir', os.path.join(DEFAULT_DATA_ROOT, 'mnist'),
    'Folder with train-images-idx3-ubyte.gz etc.; scikit-learn 8x8 digits when absent.')
PTB_DIR = flags.DEFINE_string('ptb_dir', os.path.join(DEFAULT_DATA_ROOT, 'ptb'),
                              'Folder with ptb.train.txt / ptb.valid.txt.')
PAPER_SCALE = flags.DEFINE_bool(
    'paper_scale', False, "The papers' model sizes and budgets (hours on CPU; use an "
    'accelerator) instead of the few-minute CPU defaults.')
SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
GAMMAS = flags.DEFINE_list('gammas', ['0.1', '0.3', '0.5', '0.7', '1.0'],
                           "Initial BN gammas (Cooijmans et al. appendix D's grid).")


# --------------------------------------------------------------------------------------
# Data.

@dataclasses.dataclass
class SequenceData:
  """Images as pixel sequences: `x [N, T, 1]` float32 in [0, 1], `y [N]` int32."""
  x: np.ndarray
  y: np.ndarray
  source: str

  @property
  def length(self) -> int:
    return self.x.shape[1]

  def batches(self, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The examples in order as full `(x [B, T, 1], y [B])` batches; a remainder smaller
    than `batch_size` is left out."""
    return [(self.x[i:i + batch_size], self.y[i:i + batch_size])
            for i in range(0, self.x.shape[0] - batch_size + 1, batch_size)]


def load_pixel_sequences(mnist_dir: Optional[str], split: str = 'train',
                         image_size: int = 28, limit: Optional[int] = None,
                         permutation_seed: Optional[int] = None) -> SequenceData:
  """MNIST (or 8x8 scikit-learn digits) as `[N, image_size**2, 1]` pixel sequences.

  Reads with the project's pipeline (`bn_rnn_jax.input_pipeline.mnist`).

  Args:
    mnist_dir: folder of the IDX .gz files. When it is None or lacks them, scikit-learn's
      8x8 digits are used instead (image_size is then 8); `source` says which was read.
    split: 'train' (the first 55,000 MNIST training images), 'valid' (the last 5,000, the
      split of Cooijmans et al.) or 'test'; for the digits, the pipeline's fixed split.
    image_size: 28 (sequential MNIST), or 14 / 7 (mean-pooled, shorter sequences).
    limit: keep the first `limit` examples.
    permutation_seed: permute the pixel order with this seed (pMNIST).
  """
  if split not in ('train', 'valid', 'test'):
    raise ValueError(f"split must be 'train', 'valid' or 'test'; got {split!r}.")
  files = [os.path.join(mnist_dir, f) for f in mnist_pipeline.IDX_FILES.values()
           ] if mnist_dir else []
  if files and all(os.path.exists(f) for f in files):
    arrays = _load_idx_cached(mnist_dir)
    prefix = 'test' if split == 'test' else 'train'
    images = arrays[f'{prefix}_images'].astype(np.float32) / 255.0
    labels = arrays[f'{prefix}_labels'].astype(np.int32)
    if split != 'test':
      part = slice(0, 55000) if split == 'train' else slice(55000, None)
      images, labels = images[part], labels[part]
    if 28 % image_size:
      raise ValueError(f'image_size must divide 28; got {image_size}.')
    images = mnist_pipeline.mean_pool(images, 28 // image_size)
    source = f'MNIST {image_size}x{image_size} ({split}) from {mnist_dir}'
  else:
    images, labels = mnist_pipeline.load_digits()[split]
    tried = files[0] if files else 'no --mnist_dir'
    source = f'scikit-learn 8x8 digits ({split}); MNIST not found at {tried}'
  if limit is not None:
    images, labels = images[:limit], labels[:limit]
  permutation = None
  if permutation_seed is not None:
    permutation = mnist_pipeline.make_permutation(permutation_seed,
                                                  images.shape[1] * images.shape[2])
  x = mnist_pipeline.to_sequences(images, permutation)
  return SequenceData(np.ascontiguousarray(x, np.float32), np.asarray(labels, np.int32),
                      source)


@functools.lru_cache(maxsize=2)
def _load_idx_cached(mnist_dir: str) -> dict[str, np.ndarray]:
  return mnist_pipeline.load_idx(mnist_dir)


@dataclasses.dataclass
class CharData:
  """A character stream as ids `[N]` int32 and its symbol table (id -> symbol)."""
  ids: np.ndarray
  vocab: list[str]


@functools.lru_cache(maxsize=2)
def _load_ptb_cached(ptb_dir: str):
  return text_pipeline.load_ptb(ptb_dir, 'char')


def load_ptb_chars(ptb_dir: str, split: str = 'train') -> CharData:
  """Character-level PTB with the project's derivation (`input_pipeline.text.ptb_chars`:
  words joined by '_', a '\\n' symbol per sentence, 50 symbols)."""
  if not os.path.isfile(os.path.join(ptb_dir, f'ptb.{split}.txt')):
    raise FileNotFoundError(f'Character-level PTB needs {ptb_dir}/ptb.{split}.txt '
                            '(set --ptb_dir).')
  vocab, ids = _load_ptb_cached(ptb_dir)
  return CharData(ids[split], list(vocab))


def char_batches(ids: np.ndarray, batch_size: int, length: int,
                 rng: np.random.RandomState) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Endless random windows: `(inputs [B, T], targets [B, T])`, targets shifted by one."""
  if ids.size <= length + 1:
    raise ValueError(f'A stream of {ids.size} characters is too short for windows of '
                     f'{length + 1}.')
  while True:
    starts = rng.randint(0, ids.size - length - 1, size=batch_size)
    window = np.stack([ids[s:s + length + 1] for s in starts])
    yield window[:, :-1], window[:, 1:]


def contiguous_windows(ids: np.ndarray, batch_size: int, length: int,
                       max_batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Non-overlapping evaluation windows covering the start of the stream, in order."""
  per_batch = batch_size * length
  count = min(max_batches, (ids.size - 1) // per_batch)
  if count == 0:
    raise ValueError(f'A stream of {ids.size} characters holds no [{batch_size}, {length}] '
                     'evaluation batch.')
  out = []
  for b in range(count):
    chunk = ids[b * per_batch:(b + 1) * per_batch + 1]
    inputs = chunk[:-1].reshape(batch_size, length)
    targets = chunk[1:].reshape(batch_size, length)
    out.append((inputs, targets))
  return out


def example_batches(data: SequenceData, batch_size: int,
                    rng: np.random.RandomState) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Endless shuffled minibatches `(x [B, T, 1], y [B])`, reshuffled every epoch."""
  n = data.x.shape[0]
  if n < batch_size:
    raise ValueError(f'{n} examples are fewer than batch_size={batch_size}.')
  while True:
    order = rng.permutation(n)
    for start in range(0, n - batch_size + 1, batch_size):
      index = order[start:start + batch_size]
      yield data.x[index], data.y[index]


# --------------------------------------------------------------------------------------
# Losses.

def classification_loss(logits, labels):
  """Mean cross-entropy and accuracy of `logits [B, C]` against `labels [B]`."""
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, jnp.mean(jnp.argmax(logits, -1) == labels)


def lm_loss(outputs, targets):
  """Mean next-character cross-entropy in bits, for `(carries, logits [B, T, V])`."""
  _, logits = outputs
  nats = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
  return nats, nats / jnp.log(2.0)


# --------------------------------------------------------------------------------------
# Training.

@dataclasses.dataclass
class Trainer:
  """A jitted optax step for a Flax model with a `batch_stats` collection.

  `loss_fn(model_outputs, targets) -> (loss, metric)`. The model is called as
  `model.apply(vars, inputs, train=..., rngs=...)`; its BN layers use batch statistics in
  training and population statistics in evaluation. Evaluation uses the papers' estimate:
  `estimate_population` averages the minibatch moments of a pass of training batches with
  the current parameters (Cooijmans et al. sec. 3; Laurent et al. sec. 3), which stays
  accurate early in training where a running average lags (../shared/NOTES.md).
  """
  model: Any
  optimizer: optax.GradientTransformation
  loss_fn: Callable[[Any, Any], tuple[Array, Array]]

  def init(self, rng, inputs, model=None) -> dict[str, Any]:
    """`{'params', 'batch_stats', 'opt_state', 'rng'}` for an example batch of inputs.

    `model`: initialise with this module instead (same structure, e.g. another gamma_init;
    the compiled steps of this trainer are then reused for it).
    """
    init_rng, rng = jax.random.split(rng)
    variables = (model or self.model).init({'params': init_rng, 'noise': init_rng, 'dropout': init_rng},
                                inputs, train=False)
    params = variables['params']
    return {'params': params, 'batch_stats': variables.get('batch_stats', {}),
            'opt_state': self.optimizer.init(params), 'rng': rng}

  @functools.cached_property
  def train_step(self):
    """`(state, inputs, targets) -> (state, {'loss', 'metric', 'grad_norm'})`, jitted."""
    def step(state, inputs, targets):
      rng, noise_rng, dropout_rng = jax.random.split(state['rng'], 3)

      def loss(params):
        outputs, updates = self.model.apply(
            {'params': params, 'batch_stats': state['batch_stats']}, inputs, train=True,
            rngs={'noise': noise_rng, 'dropout': dropout_rng}, mutable=['batch_stats'])
        value, metric = self.loss_fn(outputs, targets)
        return value, (metric, updates)

      (value, (metric, updates)), grads = jax.value_and_grad(loss, has_aux=True)(
          state['params'])
      updates_opt, opt_state = self.optimizer.update(grads, state['opt_state'],
                                                     state['params'])
      params = optax.apply_updates(state['params'], updates_opt)
      new_state = {'params': params, 'batch_stats': updates.get('batch_stats', {}),
                   'opt_state': opt_state, 'rng': rng}
      return new_state, {'loss': value, 'metric': metric,
                         'grad_norm': optax.tree.norm(grads)}
    return jax.jit(step, donate_argnums=0)

  def estimate_population(self, state, input_batches: Sequence[Any],
                          rng: Optional[Array] = None) -> Any:
    """`batch_stats` replaced by the papers' estimate over these input batches
    (`bn_rnn_jax.estimate_population_stats`); `rng` (default `PRNGKey(1)`) draws the
    training-mode noise."""
    if not state['batch_stats']:
      return state['batch_stats']
    return recurrent.estimate_population_stats(
        self.model, {'params': state['params'], 'batch_stats': state['batch_stats']},
        [(inputs,) for inputs in input_batches],
        rng=jax.random.PRNGKey(1) if rng is None else rng)

  @functools.cached_property
  def _eval(self):
    def evaluate(params, batch_stats, inputs, targets):
      outputs = self.model.apply({'params': params, 'batch_stats': batch_stats}, inputs,
                                 train=False)
      return self.loss_fn(outputs, targets)
    return jax.jit(evaluate)

  def evaluate(self, state, batch_stats, batches) -> tuple[float, float]:
    """Mean `(loss, metric)` over `(inputs, targets)` batches with these statistics."""
    values = [self._eval(state['params'], batch_stats, x, y) for x, y in batches]
    loss, metric = np.mean(np.asarray(jax.device_get(values)), axis=0)
    return float(loss), float(metric)


def rmsprop(learning_rate: float, momentum: float = 0.9, clip: float = 1.0):
  """Cooijmans et al.'s optimiser: RMSProp with momentum, gradients clipped at `clip`."""
  return optax.chain(optax.clip_by_global_norm(clip),
                     optax.rmsprop(learning_rate, decay=0.9, momentum=momentum))


def adam(learning_rate: float, clip: float = 1.0):
  return optax.chain(optax.clip_by_global_norm(clip), optax.adam(learning_rate))


# --------------------------------------------------------------------------------------
# Outputs.

def _to_json(value):
  if isinstance(value, dict):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_to_json(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    return _to_json(np.asarray(value).tolist())
  if isinstance(value, (np.floating, float)):
    # Five significant digits keep the JSON files small; inf/nan become strings.
    value = float(value)
    return float(f'{value:.5g}') if np.isfinite(value) else str(value)
  if isinstance(value, np.integer):
    return int(value)
  return value


def save_outputs(output_dir: str, name: str, figure, data: dict[str, Any],
                 dpi: int = 100) -> dict[str, str]:
  """Write `name.png` and `name.json` and close `figure`; returns their paths. Keep the
  PNGs < 300 KB (they are committed under experiments/results/figures/): lower `dpi` for
  busy figures."""
  os.makedirs(output_dir, exist_ok=True)
  png = os.path.join(output_dir, f'{name}.png')
  path_json = os.path.join(output_dir, f'{name}.json')
  figure.savefig(png, dpi=dpi, bbox_inches='tight')
  matplotlib_pyplot().close(figure)
  with open(path_json, 'w') as f:
    json.dump(_to_json(data), f, indent=1)
    f.write('\n')
  return {'png': png, 'json': path_json}


def parse_gammas(values: Sequence[str]) -> list[float]:
  gammas = [float(v) for v in values]
  if not gammas or any(g <= 0 for g in gammas):
    raise ValueError(f'gammas must be positive numbers; got {list(values)}.')
  return gammas


def matplotlib_pyplot():
  """pyplot on the non-interactive Agg backend (scripts and tests run headless)."""
  import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  return plt


def train_with_evals(trainer: Trainer, state, batches: Iterator[tuple[Any, Any]],
                     num_steps: int, eval_every: int,
                     evaluate: Callable[[Any], dict[str, float]]) -> tuple[Any, dict]:
  """Runs `num_steps` training steps; calls `evaluate(state)` every `eval_every` and at
  the end. Returns `(state, history)`, history = `{'step': [...], 'train_loss': [...],
  'train_metric': [...], 'eval_step': [...], 'eval': [{...}, ...], 'seconds': float}`.
  Non-finite losses are recorded (as the papers' unstable runs would be), not hidden.
  """
  if num_steps <= 0 or eval_every <= 0:
    raise ValueError(f'num_steps ({num_steps}) and eval_every ({eval_every}) must be > 0.')
  start = time.time()
  history = {'step': [], 'train_loss': [], 'train_metric': [], 'eval_step': [], 'eval': []}
  pending = []
  for step in range(1, num_steps + 1):
    inputs, targets = next(batches)
    state, metrics = trainer.train_step(state, inputs, targets)
    pending.append((step, metrics))
    if step % eval_every == 0 or step == num_steps:
      for s, m in jax.device_get(pending):
        history['step'].append(s)
        history['train_loss'].append(float(m['loss']))
        history['train_metric'].append(float(m['metric']))
      pending = []
      history['eval_step'].append(step)
      history['eval'].append(evaluate(state))
  history['seconds'] = time.time() - start
  return state, history


def smooth(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing moving average (shorter windows at the start), for noisy training curves."""
  values = np.asarray(values, np.float64)
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  index = np.arange(1, values.size + 1)
  lo = np.maximum(index - window, 0)
  return (cumsum[index] - cumsum[lo]) / (index - lo)


def fit(trainer: Trainer, batches: Iterator[tuple[Any, Any]],
        eval_batches: Sequence[tuple[Any, Any]], population_inputs: Sequence[Any],
        num_steps: int, eval_every: int, seed: int = 0,
        init_model=None) -> tuple[Any, dict]:
  """Initialises (from `init_model` if given) and trains; every evaluation first
  re-estimates the population statistics from `population_inputs` (the papers' estimate,
  with the current parameters).

  Returns `(state, history)`; `history['eval']` holds `{'loss', 'metric'}` dicts.
  """
  state = trainer.init(jax.random.PRNGKey(seed), population_inputs[0], init_model)

  def evaluate(state):
    stats = trainer.estimate_population(state, population_inputs)
    loss, metric = trainer.evaluate(state, stats, eval_batches)
    return {'loss': loss, 'metric': metric}

  return train_with_evals(trainer, state, batches, num_steps, eval_every, evaluate)


@dataclasses.dataclass
class PTBChars:
  """Character-level PTB prepared for a short run: a training stream, evaluation windows
  `[(inputs [B, T], targets [B, T])]` from the validation text, and a few training input
  windows for the population estimate."""
  train: CharData
  eval_batches: list[tuple[np.ndarray, np.ndarray]]
  population_inputs: list[np.ndarray]

  @property
  def vocab_size(self) -> int:
    return len(self.train.vocab)


def prepare_ptb_chars(ptb_dir: str, batch_size: int, length: int, eval_batches: int,
                      population_batches: int, seed: int = 0) -> PTBChars:
  train = load_ptb_chars(ptb_dir, 'train')
  valid = load_ptb_chars(ptb_dir, 'valid')
  rng = np.random.RandomState(seed + 12345)
  windows = char_batches(train.ids, batch_size, length, rng)
  population = [next(windows)[0] for _ in range(population_batches)]
  return PTBChars(train, contiguous_windows(valid.ids, batch_size, length, eval_batches),
                  population)
