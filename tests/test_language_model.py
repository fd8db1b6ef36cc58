"""Language models trained end to end on fixture text (Cooijmans et al. sec. 5.2-5.3
character models; Zaremba et al.'s word model with its carried state), and the word-PTB
report. The model's numerics are in `test_models.py`, the loss sums in `test_tasks.py`.
"""

import math

import jax
import numpy as np
import pytest

from bn_rnn_jax.training import metric_writer
from bn_rnn_jax.training import loop
import training_fixtures as fx

# Every test here trains or runs a command end to end.
pytestmark = pytest.mark.slow


@pytest.mark.exhaustive  # the trainer's language-model path: the next test
def test_tiny_character_model_learns(tmp_path):
  """A 16-unit BN-LSTM on fixture text: training loss and validation bpc fall fast."""
  config = fx.tiny_text_config(fx.load_config('ptb_char', 'bn_lstm'),
                              fx.write_ptb_fixture(tmp_path), 16, 20)
  config.optimizer.learning_rate = 1e-2
  config.train.num_steps = 100
  config.train.log_every = 20
  config.eval.every = 100
  config.checkpoint.every = 100
  config.checkpoint.best_metric = 'valid/bpc'
  last = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  records = metric_writer.read_metrics(str(tmp_path / 'run'))
  losses = [r['loss'] for r in records if r['split'] == 'train']
  symbols = 1 + len(set(''.join(fx.WORDS))) + 1           # letters, '_' and '\n'
  # Uniform guessing is log2(V) bits; a model of the word list needs well under 3 bits.
  assert losses[0] > 2.0 and losses[-1] < 0.6 * losses[0], losses
  assert last['valid']['bpc'] < math.log2(symbols) - 1.5, last['valid']


def test_trainer_carries_word_state_across_steps_and_resets_each_epoch(tmp_path):
  """Zaremba's carried state: the state after step k starts step k+1; epoch starts reset."""
  folder = fx.write_ptb_fixture(tmp_path, lines=(24, 6, 6))
  config = fx.tiny_text_config(fx.load_config('ptb_word', 'small'), folder, 4, 5, hidden=8)
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
      {'params': params}, batch['inputs'], batch['mask'], use_running_average=False,
      deterministic=False, initial_carries=carries, return_carry=True)[0])
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


