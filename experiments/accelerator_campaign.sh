#!/usr/bin/env bash
# Run a training campaign, then the campaign that evaluates it, on an offline accelerator
# machine within a wall-clock deadline; the runs' records come back in OUTDIR.
#
#   experiments/accelerator_campaign.sh TRAINING[,EVALUATION] OUTDIR [WHEEL_DIR]
#   e.g. experiments/accelerator_campaign.sh ptb_char_1000,ptb_char_1000_lengths "$OUT" .whl
#
# Run it from anywhere: it works in the repository that holds it. It expects what
# benchmarks/accelerator_check.sh expects (python3 or $PYTHON with jax and the
# accelerator's plugin, flax, optax, orbax-checkpoint, absl-py, numpy); the packages of
# benchmarks/accelerator_wheels.txt come as wheels in WHEEL_DIR (benchmarks/fetch_wheels.sh).
#
# Environment:
#   BN_RNN_JAX_DATA  the data root (required unless QUICK=1 finds the data elsewhere)
#   DEADLINE_S       seconds from the start by which the script is done (default 570)
#   MARGIN_S         what the training leaves of the deadline for its last checkpoint and
#                    test, and for packing (default 60)
#   RUNS_DIR         the runs (default: /tmp/accel_runs). Outside the checkout, so that a
#                    checkout laid anew keeps them: run the script again on the same
#                    machine and the campaign resumes them where they stopped.
#   PARALLEL         runs at a time (default: the spec's); the runs share the accelerator
#                    (XLA_PYTHON_CLIENT_PREALLOCATE=false, so each takes memory on demand)
#   QUICK=1          the campaigns' tiny budgets (--tiny): a check of this script, not results
#
# Steps: the wheels; `campaign run TRAINING` with train.time_budget_s set to what is left
# of the deadline less MARGIN_S, so that every launch stops at a checkpoint in time; when
# `campaign status` shows every training run finished, `campaign run EVALUATION` under
# `timeout` for what is left; then OUTDIR/runs.tgz: every run's records without its
# checkpoints (config, metrics.jsonl, campaign_launches.jsonl, stdout.log, an evaluation's
# JSON), which `campaign collect --runs_dir` reads, and OUTDIR/campaign.log (all output).
# Exits 0 when both campaigns finished, 3 when time ran out first (the records of what
# ran come back either way), 1 on a failure.
set -uo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 TRAINING[,EVALUATION] OUTDIR [WHEEL_DIR]" >&2
  exit 2
fi
start=$SECONDS
training=${1%%,*}
evaluation=""
[[ "$1" == *,* ]] && evaluation=${1#*,}
mkdir -p "$2" || exit 2
outdir=$(cd "$2" && pwd)
wheels=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
site=${SITE:-/tmp/site}
deadline=${DEADLINE_S:-570}
margin=${MARGIN_S:-60}
runs=${RUNS_DIR:-/tmp/accel_runs}
cd "$repo" || exit 2
exec > >(tee -a "$outdir/campaign.log") 2>&1

export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export JAX_PLATFORMS=${JAX_PLATFORMS-}
export XLA_PYTHON_CLIENT_PREALLOCATE=false

# shellcheck source=benchmarks/wheels.sh
source "$repo/benchmarks/wheels.sh"

status_args=(--runs_dir="$runs")
[[ "${QUICK:-0}" == 1 ]] && status_args+=(--tiny)
campaign_args=("${status_args[@]}" --compile_cache)
[[ -n "${PARALLEL:-}" ]] && campaign_args+=(--parallel="$PARALLEL")
left() { echo $((deadline - (SECONDS - start))); }

pack() {
  tar -czf "$outdir/runs.tgz" -C "$runs" --exclude=checkpoints --exclude=best \
    --exclude=jax_cache --exclude=lock . \
    && echo "records of $(ls "$runs" | tr '\n' ' ')in $outdir/runs.tgz ($(du -h "$outdir/runs.tgz" | cut -f1))"
}

unfinished() {  # the runs of campaign $1 that `campaign status` does not call finished
  local table
  table=$("$python" -m experiments.campaign status "$1" "${status_args[@]}" 2>&1) \
    || { echo "status failed: $table"; return; }
  awk 'NF > 2 && $2 != "finished" && $1 ~ /\//' <<< "$table"
}

echo "accelerator_campaign: $(date -u +%Y-%m-%dT%H:%M:%SZ), $training${evaluation:+ then $evaluation}," \
     "deadline ${deadline} s, runs in $runs"
mkdir -p "$runs" || exit 1
[[ -n "$wheels" ]] && install_wheels
"$python" -c 'import jax; print("devices:", jax.devices())' || exit 1

budget=$(($(left) - margin))
if (( budget <= 0 )); then
  echo "no time left to train (deadline ${deadline} s, margin ${margin} s)"
  pack
  exit 3
fi
echo "=== $training: train.time_budget_s=$budget"
"$python" -m experiments.campaign run "$training" "${campaign_args[@]}" \
  --set=train.time_budget_s="$budget"
trained=$?
"$python" -m experiments.campaign status "$training" "${status_args[@]}"
rc=0
if (( trained != 0 )); then
  echo "=== $training: exit $trained"
  rc=1
elif [[ -n "$(unfinished "$training")" ]]; then
  echo "=== $training: stopped by its time budget; run this again to resume"
  rc=3
elif [[ -n "$evaluation" ]]; then
  limit=$(($(left) - 15))
  if (( limit <= 0 )); then
    echo "=== $evaluation: no time left"
    rc=3
  else
    echo "=== $evaluation: at most $limit s"
    timeout "$limit" "$python" -m experiments.campaign run "$evaluation" "${campaign_args[@]}"
    evaluated=$?
    "$python" -m experiments.campaign status "$evaluation" "${status_args[@]}"
    if (( evaluated == 124 )); then
      echo "=== $evaluation: out of time; run this again to finish it"
      rc=3
    elif (( evaluated != 0 )); then
      echo "=== $evaluation: exit $evaluated"
      rc=1
    fi
  fi
fi
pack || rc=1
echo "accelerator_campaign: exit $rc after $((SECONDS - start)) s"
exit $rc
