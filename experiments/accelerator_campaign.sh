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
# Steps: the wheels; the campaign names checked (EVALUATION must evaluate TRAINING's runs);
# `campaign run TRAINING --train_until=<the deadline less MARGIN_S>`, so that every launch,
# a queued one too, gets what is left of that time as its train.time_budget_s and stops
# at a checkpoint in time (a run whose turn comes with under 30 s left is not started);
# when `campaign status` shows every training run finished, `campaign run EVALUATION`
# under `timeout` for what is left; then OUTDIR/runs.tgz: every run's records without its
# checkpoints (config, metrics.jsonl, campaign_launches.jsonl, stdout.log, an evaluation's
# JSON), which `campaign collect --runs_dir` reads, and OUTDIR/campaign.log (all output).
# Exits 0 when both campaigns finished, 3 when time ran out first or SIGTERM or SIGHUP
# stopped it (a time limit's `timeout`), 130 after Ctrl-C, 1 on a failure, 2 on a usage
# error (a misspelt campaign, a DEADLINE_S that is not a whole number); stopped by a
# signal, it stops the step under way and packs runs.tgz all the same.
set -uo pipefail

usage() {
  echo "usage: $0 TRAINING[,EVALUATION] OUTDIR [WHEEL_DIR]${1:+: $1}" >&2
  exit 2
}
[[ $# -lt 2 || $# -gt 3 ]] && usage
deadline=${DEADLINE_S:-570}
margin=${MARGIN_S:-60}
[[ "$deadline" =~ ^[0-9]+$ ]] || usage "DEADLINE_S=$deadline is not a whole number of seconds"
[[ "$margin" =~ ^[0-9]+$ ]] || usage "MARGIN_S=$margin is not a whole number of seconds"
[[ -z "${PARALLEL:-}" || "$PARALLEL" =~ ^[1-9][0-9]*$ ]] \
  || usage "PARALLEL=$PARALLEL is not a positive whole number"
start=$SECONDS
end=$(($(date +%s) + deadline))   # the deadline, in seconds since the epoch
training=${1%%,*}
evaluation=""
[[ "$1" == *,* ]] && evaluation=${1#*,}
mkdir -p "$2" || exit 2
outdir=$(cd "$2" && pwd)
wheels=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
site=${SITE:-/tmp/site}
runs=${RUNS_DIR:-/tmp/accel_runs}
cd "$repo" || exit 2
# tee ignores the signals that stop this script, so that its last lines reach the log.
exec > >(trap '' TERM INT HUP; exec tee -a "$outdir/campaign.log") 2>&1

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
left() { echo $((end - $(date +%s))); }

pack() {
  tar -czf "$outdir/runs.tgz" -C "$runs" --exclude=checkpoints --exclude=best \
    --exclude=jax_cache --exclude=lock . \
    && echo "records of $(ls "$runs" | tr '\n' ' ')in $outdir/runs.tgz ($(du -h "$outdir/runs.tgz" | cut -f1))"
}

finish() {  # pack the records, say how it ended, exit with $1
  local rc=$1
  pack || (( rc )) || rc=1
  echo "accelerator_campaign: exit $rc after $((SECONDS - start)) s"
  exit "$rc"
}

child=0
step() {  # run "$@" as a child that a signal's trap can stop; returns its exit status
  "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=0
  return $rc
}

stopped() {  # a signal: stop the step under way, pack what ran, exit with $2
  trap '' TERM INT HUP
  echo "=== stopped by SIG$1 after $((SECONDS - start)) s; run this again to resume"
  if (( child )); then
    kill -TERM "$child" 2>/dev/null
    wait "$child"
  fi
  finish "$2"
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
trap 'stopped TERM 3' TERM
trap 'stopped HUP 3' HUP
trap 'stopped INT 130' INT
[[ -n "$wheels" ]] && step install_wheels
step "$python" -c 'import jax; print("devices:", jax.devices())' || finish 1
step "$python" -c '
import sys
from experiments.campaign import spec
training, evaluation = sys.argv[1:]
try:
  spec.get(training)
  if evaluation and spec.get(evaluation).source != training:
    raise ValueError(f"{evaluation} is no campaign that evaluates the runs of {training}")
except ValueError as e:
  sys.exit(f"error: {e}")
' "$training" "$evaluation" || finish 2

if (( $(left) - margin <= 0 )); then
  echo "no time left to train (deadline ${deadline} s, margin ${margin} s)"
  finish 3
fi
echo "=== $training: launches train until $((end - margin)) (seconds since the epoch), $(($(left) - margin)) s from now"
step "$python" -m experiments.campaign run "$training" "${campaign_args[@]}" \
  --train_until=$((end - margin))
trained=$?
step "$python" -m experiments.campaign status "$training" "${status_args[@]}"
rc=0
if (( trained != 0 )); then
  echo "=== $training: exit $trained"
  rc=1
elif [[ -n "$(unfinished "$training")" ]]; then
  echo "=== $training: stopped by its time to train; run this again to resume"
  rc=3
elif [[ -n "$evaluation" ]]; then
  limit=$(($(left) - 15))
  if (( limit <= 0 )); then
    echo "=== $evaluation: no time left"
    rc=3
  else
    echo "=== $evaluation: at most $limit s"
    step timeout "$limit" "$python" -m experiments.campaign run "$evaluation" "${campaign_args[@]}"
    evaluated=$?
    step "$python" -m experiments.campaign status "$evaluation" "${status_args[@]}"
    if (( evaluated == 124 )); then
      echo "=== $evaluation: out of time; run this again to finish it"
      rc=3
    elif (( evaluated != 0 )); then
      echo "=== $evaluation: exit $evaluated"
      rc=1
    fi
  fi
fi
finish $rc
