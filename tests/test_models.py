"""`models.py` against the float64 reference: each model's outputs are its recurrent
layers' reference runs (`reference.run_layer`) followed by its own few NumPy operations
(one-hot or embedding lookup, a softmax layer, the final hidden state); input errors are
one line. The Attentive Reader's reference test is in `test_attentive_reader.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bn_rnn_jax import models
from bn_rnn_jax import variants
import helpers
import reference

VOCAB, HIDDEN, EMBED, BATCH, LENGTH = 7, 5, 4, 3, 6
B, T, I, H, C = 4, 7, 3, 4, 5
LENGTHS = np.array([7, 5, 3, 1])
MASK = helpers.prefix_mask(LENGTHS, T)


def perturb(params, seed):
  """Move every parameter off its initial value (gamma 0.1, zero biases) so all terms
  matter in the comparison."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  leaves = [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, leaves)


def _frames(seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(B, T, I)) * MASK[..., None]).astype(np.float32)


# ------------------------------------------------------------------ final states
def test_final_hidden_reads_h_of_each_direction():
  c, h, h_back = (np.full((2, 3), v, np.float32) for v in (1.0, 2.0, 3.0))
  np.testing.assert_array_equal(models.last_hidden((c, h)), h)
  np.testing.assert_array_equal(models.last_hidden(h), h)
  np.testing.assert_array_equal(models.final_hidden((c, h), False), h)
  np.testing.assert_array_equal(models.final_hidden(((c, h), h_back), True),
                                np.concatenate([h, h_back], axis=-1))


# ------------------------------------------------------------------ classifier
@pytest.mark.slow
def test_classifier_logits_are_the_last_valid_state_through_the_softmax_layer():
  model = models.SequenceClassifier(C, variants.make_layer('bn_lstm', H, max_length=T))
  x = _frames(1)
  variables = model.init(jax.random.PRNGKey(0), x, MASK, use_running_average=True,
                         deterministic=True)
  params = perturb(variables['params'], 3)
  logits, _ = jax.jit(lambda v, x, m: model.apply(v, x, m, use_running_average=False,
                                                  deterministic=False,
                                                  mutable=['batch_stats']))(
      {**variables, 'params': params}, x, MASK)
  p = helpers.float64(params)
  (_, h), _, _ = reference.run_layer(p['rnn']['layer_0'], x, MASK, 'bn_lstm')
  want = h @ p['classifier']['kernel'] + p['classifier']['bias']
  helpers.assert_close(logits, want, rtol=2e-4)


def test_classifier_bidirectional_reads_both_final_states():
  x = _frames()
  model = models.SequenceClassifier(3, variants.make_layer('lstm', H), bidirectional=True)
  variables = model.init(jax.random.PRNGKey(0), x, MASK, use_running_average=True,
                         deterministic=True)
  assert variables['params']['classifier']['kernel'].shape == (2 * H, 3)
  logits = model.apply(variables, x, MASK, use_running_average=True, deterministic=True)
  # Row 1 (5 valid steps) alone and unpadded gives the same logits.
  alone = model.apply(variables, x[1:2, :5], None, use_running_average=True,
                      deterministic=True)
  np.testing.assert_allclose(logits[1], alone[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ language model
def reference_lm(params, tokens, mask, variant, embed, *, train_mode=True, population=None,
                 carries=None):
  """Float64 LM: one-hot or embedding -> 2 reference layers -> softmax logits."""
  p = helpers.float64(params)
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


def make_lm(variant, embed):
  return models.LanguageModel(VOCAB, variants.make_layer(variant, HIDDEN, max_length=LENGTH),
                              embed_size=EMBED if embed else None, num_layers=2)


def tokens_and_mask(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  mask = np.ones((BATCH, LENGTH), np.float32)
  mask[2, 4:] = 0.0       # a shorter last segment, as at the end of an evaluation stream
  return tokens, mask


def zero_carries(batch):
  zeros = jnp.zeros((batch, HIDDEN), jnp.float32)
  return [(zeros, zeros), (zeros, zeros)]


@pytest.mark.parametrize('variant,embed', helpers.core_cases(
    [('lstm', True), ('bn_lstm', False), ('bn_input_only', True)], core=[('bn_lstm', False)]))
def test_logits_and_carried_state_match_reference(variant, embed):
  model = make_lm(variant, embed)
  tokens, mask = tokens_and_mask()
  variables = jax.jit(lambda t: model.init(jax.random.PRNGKey(0), t, None,
                                           use_running_average=True, deterministic=True))(
      tokens)
  params = perturb(variables['params'], 1)
  vs = {**variables, 'params': params}
  # One compiled function for every segment (zero carries = a fresh start).
  apply = jax.jit(lambda v, t, m, c: model.apply(v, t, m, use_running_average=False,
                                                 deterministic=False, initial_carries=c,
                                                 mutable=['batch_stats'],
                                                 return_carry=True)[0])

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


@pytest.mark.slow
def test_inference_reuses_last_population_row_past_training_length():
  """Evaluation on a sequence longer than T_max reads row T_max-1 for later steps."""
  model = make_lm('bn_lstm', False)
  # 32 rows give well-conditioned statistics (a 3-row variance can be tiny).
  tokens = np.random.default_rng(4).integers(0, VOCAB, size=(32, LENGTH))
  variables = jax.jit(lambda t: model.init(jax.random.PRNGKey(0), t, None,
                                           use_running_average=True, deterministic=True))(
      tokens)
  params = perturb(variables['params'], 2)
  _, updated = jax.jit(lambda v, t: model.apply(v, t, None, use_running_average=False,
                                                deterministic=False,
                                                mutable=['batch_stats']))(
      {**variables, 'params': params}, tokens)
  stats = updated['batch_stats']
  long_tokens = np.random.default_rng(3).integers(0, VOCAB, size=(2, 3 * LENGTH))
  logits = jax.jit(lambda v, t: model.apply(v, t, None, use_running_average=True,
                                            deterministic=True))(
      {'params': params, 'batch_stats': stats}, long_tokens)
  population = []
  for index in range(2):
    site_stats = helpers.float64(stats['rnn'][f'layer_{index}'])
    population.append({site: reference.population_lookup(s, 3 * LENGTH)
                       for site, s in site_stats.items()})
  _, ref_logits = reference_lm(params, long_tokens, None, 'bn_lstm', False,
                               train_mode=False, population=population)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-4, atol=2e-5)


def test_language_model_input_errors_are_one_line():
  """Raised while tracing: shapes only (`jax.eval_shape`), nothing is compiled."""
  model = make_lm('lstm', True)
  init = lambda tokens: model.init(jax.random.PRNGKey(0), tokens, use_running_average=True,
                                   deterministic=True)
  with pytest.raises(ValueError, match=r'tokens \[batch, time\]; got \(2, 3, 1\)') as error:
    jax.eval_shape(init, jnp.zeros((2, 3, 1), jnp.int32))
  helpers.one_line(error)
  variables = jax.eval_shape(init, jnp.zeros((2, 3), jnp.int32))
  with pytest.raises(ValueError, match=r'step expects tokens \[batch\]; got \(2, 3\)'):
    jax.eval_shape(lambda v: model.apply(v, None, jnp.zeros((2, 3), jnp.int32), 0,
                                         method='step'), variables)


# ------------------------------------------------------------------ tagger
def test_token_tagger_logits_are_the_reference_layer_through_the_softmax_layer():
  """Unidirectional, one layer, token ids: embedding -> reference layer -> softmax."""
  model = models.SequenceTagger(C, variants.make_layer('bn_input_only', H, max_length=T),
                                vocab_size=VOCAB, embed_size=EMBED, num_layers=1,
                                bidirectional=False)
  tokens = np.random.default_rng(5).integers(0, VOCAB, size=(B, T)).astype(np.int32)
  variables = model.init(jax.random.PRNGKey(0), tokens, MASK, use_running_average=True,
                         deterministic=True)
  params = perturb(variables['params'], 6)
  logits, _ = model.apply({**variables, 'params': params}, tokens, MASK,
                          use_running_average=False, deterministic=False,
                          mutable=['batch_stats'])
  p = helpers.float64(params)
  x = p['embed']['embedding'][tokens]
  _, h, _ = reference.run_layer(p['rnn']['layer_0'], x, MASK, 'bn_input_only')
  want = h @ p['softmax']['kernel'] + p['softmax']['bias']
  valid = MASK > 0
  helpers.assert_close(np.asarray(logits)[valid], want[valid], rtol=2e-4)


def test_tagger_input_errors_are_one_line():
  with pytest.raises(ValueError, match=r'token ids \[batch, time\]; got shape \(2, 3, 4\)'):
    models.SequenceTagger(3, variants.make_layer('lstm', 2), vocab_size=5, num_layers=1).init(
        jax.random.PRNGKey(0), jnp.zeros((2, 3, 4), jnp.int32), use_running_average=True,
        deterministic=True)
  with pytest.raises(ValueError, match="kernel_init must be one of"):
    models.SequenceTagger(3, variants.make_layer('lstm', 2), kernel_init='he',
                          num_layers=1).init(
        jax.random.PRNGKey(0), jnp.zeros((2, 3, 4)), use_running_average=True,
        deterministic=True)


# ------------------------------------------------------------------ attentive reader
def test_reader_input_errors_are_one_line():
  inputs = {'document': jnp.zeros((2, 5), jnp.int32), 'document_mask': jnp.ones((2, 4)),
            'query': jnp.zeros((2, 3), jnp.int32), 'query_mask': jnp.ones((2, 3)),
            'candidates': jnp.ones((2, 4))}
  reader = models.attentive_reader('lstm', vocab_size=9, num_entities=4, features=2)
  with pytest.raises(ValueError, match=r'document and document_mask \[batch, time\]; got '
                     r'\(2, 5\) and \(2, 4\)'):
    reader.init(jax.random.PRNGKey(0), inputs, use_running_average=True, deterministic=True)
  with pytest.raises(ValueError, match="Unknown attentive-reader variant 'bn_gru'"):
    models.attentive_reader('bn_gru', vocab_size=9, num_entities=4)
