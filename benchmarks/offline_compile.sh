#!/usr/bin/env bash
# The offline compile checks, each with the compiler stack of its target, installed from
# the package registry beside the project's own environment (CI runs both after the
# tests; by hand, from any directory):
#
#   benchmarks/offline_compile.sh gpu OUT.json   # an H100 (gpu_compile.py): a Python 3.12
#       venv in .venv-gpu-compile with benchmarks/requirements-gpu-compile.txt, the CUDA
#       13 toolkit's ptxas
#   benchmarks/offline_compile.sh tpu OUT.json   # TPU v5e and v6e (tpu_compile.py): the
#       project's environment (.venv, or $PYTHON) with libtpu
#       (benchmarks/requirements-tpu-compile.txt) installed apart in .tpu-site
#
# Where a stack cannot be installed (no Python 3.12, no ptxas, no registry), it prints one
# line saying so and exits 0: the check is skipped, not failed. A compile that fails exits
# non-zero. $PYTHON312 names a Python 3.12 interpreter where `python3.12` is not on PATH
# (pyenv's is looked for too).
set -uo pipefail

if [[ $# -ne 2 || ( $1 != gpu && $1 != tpu ) ]]; then
  echo "usage: $0 gpu|tpu OUT.json" >&2
  exit 2
fi
target=$1
out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2

skip() {
  echo "offline_compile $target: skipped, $*"
  exit 0
}

if [[ $target == gpu ]]; then
  python312=""
  for candidate in ${PYTHON312:-} python3.12 ~/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      python312=$candidate
      break
    fi
  done
  [[ -n $python312 ]] || skip "no Python 3.12 (set PYTHON312)"
  command -v ptxas >/dev/null || [[ -x /usr/local/cuda/bin/ptxas ]] || skip "no CUDA 13 ptxas"
  venv=$repo/.venv-gpu-compile
  if [[ ! -x $venv/bin/python ]]; then
    "$python312" -m venv "$venv" || skip "Python 3.12 could not make a venv"
  fi
  "$venv/bin/python" -m pip install -q -r benchmarks/requirements-gpu-compile.txt \
    || skip "benchmarks/requirements-gpu-compile.txt did not install"
  exec "$venv/bin/python" benchmarks/gpu_compile.py --json "$out"
fi

site=$repo/.tpu-site
python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || skip "no project environment at $python (make .venv, or set PYTHON)"
if ! PYTHONPATH=$site "$python" -c 'import libtpu' 2>/dev/null; then
  "$python" -m pip install -q --target "$site" -r benchmarks/requirements-tpu-compile.txt \
    || skip "benchmarks/requirements-tpu-compile.txt (libtpu) did not install"
fi
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} JAX_PLATFORMS=cpu \
  exec "$python" benchmarks/tpu_compile.py --json "$out"
