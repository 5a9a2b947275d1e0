#!/usr/bin/env bash
# The publishing round trip a cloud vendor depends on, against a real registry on 127.0.0.1
# (cargo-http-registry, from hack/install-test-deps.sh):
#
#   1. a fresh registry; the staged crates published to it with the real `cargo publish`
#      (hack/publish-staging.sh --registry --no-verify: step 5 checks each crate as
#      downloaded from the registry instead, which costs a type-check, not a full build);
#   2. the same versions published again: refused, nothing uploaded;
#   3. the API check (hack/semver-checks.sh) of every staged crate against the last release,
#      itself published to a second fresh registry from the revision hack/release.sh recorded;
#   4. examples/cloud-provider-sample, copied out of the repository, built against the
#      registry's crates by version (never by path): its binary is left at
#      $CACHE/sample/cloud-controller-manager-sample, where tests/tests/sample_provider.rs runs it
#      against a kube-apiserver.
#
# Crates.io is never written to. Prints the time each step took.
#
#   hack/publish-roundtrip.sh [--skip-semver]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
skip_semver=0
[[ "${1:-}" == "--skip-semver" ]] && skip_semver=1

START=$(date +%s); t0=$START
step() {
  local now; now=$(date +%s)
  printf '[publish-roundtrip] %-58s (previous step %3d s, total %4d s)\n' "$1" $((now - t0)) $((now - START))
  t0=$now
}
fail() { echo "[publish-roundtrip] FAILED: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/publish-roundtrip.XXXXXX")
# shellcheck source=hack/lib-registry.sh
source hack/lib-registry.sh
target=${CARGO_TARGET_DIR:-$ROOT/target}
cleanup() {
  stop_registries
  drop_registry_copies "$target"
  rm -rf "$work"
}
trap cleanup EXIT

# What the sources are (tests/tests/sample_provider.rs compares it with the working tree's).
stamp_paths=(staging examples Cargo.toml Cargo.lock)
{
  git rev-parse HEAD
  if git diff --quiet HEAD -- "${stamp_paths[@]}"; then echo clean; else echo dirty; git diff HEAD -- "${stamp_paths[@]}"; fi
} >"$work/sources"
dirty=()
[[ -n "$(git status --porcelain --untracked-files=no)" ]] && dirty=(--allow-dirty)

step "start a fresh registry on 127.0.0.1"
start_registry rcp-test

step "publish the staged crates (cargo publish --registry rcp-test)"
hack/publish-staging.sh --registry rcp-test --no-verify "${dirty[@]}"

step "publish the same versions again (must be refused)"
if out=$(hack/publish-staging.sh --registry rcp-test "${dirty[@]}" 2>&1); then
  echo "$out"; fail "publishing the same versions twice was not refused"
fi
grep -q "refused: registry 'rcp-test' already has" <<<"$out" || { echo "$out"; fail "the second publish failed for another reason"; }
echo "$out" | grep 'refused'

if ((skip_semver == 0)); then
  step "API check against the last release (hack/semver-checks.sh)"
  hack/semver-checks.sh
fi

step "build examples/cloud-provider-sample from the registry"
sample="$work/cloud-provider-sample"
cp -r examples/cloud-provider-sample "$sample"
rm -rf "$sample/target" "$sample/Cargo.lock"
# Start from the workspace's lock file: the sample then builds with the very versions of
# every third-party crate that this repository tests (cargo drops what it does not use and
# resolves the staged crates from the registry).
cp Cargo.lock "$sample/Cargo.lock"
# The sample's manifest names the crates as a vendor's does, by version from crates.io; this
# run takes them from the test registry instead (the names are not on crates.io), through the
# copy's own cargo configuration.
mkdir -p "$sample/.cargo"
{
  echo '[patch.crates-io]'
  cargo metadata --no-deps --format-version 1 --offline |
    jq -r '.packages[] | select(.name == "k8s-cloud-provider" or .name == "k8s-controller-manager")
      | "\(.name) = { version = \"=\(.version)\", registry = \"rcp-test\" }"'
} > "$sample/.cargo/config.toml"
# Outside the repository: none of its cargo configuration ([env], toolchain) applies.
built="$target/debug/cloud-controller-manager-sample"
rm -f "$built"
(cd "$sample" && CARGO_TARGET_DIR=$target cargo build --bin cloud-controller-manager-sample) >"$work/sample-build.log" 2>&1 || {
  cat "$work/sample-build.log"; fail "the sample did not build"; }
grep -v '^ *\(Compiling\|Downloaded\|Downloading\|Checking\|Locking\|Adding\|Removing\)' "$work/sample-build.log" || true
grep -q 'registry+file://' "$sample/Cargo.lock" && grep -A2 'name = "k8s-cloud-provider"' "$sample/Cargo.lock" | grep -q "source = \"registry+file://$work/rcp-test\"" ||
  fail "the sample's k8s-cloud-provider does not come from the test registry"
grep -q '^source = "path' "$sample/Cargo.lock" && fail "the sample used a path dependency"
mkdir -p "$CACHE/sample"
cp "$built" "$CACHE/sample/cloud-controller-manager-sample"
cp "$work/sources" "$CACHE/sample/sources"
echo "[publish-roundtrip] sample: $(cat "$sample"/src/*.rs | wc -l) lines of Rust, $(wc -l < "$sample/Cargo.toml") of Cargo.toml; its crates from the test registry:"
grep -B2 "source = \"registry+file://$work/rcp-test\"" "$sample/Cargo.lock" | grep -E '^(name|version)' | paste - - | sed 's/^/  /'

step "the sample: cargo fmt, cargo clippy, and its boundary rules (cargo deny, its deny.toml)"
(cd "$sample" && cargo fmt --check && CARGO_TARGET_DIR=$target cargo clippy --quiet --bin cloud-controller-manager-sample -- -D warnings &&
  cargo deny --offline --color never check bans) || fail "the sample is not clean (cargo fmt, cargo clippy or cargo deny)"

step "each published crate type-checked alone, and documented as docs.rs does"
# Each crate as downloaded from the registry, outside the repository (none of its cargo
# configuration applies): `cargo check` (it builds alone, from its package, against its
# siblings as published), then `cargo doc` with the features and rustdoc arguments of its
# [package.metadata.docs.rs]. docs.rs uses a nightly toolchain; this uses the project's.
docs="$work/docs"
mkdir -p "$docs"
members=()
while read -r name version; do
  curl -sSfL "$registry_api/api/v1/crates/$name/$version/download" | tar -xz -C "$docs"
  members+=("\"$name-$version\"")
done < <(cargo metadata --no-deps --format-version 1 --offline |
  jq -r '.packages[] | select(.manifest_path | contains("/staging/")) | "\(.name) \(.version)"')
printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' "$(IFS=,; echo "${members[*]}")" >"$docs/Cargo.toml"
cp Cargo.lock "$docs/Cargo.lock"
while IFS='|' read -r name all_features features rustdoc_args; do
  flags=()
  [[ $all_features == true ]] && flags+=(--all-features)
  [[ -n "$features" ]] && flags+=(--features "$features")
  (cd "$docs" && CARGO_TARGET_DIR="$target" cargo check --quiet -p "$name" "${flags[@]}") ||
    fail "$name, as published, does not build on its own"
  (cd "$docs" && RUSTDOCFLAGS="$rustdoc_args -D warnings" CARGO_TARGET_DIR="$target" \
    cargo doc --quiet --no-deps -p "$name" "${flags[@]}") ||
    fail "the documentation of $name does not build as docs.rs builds it"
  echo "[publish-roundtrip]   $name: checked and documented (all-features: $all_features, features: ${features:-none}, rustdoc: ${rustdoc_args:-none})"
done < <(cd "$docs" && cargo metadata --no-deps --format-version 1 |
  jq -r '.packages[] | (.metadata.docs.rs // {}) as $d
    | "\(.name)|\($d["all-features"] // false)|\(($d.features // []) | join(","))|\(($d["rustdoc-args"] // []) | join(" "))"')

step "done"
