r"""The authors' initialisation choices as options: 14x14 sequential MNIST, same budget.

Cooijmans et al.'s released code (sequential_mnist.py) differs from our `seq_mnist.py`
in two places the paper does not settle:
  * the forget-gate bias starts at 1 (ours: 0, `config.model.forget_bias`);
  * W_h is the identity on the candidate block only, the f, i, o blocks orthogonal
    (`recurrent_init='identity_candidate'`); ours tiles the identity over all four blocks
    (`'identity'`).
(Its permuted MNIST drew the pixel order with replacement; ours is a true permutation.)
This script trains each variant with each of the four combinations (OPTIONS below) on
the quickstart's 14x14 MNIST setup (`experiments/configs/quickstart.py` with
`data.name='mnist'`: 196 steps, 100 units, batch 64, RMSProp 1e-3), all with the same
seed, data order and budget, and writes the validation accuracy (papers' population
estimate) every `--eval_every` steps to `--output`:

  python experiments/init_options.py --workdir=/tmp/runs/init_options \
      --output=experiments/results/init_options.json
  python experiments/report.py init_options      # the README table

Runs live in `<workdir>/<variant>/<option>` and resume; a second call only re-reads them.
The JSON holds no paths of this machine.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bn_rnn_jax import checkpoint
from bn_rnn_jax import metric_writer
from bn_rnn_jax import loop

# report.py sits beside this file (importable however this script is started).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # pylint: disable=g-import-not-at-top,wrong-import-position

_HERE = os.path.dirname(os.path.abspath(__file__))
config_flags.DEFINE_config_file('config', os.path.join(_HERE, 'configs', 'quickstart.py'),
                                'Base config (quickstart: 14x14 MNIST with data.name=mnist).')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/runs/init_options', 'Runs go here.')
_OUTPUT = flags.DEFINE_string('output', 'experiments/results/init_options.json',
                              'JSON written at the end.')
_VARIANTS = flags.DEFINE_list('variants', ['lstm', 'bn_lstm'], 'Variants compared.')
_OPTIONS = flags.DEFINE_list('options', ['ours', 'forget_bias_1', 'identity_candidate',
                                         'authors'], 'Names in OPTIONS.')
_STEPS = flags.DEFINE_integer('num_steps', 600, 'Training steps of every run.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 100, 'Validation every this many steps.')

# name -> (config.model overrides, what it is).
OPTIONS = {
    'ours': (dict(forget_bias=0.0, recurrent_init='identity'),
             'forget bias 0, W_h identity on all four gate blocks (seq_mnist.py)'),
    'forget_bias_1': (dict(forget_bias=1.0, recurrent_init='identity'),
                      'forget bias 1, W_h identity on all four gate blocks'),
    'identity_candidate': (dict(forget_bias=0.0, recurrent_init='identity_candidate'),
                           'forget bias 0, W_h identity on g only, f/i/o orthogonal'),
    'authors': (dict(forget_bias=1.0, recurrent_init='identity_candidate'),
                "forget bias 1, W_h identity on g only (the authors' code)"),
}


def run_config(base, variant: str, option: str, num_steps: int, eval_every: int):
  """The base config with `data.name='mnist'`, this variant, option and budget."""
  if option not in OPTIONS:
    raise ValueError(f'Unknown option {option!r}; have {sorted(OPTIONS)}.')
  config = base.copy_and_resolve_references()
  config.data.name = 'mnist'
  config.model.variant = variant
  for key, value in OPTIONS[option][0].items():
    config.model[key] = value
  config.train.num_steps = num_steps
  config.eval.every = eval_every
  config.checkpoint.every = num_steps
  return config


def summarize(workdir: str) -> dict:
  """Validation records `[{'step', 'accuracy', 'loss'}]`, the last logged training window
  and the wall time, from `workdir/metrics.jsonl`."""
  records = metric_writer.read_metrics(workdir)
  valid = [{k: r[k] for k in ('step', 'accuracy', 'loss')} for r in records
           if r['split'] == 'valid']
  train_records = [r for r in records if r['split'] == 'train']
  if not valid or not train_records:
    raise ValueError(f'{workdir}/metrics.jsonl has no validation or training records.')
  last = train_records[-1]
  return {'valid': valid, 'train_accuracy_last_window': last['accuracy'],
          'train_loss_last_window': last['loss'], 'wall_time_s': last.get('time_s')}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  checkpoint.quiet_orbax_logs()
  base = flags.FLAGS.config
  runs = {}
  for variant in _VARIANTS.value:
    runs[variant] = {}
    for option in _OPTIONS.value:
      config = run_config(base, variant, option, _STEPS.value, _EVAL_EVERY.value)
      workdir = os.path.join(_WORKDIR.value, variant, option)
      logging.info('Training %s / %s in %s', variant, option, workdir)
      loop.train_and_evaluate(config, workdir)
      runs[variant][option] = summarize(workdir)
  c = run_config(base, _VARIANTS.value[0], _OPTIONS.value[0], _STEPS.value,
                 _EVAL_EVERY.value)
  valid_images = (c.eval.max_batches * c.eval.batch_size if c.eval.max_batches
                  else c.data.num_valid)
  result = {
      'setup': (f'14x14 sequential MNIST ({c.data.resolution ** 2} steps), '
                f'{c.model.hidden_size} units, batch {c.train.batch_size}, '
                f'{c.optimizer.name} lr {c.optimizer.learning_rate:g} momentum '
                f'{c.optimizer.momentum:g}, clip {c.optimizer.clip_norm:g}, h0 noise '
                f'{c.model.initial_state_noise:g}, gamma {c.model.gamma_init:g}, seed '
                f'{c.seed}; {_STEPS.value} steps; validation accuracy on the first '
                f'{valid_images} of the {c.data.num_valid} validation images with the '
                f"papers' population estimate ({c.eval.population_batches} training "
                'batches)'),
      'command': report.command_line('experiments/init_options.py', sys.argv[1:]),
      'options': {name: {**OPTIONS[name][0], 'description': OPTIONS[name][1]}
                  for name in _OPTIONS.value},
      'runs': runs,
  }
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  with open(_OUTPUT.value, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(f'Wrote {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
