# Sourced by the accelerator scripts (benchmarks/accelerator_check.sh,
# experiments/accelerator_campaign.sh): install_wheels installs each package of
# benchmarks/accelerator_wheels.txt whose module does not import already, from the wheels
# in $wheels (made by benchmarks/fetch_wheels.sh), into $site with `pip install --no-index
# --no-deps --target`. It reads $repo, $python, $wheels and $site from the caller.

normalized() { tr 'A-Z_.' 'a-z--' <<< "$1"; }

install_wheels() {
  local list="$repo/benchmarks/accelerator_wheels.txt" requirement module kind name version
  local wheel found=() missing=()
  while read -r requirement module kind; do
    [[ -z "$requirement" || "$requirement" == \#* ]] && continue
    if "$python" -c "import $module" 2>/dev/null; then
      echo "have $module"
      continue
    fi
    name=$(normalized "${requirement%%==*}")
    version=${requirement##*==}
    wheel=""
    for candidate in "$wheels"/*.whl; do
      local base=${candidate##*/}
      if [[ $(normalized "${base%%-*}") == "$name" && ${base#*-} == "$version"-* ]]; then
        wheel=$candidate
      fi
    done
    if [[ -z "$wheel" ]]; then
      missing+=("$requirement")
    else
      found+=("$wheel")
    fi
  done < "$list"
  if (( ${#missing[@]} )); then
    echo "no wheel in $wheels for: ${missing[*]}"
  fi
  if (( ${#found[@]} )); then
    echo "installing into $site: ${found[*]##*/}"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$site" "${found[@]}"
  fi
}
