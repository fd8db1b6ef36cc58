#!/usr/bin/env bash
# Download the wheels an offline accelerator machine needs (benchmarks/accelerator_wheels.txt)
# into DIR, for CPython 3.12 on manylinux x86-64 (pure-Python wheels for any platform).
#
#   benchmarks/fetch_wheels.sh DIR
#
# Needs network access to the package registry and pip. Packages published only as a
# source archive are built here into a pure-Python wheel. Then carry DIR to the machine
# and run `benchmarks/accelerator_check.sh OUTDIR DIR` there. Keep DIR out of version
# control (e.g. `.whl/`, which .gitignore lists).
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
list="$(cd "$(dirname "$0")" && pwd)/accelerator_wheels.txt"
mkdir -p "$dir"
python=${PYTHON:-python3}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)

while read -r requirement module kind; do
  [[ -z "$requirement" || "$requirement" == \#* ]] && continue
  case "$kind" in
    download)
      "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$dir" "$requirement" ;;
    build)
      "$python" -m pip wheel -q --no-deps --no-binary=:all: -w "$dir" "$requirement" ;;
    *)
      echo "$list: unknown wheel kind '$kind' for $requirement ($module)" >&2
      exit 1 ;;
  esac
  echo "fetched $requirement"
done < "$list"
ls -l "$dir"
du -sh "$dir"
