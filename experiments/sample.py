r"""Sample text from a trained character language model, one step at a time.

  python -m experiments.sample --workdir RUN --length 400 --temperature 0.8 --seed 0

`RUN` is a workdir of `experiments/main.py --config experiments/configs/ptb_char.py` (or
any language-model run on characters). The model is its best checkpoint
(`--checkpoint=latest` for the newest) with the population statistics the run
evaluates with (`experiments/export_run.py`'s `load_run`): step t of a sample is
normalised with row `min(t, last trained row)` (`LanguageModel.step`), so samples may be
longer than the training sequences. The prompt (`--prompt`, default a line end: the
start of a sentence) is read whole, then every symbol is drawn from
softmax(logits / temperature) and fed back, inside one compiled `lax.scan`.
PTB's symbols print as text: '_' (a space between words) as ' '.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bn_rnn_jax import extras

with extras.needed_by('experiments/sample.py', exit=True):
  from absl import app
  from absl import flags

  from bn_rnn_jax.training import checkpoint as checkpoint_lib
  from experiments import export_run as export_command

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'A character language-model run folder.')
flags.DEFINE_enum('checkpoint', 'best', ['best', 'latest'], 'Which checkpoint to load.')
flags.DEFINE_integer('length', 300, 'Symbols to draw after the prompt.')
flags.DEFINE_float('temperature', 1.0, 'Softmax temperature (> 0; lower is more likely text).')
flags.DEFINE_integer('seed', 0, 'Random seed of the draws.')
flags.DEFINE_integer('num_samples', 1, 'Samples drawn at once (rows of one batch).')
flags.DEFINE_string('prompt', '\n', "Text to start from ('\\n': a new sentence).")


def encode(text: str, vocab: list[str]) -> np.ndarray:
  """PTB character ids of `text` (spaces as '_'); unknown symbols are a one-line error."""
  symbols = ['_' if c == ' ' else c for c in text]
  index = {s: i for i, s in enumerate(vocab)}
  unknown = sorted({s for s in symbols if s not in index})
  if unknown:
    raise ValueError(f'--prompt has symbols outside the model\'s {len(vocab)}: {unknown}.')
  return np.asarray([index[s] for s in symbols], np.int32)


def decode(ids, vocab: list[str]) -> str:
  return ''.join(vocab[i] for i in ids).replace('_', ' ')


@functools.partial(jax.jit, static_argnums=(0, 4))
def sample(model, variables, prompt, key, length: int, temperature):
  """`[num_samples, length]` ids drawn after `prompt [num_samples, P]`.

  The prompt runs as one sequence (steps 0..P-1); each drawn symbol is then fed to
  `LanguageModel.step` at t = P, P+1, ... (traced t: one program for every step).
  """
  carries, logits = model.apply(variables, prompt, None, use_running_average=True,
                                deterministic=True, return_carry=True)
  start = prompt.shape[1]

  def draw(carry, t):
    carries, logits, key = carry
    key, subkey = jax.random.split(key)
    token = jax.random.categorical(subkey, logits / temperature).astype(jnp.int32)
    carries, logits = model.apply(variables, carries, token, t, method='step')
    return (carries, logits, key), token

  _, tokens = jax.lax.scan(draw, (carries, logits[:, -1], key),
                           start + jnp.arange(length))
  return tokens.T


def check_temperature(temperature: float) -> None:
  """The sampler divides float32 logits by the temperature: it must be a normal float32."""
  with np.errstate(over='ignore'):
    value = np.float32(temperature)
  tiny, huge = np.finfo(np.float32).tiny, np.finfo(np.float32).max
  if not (np.isfinite(value) and value >= tiny):
    raise ValueError(f'--temperature={temperature!r} is not a normal float32 (the sampler '
                     f'divides float32 logits by it); use a value in [{tiny:.3g}, {huge:.3g}].')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  checkpoint_lib.quiet_orbax_logs()
  try:
    if FLAGS.temperature <= 0 or FLAGS.length <= 0 or FLAGS.num_samples <= 0:
      raise ValueError(f'--temperature ({FLAGS.temperature}), --length ({FLAGS.length}) and '
                       f'--num_samples ({FLAGS.num_samples}) must be positive.')
    check_temperature(FLAGS.temperature)
    run = export_command.load_run(FLAGS.workdir, FLAGS.checkpoint)
    dataset = run.trainer.dataset
    if dataset.task != 'language_model' or not hasattr(dataset, 'vocab'):
      raise ValueError(f'{FLAGS.workdir} is a {dataset.task!r} run, not a language model.')
    prompt = encode(FLAGS.prompt, dataset.vocab)
    if prompt.size == 0:
      raise ValueError('--prompt is empty; give at least one symbol (e.g. a line end).')
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  prompt = np.broadcast_to(prompt, (FLAGS.num_samples, prompt.size))
  tokens = sample(run.model, run.variables, prompt, jax.random.key(FLAGS.seed),
                  FLAGS.length, FLAGS.temperature)
  for row in np.asarray(tokens):
    print(decode(list(prompt[0]) + list(row), dataset.vocab))


if __name__ == '__main__':
  flags.mark_flags_as_required(['workdir'])
  app.run(main)
