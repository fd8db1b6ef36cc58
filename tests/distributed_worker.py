"""One process of the 2-process CPU test in test_eight_devices_equal_one.py (not a test
module).

  python tests/distributed_worker.py PROCESS_ID PORT OUT_FILE

Each process has 2 CPU devices and reads its own half of every global batch; the step's
psums span both processes (4 devices). Process 0 writes the resulting params, batch_stats
and loss to OUT_FILE (.npz).
"""

import os
import sys

os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
os.environ['JAX_PLATFORMS'] = 'cpu'

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import training_fixtures as fx  # pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.input_pipeline import mnist  # pylint: disable=g-import-not-at-top,wrong-import-position
from bn_rnn_jax.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(process_id: int, port: int, out_file: str) -> None:
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  config = fx.tiny_config('bn_lstm', **{'model.initial_state': 'zeros',
                                        'train.num_devices': None})
  config.distributed.enabled = True
  config.distributed.coordinator_address = f'127.0.0.1:{port}'
  config.distributed.num_processes = 2
  config.distributed.process_id = process_id
  from bn_rnn_jax.training import parallel  # pylint: disable=g-import-not-at-top
  parallel.maybe_initialize_distributed(config)
  dataset = mnist.SequenceDataset(
      fx.synthetic_splits(), seed=config.seed, batch_size=config.train.batch_size,
      eval_batch_size=config.eval.batch_size, num_classes=4,
      process_index=jax.process_index(), process_count=jax.process_count())
  trainer = loop.Trainer(config, None, dataset)
  state = trainer.to_devices(trainer.initial_state())
  state, metrics = trainer.p_train_step(state, trainer.train_batch(0))
  host = trainer.to_host(state)
  if process_id == 0:
    leaves = jax.tree_util.tree_leaves_with_path({'params': host.params,
                                                  'batch_stats': host.batch_stats})
    arrays = {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}
    arrays['loss'] = np.asarray(metrics['loss'][0])
    arrays['global_devices'] = np.asarray(jax.device_count())
    np.savez(out_file, **arrays)
  jax.distributed.shutdown()


if __name__ == '__main__':
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
