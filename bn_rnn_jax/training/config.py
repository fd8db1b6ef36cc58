"""The fields every run has, and their checks. Imports only ml_collections.

`experiments/configs/*.py` start from `default_config()`, set a paper's values and add
their dataset's `config.data`; a field left at None takes the default of the model, layer
or variant it configures. `parse_arg` reads a config file's argument (`ptb_char.py:bn_lstm,tiny`).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from bn_rnn_jax import extras

with extras.needed_by(__name__):
  import ml_collections

PARALLEL_BACKENDS = ('pmap', 'shard_map')
#: What an evaluation normalises with: the papers' population estimate, the running
#: average, or each evaluation batch's own moments (the curves Cooijmans et al. plot).
EVAL_STATISTICS = ('estimate', 'running', 'batch')

#: `config.model` fields that are `RecurrentLayer` fields, passed to every layer of the
#: model (None = the variant's or the layer's default), and the `policy.Execution`
#: settings, which `train.layer_fields` passes as the layers' one `execution`.
#: `max_length` is resolved against the training length by the trainer.
LAYER_FIELDS = ('statistics', 'recurrent_init', 'input_init', 'initial_state',
                'initial_state_noise', 'gamma_init', 'momentum', 'epsilon', 'forget_bias',
                'min_step_count', 'min_row_support',
                'padded_statistics', 'unroll', 'remat', 'backward',
                'hoist_input', 'batch_sums', 'fused_step', 'block_h', 'num_warps')

_placeholder = ml_collections.config_dict.placeholder


def default_config() -> ml_collections.ConfigDict:
  """The fields every run has, each with its default and meaning."""
  config = ml_collections.ConfigDict()
  config.seed = 0                # every random stream of the run derives from it
  config.data = ml_collections.ConfigDict({'name': 'mnist'})  # the dataset's own fields

  config.model = m = ml_collections.ConfigDict()
  m.variant = 'bn_lstm'          # a name in variants.VARIANTS (models.READER_VARIANTS for
                                 # the attentive reader)
  m.hidden_size = 100            # units per layer (per direction)
  m.num_layers = 1               # recurrent layers in the stack
  m.dropout_rate = 0.0           # between layers, before the first and after the last
  m.bidirectional = _placeholder(bool)       # None = the model's default (tagger: True)
  m.embed_size = _placeholder(int)           # token models: None = one-hot (LM) or the
                                             # model's default
  m.input_projection = _placeholder(int)     # tagger on frames: a Dense before the stack
  m.kernel_init = _placeholder(str)          # tagger: 'lecun_normal' | 'glorot_uniform'
  m.uniform_init_scale = _placeholder(float)  # every parameter but the normalisations'
                                             # ~ U(-s, s) (Zaremba et al.)
  m.dtype = 'float32'            # matmul compute dtype ('bfloat16'); statistics stay float32
  # RecurrentLayer fields (see its docstring); None = the variant's or the layer's default.
  m.max_length = _placeholder(int)           # T_max; None = the training length
  m.statistics = _placeholder(str)           # 'per_step' | 'sequence' | 'shared'; None =
                                             # the variant's (batch_stats.STATISTICS)
  m.recurrent_init = 'orthogonal'  # W_h per gate block: 'orthogonal' | 'identity' |
                                 # 'identity_candidate' (identity on g only) |
                                 # 'glorot_uniform'
  m.input_init = 'orthogonal'    # W_x: 'orthogonal' | 'glorot_uniform'
  m.initial_state = 'zeros'      # h0, c0: 'zeros' | 'learned' | 'noise' (Gaussian h0 in
                                 # training, zeros in evaluation)
  m.initial_state_noise = 0.1    # std of the h0 noise (initial_state='noise')
  m.gamma_init = _placeholder(float)         # None = the variant's (0.1 BN, 1.0 LN)
  m.momentum = 0.99              # running-average momentum of the population statistics
  m.epsilon = 1e-5               # variance epsilon of every normalisation
  m.forget_bias = 0.0            # initial bias of the forget-gate block
  m.min_row_support = _placeholder(float)  # inference: rows less supported are the
                                 # steady state; 0 = every row; None = the layer's default
  m.min_step_count = 1           # per-step moments need this many valid sequences; fewer:
                                 # that step uses the population rows
  m.padded_statistics = False    # count padding in batch moments (Cooijmans' reader)
  m.unroll = 1                   # lax.scan unroll
  m.remat = 'auto'               # 'auto' | 'none' | 'dots' | 'full' (policy.py)
  m.backward = 'auto'            # 'auto' | 'scan' | 'layer' (policy.py)
  m.hoist_input = _placeholder(bool)         # None = the backend's choice (policy.py)
  m.batch_sums = 'auto'          # 'auto' | 'reduce' | 'contraction' (policy.py)
  m.fused_step = 'none'          # 'none' | 'xla' | 'pallas' | 'persistent' (policy.py)
  m.block_h = _placeholder(int)  # Pallas: hidden units per program (None = the layout's)
  m.num_warps = 8                # Pallas: warps per program on GPUs

  config.optimizer = o = ml_collections.ConfigDict()
  o.name = 'rmsprop'             # 'rmsprop' | 'adam' | 'sgd'
  o.learning_rate = 1e-3         # initial learning rate (see `schedule`)
  o.momentum = 0.9               # rmsprop / sgd (0 = none)
  o.decay = 0.9                  # rmsprop's squared-gradient average
  o.eps = 1e-8                   # rmsprop / adam denominator epsilon
  o.centered = False             # rmsprop
  o.b1 = 0.9                     # adam
  o.b2 = 0.999                   # adam
  o.clip_norm = _placeholder(float)  # global-norm gradient clipping; None = off
  o.schedule = 'constant'        # 'constant' | 'step_decay' (Zaremba et al.)
  o.decay_rate = 0.5             # step_decay: factor per epoch once decaying
  o.decay_after_epochs = 4       # step_decay: epochs at the initial rate

  config.train = t = ml_collections.ConfigDict()
  t.batch_size = 100             # global batch (all devices of all processes)
  t.num_steps = 1000             # training steps of the whole run (over all launches)
  t.log_every = 50               # training metrics averaged over this many steps
  t.num_devices = _placeholder(int)  # local devices to use; None = all
  # Wall-clock seconds for one launch; None = no limit. Once spent, the run stops at the
  # next checkpoint save and returns; a launch on the same workdir continues from it.
  t.time_budget_s = _placeholder(float)
  # A launch on a workdir whose run was started with other values of fields that change
  # what it computes (data, model, optimizer, batch, seed) is refused unless this is True;
  # the change is then recorded in <workdir>/config_changes.jsonl (bn_rnn_jax.training.workdir).
  t.allow_config_change = False
  # Donate the state to the train step: XLA may write the new state into the old one's
  # buffers instead of new ones (what that saves: docs/speed.md). The loop then keeps its
  # last checked state (where a replay after a non-finite step starts) as a device copy
  # made at each metrics fetch. False: no donation, no copy (the input state stays
  # readable).
  t.donate_state = True

  config.eval = e = ml_collections.ConfigDict()
  e.every = 500                  # steps between evaluations (and at the last step)
  e.batch_size = 500             # global evaluation batch (the last one is padded)
  e.splits = ('valid',)          # evaluated every `every` steps
  e.max_batches = _placeholder(int)  # periodic evaluations read at most this many
                                 # batches; None = all (the test at the end reads all)
  e.test_at_end = True           # test the best-validation checkpoint at the end
  e.population_stats = 'estimate'    # 'estimate' (the papers') | 'running' (the EMA) |
                                 # 'batch' (each eval batch's own moments, no noise)
  e.population_batches = 10      # estimate batches
  # Examples per estimate batch; None = the training batch (the papers'). A multiple k of
  # train.batch_size joins k consecutive training batches into one: the moments of later
  # sites (the cell, upper layers) then match the population-mode network better.
  e.population_batch_size = _placeholder(int)
  e.compare = ()                 # other statistics to evaluate with too, each logged as
                                 # `<metric>_<kind>`, e.g. ('batch',) -> accuracy_batch

  config.checkpoint = c = ml_collections.ConfigDict()
  c.every = 500                  # steps between saves (and at the last step)
  c.keep = 2                     # latest checkpoints kept (the best is kept apart)
  c.best_metric = 'valid/accuracy'   # 'split/metric' that picks the best checkpoint
  c.best_mode = 'max'            # 'max' | 'min'

  config.parallel = ml_collections.ConfigDict()
  config.parallel.backend = 'pmap'   # 'pmap' | 'shard_map' (jit of shard_map over a Mesh)

  config.distributed = d = ml_collections.ConfigDict()
  d.enabled = False              # call jax.distributed.initialize() (multi-host)
  d.coordinator_address = ''     # '' = auto-detect (SLURM, TPU pods, ...)
  d.num_processes = _placeholder(int)    # None = auto-detect
  d.process_id = _placeholder(int)       # None = auto-detect
  d.heartbeat_timeout_s = 100    # a process silent this long is lost: the others stop
  d.init_timeout_s = 120         # processes not all started by then: each ends with one
                                 # line (exit status 1)
  return config


# ====================================================================== config files
def parse_arg(arg: str, file: str, choices: Sequence[str] = (), kind: str = 'variant',
              presets: Sequence[str] = ('tiny',)) -> tuple[Optional[str], set[str]]:
  """A config file's argument (`<file>:<arg>`): at most one of `choices` (a variant, a
  size) and any of `presets`, comma-separated, in any order (`'bn_lstm,tiny'`).

  Returns `(the choice or None, the presets named)`. Anything else is a one-line
  ValueError naming the file and what its argument accepts.
  """
  tokens = [t.strip() for t in arg.split(',') if t.strip()] if arg else []
  named = [t for t in tokens if t in choices]
  unknown = [t for t in tokens if t not in choices and t not in presets]
  if unknown or len(named) > 1:
    accepts = (f'{kind} must be one of {tuple(choices)}, presets are {tuple(presets)}'
               if choices else f'it takes only the presets {tuple(presets)}')
    problem = (f'{unknown[0]!r} is no {kind} and no preset' if choices else
               f'{unknown[0]!r} is no preset') if unknown else f'it names two {kind}s'
    hint = '' if choices else '; set other fields with --config.<field>=<value>'
    raise ValueError(f'{file}:{arg}: {problem}; {accepts}{hint}.')
  return (named[0] if named else None), set(tokens) - set(named)


def apply_tiny(config: ml_collections.ConfigDict) -> None:
  """The fields every config's `tiny` preset shares: four steps of an 8-unit model, an
  evaluation of two batches at the end with the population estimate from one batch, one
  checkpoint. The files add what their data and model need to run in seconds."""
  config.model.hidden_size = 8
  config.train.num_steps = 4
  config.train.log_every = 2
  config.eval.every = 4
  config.eval.max_batches = 2
  config.eval.population_batches = 1
  config.eval.population_batch_size = None
  config.checkpoint.every = 4
  config.checkpoint.keep = 1


# ====================================================================== checks
def validate_config(config: ml_collections.ConfigDict) -> None:
  """One clear line per bad value, before anything is built."""
  positive = {
      'config.model.hidden_size': config.model.hidden_size,
      'config.model.num_layers': config.model.num_layers,
      'config.train.batch_size': config.train.batch_size,
      'config.train.num_steps': config.train.num_steps,
      'config.train.log_every': config.train.log_every,
      'config.eval.batch_size': config.eval.batch_size,
      'config.eval.every': config.eval.every,
      'config.checkpoint.every': config.checkpoint.every,
      'config.checkpoint.keep': config.checkpoint.keep,
  }
  for name, value in positive.items():
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f'{name} must be a positive integer; got {value!r}.')
  optional_positive = {
      'config.model.max_length': config.model.max_length,
      'config.train.num_devices': config.train.num_devices,
      'config.eval.max_batches': config.eval.max_batches,
      'config.distributed.init_timeout_s': config.distributed.get('init_timeout_s'),
  }
  for name, value in optional_positive.items():
    if value is not None and (not isinstance(value, int) or value <= 0):
      raise ValueError(f'{name} must be None (the default) or a positive integer; got '
                       f'{value!r}.')
  if config.parallel.backend not in PARALLEL_BACKENDS:
    raise ValueError(f'config.parallel.backend must be one of {PARALLEL_BACKENDS}; got '
                     f'{config.parallel.backend!r}.')
  if config.eval.population_stats not in EVAL_STATISTICS:
    raise ValueError(f'config.eval.population_stats must be one of {EVAL_STATISTICS}; got '
                     f'{config.eval.population_stats!r}.')
  compare = config.eval.compare
  if (not isinstance(compare, (tuple, list)) or any(k not in EVAL_STATISTICS for k in compare)
      or config.eval.population_stats in compare):
    raise ValueError(f'config.eval.compare must be a tuple of statistics from '
                     f'{EVAL_STATISTICS} other than config.eval.population_stats='
                     f'{config.eval.population_stats!r}; got {compare!r}.')
  size = config.eval.population_batch_size
  if size is not None and (size <= 0 or size % config.train.batch_size):
    raise ValueError('config.eval.population_batch_size must be None (the training batch) '
                     f'or a multiple of config.train.batch_size={config.train.batch_size}; '
                     f'got {size}.')
  if ('estimate' in (config.eval.population_stats, *config.eval.compare)
      and config.eval.population_batches <= 0):
    raise ValueError('config.eval.population_batches must be positive with the '
                     f"'estimate' statistics; got {config.eval.population_batches}.")
  if config.checkpoint.best_mode not in ('max', 'min'):
    raise ValueError("config.checkpoint.best_mode must be 'max' or 'min'; got "
                     f'{config.checkpoint.best_mode!r}.')
  if config.checkpoint.best_metric.count('/') != 1:
    raise ValueError("config.checkpoint.best_metric must read 'split/metric' (e.g. "
                     f"'valid/accuracy'); got {config.checkpoint.best_metric!r}.")
  lr = config.optimizer.learning_rate
  if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
    raise ValueError(f'config.optimizer.learning_rate must be a positive finite number; '
                     f'got {lr!r}.')
  budget = config.train.get('time_budget_s')
  if budget is not None and (not isinstance(budget, (int, float)) or not math.isfinite(budget)
                             or budget <= 0):
    raise ValueError('config.train.time_budget_s must be None (no limit) or a positive '
                     f'number of seconds; got {budget!r}.')
  clip = config.optimizer.clip_norm
  if clip is not None and (not math.isfinite(clip) or clip <= 0):
    raise ValueError(f'config.optimizer.clip_norm must be None (off) or positive; got '
                     f'{clip!r}.')


def layer_fields(config: ml_collections.ConfigDict) -> dict:
  """The `RecurrentLayer` fields `config.model` sets (those not None), with `dtype`."""
  fields = {name: config.model[name] for name in LAYER_FIELDS
            if config.model.get(name) is not None}
  fields['dtype'] = config.model.dtype
  return fields
