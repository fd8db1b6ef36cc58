"""The one interleaved timer: training steps of several arms, in one process.

For each arm of `Speed.arms`, the library's trainer (`loop.Trainer`, its pmapped
`p_train_step`) on one device, the arm's config with `Speed.overrides`. Every arm runs the
same host batches (built once from the first arm's dataset); a first pass compiles. Then
`rounds` rounds time `steps` consecutive steps of each arm in turn, so that load from other
processes falls on every arm alike. Per round: wall seconds per step and this process's
CPU seconds per step (all its threads); tables use the medians over rounds.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional, Sequence

from experiments import config_files
from experiments import machine_facts
from experiments.campaign import collect
from experiments.campaign import spec as spec_lib
from experiments.campaign import columns


def measure(campaign: spec_lib.Campaign, extra: Mapping[str, Any] = (),
            arms: Optional[Sequence[str]] = None) -> dict:
  """The speed JSON of `campaign.speed` (the machine included); `arms` (default the
  speed table's) must start with the reference arm."""
  import jax  # pylint: disable=g-import-not-at-top
  from bn_rnn_jax.training import loop  # pylint: disable=g-import-not-at-top
  speed = campaign.speed
  if speed is None:
    raise ValueError(f'Campaign {campaign.name!r} has no speed table.')
  arms = list(arms or speed.arms)
  # Before the timed work: the load is what else ran.
  load_at_start = machine_facts.machine(backend=False)['load_average_1_5_15_min']
  trainers, states = {}, {}
  for arm in arms:
    config = config_files.load_config(campaign.config, campaign.arms[arm].config_arg)
    config_files.apply(config, {**campaign.arms[arm].overrides, **speed.overrides, **dict(extra),
                            'train.num_devices': 1})
    dataset = next(iter(trainers.values())).dataset if trainers else None
    trainers[arm] = trainer = loop.Trainer(config, None, dataset)
    states[arm] = trainer.to_devices(trainer.initial_state())
  first = trainers[arms[0]]
  host_batches = (speed.batches(first.dataset, speed.steps) if speed.batches else
                  [first.dataset.train_batch(s) for s in range(speed.steps)])
  batches = [first.shard(b) for b in host_batches]

  def steps(arm):
    state, metrics = states[arm], None
    for batch in batches:
      state, metrics = trainers[arm].p_train_step(state, batch)
    jax.block_until_ready((state, metrics))
    states[arm] = state

  out = {arm: {'wall_s_per_step_rounds': [], 'cpu_s_per_step_rounds': []} for arm in arms}
  for arm in arms:
    start = time.perf_counter()
    steps(arm)
    out[arm]['first_pass_s'] = round(time.perf_counter() - start, 3)
  for _ in range(speed.rounds):
    for arm in arms:
      wall, cpu = time.perf_counter(), time.process_time()
      steps(arm)
      out[arm]['wall_s_per_step_rounds'].append((time.perf_counter() - wall) / speed.steps)
      out[arm]['cpu_s_per_step_rounds'].append((time.process_time() - cpu) / speed.steps)
  for record in out.values():
    record['wall_s_per_step'] = columns.median(record['wall_s_per_step_rounds'])
    record['cpu_s_per_step'] = columns.median(record['cpu_s_per_step_rounds'])
  shapes = []   # each distinct batch layout once: {leaf path: shape}
  for batch in host_batches:
    layout = {jax.tree_util.keystr(path): list(leaf.shape)
              for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]}
    if layout not in shapes:
      shapes.append(layout)
  return {'kind': 'campaign_speed', 'campaign': campaign.name, 'speed': speed.name,
          'command': f'python -m experiments.campaign speed {campaign.name}',
          'spec': spec_lib.jsonable({
              'config': campaign.config, 'arms': arms,
              'overrides': dict(speed.overrides), 'set': collect.scrub(dict(extra)),
              'steps': speed.steps, 'rounds': speed.rounds, 'what': speed.what,
              'expected': speed.expected}),
          'machine': {**machine_facts.machine(), 'load_average_at_start': load_at_start},
          'batch_shapes': shapes, 'arms': out}

