"""What a workdir remembers of its run: `config.json` (the first launch's config, never
rewritten) and `config_changes.jsonl` (per launch that changed the run's meaning with
`config.train.allow_config_change`: the step it resumed from and `{field: [before,
after]}`). `check` refuses, before anything is written, a launch that changes a field of
the run's meaning (any but `HARMLESS`) without that flag, or sets `train.num_steps` below
the newest checkpoint."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
from typing import Any, Optional

from bn_rnn_jax import extras

CONFIG = 'config.json'
CHANGES = 'config_changes.jsonl'
#: How config_changes.jsonl records the side of a change that lacks the field.
ABSENT_RECORD = '<absent>'

#: Fields (or sections, ending in '.') that do not change what a run computes: logging,
#: evaluation, checkpoint and time cadence, devices and processes, where the data lives,
#: execution choices of the layers (policy.py) and of the train step (donating its state),
#: and the override flag itself.
HARMLESS = ('train.log_every', 'train.num_steps', 'train.time_budget_s', 'train.num_devices',
            'train.allow_config_change', 'train.donate_state', 'eval.', 'checkpoint.every',
            'checkpoint.keep', 'parallel.', 'distributed.', 'data.root', 'data.tfds_data_dir',
            'data.cache_dir', 'model.remat', 'model.unroll', 'model.backward',
            'model.hoist_input', 'model.batch_sums', 'model.fused_step', 'model.block_h',
            'model.num_warps')


def flat_config(config) -> dict:
  """`{'a.b': value}` of a config (or of its JSON-like dict), values as JSON reads them."""
  tree = json.loads(config.to_json_best_effort(sort_keys=True)) if hasattr(
      config, 'to_json_best_effort') else config
  flat = {}

  def walk(node, prefix):
    if isinstance(node, dict) and node:
      for key, value in node.items():
        walk(value, f'{prefix}{key}.')
    else:
      flat[prefix[:-1]] = node
  walk(tree, '')
  return flat


def _example_shape(value):
  """`'float32[20, 2]'`: the dtype and shape of one example (the leading batch axis
  dropped) of a batch's array, or of each array of a mapping of them."""
  if isinstance(value, dict):
    return {key: _example_shape(v) for key, v in sorted(value.items())}
  shape, dtype = tuple(getattr(value, 'shape', ())), getattr(value, 'dtype', type(value).__name__)
  return f'{dtype}[{", ".join(map(str, shape[1:]))}]'


def dataset_fields(dataset) -> dict:
  """What config.json records as `config.data` for a dataset object given to the trainer:
  `name` (its attribute, else its class's name), `given: True`, the interface's `task`,
  `model_kwargs`, `train_length`, `steps_per_epoch`, and `example`, the dtype and shape of
  one example of each training array (`{'inputs': 'float32[20, 2]', 'labels': 'int32[]'}`)."""
  name = getattr(dataset, 'name', None)
  return {'name': name if isinstance(name, str) else type(dataset).__name__,
          'given': True,
          'task': str(dataset.task),
          'model_kwargs': json.loads(json.dumps(dict(dataset.model_kwargs), default=str)),
          'train_length': int(dataset.train_length),
          'steps_per_epoch': int(dataset.steps_per_epoch),
          'example': _example_shape(dict(dataset.train_batch(0)))}


def with_dataset(config, dataset):
  """A copy of `config` whose `data` is `dataset_fields(dataset)`."""
  with extras.needed_by(f'{__name__}.with_dataset'):
    import ml_collections  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.data = ml_collections.ConfigDict(dataset_fields(dataset))
  return config


def harmless(field: str) -> bool:
  return any(field == h or (h.endswith('.') and field.startswith(h)) for h in HARMLESS)


def make(workdir: str) -> bool:
  """Create `workdir` when missing; True when this call created it."""
  if workdir is None:
    raise ValueError('No workdir given: pass --workdir (where checkpoints and metrics go).')
  workdir = os.path.abspath(workdir)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir {workdir} is a file, not a directory.')
  if os.path.isdir(workdir):
    return False
  try:
    os.makedirs(workdir)
  except FileExistsError:
    return False
  except OSError as e:
    raise ValueError(f'Cannot create the workdir {workdir} ({e.strerror}).') from e
  return True


def checkpoint_steps(workdir: str, folder: str = 'checkpoints') -> list[int]:
  """The steps of the complete checkpoints in `<workdir>/<folder>`, read from the folder
  names only (orbax's temporary folders of an unfinished save are not steps)."""
  path = os.path.join(workdir, folder)
  if not os.path.isdir(path):
    return []
  return sorted(int(n) for n in os.listdir(path)
                if re.fullmatch(r'\d+', n) and os.path.isdir(os.path.join(path, n)))


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    what = e.strerror if isinstance(e, OSError) else f'not JSON: {" ".join(str(e).split())}'
    raise ValueError(f'Cannot read the run\'s config {path} ({what}); restore it or move the '
                     'workdir aside to start a new run.') from None


def read_changes(workdir: str) -> list[dict]:
  """The records of `config_changes.jsonl` (none when missing)."""
  path = os.path.join(workdir, CHANGES)
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        if not isinstance(record.get('changed'), dict):
          raise ValueError('no "changed" object')
      except (ValueError, AttributeError) as e:
        raise ValueError(f'{path}, line {number}, is not a config change record ('
                         f'{" ".join(str(e).split())}); repair or remove the line.') from None
      records.append(record)
  return records


def run_config(workdir: str) -> Optional[dict]:
  """The flat config (`{'a.b': value}`) of the run in `workdir`: config.json with the
  recorded changes applied; None when the workdir has no config.json."""
  path = os.path.join(workdir, CONFIG)
  if not os.path.exists(path):
    return None
  config = flat_config(_read_json(path))
  for record in read_changes(workdir):
    for field, (_, after) in record['changed'].items():
      if after == ABSENT_RECORD:   # the field was removed from the config
        config.pop(field, None)
      else:
        config[field] = after
  return config


def load_config(workdir: str):
  """The run's config (`run_config`) as an `ml_collections.ConfigDict`; None without
  config.json."""
  with extras.needed_by(f'{__name__}.load_config'):
    import ml_collections  # pylint: disable=g-import-not-at-top
  flat = run_config(workdir)
  if flat is None:
    return None
  tree = {}
  for key, value in flat.items():
    node = tree
    *path, name = key.split('.')
    for part in path:
      node = node.setdefault(part, {})
    node[name] = value
  return ml_collections.ConfigDict(tree)


def lineage(workdir: str) -> Optional[str]:
  """SHA-256 of the run's config.json as written at its first launch (None without one):
  what ties a best checkpoint to its run."""
  path = os.path.join(workdir, CONFIG)
  if not os.path.exists(path):
    return None
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


@dataclasses.dataclass
class Launch:
  """What the checks found: the run's saved config (None: a first launch), the newest
  checkpoint's step, and the changes of the run's meaning this launch makes on purpose."""
  saved: Optional[dict]
  latest_step: Optional[int]
  changed: dict


def _shown(value) -> str:
  return ABSENT_RECORD if value is _ABSENT else repr(value)


def _recorded(value):
  """A value as config_changes.jsonl records it: a field one side lacks is '<absent>'."""
  return ABSENT_RECORD if value is _ABSENT else value


_ABSENT = object()


def check(config, workdir: str) -> Launch:
  """Check a launch of `config` on `workdir` against the run it holds; reads only.

  Raises ValueError (one line) for a changed field of the run's meaning without
  `config.train.allow_config_change`, or `train.num_steps` below the newest checkpoint.
  """
  workdir = os.path.abspath(workdir)
  steps = checkpoint_steps(workdir) if os.path.isdir(workdir) else []
  latest = steps[-1] if steps else None
  num_steps = config.train.num_steps
  if latest is not None and num_steps < latest:
    raise ValueError(f'config.train.num_steps={num_steps} is below the newest checkpoint of '
                     f'{workdir} (step {latest}); pass --config.train.num_steps={latest} or '
                     'more, or use another --workdir.')
  saved = run_config(workdir) if os.path.isdir(workdir) else None
  if saved is None:
    return Launch(None, latest, {})
  new = flat_config(config)
  pairs = {k: (saved.get(k, _ABSENT), new.get(k, _ABSENT))
           for k in sorted(set(saved) | set(new)) if not harmless(k)}
  pairs = {k: (before, after) for k, (before, after) in pairs.items() if before != after}
  changed = {k: [_recorded(before), _recorded(after)] for k, (before, after) in pairs.items()}
  if pairs and not config.train.get('allow_config_change', False):
    shown = ', '.join(f'{k} ({_shown(before)} -> {_shown(after)})'
                      for k, (before, after) in pairs.items())
    raise ValueError(f'The run in {workdir} was started with another config: {shown}. '
                     'Use another --workdir, or pass '
                     '--config.train.allow_config_change=True to continue this run with '
                     'the change (recorded in config_changes.jsonl).')
  return Launch(saved, latest, changed)


def write_config(config, workdir: str, launch: Launch) -> None:
  """Write config.json at a first launch (nothing on a relaunch)."""
  path = os.path.join(os.path.abspath(workdir), CONFIG)
  if launch.saved is None and not os.path.exists(path):
    with open(path + '.tmp', 'w') as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True) + '\n')
    os.replace(path + '.tmp', path)


def record_changes(workdir: str, launch: Launch) -> None:
  """Append the launch's changes (if any) to config_changes.jsonl, once the run's checkpoint
  has been restored under the changed config (a change it has no place for is never
  recorded)."""
  if launch.changed:
    entry = {'step': launch.latest_step or 0, 'changed': launch.changed,
             'time': datetime.datetime.now(datetime.timezone.utc).isoformat(
                 timespec='seconds')}
    with open(os.path.join(os.path.abspath(workdir), CHANGES), 'a') as f:
      f.write(json.dumps(entry) + '\n')
