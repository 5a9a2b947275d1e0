#!/usr/bin/env bash
# Fuzzing (a benchmark, not a test): builds the cargo-fuzz targets of fuzz/ with nightly Rust and
# libFuzzer, and runs each for the given time (or number of runs). Each target's corpus lives in
# the cache ($CACHE/fuzz-corpus/<target>, seeded from fuzz/corpus/) and grows from run to run;
# every run is added to $CACHE/fuzz-corpus/<target>.runs, so the execs a target has survived in
# total are printed beside those of this run. A crash is saved under fuzz/artifacts/<target>/;
# copy it to fuzz/regressions/<target>/ with the fix, so hack/fuzz-targets' unit test replays it
# in CI.
#   hack/fuzz.sh [--time 60] [--runs N] [--sanitizer address|none] [--features aws,vsphere]
#                [target...]
# --sanitizer none runs ~2-3x faster (the code under test has no unsafe of its own; ASan only
# watches dependencies); --features vsphere builds the targets that need no AWS SDK.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
time=60 runs= sanitizer=address features=aws,vsphere targets=()
while (($#)); do
  case "$1" in
    --time) time=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --sanitizer) sanitizer=$2; shift 2 ;;
    --features) features=$2; shift 2 ;;
    -*) echo "usage: $0 [--time SECONDS] [--runs N] [--sanitizer address|none] [--features aws,vsphere] [target...]" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "hack/fuzz.sh needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1
fi
if ! command -v cargo-fuzz >/dev/null; then
  cargo install --locked --quiet --root "$CACHE" cargo-fuzz@0.13.2
fi
build=(--fuzz-dir fuzz -O -s "$sanitizer" --no-default-features --features "$features")
if ((${#targets[@]} == 0)); then
  # Every target of the chosen features (a target named aws_*/vsphere_* needs that feature).
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz |
    grep -v -E "^($( [[ ,$features, == *,aws,* ]] || printf 'aws_|' )$( [[ ,$features, == *,vsphere,* ]] || printf 'vsphere_|' )-)")
fi
# One target directory per sanitizer: switching would otherwise rebuild everything.
export CARGO_TARGET_DIR="$CACHE/fuzz-target"
[[ $sanitizer == address ]] || CARGO_TARGET_DIR="$CACHE/fuzz-target-$sanitizer"
cargo +nightly fuzz build "${build[@]}"
mkdir -p "$CACHE/fuzz-corpus"
status=0
for t in "${targets[@]}"; do
  corpus="$CACHE/fuzz-corpus/$t"
  mkdir -p "$corpus"
  cp -rn "fuzz/corpus/$t/." "$corpus/"
  limit=(-max_total_time="$time")
  [[ -n "$runs" ]] && limit=(-runs="$runs")
  log=$(mktemp)
  if cargo +nightly fuzz run "${build[@]}" "$t" "$corpus" -- "${limit[@]}" -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  elif grep -q 'libFuzzer: run interrupted' "$log"; then
    result=ok  # stopped by a signal (Ctrl-C): no crash, its execs count
  else
    result=CRASH; status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  secs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "$(date -u +%FT%TZ) $result $execs $sanitizer" >> "$CACHE/fuzz-corpus/$t.runs"
  total=$(awk '$2 == "ok" { n += $3 } END { print n + 0 }' "$CACHE/fuzz-corpus/$t.runs")
  printf '%-18s %-6s execs %12s  (%s/s, %s)  crash-free execs in all runs: %s\n' \
    "$t" "$result" "$execs" "$secs" "$sanitizer" "$total"
  [[ $result == ok ]] || tail -40 "$log"
  rm -f "$log"
done
exit $status
