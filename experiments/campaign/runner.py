"""Launch a campaign's runs, skip the finished ones, resume the others, show one bar.

Each run is an `experiments/main.py` process in `<runs_dir>/<campaign>/<run>` (its log in
`stdout.log` there), at most `parallel` at a time, with the spec's environment. A run is
finished when its metrics.jsonl holds the last records its config asks for (the test of
the best checkpoint, or else every evaluation split at the last step): it is never
launched again, so nothing is evaluated twice. Any other run is launched again and the
trainer resumes it from its latest checkpoint exactly. A workdir whose config.json
differs from the spec's (other than in its step or time budget) is an error, not mixed in.

One runner at a time per campaign (`runner.lock` in its runs folder); Ctrl-C or SIGTERM
stops the runs (SIGTERM, then SIGKILL after 30 s) and ends the runner with one line.

Each launch appends its record to the run's `campaign_launches.jsonl` when it starts (its
start time, machine and GPUs, load average, steps done, step budget) and again, complete, when it ends
or is stopped (exit code, wall and process CPU seconds, steps done): a launch killed with
the runner keeps its start line. collect.py copies the records into results.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import ml_collections

from experiments import machine_facts
from experiments.campaign import collect
from experiments.campaign import spec as spec_lib

_POLL_S = 1.0
#: The least time budget a launch is started with (`run`'s `train_until`): less would not
#: reach a checkpoint past the start-up and compilation.
MIN_BUDGET_S = 30


@dataclasses.dataclass
class Task:
  """One process to run: a training run, or an evaluation of a finished one."""
  key: str                       # '<campaign>/<run>'
  workdir: str
  argv: list[str]                # after `python`
  env: dict
  total: int                     # training steps (1 for an evaluation)
  config: Optional[ml_collections.ConfigDict] = None   # training runs only
  after: Optional[str] = None    # the key of a task that must finish first


def plan(campaign: spec_lib.Campaign, runs_dir: str, seeds=None, arms=None,
         extra: Mapping[str, Any] = (), compile_cache: bool = False,
         tiny: bool = False) -> list[Task]:
  """The tasks of a campaign (for an evaluation campaign, its source's runs first, each to
  the budget of its newest launch unless `extra` sets `train.num_steps`)."""
  runs_dir = os.path.abspath(runs_dir)
  env = child_env(runs_dir, compile_cache)
  trainer = spec_lib.get(campaign.source) if campaign.source else campaign
  tasks = []
  for run in campaign.runs(seeds, arms):
    workdir = os.path.join(runs_dir, trainer.name, run.name)
    config = trainer.config_of(run, extra)
    if campaign.source and 'train.num_steps' not in extra:
      # An evaluation takes a run trained to a budget of its own as it stands, where the
      # training campaign's budget would train it on first.
      budget = collect.launch_budget(collect.read_launches(workdir))
      if budget is not None:
        config.train.num_steps = budget
    tasks.append(Task(f'{trainer.name}/{run.name}', workdir,
                      trainer.main_args(run, workdir, extra), {**trainer.env, **env},
                      config.train.num_steps, config))
    if campaign.evaluate is not None:
      argv = ['-m', 'experiments.campaign', 'evaluate_run', campaign.name, run.name,
              f'--runs_dir={runs_dir}'] + (['--tiny'] if tiny else [])
      tasks.append(Task(f'{campaign.name}/{run.name}',
                        os.path.join(runs_dir, campaign.name, run.name), argv,
                        {**campaign.env, **env}, 1, after=tasks[-1].key))
  return tasks


def child_env(runs_dir: str, compile_cache: bool) -> dict:
  """What every child process gets beside the spec's environment: this repository first
  on the import path, and optionally a persistent XLA cache in `runs_dir`."""
  env = {'PYTHONPATH': os.pathsep.join(
      [spec_lib.ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])}
  if compile_cache:
    # Runs of the same shapes (the seeds of an arm) reuse each other's XLA programs.
    env.update(JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.abspath(runs_dir), 'jax_cache'),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  return env


# ---------------------------------------------------------------------- state
def progress(task: Task) -> tuple[str, int]:
  """`(state, steps done)`: state is 'new', 'partial', 'finished' or 'running' (another
  process holds the run's workdir lock). A partial run's steps done are those its next
  launch keeps: the steps it logged up to its latest checkpoint, as the trainer resumes
  from there and logs the later ones again."""
  if task.config is None:
    done = os.path.exists(os.path.join(task.workdir, collect.EVALUATION))
    return ('finished', 1) if done else ('new', 0)
  if not os.path.exists(os.path.join(task.workdir, 'metrics.jsonl')):
    return 'new', 0
  check_config(task)
  from bn_rnn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  records = metric_writer.read_metrics(task.workdir)
  if collect.finished(records, task.config):
    return 'finished', task.total
  logged = max((r['step'] for r in records if r['split'] == 'train'), default=0)
  if _locked(task.workdir):
    return 'running', logged
  return 'partial', min(logged, _latest_checkpoint(task.workdir))


def _latest_checkpoint(workdir: str) -> int:
  """The step of the latest checkpoint under `workdir/checkpoints` (orbax names each
  folder by its step; a save in flight has a suffix), 0 where there is none."""
  path = os.path.join(workdir, 'checkpoints')
  names = os.listdir(path) if os.path.isdir(path) else []
  return max((int(name) for name in names if name.isdigit()), default=0)


def check_config(task: Task) -> None:
  """A workdir trained with another config is an error. The run's config is its own
  (config.json of its first launch, with the changes recorded since); fields that do not
  change what it computes (`bn_rnn_jax.training.workdir.HARMLESS`: a longer or shorter budget,
  cadences) may differ: the run goes on or is finished."""
  differ = collect.config_differences(task.workdir, task.config)
  if differ:
    shown = ', '.join(f'{k}: {there!r} there, {wanted!r} wanted'
                      for k, there, wanted in differ[:3])
    raise ValueError(f'{task.workdir} holds a run of another config ({shown}); remove it '
                     'or choose another --runs_dir.')


def _locked(workdir: str) -> bool:
  path = os.path.join(workdir, 'lock')
  if not os.path.exists(path):
    return False
  with open(path) as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return True
    fcntl.flock(f, fcntl.LOCK_UN)
  return False


# ---------------------------------------------------------------------- launching
def core_slots(parallel: int, cores: Optional[Sequence[int]] = None
               ) -> list[Optional[frozenset[int]]]:
  """The CPU cores of each of `parallel` run slots: `cores` (default: those this process
  may use) split into `parallel` groups as even as can be, or None for every slot where
  there are fewer cores than slots (the runs then share them all).

  XLA's CPU client sizes its thread pool by the cores a process may use, so a run pinned
  to its own group computes on those alone: runs side by side neither oversubscribe the
  cores nor evict each other's caches, and their step times compare.
  """
  if cores is None:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else []
  cores = sorted(cores)
  if parallel <= 1 or len(cores) < parallel:
    return [None] * max(parallel, 1)
  size, extra = divmod(len(cores), parallel)
  bounds = [i * size + min(i, extra) for i in range(parallel + 1)]
  return [frozenset(cores[a:b]) for a, b in zip(bounds, bounds[1:])]


def _child_setup(cores: Optional[frozenset[int]]) -> Callable[[], None]:
  """What a child runs before its program: Ctrl-C (SIGINT to the terminal's process
  group) is the runner's to handle, as it stops the runs; the child keeps to `cores`."""
  def setup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cores is not None:
      os.sched_setaffinity(0, cores)
  return setup


class _Child:
  """A launched task: its process, log and launch record."""

  def __init__(self, task: Task, done: int, cores: Optional[frozenset[int]] = None,
               budget: Optional[int] = None):
    os.makedirs(task.workdir, exist_ok=True)
    self.task, self.done, self.cores, self.budget = task, done, cores, budget
    self.log_path = os.path.join(task.workdir, 'stdout.log')
    self.start = time.time()
    self.record = {'started': _iso(self.start),
                   'machine': machine_facts.machine(task.env.get('XLA_FLAGS'),
                                                    backend=False),
                   'steps_before': done}
    if cores is not None:   # the cores this run kept to (`core_slots`)
      self.record['cores_used'] = len(cores)
    if task.config is not None:   # the budget collect counts the run finished at
      self.record['num_steps'] = task.config.train.num_steps
    if budget is not None:   # what was left of `run`'s `train_until`
      self.record['time_budget_s'] = budget
    argv = task.argv + ([f'--config.train.time_budget_s={budget}'] if budget else [])
    # Written now and again, complete, at the end (`collect.read_launches` keeps the
    # last): a launch killed with the runner still says where its steps ran.
    self._write_record()
    self._log = open(self.log_path, 'a')
    self.process = subprocess.Popen([sys.executable, *argv], cwd=spec_lib.ROOT,
                                    env={**os.environ, **task.env}, stdout=self._log,
                                    stderr=subprocess.STDOUT,
                                    preexec_fn=_child_setup(cores))

  def poll(self) -> Optional[int]:
    """The exit code once the process ended (its CPU time recorded), else None."""
    pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
    if pid == 0:
      return None
    self.process.returncode = os.waitstatus_to_exitcode(status)
    self._finish(round(usage.ru_utime + usage.ru_stime, 3))
    return self.process.returncode

  def _finish(self, cpu_s: Optional[float]) -> None:
    self._log.close()
    self.record.update(exit_code=self.process.returncode,
                       wall_s=round(time.time() - self.start, 3), cpu_s=cpu_s,
                       load_average_end=[round(v, 2) for v in os.getloadavg()])
    self.record['steps_after'] = progress(self.task)[1]
    self._write_record()

  def _write_record(self) -> None:
    with open(os.path.join(self.task.workdir, collect.LAUNCHES), 'a') as f:
      f.write(json.dumps(self.record) + '\n')

  def last_line(self) -> str:
    with open(self.log_path, errors='replace') as f:
      lines = [l.strip() for l in f.read().splitlines()[-50:] if l.strip()]
    errors = [l for l in lines if l.startswith('error:')]
    return (errors or lines or ['(no output)'])[-1]

  def stop(self) -> None:
    """SIGTERM (the trainer exits without a traceback), SIGKILL after 30 s; the launch
    record is completed (its CPU time unknown)."""
    self.process.terminate()
    try:
      self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    self._finish(cpu_s=None)


class Eta:
  """The time a campaign has left, from what its launches measured: the steps/s of a run
  once its steps move (a run's first logged steps come after its start-up and
  compilation), and each launch's start-up (the time to its first logged steps, less
  those steps at that rate). The runs left share `parallel` slots."""

  def __init__(self, parallel: int):
    self.parallel = max(parallel, 1)
    # key -> [launch time, steps at launch, (time, steps) first moved or None, (time, steps)]
    self.launches: dict[str, list] = {}

  def launched(self, key: str, now: float, done: int) -> None:
    self.launches[key] = [now, done, None, (now, done)]

  def progressed(self, key: str, now: float, done: int) -> None:
    launch = self.launches[key]
    if launch[2] is None and done > launch[1]:
      launch[2] = (now, done)
    launch[3] = (now, done)

  def rate(self) -> Optional[float]:
    """Steps/s of one run, over the measured spans after the runs' steps moved."""
    spans = [(last[1] - first[1], last[0] - first[0])
             for _, _, first, last in self.launches.values() if first and last[0] > first[0]]
    steps, seconds = sum(s for s, _ in spans), sum(t for _, t in spans)
    return steps / seconds if steps > 0 and seconds > 0 else None

  def start_up(self, rate: float) -> float:
    """The mean start-up of the launches whose steps moved."""
    times = [max(first[0] - start - (first[1] - done) / rate, 0.0)
             for start, done, first, _ in self.launches.values() if first]
    return sum(times) / len(times) if times else 0.0

  def left(self, now: float, running: Mapping[str, int], pending: Sequence[int]) -> str:
    """The time left ('?' before a rate is measured): `running` maps each running
    launch to its steps left, `pending` holds the steps left of each run not started."""
    rate = self.rate()
    if rate is None:
      return '?'
    start_up = self.start_up(rate)
    times = []
    for key, steps in running.items():
      launched, _, first, _ = self.launches[key]
      waiting = 0.0 if first else max(start_up - (now - launched), 0.0)
      times.append(waiting + steps / rate)
    work = sum(times) + sum(start_up + steps / rate for steps in pending)
    return _clock(max([work / self.parallel] + times))


class Bar:
  """One progress line over all tasks: steps, runs, elapsed time, ETA (`Eta`)."""

  def __init__(self, name: str, tasks: Sequence[Task], stream=None):
    self.name, self.stream = name, stream or sys.stderr
    self.total = sum(t.total for t in tasks)
    self.start, self.last_print = time.time(), 0.0
    self.tty = self.stream.isatty()

  def show(self, done: int, finished: int, runs: int, running: int, eta: str = '?',
           force=False) -> None:
    now = time.time()
    elapsed = now - self.start
    width = 24
    filled = int(width * done / max(self.total, 1))
    line = (f'{self.name} [{"#" * filled}{"." * (width - filled)}] {done}/{self.total} '
            f'steps | runs {finished}/{runs} finished, {running} running | '
            f'{_clock(elapsed)} elapsed, ETA {eta}')
    if self.tty:
      self.stream.write('\r' + line.ljust(110))
    elif force or time.time() - self.last_print >= 30:
      self.stream.write(line + '\n')
      self.last_print = time.time()
    self.stream.flush()

  def event(self, text: str) -> None:
    self.stream.write(('\r' if self.tty else '') + text.ljust(110 if self.tty else 0) + '\n')
    self.stream.flush()


def _iso(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
      timespec='milliseconds')


def _clock(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class Stopped(Exception):
  """The runner was stopped (Ctrl-C or SIGTERM) after stopping its runs."""


class CampaignLock:
  """One runner per campaign: an exclusive `flock` on `<runs_dir>/<campaign>/runner.lock`
  holding the runner's pid; a second runner fails at once naming it."""

  def __init__(self, runs_dir: str, name: str):
    self.path = os.path.join(os.path.abspath(runs_dir), name, 'runner.lock')
    self._file = None

  def __enter__(self):
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    handle = open(self.path, 'a+')
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      handle.seek(0)
      holder = handle.read().strip() or 'unknown'
      handle.close()
      raise ValueError(f'The campaign {os.path.basename(os.path.dirname(self.path))} is busy: '
                       f'another runner (pid {holder}) holds {self.path}; wait for it to '
                       'finish or stop it.') from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    self._file = handle
    return self

  def __exit__(self, *exc):
    self._file.seek(0)
    self._file.truncate()
    fcntl.flock(self._file, fcntl.LOCK_UN)
    self._file.close()


def _raise_stopped(signum, frame):
  del frame
  raise Stopped(signal.Signals(signum).name)


def run(campaign: spec_lib.Campaign, runs_dir: str, parallel: int = 0, seeds=None,
        arms=None, extra: Mapping[str, Any] = (), compile_cache: bool = False,
        tiny: bool = False, train_until: Optional[float] = None) -> list[str]:
  """Run every unfinished task; returns the keys of those that failed. Raises ValueError
  when another runner runs the campaign, `Stopped` after Ctrl-C or SIGTERM (its runs
  stopped first).

  `train_until` (seconds since the epoch): the time by which training stops. Each
  training launch gets what is left of it as its `train.time_budget_s` (whole seconds),
  so that runs queued behind others stop in time too; a run whose turn comes with less
  than `MIN_BUDGET_S` left is not launched (it stays unfinished, and is named)."""
  with CampaignLock(runs_dir, campaign.name):
    previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      return _run(campaign, runs_dir, parallel, seeds, arms, extra, compile_cache, tiny,
                  train_until)
    finally:
      for number, handler in previous.items():
        signal.signal(number, handler)


def budget_left(train_until: Optional[float], now: float) -> Optional[int]:
  """A launch's `train.time_budget_s` at `now`: the whole seconds left until
  `train_until` (None without one; 0 when fewer than `MIN_BUDGET_S` are left)."""
  if train_until is None:
    return None
  left = int(train_until - now)
  return left if left >= MIN_BUDGET_S else 0


def _run(campaign, runs_dir, parallel, seeds, arms, extra, compile_cache, tiny,
         train_until) -> list[str]:
  tasks = plan(campaign, runs_dir, seeds, arms, extra, compile_cache, tiny)
  parallel = parallel or campaign.parallel
  states = {t.key: progress(t) for t in tasks}
  busy = [k for k, (s, _) in states.items() if s == 'running']
  if busy:
    raise ValueError(f'{", ".join(busy)} are being trained by another process; wait for '
                     'it to finish.')
  counts = {s: sum(1 for v, _ in states.values() if v == s) for s in ('finished', 'partial')}
  bar = Bar(campaign.name, tasks)
  eta = Eta(parallel)
  bar.event(f'{campaign.name}: {len(tasks)} runs in {os.path.abspath(runs_dir)}: '
            f'{counts["finished"]} finished before (skipped), {counts["partial"]} to '
            f'resume, {parallel} at a time')
  pending = [t for t in tasks if states[t.key][0] != 'finished']
  running: dict[str, _Child] = {}
  failed: list[str] = []
  late: list[str] = []   # not launched: `train_until` came first
  slots = core_slots(parallel)
  try:
    while pending or running:
      for task in list(pending):
        if len(running) >= parallel:
          break
        if task.after in failed:
          pending.remove(task)
          failed.append(task.key)
          continue
        if task.after and states[task.after][0] != 'finished':
          continue
        pending.remove(task)
        budget = budget_left(train_until, time.time()) if task.config else None
        if budget == 0:
          late.append(task.key)
          continue
        done = states[task.key][1]
        held = [child.cores for child in running.values()]
        cores = next(slot for slot in slots if slot is None or slot not in held)
        running[task.key] = _Child(task, done, cores, budget)
        eta.launched(task.key, running[task.key].start, done)
        bar.event(f'started {task.key}' + (f' (resuming after step {done})' if done else ''))
      time.sleep(_POLL_S)
      for key, child in list(running.items()):
        code = child.poll()
        if code is None:
          states[key] = ('running', progress(child.task)[1])
          eta.progressed(key, time.time(), states[key][1])
          continue
        del running[key]
        states[key] = progress(child.task)
        eta.progressed(key, time.time(), states[key][1])
        seconds = child.record['wall_s']
        if code == 0 and states[key][0] == 'finished':
          bar.event(f'finished {key} ({seconds:.0f} s)')
        elif code == 0 and child.task.config and (
            child.budget or child.task.config.train.get('time_budget_s')):
          bar.event(f'stopped {key} after step {states[key][1]}: its time budget '
                    f'(train.time_budget_s) is spent; the same command resumes it')
        else:
          failed.append(key)
          bar.event(f'FAILED {key} (exit {code}): {child.last_line()}  [{child.log_path}]')
      done = sum(s for _, s in states.values())
      left = eta.left(time.time(), {k: c.task.total - states[k][1] for k, c in running.items()},
                      [t.total - states[t.key][1] for t in pending])
      bar.show(done, sum(1 for s, _ in states.values() if s == 'finished'), len(tasks),
               len(running), left, force=not (pending or running))
    if late:
      bar.event(f'not started, as fewer than {MIN_BUDGET_S} s were left of the time to '
                f'train until: {", ".join(late)}; the same command starts them')
    if not failed and all(s == 'finished' for s, _ in states.values()):
      bar.event(f'{campaign.name}: all {len(tasks)} runs finished')
  except (KeyboardInterrupt, Stopped) as e:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # stopping: a second signal waits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for child in running.values():
      child.stop()
    raise Stopped(f'stopped by {e.args[0] if isinstance(e, Stopped) else "SIGINT"}: '
                  f'{len(running)} run(s) stopped; `python -m experiments.campaign run '
                  f'{campaign.name}` resumes the unfinished runs') from None
  return failed


def status(campaign: spec_lib.Campaign, runs_dir: str, seeds=None, arms=None,
           extra: Mapping[str, Any] = ()) -> str:
  """One line per task: state, steps, wall time so far, launches."""
  from bn_rnn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  lines = []
  for task in plan(campaign, runs_dir, seeds, arms, extra):
    state, done = progress(task)
    wall = ''
    if task.config is not None and state != 'new':
      times = [r.get('time_s', 0.0) for r in metric_writer.read_metrics(task.workdir)]
      wall = f'{max(times, default=0.0):8.0f} s'
    launches = len(collect.read_launches(task.workdir))
    lines.append(f'{task.key:<44} {state:<9} {done:>7}/{task.total:<7} {wall:>10}  '
                 f'{launches} launch(es)')
  return '\n'.join(lines)
