"""The language model on the text pipelines: numerics against the float64 NumPy reference
(`tests/reference.py`), the carried state across segments, bits per character /
perplexity, and a tiny model whose loss falls on a fixture text.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from bn_rnn_jax import models
from bn_rnn_jax import tasks
from bn_rnn_jax import metric_writer
from bn_rnn_jax import train
from bn_rnn_jax import loop

VOCAB, HIDDEN, EMBED, BATCH, LENGTH = 7, 5, 4, 3, 6


def to_numpy(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def perturb(params, seed):
  """Move every parameter off its initial value (gamma 0.1, zero biases) so all terms
  matter in the comparison."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  leaves = [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, leaves)


def reference_lm(params, tokens, mask, variant, embed, *, train_mode=True, population=None,
                 carries=None):
  """Float64 LM: one-hot or embedding -> 2 reference layers -> softmax logits."""
  p = to_numpy(params)
  x = p['embed']['embedding'][tokens] if embed else np.eye(VOCAB)[tokens]
  finals = []
  for index in range(2):
    layer = p['rnn'][f'layer_{index}']
    pop = None if population is None else population[index]
    start = None if carries is None else carries[index]
    carry, x, _ = reference.run_layer(layer, x, mask, variant, train=train_mode,
                                      population=pop, initial_carry=start)
    finals.append(carry)
  return finals, x @ p['softmax']['kernel'] + p['softmax']['bias']


def log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def make_lm(variant, embed):
  return models.LanguageModel(vocab_size=VOCAB, embed_size=EMBED if embed else None,
                              variant=variant, hidden_size=HIDDEN, num_layers=2,
                              layer_options=dict(max_length=LENGTH))


def tokens_and_mask(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  mask = np.ones((BATCH, LENGTH), np.float32)
  mask[2, 4:] = 0.0       # a shorter last segment, as at the end of an evaluation stream
  return tokens, mask


def zero_carries(batch):
  zeros = jnp.zeros((batch, HIDDEN), jnp.float32)
  return [(zeros, zeros), (zeros, zeros)]


@pytest.mark.parametrize('variant,embed', [('lstm', True), ('bn_lstm', False),
                                           ('bn_input_only', True)])
def test_logits_and_carried_state_match_reference(variant, embed):
  model = make_lm(variant, embed)
  tokens, mask = tokens_and_mask()
  variables = jax.jit(lambda t: model.init(jax.random.PRNGKey(0), t, None, train=False))(
      tokens)
  params = perturb(variables['params'], 1)
  vs = {**variables, 'params': params}
  # One compiled function for every segment (zero carries = a fresh start).
  apply = jax.jit(lambda v, t, m, c: model.apply(v, t, m, train=True, initial_carries=c,
                                                 mutable=['batch_stats'])[0])

  # Segment 1 from the zero state, segment 2 from segment 1's final state.
  carries, logits = apply(vs, tokens, mask, zero_carries(BATCH))
  ref_carries, ref_logits = reference_lm(params, tokens, mask, variant, embed)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-4, atol=2e-5)
  tokens2, _ = tokens_and_mask(seed=1)
  full = np.ones_like(mask)
  carries2, logits2 = apply(vs, tokens2, full, carries)
  ref_carries2, ref_logits2 = reference_lm(params, tokens2, full, variant, embed,
                                           carries=ref_carries)
  np.testing.assert_allclose(logits2, ref_logits2, rtol=2e-4, atol=2e-5)
  for got, want in zip(jax.tree.leaves(carries2), jax.tree.leaves(ref_carries2)):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
  # The carry really matters: from zeros the second segment's logits differ.
  _, from_zero = apply(vs, tokens2, full, zero_carries(BATCH))
  assert np.max(np.abs(np.asarray(from_zero) - ref_logits2)) > 1e-3


def test_inference_reuses_last_population_row_past_training_length():
  """Evaluation on a sequence longer than T_max reads row T_max-1 for later steps."""
  model = make_lm('bn_lstm', False)
  # 32 rows give well-conditioned statistics (a 3-row variance can be tiny).
  tokens = np.random.default_rng(4).integers(0, VOCAB, size=(32, LENGTH))
  variables = jax.jit(lambda t: model.init(jax.random.PRNGKey(0), t, None, train=False))(
      tokens)
  params = perturb(variables['params'], 2)
  _, updated = jax.jit(lambda v, t: model.apply(v, t, None, train=True,
                                                mutable=['batch_stats']))(
      {**variables, 'params': params}, tokens)
  stats = updated['batch_stats']
  long_tokens = np.random.default_rng(3).integers(0, VOCAB, size=(2, 3 * LENGTH))
  _, logits = jax.jit(lambda v, t: model.apply(v, t, None, train=False))(
      {'params': params, 'batch_stats': stats}, long_tokens)
  population = []
  for index in range(2):
    site_stats = to_numpy(stats['rnn'][f'layer_{index}'])
    population.append({site: reference.population_lookup(s, 3 * LENGTH)
                       for site, s in site_stats.items()})
  _, ref_logits = reference_lm(params, long_tokens, None, 'bn_lstm', False,
                               train_mode=False, population=population)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-4, atol=2e-5)


def test_loss_sums_give_bits_per_character_and_perplexity():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(BATCH, LENGTH, VOCAB))
  targets = rng.integers(0, VOCAB, size=(BATCH, LENGTH))
  mask = np.ones((BATCH, LENGTH))
  mask[1, 3:] = 0
  weights = np.array([1.0, 1.0, 0.0])     # an all-padding row of an evaluation batch
  batch = {'targets': jnp.asarray(targets), 'mask': jnp.asarray(mask, jnp.float32),
           'weights': jnp.asarray(weights, jnp.float32)}
  sums, count = tasks.TASKS['language_model'].loss_sums(jnp.asarray(logits, jnp.float32),
                                                         batch)
  nll = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
  valid = mask * weights[:, None]
  assert float(count) == valid.sum() == 9
  mean = (nll * valid).sum() / valid.sum()
  means = {k: float(v) / float(count) for k, v in sums.items()}
  characters = tasks.get('language_model', 'character').finalize(means)
  words = tasks.get('language_model', 'word').finalize(means)
  np.testing.assert_allclose(characters['loss'], mean, rtol=1e-5)
  np.testing.assert_allclose(characters['bpc'], mean / math.log(2), rtol=1e-5)
  np.testing.assert_allclose(words['perplexity'], math.exp(mean), rtol=1e-5)


# ------------------------------------------------------------------ through the trainer
WORDS = ('the', 'cat', 'dog', 'sat', 'on', 'a', 'mat', 'ran', 'to', 'big', 'red', 'house')


def write_ptb_fixture(folder, seed=0, lines=(300, 40, 40)):
  """Mikolov-format files of random short sentences over a 12-word vocabulary."""
  rng = np.random.default_rng(seed)
  for split, count in zip(('train', 'valid', 'test'), lines):
    text = ''.join(' ' + ' '.join(rng.choice(WORDS, size=rng.integers(3, 8))) + ' \n'
                   for _ in range(count))
    (folder / f'ptb.{split}.txt').write_text(text)
  return str(folder)


def load_config(name, arg):
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(__file__), '..', 'experiments', 'configs', f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'config_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def tiny(config, data_path, batch_size, seq_length, hidden=16):
  config.data.path = data_path
  config.data.seq_length = seq_length
  config.model.hidden_size = hidden
  config.model.max_length = seq_length
  if config.model.get('embed_size'):
    config.model.embed_size = hidden
  config.train.batch_size = batch_size
  config.train.num_devices = 1
  config.eval.batch_size = batch_size
  config.eval.population_batches = 2
  config.eval.test_at_end = False
  return config


def test_tiny_character_model_learns(tmp_path):
  """A 16-unit BN-LSTM on fixture text: training loss and validation bpc fall fast."""
  config = tiny(load_config('ptb_char', 'bn_lstm'), write_ptb_fixture(tmp_path), 16, 20)
  config.optimizer.learning_rate = 1e-2
  config.train.num_steps = 100
  config.train.log_every = 20
  config.eval.every = 100
  config.checkpoint.every = 100
  config.checkpoint.best_metric = 'valid/bpc'
  last = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  records = metric_writer.read_metrics(str(tmp_path / 'run'))
  losses = [r['loss'] for r in records if r['split'] == 'train']
  symbols = 1 + len(set(''.join(WORDS))) + 1           # letters, '_' and '\n'
  # Uniform guessing is log2(V) bits; a model of the word list needs well under 3 bits.
  assert losses[0] > 2.0 and losses[-1] < 0.6 * losses[0], losses
  assert last['valid']['bpc'] < math.log2(symbols) - 1.5, last['valid']


def test_trainer_carries_word_state_across_steps_and_resets_each_epoch(tmp_path):
  """Zaremba's carried state: the state after step k starts step k+1; epoch starts reset."""
  folder = write_ptb_fixture(tmp_path, lines=(24, 6, 6))
  config = tiny(load_config('ptb_word', 'small'), folder, 4, 5, hidden=8)
  config.train.num_devices = 2          # the carry is split over devices with the batch
  trainer = loop.Trainer(config)
  data = trainer.dataset
  steps = data.steps_per_epoch
  assert data.carries_state and 3 <= steps <= 12, steps
  host = trainer.initial_state()
  # Zaremba's initialisation: every parameter ~ U(-0.1, 0.1) but the BN scales (none here).
  for value in jax.tree.leaves(host.params):
    assert 0.09 < np.abs(value).max() <= 0.1 and abs(float(value.mean())) < 0.03
  state = trainer.to_devices(host)
  forward = jax.jit(lambda params, batch, carries: trainer.model.apply(
      {'params': params}, batch['inputs'], batch['mask'], train=True,
      initial_carries=carries)[0])
  zeros = [(np.zeros((4, 8), np.float32),) * 2] * 2
  expected = zeros
  for step in range(steps + 2):
    params = trainer.to_host(state).params
    start = zeros if step % steps == 0 else expected
    expected = forward(params, data.train_batch(step), start)
    state, _ = trainer.p_train_step(state, trainer.train_batch(step))
    # [devices, B / devices, H] -> [B, H], compared with the forward pass from `start`.
    got = jax.tree.map(lambda c: np.asarray(c).reshape((-1,) + c.shape[2:]), state.carry)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert np.abs(jax.tree.leaves(got)[0]).max() > 0


def test_uniform_init_keeps_normalisation_parameters():
  params = {'embed': {'embedding': np.zeros((50, 8), np.float32)},
            'rnn': {'layer_0': {'input_kernel': np.zeros((8, 32), np.float32),
                                'input_scale': np.full((32,), 0.1, np.float32),
                                'cell_bias': np.zeros((8,), np.float32),
                                'bias': np.zeros((32,), np.float32)}}}
  out = train.uniform_init(params, jax.random.PRNGKey(0), 0.05)
  np.testing.assert_array_equal(out['rnn']['layer_0']['input_scale'], np.float32(0.1))
  np.testing.assert_array_equal(out['rnn']['layer_0']['cell_bias'], 0.0)
  for value in (out['embed']['embedding'], out['rnn']['layer_0']['input_kernel'],
                out['rnn']['layer_0']['bias']):
    assert 0.04 < np.abs(value).max() <= 0.05
