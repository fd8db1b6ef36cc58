"""`population.py`: the papers' population estimate (the average over training batches of
each step's minibatch moments) against float64 moments of the parameters' projections and
the reference's average of records, and its pooled variances against the float64
variance of every batch's projections together; its compiled pass is reused across calls. A batch is
positional or keyword arguments, the keywords asking for batch statistics are arguments
too, and the estimate warns where its result would be wrong without a word: batches that
look zero-padded but pass no lengths, sites no batch reached or none supported; it checks
a concrete mask and lengths as the layer does before it traces them, and refuses batches
whose moments are NaN."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from flax import linen as nn

import bn_rnn_jax as br
from bn_rnn_jax import batch_stats
from bn_rnn_jax import checks
from bn_rnn_jax import population
import helpers
import reference as ref

B, T, I, H, F = 4, 6, 3, 5, 5   # `helpers.uneven_batch`


@pytest.fixture(scope='module')
def data():
  return helpers.uneven_batch(features=I)


def _record(rng, rows, seen):
  return {'mean': rng.normal(size=(rows, F)), 'var': rng.uniform(0.1, 2.0, (rows, F)),
          'count': np.asarray(seen, np.float64)}


@pytest.mark.parametrize('variance', population.VARIANCES)
def test_average_minibatch_moments(variance):
  """The estimate over a nested tree of sites, rows reached by some batches only, each
  batch's row weighted by its valid count; thin rows (negative counts) carry no weight."""
  rng = np.random.default_rng(10)
  seen = ([8, 8, 5, 0, 0], [8, 3, -1, 0, 0], [8, 8, 7, 1, 0])
  records = [{'layer_0': {'cell': _record(rng, 5, s)}, 'layer_1': {'input': _record(rng, 5, s)}}
             for s in seen]
  estimate = jax.jit(population.average_minibatch_moments, static_argnames='variance')(
      jax.tree.map(jnp.float32, records), variance=variance)
  got = jax.tree.map(np.asarray, estimate)
  for layer, site in (('layer_0', 'cell'), ('layer_1', 'input')):
    want = ref.average_records([r[layer][site] for r in records], variance)
    for key in ('mean', 'var', 'count'):
      helpers.assert_close(got[layer][site][key], want[key], what=f'{layer} {site} {key}')
  np.testing.assert_array_equal(got['layer_0']['cell']['count'], [24, 19, 12, 1, 0])
  # Row 1: the batch of 3 weighs 3/19, not 1/3.
  means = [r['layer_0']['cell']['mean'][1] for r in records]
  helpers.assert_close(got['layer_0']['cell']['mean'][1],
                       (8 * means[0] + 3 * means[1] + 8 * means[2]) / 19, what='row 1')
  np.testing.assert_array_equal(got['layer_0']['cell']['var'][4], np.ones(F))


def test_population_estimate_of_no_records_names_the_problem():
  with pytest.raises(ValueError, match='at least one minibatch record'):
    population.average_minibatch_moments([])
  with pytest.raises(ValueError, match=r"variance must be one of \('averaged', 'pooled'\); "
                                       "got 'mean'"):
    population.average_minibatch_moments([], variance='mean')


def _input_terms(batches, variables):
  """Float64 W_x x `[B, T, 4H]` of each batch."""
  kernel = np.asarray(variables['params']['input_kernel'], np.float64)
  return [np.asarray(x, np.float64) @ kernel for x, _ in batches]


def test_pooled_estimate_is_the_variance_of_every_sequence_at_a_row(data):
  """Pooled, the input term's row t is the mean and variance of the valid W_x x of every
  batch at step t taken together (float64), and differs from the averaged variances by
  the spread of the batch means: so on rows one sequence reached in every batch, whose
  averaged variance is 0."""
  x, mask = data
  batches = [(x, mask), (np.asarray(x)[::-1] * 1.5 + 0.3, mask[::-1])]
  layer = br.make_layer('bn_lstm', H, max_length=T)
  variables = layer.init(jax.random.key(0), x, mask, use_running_average=False,
                         deterministic=False)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')   # the one-sequence rows' warning
    stats = {v: br.estimate_population_stats(layer, variables, batches, variance=v)['input']
             for v in population.VARIANCES}
  z = _input_terms(batches, variables)
  for t in range(T):
    rows = np.concatenate([zb[m[:, t] > 0, t] for zb, (_, m) in zip(z, batches)])
    helpers.assert_close(stats['pooled']['mean'][t], rows.mean(0), what=f'mean {t}')
    helpers.assert_close(stats['pooled']['var'][t], rows.var(0), what=f'var {t}')
  single = np.asarray(mask).sum(0) == 1                  # one sequence in each batch
  assert single.any()
  np.testing.assert_array_equal(np.asarray(stats['averaged']['var'])[single], 0.0)
  assert np.all(np.asarray(stats['pooled']['var'])[single] > 0.0)


def test_estimate_population_stats_averages_minibatch_moments(data):
  """Input-term rows = the mean over batches of the float64 per-step moments of W_x x."""
  x, mask = data
  x2 = np.asarray(x)[::-1] * 1.5 + 0.3
  layer = br.make_layer('bn_lstm', H, max_length=T + 2)
  variables = layer.init(jax.random.key(0), x, mask, use_running_average=False,
                         deterministic=False)
  stats = br.estimate_population_stats(layer, variables, [(x, mask), (x2, mask)])
  kernel = np.asarray(variables['params']['input_kernel'], np.float64)
  expected_mean, expected_var = [], []
  for batch in (x, x2):
    z = np.asarray(batch, np.float64) @ kernel                       # [B, T, 4H]
    mean, var = [], []
    for t in range(T):
      rows = z[mask[:, t] > 0, t]
      mean.append(rows.mean(0))
      var.append(rows.var(0))
    expected_mean.append(mean)
    expected_var.append(var)
  site = stats['input']
  np.testing.assert_allclose(np.asarray(site['mean'])[:T], np.mean(expected_mean, 0),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(site['var'])[:T], np.mean(expected_var, 0),
                             rtol=1e-4, atol=1e-5)
  # Count: the valid entries behind each row, over both batches.
  np.testing.assert_array_equal(np.asarray(site['count']),
                                list(2 * np.asarray(mask).sum(0)) + [0.0, 0.0])
  # The running averages of `variables` were not touched.
  for leaf in jax.tree.leaves(variables['batch_stats']):
    assert not np.any(np.isnan(np.asarray(leaf)))
  # The estimate drives inference: rows past the last seen one reuse row T-1.
  out = layer.apply({**variables, 'batch_stats': stats}, x, mask, use_running_average=True,
                    deterministic=True)
  assert np.all(np.isfinite(np.asarray(out)))


def test_estimate_population_stats_compiles_once_per_model(data):
  """Repeated estimates (one per evaluation in a training loop) reuse the compiled pass,
  also for a model with an unhashable dict field."""
  x, mask = data
  model = br.SequenceClassifier(2, br.make_layer('bn_lstm', H, max_length=T))
  variables = model.init(jax.random.key(0), x, mask, use_running_average=True,
                         deterministic=True)
  before = population._minibatch_moments_jit._cache_size()
  for _ in range(3):
    br.estimate_population_stats(model, variables, [(x, mask)] * 2)
  assert population._minibatch_moments_jit._cache_size() == before + 1


def test_the_estimate_draws_the_h0_noise_of_training_and_no_dropout(data):
  """The estimate's pass runs the network with batch statistics as training does, but
  without dropout: with one batch it records the moments a training pass from fresh
  statistics records (a row's first update takes the batch's moments) with the same h0
  noise and dropout off, whatever the dropout rate; without h0 noise the moments differ.
  It needs no rng (a fixed default key: the same estimate twice); another key draws
  other noise."""
  x, mask = data
  noise = {'max_length': T, 'initial_state': 'noise'}
  model = lambda rate, options: br.SequenceClassifier(
      2, br.make_layer('bn_lstm', H, **options), num_layers=2, dropout_rate=rate)
  plain, noisy, dropout = model(0.0, {'max_length': T}), model(0.0, noise), model(0.5, noise)
  variables = plain.init(jax.random.key(0), x, mask, use_running_average=True,
                         deterministic=True)
  key = jax.random.key(7)
  got = br.estimate_population_stats(dropout, variables, [(x, mask)], rng=key)
  _, trained = noisy.apply(variables, x, mask, use_running_average=False,
                           deterministic=False, mutable=['batch_stats'],
                           rngs={'noise': jax.random.fold_in(key, 0)})
  moments = lambda tree: jax.tree.map(lambda site: (site['mean'], site['var']), tree,
                                      is_leaf=batch_stats.is_site)
  helpers.assert_trees_close(moments(got), moments(trained['batch_stats']), rtol=1e-5,
                             atol=1e-7)
  default = br.estimate_population_stats(dropout, variables, [(x, mask)])
  helpers.assert_trees_equal(default, br.estimate_population_stats(
      noisy, variables, [(x, mask)], rng=jax.random.key(0)))
  var = lambda tree: np.asarray(tree['rnn']['layer_0']['recurrent']['var'])
  assert not np.allclose(var(got), var(default))
  assert not np.allclose(var(br.estimate_population_stats(plain, variables, [(x, mask)])),
                         var(default))


def test_unhashable_model_is_a_clear_error(data):
  """The pass compiles once per model, so the model is a static argument."""
  x, mask = data

  class Unhashable(br.StackedRNN):
    __hash__ = None

  model = Unhashable(br.make_layer('lstm', H))
  variables = model.init(jax.random.key(0), x, mask, use_running_average=True,
                         deterministic=True)
  with pytest.raises(ValueError, match='the model must be hashable; Unhashable is not'):
    br.estimate_population_stats(model, variables, [(x, mask)])
  with pytest.raises(ValueError, match='needs at least one batch'):
    br.estimate_population_stats(br.StackedRNN(br.make_layer('lstm', H)), variables, [])


def test_rows_of_one_sequence_are_named_and_fall_back_with_a_threshold():
  """Uneven lengths [6, 2, 2, 2] (a single long sequence): by default the rows only it
  reached are estimated with variance 0, and the estimate says so; with
  `min_step_count=2` they are not estimated, the estimate names them, and inference
  there (and past the training length) uses the last row two sequences supported, as
  the float64 reference of the weighted estimate says."""
  rng = np.random.default_rng(3)
  lengths, T_MAX = [6, 2, 2, 2], 6
  mask = helpers.prefix_mask(lengths, T_MAX)
  batches = [(rng.normal(size=(4, T_MAX, I)).astype(np.float32), mask) for _ in range(2)]
  default = br.make_layer('bn_lstm', H, max_length=T_MAX)
  variables = default.init(jax.random.key(0), *batches[0], use_running_average=True,
                           deterministic=True)
  with pytest.warns(UserWarning, match=r"site 'cell': rows 2-5 rest on one sequence in "
                    r'every batch: their variance is 0'):
    single = br.estimate_population_stats(default, variables, batches)
  assert not np.asarray(single['cell']['var'])[2:].any()
  # The threshold's rule alone (no steady tail: `min_row_support=0`).
  layer = br.make_layer('bn_lstm', H, max_length=T_MAX, min_step_count=2,
                        min_row_support=0.0)
  with pytest.warns(UserWarning, match=r"site 'recurrent': rows 2-5 rest on 1 sequence"):
    stats = br.estimate_population_stats(layer, variables, batches)
  params = helpers.float64(variables['params'])
  records = {site: [] for site in ('recurrent', 'input', 'cell')}
  for x, m in batches:
    _, _, moments = ref.run_layer(params, np.float64(x), m, 'bn_lstm')
    for site in records:
      records[site].append(ref.minibatch_record(moments[site], False, T_MAX, min_count=2))
  for site, site_records in records.items():
    want = ref.average_records(site_records)
    np.testing.assert_array_equal(want['count'], [8, 8, 0, 0, 0, 0])
    for key in ('mean', 'var', 'count'):
      helpers.assert_close(np.asarray(stats[site][key]), want[key], rtol=1e-4,
                           what=f'{site} {key}')
  # Inference on a longer sequence normalises every step past row 1 with row 1.
  x = rng.normal(size=(3, 9, I))
  got = layer.apply({**variables, 'batch_stats': stats}, jnp.float32(x),
                    use_running_average=True, deterministic=True)
  population = {site: ref.population_lookup(helpers.float64(stats[site]), 9)
                for site in records}
  assert np.all(population['cell'][0][2:] == population['cell'][0][1])
  _, want, _ = ref.run_layer(params, x, np.ones((3, 9)), 'bn_lstm', train=False,
                             population=population)
  helpers.assert_close(np.asarray(got), want, rtol=1e-4, what='outputs')


def _padded_like(x, mask):
  """x with zeros where `mask` is 0: zero padding."""
  return np.where(np.asarray(mask)[..., None] > 0, x, 0.0).astype(np.float32)


def test_a_batch_of_keyword_arguments_passes_the_lengths(data):
  """A bare `RNN`, whose lengths are keyword-only, takes a batch of keyword arguments and
  the estimate's own flags: each row counts the sequences the lengths give it, over both
  batches; the zero padding does not warn."""
  x, mask = data
  lengths = np.asarray(mask).sum(1).astype(np.int32)
  rnn = br.RNN(br.BNLSTMCell(H, max_length=T))
  variables = rnn.init(jax.random.key(0), x, seq_lengths=lengths, use_running_average=True)
  batch = {'inputs': _padded_like(x, mask), 'seq_lengths': lengths}
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    stats = br.estimate_population_stats(rnn, variables, [batch] * 2)
  assert not [w for w in record if 'Pass the lengths' in str(w.message)]
  np.testing.assert_array_equal(np.asarray(stats['cell']['cell']['count']),
                                2 * np.asarray(mask).sum(0))


def test_batches_and_keywords_that_cannot_be_a_call_are_errors(data):
  x, mask = data
  layer = br.make_layer('bn_lstm', H, max_length=T)
  with pytest.raises(TypeError, match=r'A batch is a tuple .*; got ndarray of shape '
                     r'\(4, 6, 3\)') as error:
    br.estimate_population_stats(layer, {}, [x])
  helpers.one_line(error)
  with pytest.raises(ValueError, match="The batch passes 'deterministic', which the "
                     'estimate sets itself') as error:
    population.minibatch_moments(layer, {}, {'inputs': x, 'deterministic': False})
  helpers.one_line(error)


def test_zero_padding_without_lengths_is_detected(data):
  """Rows ending in different numbers of all-zero frames, with none elsewhere, and no
  `[batch]` or `[batch, time]` array beside them, are padding; lengths or a mask, inputs
  without such ends, or zero frames inside rows (zeros as data) are not."""
  x, mask = data
  padded = _padded_like(x, mask)
  lengths = np.asarray(mask).sum(1).astype(np.int32)
  found = population.padding_without_lengths((padded,))
  assert found.startswith('inputs (4, 6, 3) with no lengths or mask') and '\n' not in found
  assert population.padding_without_lengths({'inputs': padded, 'seq_lengths': None})
  assert population.padding_without_lengths((padded, mask)) is None
  assert population.padding_without_lengths({'inputs': padded, 'seq_lengths': lengths}) is None
  assert population.padding_without_lengths((x,)) is None
  data_zeros = padded.copy()
  data_zeros[1, 0] = 0.0                                   # a zero frame inside a row
  assert population.padding_without_lengths((data_zeros,)) is None
  # The estimate warns once, with the remedy, on a padded batch without lengths.
  layer = br.make_layer('bn_lstm', H, max_length=T)
  variables = layer.init(jax.random.key(0), padded, use_running_average=True,
                         deterministic=True)
  with pytest.warns(UserWarning, match=r'estimate_population_stats: a batch passes inputs '
                    r".*Pass the lengths or mask the model trains with") as record:
    br.estimate_population_stats(layer, variables, [(padded,)] * 2)
  assert sum('Pass the lengths' in str(w.message) for w in record) == 1


def _eager_error(call) -> str:
  with pytest.raises(ValueError) as error:
    call()
  return helpers.one_line(error)


@pytest.mark.parametrize('bad', ['half', 'double', 'valid_after_padding', 'long', 'negative'])
def test_a_concrete_mask_or_lengths_are_checked_before_the_estimate_traces_them(data, bad):
  """The estimate's pass is compiled, so the mask and lengths it gets are traced: it
  checks their concrete values first, with the line the layer's eager call gives, after
  the batch's index (here the second batch is bad)."""
  x, mask = data
  if bad in ('long', 'negative'):
    model = br.RNN(br.BNLSTMCell(H, max_length=T))
    lengths = np.asarray(mask).sum(1).astype(np.int32)
    wrong = lengths.copy()
    wrong[2] = T + 1 if bad == 'long' else -1
    batches = [{'inputs': x, 'seq_lengths': lengths}, {'inputs': x, 'seq_lengths': wrong}]
    variables = model.init(jax.random.key(0), x, seq_lengths=lengths,
                           use_running_average=True)
    eager = lambda: model.apply(variables, x, seq_lengths=wrong, use_running_average=False,
                                mutable=['batch_stats'])
  else:
    model = br.make_layer('bn_lstm', H, max_length=T)
    wrong = {'half': mask * 0.5, 'double': mask * 2.0,
             'valid_after_padding': np.roll(mask, 1, axis=1)}[bad]
    batches = [(x, mask), (x, wrong)]
    variables = model.init(jax.random.key(0), x, mask, use_running_average=True,
                           deterministic=True)
    eager = lambda: model.apply(variables, x, wrong, use_running_average=False,
                                deterministic=True, mutable=['batch_stats'])
  line = _eager_error(eager)
  with pytest.raises(ValueError) as error:
    br.estimate_population_stats(model, variables, batches)
  assert helpers.one_line(error) == f'estimate_population_stats: batch 1: {line}'


def test_batches_with_no_valid_step_warn_and_nan_at_a_valid_step_is_refused(data):
  """All-padding or empty batches give every site count 0: a warning names them (as
  evaluation will refuse them). A NaN input at a valid step would make the estimate NaN:
  one line names the batch, the site and the rows; NaN in padding is inert."""
  x, mask = data
  layer = br.make_layer('bn_lstm', H, max_length=T)
  variables = layer.init(jax.random.key(0), x, mask, use_running_average=True,
                         deterministic=True)
  for batch in ((x, np.zeros_like(mask)), (x[:0], mask[:0])):
    with pytest.warns(UserWarning, match=r"estimate_population_stats: the batches give "
                      r"site\(s\) 'cell', 'input', 'recurrent' no supported row \(count 0 in "
                      'every row'):
      stats = br.estimate_population_stats(layer, variables, [batch])
    assert batch_stats.untrained_sites(stats) == ['cell', 'input', 'recurrent']
  nan_valid, nan_padding = np.array(x), np.array(x)
  nan_valid[1, 2, 0] = np.nan                       # row 1 has 4 valid steps
  nan_padding[2, 4, 0] = np.nan                     # row 2 has 2
  with pytest.raises(ValueError) as error:
    br.estimate_population_stats(layer, variables, [(x, mask), (nan_valid, mask)])
  assert helpers.one_line(error).startswith(
      "estimate_population_stats: batch 1 gives non-finite moments at site 'cell' (rows "
      "2-5): the batch's inputs at valid steps, or the parameters, hold NaN or inf")
  stats = br.estimate_population_stats(layer, variables, [(nan_padding, mask)])
  assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(stats))


class _Branches(nn.Module):
  """Two MaskedBatchNorms, the second run only when `second` is True."""

  @nn.compact
  def __call__(self, x, second=False, *, use_running_average, deterministic):
    y = batch_stats.MaskedBatchNorm(name='first')(x, use_running_average=use_running_average)
    if second:
      y = batch_stats.MaskedBatchNorm(name='second')(y,
                                                     use_running_average=use_running_average)
    return y


def test_a_site_no_batch_reached_is_named_and_refused(data):
  """The estimate holds every site of the model: one no batch ran comes back with count 0,
  a warning names it, and a jitted evaluation that runs it gives NaN (a checked one,
  `checks.checkify`, names it)."""
  x, _ = data
  model = _Branches()
  variables = model.init(jax.random.key(0), x, True, use_running_average=True,
                         deterministic=True)
  with pytest.warns(UserWarning, match=r"no batch reached site\(s\) 'second/stats'"):
    stats = br.estimate_population_stats(model, variables, [(x,)])
  assert set(stats) == {'first', 'second'}
  assert batch_stats.untrained_sites(stats) == ['second/stats']
  evaluate = lambda v, x: model.apply(v, x, True, use_running_average=True,
                                     deterministic=True)
  variables = {**variables, 'batch_stats': stats}
  assert np.isnan(jax.jit(evaluate)(variables, x)).all()
  error, _ = jax.jit(checks.checkify(evaluate))(variables, x)
  with pytest.raises(checkify.JaxRuntimeError,
                     match="MaskedBatchNorm 'second' site 'stats'.*no training batch reached"):
    error.throw()
