#!/usr/bin/env bash
# The API check of the staged crates: each one's public API now, compared by
# cargo-semver-checks with the same crate as the last release published it (hack/last-release:
# the commit it was published from). The release is published to a fresh registry on
# 127.0.0.1 from that commit, downloaded from it like any dependency, and used as the baseline.
#
# A change that breaks a public item fails unless the crate's version (its train's: the
# framework's or the providers', docs/versioning.md) is bumped enough for it (before 1.0:
# 0.1.x -> 0.2.0): cargo-semver-checks reads the required bump from the two versions. While a
# crate's version is still the one it had in the last release (nothing bumped yet), its
# unreleased changes are held to a patch release's rules (0.1.0 -> 0.1.1: additions only).
#
#   hack/semver-checks.sh [-p CRATE ...]     default: every staged crate
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
fail() { echo "semver-checks: $*" >&2; exit 1; }

crates=()
while (($#)); do
  case "$1" in
    -p) crates+=("${2:?-p needs a crate}"); shift ;;
    *) fail "unknown argument '$1' (usage: $0 [-p CRATE ...])" ;;
  esac
  shift
done
((${#crates[@]})) || mapfile -t crates < <(hack/staged-crates.sh)

[[ -f hack/last-release ]] || fail "hack/last-release is missing: nothing to compare with"
# shellcheck disable=SC1091
source hack/last-release
: "${version:?hack/last-release names no version}" "${commit:?hack/last-release names no commit}"
last=$version
# Each staged crate's version now.
declare -A current
while read -r name v; do current[$name]=$v; done < <(cargo metadata --no-deps --format-version 1 --offline |
  jq -r '.packages[] | "\(.name) \(.version)"')

work=$(mktemp -d "${TMPDIR:-/tmp}/semver-checks.XXXXXX")
# shellcheck source=hack/lib-registry.sh
source hack/lib-registry.sh
target=${CARGO_TARGET_DIR:-$ROOT/target}
trap 'stop_registries; drop_registry_copies "$target"; rm -rf "$work"' EXIT

echo "semver-checks: baseline: the staged crates $last as published from ${commit:0:12}"
start_registry rcp-baseline
# Verified when it was released; here only its sources matter.
hack/publish-staging.sh --registry rcp-baseline --rev "$commit" --no-verify >"$work/publish.log" 2>&1 ||
  { cat "$work/publish.log"; fail "could not publish the baseline from $commit"; }

# The baseline as a workspace of the crates downloaded from the registry.
mkdir -p "$work/baseline"
members=()
checked=()
declare -A baseline_version
for c in "${crates[@]}"; do
  # A crate the release did not have (new since) has no baseline: nothing to compare.
  if ! git show "$commit:Cargo.toml" | grep -q "^$c = { path"; then
    echo "semver-checks: $c is new since $last (not in ${commit:0:12}): no baseline, not compared"
    continue
  fi
  # The version the release published it at (the only one the baseline registry has).
  released=$(hack/lib/registry-index.py --registry rcp-baseline "$c" | jq -r .vers | tail -n1) ||
    fail "the baseline registry has no $c (was it in the release?)"
  curl -sSfL "$registry_api/api/v1/crates/$c/$released/download" -o "$work/$c.crate" ||
    fail "the registry has no $c $released (was it in the release?)"
  tar -xzf "$work/$c.crate" -C "$work/baseline"
  members+=("\"$c-$released\"")
  checked+=("$c")
  baseline_version[$c]=$released
done
crates=("${checked[@]}")
printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' "$(IFS=,; echo "${members[*]}")" >"$work/baseline/Cargo.toml"

# major_bump OLD NEW: whether NEW is a major release after OLD by Cargo's rules (the first
# non-zero of major.minor.patch changed: 0.1.0 -> 0.2.0, 1.2.0 -> 2.0.0, 0.0.1 -> 0.0.2).
major_bump() {
  local a b i
  IFS=. read -r -a a <<<"${1%%[-+]*}"
  IFS=. read -r -a b <<<"${2%%[-+]*}"
  for i in 0 1 2; do
    if [[ "${a[i]:-0}" != "${b[i]:-0}" ]]; then return 0; fi
    [[ "${a[i]:-0}" == 0 ]] || return 1
  done
  return 1
}

# Crates still at their released version are held to a patch release's rules; the others to
# what their bump allows (cargo-semver-checks reads it from the two versions). A major bump
# allows every change: cargo-semver-checks would build both sides' rustdoc and then skip all of
# its lints (in CI that was ~11 min of builds for no check), so such a crate is not built.
unbumped=()
bumped=()
for c in "${crates[@]}"; do
  if [[ "${current[$c]}" == "${baseline_version[$c]}" ]]; then
    unbumped+=(-p "$c")
    echo "semver-checks: $c ${current[$c]} not bumped since the release: only changes a patch release may make are accepted"
  elif major_bump "${baseline_version[$c]}" "${current[$c]}"; then
    echo "semver-checks: $c ${baseline_version[$c]} -> ${current[$c]}: a major release, every change allowed; not compared"
  else
    bumped+=(-p "$c")
    echo "semver-checks: $c ${baseline_version[$c]} -> ${current[$c]}"
  fi
done
# Nothing to compare while every crate's next version is a major release after the last one (or
# new since): cargo-semver-checks is then neither installed nor run, nor its self-test below
# (CI: ~2 min of CPU for its build, ~1 min for the self-test's rustdoc builds). Both come back
# once a crate's version is a patch or minor release after the last one, or not bumped at all.
if ((${#unbumped[@]} + ${#bumped[@]} == 0)); then
  echo "semver-checks: nothing to compare: every staged crate is a major release after $last or new since (cargo-semver-checks and its self-test run once one is not)"
  exit 0
fi
if ! command -v cargo-semver-checks >/dev/null; then
  echo "semver-checks: installing cargo-semver-checks (hack/install-test-deps.sh)"
  RCP_ONLY=cargo-semver-checks hack/install-test-deps.sh >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; fail "cargo-semver-checks could not be installed (above)"; }
fi
command -v cargo-semver-checks >/dev/null || fail "cargo-semver-checks is not installed: run hack/install-test-deps.sh"

# The libraries enable no k8s-openapi version (their binaries do): the rustdoc builds, made
# outside the repository, need one. Both sides are built against the oldest API version
# k8s-openapi 0.29 knows (1.33): the staged crates support every version from it on (a vendor
# may choose it), and the last release was published against it (its code does not compile
# against 1.36+, where fields such as `TokenReviewStatus.token`'s became optional).
export K8S_OPENAPI_ENABLED_VERSION=1.33
if ((${#unbumped[@]})); then
  cargo semver-checks check-release "${unbumped[@]}" --baseline-root "$work/baseline" --release-type patch
fi
if ((${#bumped[@]})); then
  cargo semver-checks check-release "${bumped[@]}" --baseline-root "$work/baseline"
fi

# The check's own check: while every crate is bumped past the release by a major release
# (0.1.0 -> 0.2.0), nothing above is compared. A copy of a released crate
# with one public function made private must fail a patch release's rules, or the wiring (the
# baseline, the k8s-openapi version, the tool) is broken.
planted=vsphere-api
if [[ -n "${baseline_version[$planted]:-}" ]]; then
  copy="$work/planted/$planted"
  mkdir -p "$work/planted"
  cp -r "$work/baseline/$planted-${baseline_version[$planted]}" "$copy"
  grep -q '^pub fn error_chain(' "$copy/src/lib.rs" ||
    fail "self-test: $planted ${baseline_version[$planted]} has no 'pub fn error_chain(' in src/lib.rs to make private"
  sed -i 's/^pub fn error_chain(/pub(crate) fn error_chain(/' "$copy/src/lib.rs"
  if cargo semver-checks check-release --manifest-path "$copy/Cargo.toml" --baseline-root "$work/baseline" \
    --release-type patch >"$work/planted.log" 2>&1; then
    cat "$work/planted.log"
    fail "self-test: $planted with error_chain made private passed a patch release's rules: the API check cannot fail"
  fi
  grep -q 'function_missing' "$work/planted.log" || {
    cat "$work/planted.log"; fail "self-test: the check failed, but not on the removed function (above)"; }
  echo "semver-checks: self-test: a public function made private in $planted fails a patch release (function_missing)"
fi
