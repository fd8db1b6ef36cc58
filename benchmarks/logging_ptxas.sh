#!/usr/bin/env bash
# ptxas as XLA calls it, with -v: each call's report (registers, stack, spills per
# kernel) is kept in $PTXAS_LOG_DIR/<time>.txt. gpu_compile.py puts this file first as
# bin/ptxas of the CUDA directory it gives XLA, and names the real one in $REAL_PTXAS.
real=${REAL_PTXAS:?REAL_PTXAS must name the real ptxas}
if [[ " $* " == *" --version "* ]]; then
  exec "$real" "$@"
fi
log=${PTXAS_LOG_DIR:?PTXAS_LOG_DIR must name a folder}/$(date +%s%N).txt
"$real" -v "$@" 2>"$log"
status=$?
cat "$log" >&2
exit $status
