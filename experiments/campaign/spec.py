"""What a campaign is: a config file, a grid of arms x seeds, the runs' environment, and
the tables and figure that its results JSON renders.

A spec module `experiments/campaign_specs/<name>.py` defines `get_campaign() -> Campaign`.
Every run of a campaign is `experiments/main.py --config <config>[:<arm.config_arg>]`
with, in this order, the campaign's `overrides`, the arm's `overrides`, `seed=<seed>` and
the command line's `--set key=value` pairs. Table and figure functions read the results
JSON only (`experiments/campaign/collect.py` writes it), so a table regenerates from a
committed JSON without the runs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
from typing import Any, Callable, Mapping, Optional, Sequence

import ml_collections

from experiments import config_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN = os.path.join('experiments', 'main.py')
RESULTS = os.path.join(ROOT, 'experiments', 'results')
# The environment of every run, recorded with its machine. What holds a run to one
# thread on a machine with a core per run is the runner's pinning (`runner.core_slots`):
# XLA's CPU client starts a thread per core the process may use, whatever these flags say.
ONE_THREAD = {'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'}

Table = Callable[[dict], str]


@dataclasses.dataclass(frozen=True)
class Arm:
  """One cell of the grid (trained once per seed).

  Attributes:
    config_arg: the config file's argument (`ptb_char.py:<config_arg>`), or None.
    overrides: config fields this arm sets, e.g. `{'model.variant': 'lstm'}`.
    label: the name tables and figures print.
    tags: what tables group by, e.g. `{'variant': 'lstm', 'option': 'ours'}`.
  """
  config_arg: Optional[str] = None
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  label: str = ''
  tags: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Speed:
  """An interleaved timing of some arms' training steps in one process.

  Attributes:
    name: the result is `experiments/results/<name>.json`.
    arms: the arms timed, the first being the reference of the ratios.
    overrides: fields set on each arm's config for the timing (the campaign's own
      `overrides` do not apply: a timing may use the config's full size).
    steps: timed steps per arm and round (the same batches in every round).
    rounds: interleaved rounds; tables use the medians over rounds.
    what: one line saying what a step is.
    tables: `{table name: function(speed JSON) -> text}`.
    expected: run time on stated hardware.
    batches: `(dataset, steps) -> host batches`; default the first `steps` training ones.
  """
  name: str
  arms: Sequence[str]
  steps: int
  rounds: int
  what: str
  tables: Mapping[str, Table]
  expected: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  batches: Optional[Callable[[Any, int], list]] = None


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run (or, for an evaluation campaign, one evaluation) of a campaign."""
  campaign: str
  arm: str
  seed: int

  @property
  def name(self) -> str:
    return f'{self.arm}_s{self.seed}'


@dataclasses.dataclass(frozen=True)
class Campaign:
  """A paper table or figure set: what to train, how, and how to show it.

  Attributes:
    name: the spec module's name; results go to `experiments/results/<name>.json`.
    title: one line saying what the campaign compares.
    config: the config file, relative to the repository root.
    arms: `{arm name: Arm}` in table order.
    tables: `{table name: function(results JSON) -> text}`.
    expected: run time on stated hardware (what `list` prints).
    seeds: the seeds every arm is trained with.
    overrides: config fields set on every run.
    env: environment variables of every run (e.g. single-threaded XLA).
    parallel: runs at a time by default.
    tiny: overrides of the tiny-budget mode (`run --tiny`: two steps, a small model).
    paper: the papers' numbers the tables print beside ours.
    figure: `function(results JSON, png path)`, drawn by `report`.
    baselines: `function(config) -> dict`, computed from the data by `collect`.
    setup: `function(config) -> str`, the one-line description `collect` stores.
    speed: the campaign's speed table, measured by `speed`.
    source: for an evaluation campaign, the campaign whose runs it evaluates (same arm and
      run names); the runner trains those runs first where they are not finished.
    evaluate: for an evaluation campaign, `function(source workdir, tiny) -> dict` (`tiny`:
      the tiny-budget mode's shorter evaluation).
  """
  name: str
  title: str
  config: str
  arms: Mapping[str, Arm]
  tables: Mapping[str, Table]
  expected: str
  seeds: Sequence[int] = (0,)
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(ONE_THREAD))
  parallel: int = 1
  tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  paper: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  figure: Optional[Callable[[dict, str], None]] = None
  baselines: Optional[Callable[[ml_collections.ConfigDict], dict]] = None
  setup: Optional[Callable[[ml_collections.ConfigDict], str]] = None
  speed: Optional[Speed] = None
  source: Optional[str] = None
  evaluate: Optional[Callable[[str, bool], dict]] = None

  @property
  def command(self) -> str:
    """The commands that make its results JSON (`speed` makes the speed JSON)."""
    prefix = 'python -m experiments.campaign'
    parallel = f' --parallel={self.parallel}' if self.parallel > 1 else ''
    return f'{prefix} run {self.name}{parallel} && {prefix} collect {self.name}'

  def runs(self, seeds: Optional[Sequence[int]] = None,
           arms: Optional[Sequence[str]] = None) -> list[Run]:
    """The grid, arm by arm (each arm's seeds side by side)."""
    arms = list(self.arms) if arms is None else list(arms)
    unknown = [a for a in arms if a not in self.arms]
    if unknown:
      raise ValueError(f'Campaign {self.name!r} has no arm(s) {unknown}; it has '
                       f'{list(self.arms)}.')
    seeds = self.seeds if seeds is None else seeds
    return [Run(self.name, arm, seed) for arm in arms for seed in seeds]

  def config_of(self, run: Run, extra: Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
    """The config `experiments/main.py` builds for `run` from `main_args`."""
    arm = self.arms[run.arm]
    config = config_files.load_config(self.config, arm.config_arg)
    for overrides in (self.overrides, arm.overrides, {'seed': run.seed}, dict(extra)):
      config_files.apply(config, overrides)
    return config

  def main_args(self, run: Run, workdir: str, extra: Mapping[str, Any] = ()) -> list[str]:
    """The arguments of `experiments/main.py` that train `run` in `workdir`."""
    arm = self.arms[run.arm]
    config = self.config + (f':{arm.config_arg}' if arm.config_arg else '')
    values = {**self.overrides, **arm.overrides, 'seed': run.seed, **dict(extra)}
    return [MAIN, f'--config={config}', f'--workdir={workdir}'] + [
        f'--config.{key}={config_files.flag_value(value)}' for key, value in values.items()]

  def describe(self) -> dict:
    """The spec as JSON: what the results JSON records under 'spec'."""
    out = {'title': self.title, 'config': self.config,
           'arms': {name: {k: v for k, v in dataclasses.asdict(arm).items() if v}
                    for name, arm in self.arms.items()},
           'seeds': list(self.seeds), 'overrides': dict(self.overrides),
           'env': dict(self.env), 'paper': dict(self.paper), 'expected': self.expected}
    if self.source:
      out['source'] = self.source
    return jsonable(out)


def jsonable(value):
  if isinstance(value, Mapping):
    return {str(k): jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(v) for v in value]
  return value


# ---------------------------------------------------------------------- registry
def get(name: str) -> Campaign:
  """The campaign of `experiments/campaign_specs/<name>.py`."""
  if name not in names():
    raise ValueError(f'Unknown campaign {name!r}; have {", ".join(names())}.')
  campaign = importlib.import_module(f'experiments.campaign_specs.{name}').get_campaign()
  if campaign.name != name:
    raise ValueError(f'experiments/campaign_specs/{name}.py names its campaign {campaign.name!r}.')
  return campaign


@functools.lru_cache(maxsize=None)
def names() -> tuple[str, ...]:
  """The campaigns: every module of experiments/campaign_specs/ but those whose name
  starts with '_' (what several specs share), by name."""
  from experiments import campaign_specs  # pylint: disable=g-import-not-at-top
  return tuple(sorted(info.name for info in pkgutil.iter_modules(campaign_specs.__path__)
                      if not info.name.startswith('_')))
