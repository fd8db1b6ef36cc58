#!/usr/bin/env bash
# Full-length sequential MNIST (784 steps, experiments/configs/seq_mnist.py), BN-LSTM and
# LSTM, trained for a wall-clock budget per launch and continued by the next launch.
#
#   experiments/seq_mnist_long_run.sh ROOT BUDGET_S [--config.FIELD=VALUE ...]
#
# Trains ROOT/bn_lstm, then ROOT/lstm ($MODELS), each for BUDGET_S seconds of this launch
# (`config.train.time_budget_s`, counted from the model's start: data, compilation and
# steps). A model stops at its first checkpoint save after its budget (a save every
# $EVERY steps, default 100) and exits cleanly; the same command with the same ROOT
# continues each model from its checkpoint as if it had not stopped, here or on a
# machine the workdirs were copied to (bit for bit where the device and software are the
# same). A model that has reached `train.num_steps` trains no further (a launch only
# repeats its end-of-run test). One launch takes about MODELS x (BUDGET_S + one
# checkpoint interval).
#
# Each workdir keeps one latest checkpoint (`checkpoint.keep=1`) and the best-validation
# one (written at each evaluation, every 1,000 steps): a few MB each for the BN-LSTM
# (most of it its per-step population statistics: 784 rows for each of its three
# sites), under one for the LSTM; the script prints the sizes. With PACK=DIR it also
# writes DIR/<model>.tar (the workdir without its lock file) to carry back; unpack it
# into ROOT to go on from it.
#
# Needs the MNIST IDX files under the data root ($BN_RNN_JAX_DATA/mnist, or pass
# --config.data.mnist_dir=PATH). Extra arguments go to experiments/main.py after the
# script's own (e.g. --config.train.num_steps=20000). Exits 1 if a model's run failed.
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 ROOT BUDGET_S [--config.FIELD=VALUE ...]" >&2
  exit 2
fi
root=$1
budget=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
models=${MODELS:-bn_lstm lstm}
every=${EVERY:-100}
mkdir -p "$root" || exit 2
root=$(cd "$root" && pwd)

status=0
for model in $models; do
  workdir="$root/$model"
  echo "=== $model: $workdir, budget ${budget} s"
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" "$repo/experiments/main.py" \
    --config "$repo/experiments/configs/seq_mnist.py" --workdir "$workdir" \
    --config.model.variant="$model" --config.train.time_budget_s="$budget" \
    --config.checkpoint.keep=1 --config.checkpoint.every="$every" "$@" || status=1
  latest=$(ls "$workdir/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
  size() { du -sh "$1" 2>/dev/null | cut -f1; }
  echo "=== $model: latest checkpoint step ${latest:-none}; sizes: checkpoints/" \
    "$(size "$workdir/checkpoints"), best/ $(size "$workdir/best"), the workdir" \
    "$(size "$workdir")"
  if [[ -n "${PACK:-}" ]]; then
    mkdir -p "$PACK"
    tar -cf "$PACK/$model.tar" -C "$root" --exclude "$model/lock" "$model" || status=1
    echo "=== $model: packed $(du -h "$PACK/$model.tar" | cut -f1) into $PACK/$model.tar"
  fi
done
exit $status
