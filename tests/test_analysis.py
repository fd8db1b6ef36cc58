"""The analyses of experiments/analysis/, each run once in a tiny mode.

Each test calls an analysis's library function with tiny sizes and checks the JSON it
writes: shapes,
finite values, and the orderings the papers predict where a tiny run can show them.
Numbers are checked against float64 references written here (scipy quadrature, NumPy
moments), never against the scripts' own code. Scripts that need PTB skip without it.
"""

import hashlib
import json
import logging
import os
import shutil
import sys

from absl import flags
import numpy as np
import pytest
from scipy import integrate

import bn_rnn_jax as br
from bn_rnn_jax import extras
from bn_rnn_jax import input_pipeline
from bn_rnn_jax import normalization
from bn_rnn_jax.training import parallel
from bn_rnn_jax.training import loop
from bn_rnn_jax.training import metric_writer
from experiments.analysis.lib import cli
from experiments.analysis.lib import early_estimates
from experiments.analysis.lib import gamma_figures
from experiments.analysis.lib import length_cause
from experiments.analysis.lib import length_studies
from experiments.analysis.lib import recurrence_figures
from experiments.analysis.lib import sign_task
from experiments.analysis.lib import trained_runs
from experiments.analysis.lib import training
from experiments.campaign import columns
import helpers

PTB_DIR = training.data_dir('ptb') or 'ptb'
MNIST_DIR = training.data_dir('mnist') or 'mnist'
needs_ptb = pytest.mark.skipif(
    not os.path.isfile(os.path.join(PTB_DIR, 'ptb.train.txt')),
    reason=f'character-level PTB not found at {PTB_DIR}')


def _read_json(directory, name):
  assert os.path.getsize(os.path.join(directory, f'{name}.png')) > 1000
  with open(os.path.join(directory, f'{name}.json')) as f:
    return json.load(f)


def _finite(values):
  values = np.asarray(values, np.float64)
  return values.size > 0 and np.all(np.isfinite(values))


# ---------------------------------------------------------------- tanh derivative (1b)

def _reference_expected_tanh_prime(std):
  if std == 0:
    return 1.0
  density = lambda x: np.exp(-0.5 * (x / std) ** 2) / (std * np.sqrt(2 * np.pi))
  value, _ = integrate.quad(lambda x: (1 - np.tanh(x) ** 2) * density(x), -np.inf, np.inf)
  return value


def test_tanh_derivative(tmp_path):
  result = gamma_figures.tanh_derivative(str(tmp_path), num_stds=6, max_std=1.0,
                                         samples=40_000)
  saved = _read_json(tmp_path, 'tanh_derivative')
  stds = np.asarray(saved['stds'])
  np.testing.assert_allclose(stds, np.linspace(0, 1, 6))
  reference = np.array([_reference_expected_tanh_prime(s) for s in stds])
  np.testing.assert_allclose(saved['quadrature'], reference, rtol=1e-4, atol=1e-5)
  assert reference[-1] == pytest.approx(0.6057, abs=1e-3)  # E tanh'(N(0, 1)).
  # Monte Carlo agrees within its own error bars (5 standard errors, or rounding).
  mc, err = np.asarray(saved['mc_mean']), np.asarray(saved['mc_stderr'])
  assert np.all(np.abs(mc - reference) <= 5 * err + 1e-4)
  assert np.all(np.diff(saved['quadrature']) < 0)  # Decreasing in the std.
  assert np.all(np.asarray(saved['mc_q25']) <= np.asarray(saved['mc_q75']))
  assert result['samples'] == 40_000
  assert saved['machine']['cores'] >= 1 and saved['machine']['versions']['jax']
  assert saved['kind'] == 'tanh_derivative'


def test_a_scripts_flags_are_its_functions_arguments(tmp_path):
  """Types, defaults, lists and help come from the signature and the docstring."""
  values = flags.FlagValues()
  arguments = cli.define_flags(gamma_figures.tanh_derivative, values)
  values(['tanh_derivative', f'--output_dir={tmp_path}', '--num_stds=3', '--samples=100',
          '--max_std=2.0'])
  gamma_figures.tanh_derivative(**arguments())
  saved = _read_json(tmp_path, 'tanh_derivative')
  assert saved['stds'] == [0.0, 1.0, 2.0] and saved['samples'] == 100
  assert values['nodes'].value == 80 and values['paper_scale'].value is False
  assert values['max_std'].help == 'the largest standard deviation.'
  values = flags.FlagValues()
  arguments = cli.define_flags(trained_runs.running_average_lag, values)
  values(['lag', '--workdir=w', '--momenta=0.9,0.5'])
  assert arguments()['momenta'] == [0.9, 0.5] and arguments()['step'] is None
  assert 'settings' not in values   # a tuple of pairs is no flag: its default holds


def test_tanh_derivative_rejects_bad_sizes(tmp_path):
  with pytest.raises(ValueError, match='num_stds'):
    gamma_figures.tanh_derivative(str(tmp_path), num_stds=1)


# ---------------------------------------------------------------- gradient flow (1a)

@pytest.mark.slow
def test_gradient_flow_vanishes_for_large_gamma(tmp_path):
  # 8x8 digits (64 steps): the offline fallback; real MNIST is the script's default.
  result = gamma_figures.gradient_flow(str(tmp_path), None, [0.1, 1.0], hidden_size=32,
                                       batch_size=32, num_batches=1,
                                       recurrent_inits=('identity',))
  saved = _read_json(tmp_path, 'gradient_flow')
  assert 'digits' in saved['data'] and result['gammas'] == [0.1, 1.0]
  small, large = (np.asarray(saved['grad_norm']['identity'][g]) for g in ('0.1', '1'))
  assert small.shape == large.shape == (64,)
  assert _finite(small) and _finite(large) and np.all(small > 0) and np.all(large > 0)
  # The loss reads h_T only, so the last step's gradient is the classifier's and is
  # of the same size for both; going back in time, gamma = 1 loses orders of magnitude
  # more than gamma = 0.1 (Cooijmans et al. Fig. 1a).
  ratio = saved['ratio_first_to_last']['identity']
  assert ratio['1'] < 1e-2 * ratio['0.1']
  assert 0.1 < ratio['0.1'] < 10  # Nearly constant for small gamma.


def test_gradient_flow_rejects_too_few_examples(tmp_path):
  with pytest.raises(ValueError, match='fewer than'):
    gamma_figures.gradient_flow(str(tmp_path), None, [0.1], batch_size=2000, num_batches=1)


# ---------------------------------------------------------------- common pieces

def _tiny_digits_trainer(**model_fields):
  config = training.mnist_config(None, hidden_size=4, batch_size=8, eval_examples=16,
                               population_batches=3, variant='bn_lstm', **model_fields)
  return loop.Trainer(config)


@pytest.mark.slow
def test_population_estimate_matches_numpy_moments():
  """The scripts' population estimate (the library's Trainer) of the input-term
  statistics equals the float64 average of the per-step batch moments of x_t W_x over the
  training batches it reads (those of the current step on)."""
  trainer = _tiny_digits_trainer()
  state = trainer.to_devices(trainer.initial_state())
  stats = parallel.unreplicate(trainer.population_stats(state))
  site = stats['rnn']['layer_0']['input']
  kernel = np.asarray(parallel.unreplicate(state.params)['rnn']['layer_0']['input_kernel'],
                      np.float64)
  terms = [trainer.dataset.train_batch(i)['inputs'].astype(np.float64) @ kernel
           for i in range(3)]  # [B, T, 4H] each.
  np.testing.assert_allclose(site['mean'], np.mean([t.mean(0) for t in terms], 0),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(site['var'], np.mean([t.var(0) for t in terms], 0),
                             rtol=1e-4, atol=1e-5)
  # Each row counts the sequences of the three batches (all valid at every step).
  np.testing.assert_allclose(site['count'], np.full(64, 3.0 * terms[0].shape[0]))


@pytest.mark.exhaustive
def test_initial_state_changes_gamma_and_shares_the_step():
  """`initial_state` sets the BN gammas; both states train with the one compiled step, and
  `evaluate_with` on the state's own running statistics equals the 'running' evaluation."""
  trainer = _tiny_digits_trainer(gamma_init=0.1)
  histories = []
  for gamma in (0.1, 0.7):
    state = training.initial_state(trainer, gamma_init=gamma)
    scale = parallel.unreplicate(state.params)['rnn']['layer_0']['recurrent_scale']
    np.testing.assert_allclose(scale, gamma)
    state, history = training.fit(trainer, state, 2, eval_every=1)
    histories.append(history)
    assert history['step'] == [1, 2] and history['eval_step'] == [1, 2]
    assert all(0 <= e['metric'] <= 1 for e in history['eval'])
    running = training.evaluate_with(trainer, state, parallel.unreplicate(state.batch_stats))
    assert running == trainer.evaluate(state, 'valid', 'running')
  # Same data and parameter seed; only gamma differs, and so does the first loss.
  assert histories[0]['train_loss'][0] != histories[1]['train_loss'][0]


def test_smooth_is_a_trailing_mean():
  values = np.array([1.0, 3.0, 5.0, 7.0])
  np.testing.assert_allclose(columns.smooth(values, 2), [1.0, 2.0, 4.0, 6.0])


def test_configs_fall_back_to_digits_and_describe_without_paths(tmp_path):
  config = training.mnist_config(str(tmp_path), permutation_seed=3)
  assert config.data.name == 'digits' and config.data.permute
  dataset = input_pipeline.get_dataset(config)
  text = training.data_description(config, dataset)
  assert 'digits' in text and 'permuted' in text and str(tmp_path) not in text
  assert dataset.train_length == 64


@pytest.mark.skipif(not os.path.isdir(MNIST_DIR), reason=f'MNIST not found at {MNIST_DIR}')
def test_mnist_config_reads_pooled_mnist():
  config = training.mnist_config(MNIST_DIR, resolution=14)
  assert config.data.name == 'mnist' and config.data.resolution == 14
  assert training.data_description(config, None) == 'MNIST 14x14 (196 steps; IDX files)'


def test_shared_row_variances():
  """Averaged variance mean_t v_t vs pooled mean_t v_t + var_t m_t, by hand."""
  mean = np.array([[0.0, 1.0], [2.0, 1.0]])
  var = np.array([[1.0, 1.0], [1.0, 3.0]])
  out = recurrence_figures.shared_row_variances(mean, var)
  # Unit 0: averaged 1, pooled 1 + 1 = 2; unit 1: averaged 2, pooled 2 + 0.
  assert out['ratio_max'] == pytest.approx(2.0)
  assert out['ratio_median'] == pytest.approx(1.5)
  assert out['fraction_over_1.1'] == pytest.approx(0.5)


# ---------------------------------------------------------------- population stats (5)

def test_convergence_measure():
  mean = np.array([[2.0], [0.0], [0.0], [0.0]])
  var = np.array([[1.0], [4.0], [4.0], [4.0]])
  conv = recurrence_figures.convergence(mean, var)
  # Stationary: mean 0, var 4 (second half); step 0 is 2/sqrt(4) = 1 std away, var -75%.
  np.testing.assert_allclose(conv['mean_shift'], [1.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(conv['var_change'], [0.75, 0.0, 0.0, 0.0])


@needs_ptb
@pytest.mark.exhaustive
def test_population_stats(tmp_path):
  recurrence_figures.population_stats(str(tmp_path), PTB_DIR, hidden_size=8, num_steps=3,
                                      batch_size=8, length=12, units_shown=5,
                                      population_batches=2)
  saved = _read_json(tmp_path, 'population_stats')
  for site in recurrence_figures.SITES:
    for key in ('population', 'running_average'):
      mean = np.asarray(saved[key][site]['mean'])
      var = np.asarray(saved[key][site]['var'])
      assert mean.shape == var.shape == (12, 5) and _finite(mean) and _finite(var)
      assert np.all(var >= 0)
    assert len(saved['units'][site]) == 5
    assert _finite(saved['convergence'][site]['mean_shift'])
    assert _finite(list(saved['shared_row'][site].values()))
  # h_0 = 0, so the recurrent term of step 0 is exactly 0 in every example.
  np.testing.assert_allclose(saved['population']['recurrent']['var'][0], 0.0, atol=1e-12)
  np.testing.assert_allclose(saved['population']['recurrent']['mean'][0], 0.0, atol=1e-12)
  assert saved['valid_bits_per_char'] > 0


# ---------------------------------------------------------------- gamma sensitivity (6)

@pytest.mark.exhaustive
def test_gamma_sensitivity_mnist_digits(tmp_path):
  result = gamma_figures.gamma_sensitivity(
      str(tmp_path), None, PTB_DIR, [0.1, 1.0], tasks=('mnist',), image_size=8,
      mnist_hidden=8, mnist_steps=4, num_evals=2, eval_examples=32)
  saved = _read_json(tmp_path, 'gamma_sensitivity')
  assert set(saved['tasks']) == {'mnist'} and result['gammas'] == [0.1, 1.0]
  for gamma in ('0.1', '1'):
    history = saved['tasks']['mnist']['curves'][gamma]
    assert history['step'] == [1, 2, 3, 4] and history['eval_step'] == [2, 4]
    assert 'digits' in saved['tasks']['mnist']['data']
    assert _finite(history['train_loss'])
    assert all(0 <= e['metric'] <= 1 and np.isfinite(e['loss']) for e in history['eval'])
  with pytest.raises(ValueError, match='tasks'):
    gamma_figures.gamma_sensitivity(str(tmp_path), None, PTB_DIR, [0.1], tasks=('cifar',))


@needs_ptb
@pytest.mark.exhaustive  # the script's digits form: the test above
def test_gamma_sensitivity_ptb(tmp_path):
  gamma_figures.gamma_sensitivity(str(tmp_path), None, PTB_DIR, [0.1, 1.0], tasks=('ptb',),
                                  ptb_hidden=8, ptb_steps=3, num_evals=1)
  saved = _read_json(tmp_path, 'gamma_sensitivity')
  for history in saved['tasks']['ptb']['curves'].values():
    bpc = [e['metric'] for e in history['eval']]
    # Near-uniform predictions over 50 symbols after 3 steps: about log2(50) = 5.6 bits.
    assert len(bpc) == 1 and 4.0 < bpc[0] < 7.0


# ---------------------------------------------------------------- Laurent appendix A

def test_laurent_variant_parsing():
  assert recurrence_figures.parse_variants(['rnn', 'rnn_bn_recurrence:0.1']) == [
      ('rnn', 1.0), ('rnn_bn_recurrence', 0.1)]
  with pytest.raises(ValueError, match='tanh-RNN variant'):
    recurrence_figures.parse_variants(['bn_lstm'])


@needs_ptb
@pytest.mark.exhaustive
def test_laurent_appendix(tmp_path):
  recurrence_figures.laurent_appendix(
      str(tmp_path), PTB_DIR, ['rnn_bn_input', 'rnn_bn_recurrence:0.1'], num_steps=3,
      hidden_size=8, num_layers=1, embed_size=4, batch_size=8, length=10, num_evals=1,
      eval_batches=2)
  saved = _read_json(tmp_path, 'laurent_appendix')
  assert set(saved['final_valid_bpc']) == {'rnn_bn_input gamma=1',
                                           'rnn_bn_recurrence gamma=0.1'}
  for history in saved['curves'].values():
    assert _finite(history['train_loss']) and len(history['train_loss']) == 3
  assert all(3.0 < v < 8.0 for v in saved['final_valid_bpc'].values())


# ---------------------------------------------------------------- estimate batch size

@pytest.mark.exhaustive
@pytest.mark.parametrize('permute', [False, True])
def test_estimate_batch_size_digits(tmp_path, permute):
  """Every estimate setting is drawn `draws` times and scored; every site is swapped."""
  early_estimates.estimate_batch_size(str(tmp_path), None, num_steps=3, batch_size=16,
                                      hidden_size=8, valid_examples=64, draws=2,
                                      image_size=8, settings=((2, 1), (1, 2)),
                                      permute=permute)
  saved = _read_json(tmp_path, 'estimate_batch_size' + ('_pmnist' if permute else ''))
  assert ('permuted' in saved['data']) == permute
  assert set(saved['estimates']) == {'2 x 16', '1 x 32'}
  scores = [s for v in saved['estimates'].values() for s in v]
  assert len(scores) == 4
  assert set(saved['site_from_small']) == {'input', 'recurrent', 'cell'}
  for value in scores + list(saved['site_from_small'].values()) + [
      saved['batch_statistics']]:
    assert 0.0 <= value <= 1.0
    # 64 examples in batches of 16: accuracies are multiples of 1/64.
    assert abs(value * 64 - round(value * 64)) < 1e-3
  assert saved['length'] == 64


@pytest.mark.exhaustive
def test_estimate_noise_digits(tmp_path):
  """Both estimates on the same batches, each arm's draws recorded; without noise the
  estimate is the library's (`estimate_population_stats`)."""
  early_estimates.estimate_noise(str(tmp_path), None, num_steps=3, batch_size=16,
                                 hidden_size=8, valid_examples=32, draws=2, estimate_batch=32)
  saved = _read_json(tmp_path, 'estimate_noise')
  assert set(saved['accuracy']) == {'estimate without noise', 'estimate with h0 noise'}
  assert all(len(v) == 2 and all(0.0 <= a <= 1.0 for a in v)
             for v in saved['accuracy'].values())
  assert 0.0 <= saved['batch_statistics'] <= 1.0
  assert set(saved['largest_relative_variance_change']) >= {
      'rnn/layer_0/recurrent', 'rnn/layer_0/input', 'rnn/layer_0/cell'}
  # The noise reaches the recurrent term's statistics.
  assert saved['largest_relative_variance_change']['rnn/layer_0/recurrent'] > 0.0


def _tiny_bn_lstm_run(tmp_path):
  """`(workdir, last validation record)` of a 4-step BN-LSTM run on the 8x8 digits,
  evaluated with its running average and batch statistics and saved at steps 2 and 4, in
  `<tmp_path>/campaign/bn_lstm_s0`."""
  config = training.mnist_config(None, hidden_size=4, batch_size=8, eval_examples=16,
                               population_batches=3, variant='bn_lstm',
                               initial_state='noise')
  config.eval.max_batches = None
  config.eval.population_stats = 'running'
  config.eval.compare = ('batch',)
  config.train.num_steps = 4
  config.eval.every = config.checkpoint.every = 2
  config.eval.test_at_end = False
  run_dir = tmp_path / 'campaign' / 'bn_lstm_s0'
  loop.train_and_evaluate(config, str(run_dir))
  logged = [r for r in metric_writer.read_metrics(str(run_dir)) if r['split'] == 'valid'][-1]
  return run_dir, logged


@pytest.mark.exhaustive
def test_running_average_gap_scores_and_locates_the_running_average(tmp_path):
  """The running average scores as the run's own evaluation with it did; a hybrid whose
  rows all come from the running average scores as the running average, one with none as
  the estimate; per site and row, the running average's distance from the estimate."""
  run_dir, logged = _tiny_bn_lstm_run(tmp_path)
  trained_runs.running_average_gap(str(run_dir), str(tmp_path / 'out'), num_batches=2, size=8)
  saved = _read_json(tmp_path / 'out', 'running_average_gap_bn_lstm_s0')
  assert saved['run'] == 'campaign/bn_lstm_s0' and saved['step'] == 4
  assert saved['running'] == pytest.approx(logged['accuracy'], abs=1e-4)
  rows = len(next(iter(saved['per_row'].values()))['mean_shift'])
  assert saved['hybrids'][f'rows < {rows}'] == pytest.approx(saved['running'], abs=1e-4)
  assert set(saved['per_row']) == {'rnn/layer_0/recurrent', 'rnn/layer_0/input',
                                   'rnn/layer_0/cell'}
  assert all(_finite(row['mean_shift']) and _finite(row['log_var_ratio'])
             for row in saved['per_row'].values())
  assert set(saved['per_row_noise_free']) == set(saved['per_row'])
  assert 0.0 <= saved['noise-free'] <= 1.0


@pytest.mark.exhaustive
def test_running_average_lag_holds_or_trains_the_parameters(tmp_path):
  """Frozen, the parameters stay those restored (batch statistics score as at the
  restored step); every momentum arm trains the same parameters (batch statistics score
  alike at each step), whatever its running average."""
  run_dir, _ = _tiny_bn_lstm_run(tmp_path)
  trained_runs.running_average_lag(str(run_dir), str(tmp_path / 'out'), num_steps=4, every=2,
                          momenta=(0.99, 0.5))
  saved = _read_json(tmp_path / 'out', 'running_average_lag_bn_lstm_s0')
  assert saved['step'] == 4 and set(saved['arms']) == {'frozen', 'momentum 0.99',
                                                       'momentum 0.5'}
  assert [r['step'] for r in saved['arms']['frozen']] == [6, 8]
  assert all(r['batch'] == saved['restored']['batch'] for r in saved['arms']['frozen'])
  slow, fast = saved['arms']['momentum 0.99'], saved['arms']['momentum 0.5']
  assert [r['batch'] for r in slow] == [r['batch'] for r in fast]
  assert [r['running'] for r in slow] != [r['running'] for r in fast]


@pytest.mark.exhaustive
def test_estimate_spread_draws_and_locates_the_spread(tmp_path):
  """A hybrid with every row from a draw scores as that draw; one draw alone is "all
  draws", with no spread in any row; the nonzero fraction is that of the drawn inputs;
  the noise-free draws are the same batches without the run's h0 noise, which the
  recurrent term's variances show."""
  run_dir, _ = _tiny_bn_lstm_run(tmp_path)
  trained_runs.estimate_spread(str(run_dir), str(tmp_path / 'out'), draws=2, num_batches=2, size=8)
  saved = _read_json(tmp_path / 'out', 'estimate_spread_bn_lstm_s0')
  rows = len(saved['nonzero_inputs'])
  for draw, hybrid in zip(saved['draws'], saved['hybrids']):
    assert hybrid[f'rows < {rows}'] == pytest.approx(draw, abs=1e-4)
  assert set(saved['per_row']) == {'rnn/layer_0/recurrent', 'rnn/layer_0/input',
                                   'rnn/layer_0/cell'} == set(saved['per_row_noise_free'])
  assert len(saved['noise-free draws']) == 2
  recurrent = lambda key: np.asarray(saved[key]['rnn/layer_0/recurrent']['var_mean'])
  assert not np.allclose(recurrent('per_row'), recurrent('per_row_noise_free'))
  np.testing.assert_array_equal(
      np.asarray(saved['per_row']['rnn/layer_0/input']['var_mean']),
      np.asarray(saved['per_row_noise_free']['rnn/layer_0/input']['var_mean']))
  assert any(max(row['var_spread']) > 0 for row in saved['per_row'].values())
  one = trained_runs.estimate_spread(str(run_dir), str(tmp_path / 'one'), draws=1, num_batches=2,
                            size=8)
  assert one['draws'] == [pytest.approx(one['all draws'], abs=1e-6)]
  assert all(not np.any(row['var_spread']) for row in one['per_row'].values())
  trainer, _, _ = trained_runs.restore(str(run_dir))
  inputs = np.asarray(trainer.dataset.splits['train']['inputs'])
  index = np.random.RandomState(0).randint(0, inputs.shape[0], (1, 2, 8))
  chosen = inputs[np.unique(index)]
  np.testing.assert_allclose(one['nonzero_inputs'],
                             (chosen != 0).any(axis=-1).mean(axis=0))


@pytest.mark.exhaustive
def test_estimate_trained_scores_a_runs_checkpoint_as_the_run_did(tmp_path):
  """Restored from the run's workdir, batch statistics and the running average score the
  whole validation split as the run's own last evaluation did; each estimate is drawn
  and scored; the JSON names the run, not its path."""
  run_dir, logged = _tiny_bn_lstm_run(tmp_path)
  assert logged['step'] == 4
  trained_runs.estimate_trained(str(run_dir), str(tmp_path / 'out'), draws=2,
                       settings=((2, 8), (1, 16)))
  saved = _read_json(tmp_path / 'out', 'estimate_trained_bn_lstm_s0')
  assert saved['step'] == 4 and saved['run'] == 'campaign/bn_lstm_s0'
  assert saved['valid_examples'] == logged['count']
  assert saved['batch_statistics'] == pytest.approx(logged['accuracy_batch'], abs=1e-4)
  assert saved['running_average'] == pytest.approx(logged['accuracy'], abs=1e-4)
  assert set(saved['estimates']) == {'2 x 8', '1 x 16'}
  for scores in saved['estimates'].values():
    assert len(scores) == 2
    for value in scores:
      count = saved['valid_examples'] * value
      assert 0.0 <= value <= 1.0 and abs(count - round(count)) < 1e-2
  assert str(tmp_path) not in json.dumps(saved) and saved['machine']['cores'] >= 1
  assert trained_runs.estimate_trained(str(run_dir), str(tmp_path / 'out'), step=2, draws=1,
                              settings=((1, 8),))['step'] == 2


def _tree(folder) -> dict:
  """Every folder and file under `folder`: a file's SHA-256, None for a folder."""
  out = {}
  for root, dirs, files in os.walk(folder):
    for name in dirs:
      out[os.path.relpath(os.path.join(root, name), folder)] = None
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), folder)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def test_estimate_trained_reads_a_run_without_writing_in_it(tmp_path, caplog):
  """A mistyped step is one line naming the steps there are; a run whose checkpoints/
  are all damaged, or gone, is scored from its intact best/; the run's folder is left
  byte for byte as it was."""
  config = training.mnist_config(None, hidden_size=4, batch_size=8, eval_examples=16,
                               population_batches=3, variant='bn_lstm',
                               initial_state='noise')
  config.train.num_steps = 4
  config.eval.every = config.checkpoint.every = 2
  config.eval.test_at_end = False
  run_dir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, run_dir)
  best, = os.listdir(os.path.join(run_dir, 'best'))
  with pytest.raises(ValueError) as error:
    trained_runs.restore(run_dir, step=3)
  assert helpers.one_line(error) == (
      f'{run_dir} has no checkpoint of step 3 (--step): checkpoints/ holds steps [2, 4], '
      f'best/ holds [{best}].')
  for step in ('2', '4'):   # every latest checkpoint damaged: empty folders
    shutil.rmtree(os.path.join(run_dir, 'checkpoints', step))
    os.makedirs(os.path.join(run_dir, 'checkpoints', step))
  before = _tree(run_dir)
  with caplog.at_level(logging.WARNING):
    assert trained_runs.restore(run_dir)[2] == int(best)
  assert 'Trying the best checkpoint' in caplog.text
  assert _tree(run_dir) == before
  shutil.rmtree(os.path.join(run_dir, 'checkpoints'))
  before = _tree(run_dir)
  assert trained_runs.restore(run_dir)[2] == int(best)
  assert trained_runs.restore(run_dir, step=int(best))[2] == int(best)
  assert _tree(run_dir) == before


def test_estimate_trained_without_matplotlib_refuses_before_the_work(tmp_path, monkeypatch):
  """The missing package is named before the run is read (here: there is none, which
  the work would have found first)."""
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  with pytest.raises(extras.MissingExtra, match="needs matplotlib \\(the 'plot' extra\\)"):
    trained_runs.estimate_trained(str(tmp_path / 'no_run'), str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_estimate_trained_names_a_workdir_without_a_run(tmp_path):
  result = helpers.run_python(['-m', 'experiments.analysis.estimate_trained',
                               f'--workdir={tmp_path}', f'--output_dir={tmp_path}'],
                              one_device=True)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: {tmp_path} holds no run (no config.json).')


# ------------------------------------------------------------- variable lengths (item 3)

def test_bucketed_batches_hold_one_length():
  rng = np.random.default_rng(0)
  _, mask, _ = sign_task.batch(rng, 16, (5, 50), 50, bucketed=True)
  assert len({int(n) for n in mask.sum(1)}) == 1
  _, mask, labels = sign_task.batch(rng, 256, (5, 50), 50)
  assert len({int(n) for n in mask.sum(1)}) > 1 and set(labels.tolist()) == {0, 1}


@pytest.mark.exhaustive
def test_variable_length_pairs_each_arm_with_the_lstm_trained_alike(tmp_path):
  arms = ['lstm, bucketed', 'bn_lstm, bucketed']
  result = length_studies.variable_length(steps=2, seeds=2, estimate_batches=1, arms=arms,
                                          output_dir=str(tmp_path))
  assert list(result['accuracy']) == arms and list(result['against_lstm']) == arms[1:]
  for length_range, paired in result['against_lstm'][arms[1]].items():
    d = np.array([result['accuracy'][arms[1]][s][length_range]
                  - result['accuracy'][arms[0]][s][length_range] for s in ('0', '1')])
    assert paired['mean'] == pytest.approx(d.mean())
    assert paired['se'] == pytest.approx(np.std(d, ddof=1) / np.sqrt(2))
    assert paired['wins'] == int(np.sum(d >= 0)) and paired['seeds'] == 2
  text = length_studies.variable_length_table(result)
  assert 'bn_lstm, bucketed' in text and 'nan' not in text
  with pytest.raises(ValueError, match='Unknown arm'):
    length_studies.variable_length(steps=1, seeds=1, estimate_batches=1, arms=['gru'],
                                   output_dir=str(tmp_path))


def test_variable_length_cause_pairs_each_statistics_with_the_lstm_of_its_seed():
  ranges = ('5-50', '51-100', '101-200')
  def scores(base):
    return {r: base + 0.01 * i for i, r in enumerate(ranges)}
  runs = {'1000': {
      'lstm': {s: {'accuracy': {'none': scores(0.9 - 0.1 * int(s))}} for s in '01'},
      'bn_lstm': {s: {'accuracy': {'steady tail': scores(0.8 + 0.2 * int(s)),
                                   'test lengths': scores(0.7)}} for s in '01'},
      'ln_lstm': {s: {'accuracy': {'none': scores(0.95)}} for s in '01'}}}
  summary = length_cause.summary(runs)['1000']
  assert list(summary['accuracy']) == ['lstm', 'bn_lstm, steady tail',
                                       'bn_lstm, test lengths', 'ln_lstm']
  paired = summary['against_lstm']
  tail = paired['bn_lstm, steady tail']['5-50']
  d = np.array([0.8 - 0.9, 1.0 - 0.8])            # seed 0 below its LSTM, seed 1 above
  assert tail['mean'] == pytest.approx(d.mean())
  assert tail['se'] == pytest.approx(np.std(d, ddof=1) / np.sqrt(2))
  assert tail['wins'] == 1 and paired['bn_lstm, test lengths']['5-50']['wins'] == 0
  assert summary['accuracy']['bn_lstm, steady tail']['5-50']['mean'] == pytest.approx(0.9)
  assert paired['ln_lstm']['5-50']['wins'] == 2   # an arm without statistics is paired too
  assert 'lstm' not in paired                     # the LSTM is not paired with itself


@pytest.mark.slow
def test_variable_length_cause_long_copy_reads_the_default_statistics():
  """The T_max = 200 copy with `_steady_tail_rows` computes what the T_max = 50 model
  computes with its own statistics past T_max: the hybrids differ from the default only
  by the site they take from the test-length estimate."""
  model, variables, rng = sign_task.train_arm('bn_lstm', {}, 0, 0, 32, 16)
  stats = br.estimate_population_stats(
      model, variables, [sign_task.batch(rng, 16, (5, 50), 50)[:2]] * 2)
  long_model = sign_task.classifier('bn_lstm', 32, 200)
  layer = stats['rnn']['layer_0']
  tails = {'rnn': {'layer_0': {s: length_cause.steady_tail_rows(
      layer[s], normalization.DEFAULT_MIN_ROW_SUPPORT, 200) for s in layer}}}
  x, mask, _ = sign_task.batch(rng, 32, (101, 200), 200)
  mode = dict(use_running_average=True, deterministic=True)
  np.testing.assert_array_equal(
      model.apply({**variables, 'batch_stats': stats}, x, mask, **mode),
      long_model.apply({'params': variables['params'], 'batch_stats': tails}, x, mask,
                       **mode))
  hybrids = length_cause.site_hybrids(stats, tails, 0.05)
  assert list(hybrids) == [f'test lengths, {s} only' for s in length_cause.SITES]


@pytest.mark.exhaustive
def test_variable_length_cause_end_to_end(tmp_path):
  answer = lambda question: length_cause.answer(question, steps=[2], seeds=1,
                                                estimate_batches=1, output_dir=str(tmp_path))
  result = answer('variable_length_cause')
  assert list(result['runs']['2']) == list(length_cause.get('variable_length_cause').arms)
  bn = result['runs']['2']['bn_lstm']['0']
  assert set(bn['accuracy']) == set(length_cause.STATISTICS)
  cell_ln = result['runs']['2']['bn_lstm, cell layer norm']['0']
  assert set(cell_ln['accuracy']) == {'steady tail', 'test lengths'}
  assert 'cell' not in cell_ln['var_by_row']      # c_t is layer-normalised: no statistics
  assert set(result['runs']['2']['ln_lstm']['0']['accuracy']) == {'none'}
  gamma = answer('variable_length_gamma')
  assert list(gamma['runs']['2']) == list(length_cause.get('variable_length_gamma').arms)
  assert gamma['runs']['2']['lstm'] == result['runs']['2']['lstm']   # the same LSTM
  assert gamma['command'].endswith('--question=variable_length_gamma')
  rate = answer('variable_length_rate')
  assert rate['runs']['2']['lstm'] == result['runs']['2']['lstm']
  assert rate['runs']['2']['lstm, adam 3e-2'] != result['runs']['2']['lstm']
  assert gamma['setup']['optimizer'] == 'adam 3e-3, clip 1'
  assert rate['setup']['optimizer'] == "adam at each arm's learning rate, clip 1"
  shared = answer('variable_length_shared')
  one_row = shared['runs']['2']['bn_lstm_shared']['0']
  assert {len(v) for v in one_row['var_by_row_test_lengths'].values()} == {1}
  assert one_row['growth_by_row_test_lengths'] == {}   # no rows to grow along
  assert len(bn['var_by_row']['cell']) == sign_task.TRAIN_LENGTHS[1]
  assert len(bn['var_by_row_test_lengths']['cell']) == length_cause.LONG_MAX
  growth = bn['growth_by_row_test_lengths']['cell']
  assert growth[length_cause.REFERENCE_ROW] == pytest.approx(1.0, rel=1e-3)
  text = length_cause.table(result)
  assert 'bn_lstm, test lengths' in text and 'nan' not in text
  for question in ('variable_length_cause', 'variable_length_rate'):   # those with a figure
    assert (tmp_path / f'{question}.png').stat().st_size > 0
  assert not (tmp_path / 'variable_length_gamma.png').exists()
