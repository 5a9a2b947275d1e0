#!/usr/bin/env bash
# Fuzzing (a benchmark, not a test): builds the cargo-fuzz targets of fuzz/ with nightly Rust and
# libFuzzer, and runs each for the given time (or number of runs), starting from fuzz/corpus/.
# Prints execs and crashes per target. A crash is saved under fuzz/artifacts/<target>/; copy it
# to fuzz/regressions/<target>/ with the fix, so hack/fuzz-targets' unit test replays it in CI.
#   hack/fuzz.sh [--time 60] [--runs N] [--jobs 1] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
time=60 runs= targets=()
while (($#)); do
  case "$1" in
    --time) time=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -*) echo "usage: $0 [--time SECONDS] [--runs N] [target...]" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "hack/fuzz.sh needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1
fi
if ! command -v cargo-fuzz >/dev/null; then
  cargo install --locked --quiet --root "$CACHE" cargo-fuzz@0.13.2
fi
((${#targets[@]})) || mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
export CARGO_TARGET_DIR="$CACHE/fuzz-target"
cargo +nightly fuzz build --fuzz-dir fuzz -O
status=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$t/." "$work/"
  limit=(-max_total_time="$time")
  [[ -n "$runs" ]] && limit=(-runs="$runs")
  log="$work/fuzz.log"
  if cargo +nightly fuzz run --fuzz-dir fuzz -O "$t" "$work" -- "${limit[@]}" -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH; status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  secs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  printf '%-18s %-6s execs %12s  (%s/s)\n' "$t" "$result" "$execs" "$secs"
  [[ $result == ok ]] || tail -40 "$log"
  rm -rf "$work"
done
exit $status
