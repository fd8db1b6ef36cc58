#!/usr/bin/env bash
# Check and time the library on a fresh accelerator machine; everything goes to OUTDIR.
#
#   benchmarks/accelerator_check.sh OUTDIR [WHEEL_DIR]
#
# Run it from anywhere: it works in the repository that holds it (nothing is installed
# there). It expects python3 (or $PYTHON) with jax and the accelerator's jaxlib plugin,
# flax, optax, orbax-checkpoint, absl-py, chex, numpy, scipy, scikit-learn and pytest.
# The packages listed in benchmarks/accelerator_wheels.txt (ml_collections, kaldiio,
# tensorboardX, tensorflow-datasets and what they need) come as wheels in WHEEL_DIR,
# made on a machine with network by `benchmarks/fetch_wheels.sh WHEEL_DIR`: each one whose
# module does not import already is installed with `pip install --no-index --no-deps
# --target $SITE` (default /tmp/site), and $SITE goes on PYTHONPATH after the repository.
# No network and no data files are needed.
#
# Stages, in the order given ($STAGES, default "canary env tests speed profile hoist
# donation overhead"):
#   canary    fused_canary.py, first, in a process of its own: the compiled Pallas forms of
#             the BN-LSTM against its pure-JAX fused path at shapes (a) and (c) (its
#             --configs from $CANARY_CONFIGS, e.g. 32x4,8x4: block_h x num_warps), so
#             that nothing unchecked is timed                  -> canary.json
#   env       device, jax / jaxlib / flax / CUDA / cuDNN versions, whether cuDNN's LSTM
#             runs, the packages above                       -> env.json
#   tests     the suite's core tier on the default device: pytest -m "not slow", the data
#             root pointed at an empty folder (the data tests skip), float32 matmuls at
#             full precision (JAX_DEFAULT_MATMUL_PRECISION=highest unless set: the tests
#             compare with a float64 reference; TF32 products would not pass), GPU memory
#             allocated on demand. Tests written for 8 CPU devices or the CPU's policy
#             fail on one GPU; the XML says which. $TEST_TIMEOUT (seconds) bounds the
#             stage                                          -> tests.xml
#   speed     rnn_speed.py at shapes a-d ($SHAPES), float32 and bfloat16, one JSON per
#             shape (batch-sum timings with the first); $IMPLS (rnn_speed.py's
#             --impls) picks the implementations; with the canary stage, a Pallas form
#             is timed only where the canary passed it       -> rnn_speed_<shape>.json
#   profile   launch_profile.py: one jax.profiler trace of shape (a) per implementation
#             ($TRACED, comma-separated, picks them), kernels per time step and the gaps
#             between them; the canary gates it as speed     -> launch_profile_a.json
#   hoist     rnn_speed.py at $SHAPES with the input term computed in the step
#             (--hoist false), float32, lstm and bn_lstm: the hoisting choice of the
#             execution policy                               -> rnn_speed_<shape>_in_step.json
#   donation  donation_memory.py: the train step's device memory with its state donated
#             and not                                        -> donation_memory.json
#   overhead  trainer_overhead.py with the quickstart's population timing, or with
#             $OVERHEAD_ARGS instead where set               -> trainer_overhead.json
# and check.log (all output). QUICK=1 runs a check of the script, not numbers: one
# repetition, shape (d) only ($SHAPES where set), four implementations ($IMPLS where
# set), two test files, a few loop steps, the canary at four time steps. Each stage's
# exit status is logged; the script exits 1 if any stage failed. Every Python command
# of a stage runs under `timeout $STAGE_TIMEOUT` (seconds; 0, the default, is none; the
# canary's is $CANARY_TIMEOUT, default 180, 900 with QUICK): a stage that hangs is
# stopped, what its JSON holds so far is kept (the benchmarks write each row as it
# finishes) and the next stage runs. A machine that limits one command's time can run
# the stages one at a time (STAGES=tests ...).
# $PYTEST_ARGS is added to pytest's arguments (e.g. "-n 4" where pytest-xdist is there).
set -uo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUTDIR [WHEEL_DIR]" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
outdir=$(cd "$1" && pwd)
wheels=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
site=${SITE:-/tmp/site}
stages=${STAGES-canary env tests speed profile hoist donation overhead}
# With the canary stage, the timing stages take its verdicts (no file: nothing it checks).
canary=()
[[ " $stages " == *" canary "* ]] && canary=(--canary "$outdir/canary.json")
quick=${QUICK:-0}
cd "$repo" || exit 2
exec > >(tee -a "$outdir/check.log") 2>&1

export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Empty: every platform JAX finds, the accelerator first (tests/conftest.py would
# otherwise pick the CPU).
export JAX_PLATFORMS=${JAX_PLATFORMS-}

# shellcheck source=benchmarks/wheels.sh
source "$repo/benchmarks/wheels.sh"

failed=()
run_stage() {
  local name=$1 start=$SECONDS rc
  shift
  echo "=== $name: $*"
  "$@"
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  (( rc == 0 )) || failed+=("$name")
}

# The stage's Python, under its timeout.
py() {
  timeout "${STAGE_TIMEOUT:-0}" "$python" "$@"
}

canary_stage() {
  local args=(--configs "${CANARY_CONFIGS:-default}") limit=${CANARY_TIMEOUT:-180}
  # On a CPU (QUICK) the kernels run interpreted: minutes, not seconds.
  (( quick )) && { args+=(--steps 4 --repeats 1 --shapes "${SHAPES:-a}"); limit=${CANARY_TIMEOUT:-900}; }
  rm -f "$outdir/canary.json"   # an earlier run's verdicts are not this one's
  timeout "$limit" "$python" benchmarks/fused_canary.py "${args[@]}" --json "$outdir/canary.json"
}

env_stage() {
  py benchmarks/environment.py "$outdir/env.json"
}

tests_stage() {
  local targets=(tests) empty_root
  (( quick )) && targets=(tests/test_benchmarks.py tests/test_initializers.py)
  empty_root=$(mktemp -d)
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
  BN_RNN_JAX_DATA=$empty_root \
  JAX_DEFAULT_MATMUL_PRECISION=${JAX_DEFAULT_MATMUL_PRECISION:-highest} \
  XLA_PYTHON_CLIENT_PREALLOCATE=false \
    timeout "${TEST_TIMEOUT:-${STAGE_TIMEOUT:-0}}" "$python" -m pytest -q -m "not slow" -p no:cacheprovider -rfE \
      --junitxml="$outdir/tests.xml" ${PYTEST_ARGS:-} "${targets[@]}"
  local rc=$?
  rmdir "$empty_root"
  return $rc
}

speed_stage() {
  local shapes=${SHAPES:-a,b,c,d} impls=() repeats=() sums=--batch_sums rc=0 shape
  [[ -n "${IMPLS:-}" ]] && impls=(--impls "$IMPLS")
  if (( quick )); then
    shapes=${SHAPES:-d}
    impls=(--impls "${IMPLS:-flax_optimized_lstm,cudnn_lstm,lstm,bn_lstm}")
    repeats=(--repeats 1)
  fi
  for shape in ${shapes//,/ }; do
    py benchmarks/rnn_speed.py --shapes "$shape" --dtypes float32,bfloat16 \
      "${impls[@]}" "${repeats[@]}" "${canary[@]}" $sums --json "$outdir/rnn_speed_$shape.json" || rc=1
    sums=--nobatch_sums
  done
  return $rc
}

profile_stage() {
  local traced=${TRACED:-flax_optimized_lstm,cudnn_lstm,lstm,bn_lstm,bn_lstm_cell} calls=3
  (( quick )) && calls=1
  py benchmarks/launch_profile.py --shape a --traced "$traced" "${canary[@]}" \
    --calls $calls --json "$outdir/launch_profile_a.json"
}

hoist_stage() {
  local shapes=${SHAPES:-a,b,c,d} repeats=() rc=0 shape
  (( quick )) && { shapes=${SHAPES:-d}; repeats=(--repeats 1); }
  for shape in ${shapes//,/ }; do
    py benchmarks/rnn_speed.py --shapes "$shape" --dtypes float32 --hoist false \
      --impls flax_optimized_lstm,lstm,bn_lstm "${repeats[@]}" --nobatch_sums \
      --json "$outdir/rnn_speed_${shape}_in_step.json" || rc=1
  done
  return $rc
}

donation_stage() {
  local args=()
  (( quick )) && args=(--quick)
  py benchmarks/donation_memory.py "${args[@]}" --out "$outdir/donation_memory.json"
}

overhead_stage() {
  local args=(--population --population_repeats 3)
  # shellcheck disable=SC2206  # OVERHEAD_ARGS is a list of words
  [[ -n "${OVERHEAD_ARGS:-}" ]] && args=($OVERHEAD_ARGS)
  (( quick )) && args=(--steps_quickstart 4 --steps_mnist 2 --repeats 1)
  py benchmarks/trainer_overhead.py "${args[@]}" --out "$outdir/trainer_overhead.json"
}

echo "accelerator_check: $(date -u +%Y-%m-%dT%H:%M:%SZ), stages: $stages, quick: $quick"
if [[ -n "$wheels" ]]; then
  run_stage wheels install_wheels
fi
for stage in $stages; do
  case "$stage" in
    canary|env|tests|speed|profile|hoist|donation|overhead) run_stage "$stage" "${stage}_stage" ;;
    *) echo "unknown stage '$stage' (canary, env, tests, speed, profile, hoist, donation, overhead)"
       failed+=("$stage") ;;
  esac
done
if (( ${#failed[@]} )); then
  echo "accelerator_check: failed stages: ${failed[*]} (see $outdir/check.log)"
  exit 1
fi
echo "accelerator_check: all stages passed; results in $outdir"
