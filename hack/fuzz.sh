#!/usr/bin/env bash
# Fuzzing (a benchmark, not a test): builds the cargo-fuzz targets of fuzz/ with nightly Rust and
# libFuzzer, and runs each for the given time (or number of runs, or until it has survived a
# number of execs at this code version). Each target's corpus lives in the cache
# ($CACHE/fuzz-corpus/<target>, seeded from fuzz/corpus/) and grows from run to run; every run is
# added to $CACHE/fuzz-corpus/<target>.runs with the code version it ran (a hash of the sources
# the target compiles at HEAD, see code_version below; "dirty" when the working tree differs
# there). The crash-free execs a target has survived at
# this code version are printed beside those of this run: runs of other versions never count.
# A crash is saved under fuzz/artifacts/<target>/; copy it to fuzz/regressions/<target>/ with the
# fix, so hack/fuzz-targets' unit test replays it in CI.
#   hack/fuzz.sh [--time 60 | --runs N | --until-execs N] [--sanitizer address|none]
#                [--features aws,vsphere,openstack] [--summary FILE] [target...]
# --sanitizer none runs ~2-3x faster (the code under test has no unsafe of its own; ASan only
# watches dependencies); --features vsphere,openstack builds the targets that need no AWS SDK.
# --summary appends one Markdown table row per target to FILE (for docs/reliability-figures.md).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
time=60 runs= until= summary= sanitizer=address features=aws,vsphere,openstack targets=()
while (($#)); do
  case "$1" in
    --time) time=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --until-execs) until=$2; shift 2 ;;
    --summary) summary=$2; shift 2 ;;
    --sanitizer) sanitizer=$2; shift 2 ;;
    --features) features=$2; shift 2 ;;
    -*) echo "usage: $0 [--time SECONDS | --runs N | --until-execs N] [--sanitizer address|none] [--features aws,vsphere,openstack] [--summary FILE] [target...]" >&2; exit 2 ;;
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
  # Every target of the chosen features (a target named aws_*/vsphere_*/openstack_* needs that
  # feature).
  skip=-
  for f in aws vsphere openstack; do
    [[ ,$features, == *,$f,* ]] || skip="${f}_|$skip"
  done
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz | grep -v -E "^($skip)")
fi
# One target directory per sanitizer: switching would otherwise rebuild everything.
export CARGO_TARGET_DIR="$CACHE/fuzz-target"
[[ $sanitizer == address ]] || CARGO_TARGET_DIR="$CACHE/fuzz-target-$sanitizer"
cargo +nightly fuzz build "${build[@]}"
mkdir -p "$CACHE/fuzz-corpus"
# The code version of a target: what it compiles, as committed ("dirty" when that differs in the
# tree): the framework crates, the staged crates of its provider (a target named aws_*,
# vsphere_* or openstack_*; the others none), hack/fuzz-targets, its fuzz/fuzz_targets file,
# and the external crates of Cargo.lock (the workspace's own entries left out: a version bump
# changes no code). A change to another provider's code leaves a target's count alone.
code_version() {
  local t=$1 sources=(staging/cloud-provider staging/controller-manager hack/fuzz-targets "fuzz/fuzz_targets/$t.rs")
  case $t in
    aws_*) sources+=(staging/legacy-cloud-providers/aws) ;;
    vsphere_*) sources+=(staging/legacy-cloud-providers/vsphere staging/vsphere-api) ;;
    openstack_*) sources+=(staging/legacy-cloud-providers/openstack) ;;
  esac
  if ! git diff --quiet HEAD -- "${sources[@]}" Cargo.lock || [[ -n $(git ls-files --others --exclude-standard -- "${sources[@]}") ]]; then
    echo dirty; return
  fi
  {
    for p in "${sources[@]}"; do git rev-parse "HEAD:$p"; done
    git show HEAD:Cargo.lock | awk 'BEGIN { RS = ""; ORS = "\n\n" } /\nsource = / || !/^\[\[package\]\]/'
  } | sha1sum | cut -c1-12
}
commit=$(git rev-parse --short=7 HEAD)
status=0
for t in "${targets[@]}"; do
  version=$(code_version "$t")
  corpus="$CACHE/fuzz-corpus/$t"
  mkdir -p "$corpus"
  cp -rn "fuzz/corpus/$t/." "$corpus/"
  survived() { awk -v v="$version" '$2 == "ok" && $5 == v { n += $3 } END { print n + 0 }' "$CACHE/fuzz-corpus/$t.runs" 2>/dev/null || echo 0; }
  limit=(-max_total_time="$time")
  [[ -n "$runs" ]] && limit=(-runs="$runs")
  if [[ -n "$until" ]]; then
    have=$(survived)
    if [[ $version == dirty ]]; then
      echo "hack/fuzz.sh: --until-execs counts runs of a committed code version; commit first" >&2; exit 2
    fi
    if ((have >= until)); then
      printf '%-18s %-6s already %s crash-free execs at code version %s\n' "$t" ok "$have" "$version"
      [[ -z $summary ]] || echo "| $t | $have | 0 | – | $sanitizer | $version ($commit) |" >> "$summary"
      continue
    fi
    limit=(-runs="$((until - have))")
  fi
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
  echo "$(date -u +%FT%TZ) $result $execs $sanitizer $version $commit" >> "$CACHE/fuzz-corpus/$t.runs"
  total=$(survived)
  printf '%-18s %-6s execs %12s  (%s/s, %s)  crash-free execs at code version %s: %s\n' \
    "$t" "$result" "$execs" "$secs" "$sanitizer" "$version" "$total"
  [[ -z $summary ]] || echo "| $t | $total | $([[ $result == ok ]] && echo 0 || echo 1) | $secs | $sanitizer | $version ($commit) |" >> "$summary"
  [[ $result == ok ]] || tail -40 "$log"
  rm -f "$log"
done
exit $status
