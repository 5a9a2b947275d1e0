#!/usr/bin/env bash
# A cold CI run, timed: HEAD cloned into a fresh directory and `.ci/run` run there with an empty
# project cache, Go build cache and cargo home (test servers installed, crates downloaded and
# everything built from nothing; Debian packages and the Rust toolchains already installed, as on
# a CI machine with its image). The advisory database beside this
# checkout (../shared/advisory-db) is used as CI uses it. Prints the total time, the exit status
# and each step of hack/test.sh with its time; the run's log is kept in the printed directory
# with --keep (deleted otherwise, ~20 GiB).
#   hack/cold-ci.sh [--keep]
# Takes ~1 h on 2 cores: do not load the machine meanwhile (the figure would be too high).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
while (($#)); do
  case "$1" in
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
  esac
done
commit=$(git rev-parse --short=7 HEAD)
# A cold run needs ~25 GiB (its own target directory and test-server cache); a full disk shows
# up much later as a build failure (exit 101) that says nothing of the cause.
free_gib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 { print int($4 / 1048576) }')
if ((free_gib < 25)); then
  echo "cold-ci: only ${free_gib} GiB free in ${TMPDIR:-/tmp}; a cold run needs ~25 GiB (the project cache's target/debug/incremental is safe to remove)" >&2
  exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/cold-ci.XXXXXX")
((keep)) || trap 'rm -rf "$work"' EXIT
git clone --quiet "$PWD" "$work/main"
git -C "$work/main" checkout --quiet "$commit"
[[ -d ../shared ]] && ln -s "$(cd ../shared && pwd)" "$work/shared"
start=$(date +%s)
rc=0
# Empty caches outside the project's too, as on a fresh machine: Go's build cache (the Kubernetes
# and vcsim builds would otherwise reuse this machine's) and cargo's home (crates downloaded).
mkdir -p "$work/go-build" "$work/cargo-home"
(cd "$work/main" && env -u CARGO_TARGET_DIR RCP_CACHE_DIR="$work/cache" GOCACHE="$work/go-build" \
  CARGO_HOME="$work/cargo-home" CI=true .ci/run) >"$work/log" 2>&1 || rc=$?
took=$(($(date +%s) - start))
# Every nextest run's summary (the whole suite, then the oldest minor's core scenarios).
tests=$(grep -o '[0-9]* tests\{0,1\} run: [0-9]* passed[^,]*' "$work/log" | paste -sd';' - | sed 's/;/; /g' || true)
echo "cold CI at $commit: ${took} s ($((took / 60)) min $((took % 60)) s), exit $rc; ${tests:-no test summary}"
# hack/test.sh prints "[test.sh] <step> (previous step N s, …)" as each step starts: one line
# per step with its own time instead.
grep '^\[test.sh\] ' "$work/log" | awk '
  match($0, /\(previous step +[0-9]+ s/) {
    secs = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", secs)
    if (step != "") printf "%5d s  %s\n", secs, step
  }
  { step = $0; sub(/^\[test.sh\] /, "", step); sub(/ *\(previous step.*$/, "", step) }
' || true
((keep)) && echo "log: $work/log"
exit "$rc"
