#!/usr/bin/env bash
# The publishing round trip a cloud vendor depends on, against a real registry on 127.0.0.1
# (cargo-http-registry, from hack/install-test-deps.sh):
#
#   1. a fresh registry; the staged crates published to it with the real `cargo publish`
#      (hack/publish-staging.sh --registry --no-verify: step 5 checks each crate as
#      downloaded from the registry instead, which costs a type-check, not a full build);
#   2. a failure injected after the third upload (new crates paced as crates.io paces them,
#      scaled down), then the same command again: it resumes, skipping what the registry has
#      with the same checksum; once more: nothing uploaded; a changed crate at a published
#      version: refused, nothing uploaded;
#   3. the API check (hack/semver-checks.sh) of every staged crate against the last release,
#      itself published to a second fresh registry from the revision hack/release.sh recorded;
#   4. examples/cloud-provider-sample, copied out of the repository, built against the
#      registry's crates by version (never by path): its binary is left at
#      $CACHE/sample/cloud-controller-manager-sample, where tests/tests/sample_provider.rs runs it
#      against a kube-apiserver;
#   5. the packaging checks: each published crate as downloaded, type-checked alone and
#      documented as docs.rs does with the declared rust-version's toolchain, then the framework
#      crates and the sample with the lowest versions their manifests allow.
#
# Crates.io is never written to. Prints the time each step took.
#
#   hack/publish-roundtrip.sh [--skip-semver] [--until-sample | --packaging-only]
#
# --until-sample stops after step 4 and --packaging-only does step 5 alone (after a plain
# publish to a fresh registry): hack/test.sh builds the sample before the tests and runs the
# packaging checks beside them, on CPU the tests leave idle.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
skip_semver=0
part=all
while (($#)); do
  case "$1" in
    --skip-semver) skip_semver=1 ;;
    --until-sample) part=sample ;;
    --packaging-only) part=packaging ;;
    *) echo "usage: $0 [--skip-semver] [--until-sample | --packaging-only]" >&2; exit 2 ;;
  esac
  shift
done

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

# The sample, copied out of the repository into $sample, set up to take the framework's crates
# from the test registry.
sample="$work/cloud-provider-sample"
prepare_sample() {
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
      jq -r '.packages[] | select(.name == "k8s-cloud-provider" or .name == "k8s-controller-manager" or .name == "k8s-cloud-provider-testkit")
        | "\(.name) = { version = \"=\(.version)\", registry = \"rcp-test\" }"'
  } > "$sample/.cargo/config.toml"
}

if [[ $part == packaging ]]; then
  step "publish the staged crates"
  hack/publish-staging.sh --registry rcp-test --no-verify "${dirty[@]}" >"$work/publish.log" 2>&1 ||
    { cat "$work/publish.log"; fail "publishing the staged crates failed"; }
  prepare_sample
else
  # published_count: how many versions of the staged crates the registry's index has.
  published_count() {
    local c n=0
    for c in $(hack/staged-crates.sh); do
      if out=$(hack/lib/registry-index.py --registry rcp-test "$c"); then n=$((n + $(wc -l <<<"$out"))); fi
    done
    echo "$n"
  }
  index_head() { git -C "$work/rcp-test" rev-parse HEAD; }
  staged_count=$(hack/staged-crates.sh | wc -l)

  step "publish the staged crates, a failure injected after the third upload"
  # Paced as crates.io paces new crates, scaled down: 2 in a burst, then one per 3 s.
  pace=(--new-crate-burst 2 --new-crate-interval 3)
  if PUBLISH_STAGING_FAIL_AFTER=3 hack/publish-staging.sh --registry rcp-test --no-verify "${pace[@]}" "${dirty[@]}" \
    >"$work/publish-1.log" 2>&1; then
    cat "$work/publish-1.log"; fail "the injected failure did not stop the publish"
  fi
  cat "$work/publish-1.log"
  grep -q 'stopped after 3 uploads' "$work/publish-1.log" || fail "the publish stopped for another reason than the injected failure"
  grep -q 'then one per 3 s: waiting' "$work/publish-1.log" || fail "the third new crate was not paced"
  [[ $(published_count) == 3 ]] || fail "the registry should have 3 crates after the injected failure, not $(published_count)"

  step "the same command again: resumes"
  hack/publish-staging.sh --registry rcp-test --no-verify "${pace[@]}" "${dirty[@]}" | tee "$work/publish-2.log"
  [[ $(grep -c 'already published with the same checksum, skipped' "$work/publish-2.log") == 3 ]] ||
    fail "the resumed publish should skip the 3 crates already published"
  grep -q "published $((staged_count - 3)) crates to registry 'rcp-test' (3 already there)" "$work/publish-2.log" ||
    fail "the resumed publish should upload the $((staged_count - 3)) other crates"
  [[ $(published_count) == "$staged_count" ]] || fail "the registry should have all $staged_count crates, not $(published_count)"

  step "the same versions again: nothing uploaded"
  before=$(index_head)
  hack/publish-staging.sh --registry rcp-test "${dirty[@]}" | tee "$work/publish-3.log"
  grep -q "nothing to publish" "$work/publish-3.log" || fail "publishing the same versions again was not a no-op"
  [[ $(index_head) == "$before" ]] || fail "the registry's index changed on a publish with nothing to publish"

  step "a changed crate at a published version: refused, nothing uploaded"
  # A commit on a scratch clone that changes one staged crate's source, version unchanged.
  changed="$work/changed"
  git clone --quiet --shared "$ROOT" "$changed"
  if ((${#dirty[@]})); then git diff --binary HEAD | git -C "$changed" apply --whitespace=nowarn; fi
  echo '// changed after the release' >>"$changed/staging/vsphere-api/src/lib.rs"
  git -C "$changed" -c user.name=roundtrip -c user.email=roundtrip@localhost commit --quiet -am "a change without a version bump"
  if out=$("$changed/hack/publish-staging.sh" --registry rcp-test 2>&1); then
    echo "$out"; fail "a changed crate was published over its published version"
  fi
  echo "$out"
  [[ $(grep -c REFUSED <<<"$out") == 1 ]] || { echo "$out"; fail "only vsphere-api should be refused"; }
  grep -q "vsphere-api [0-9.]*: REFUSED: already published with other files (src/lib.rs)" <<<"$out" ||
    { echo "$out"; fail "the refusal should name the file that differs"; }
  # The five others: the same files packaged at another commit.
  [[ $(grep -c 'already published with the same files from commit' <<<"$out") == $((staged_count - 1)) ]] ||
    { echo "$out"; fail "the unchanged crates, packaged at another commit, should be recognised as published"; }
  [[ $(index_head) == "$before" ]] || fail "the registry's index changed on a refused publish"

  step "a framework patch release: the framework's three crates uploaded, the providers' untouched"
  # Another scratch clone: a framework change, released with hack/release.sh bump-framework
  # (the next patch version), published to the same registry. The providers' crates require the
  # framework with a caret: their packages are the same files, so nothing of them is uploaded.
  patch_clone="$work/framework-patch"
  git clone --quiet --shared "$ROOT" "$patch_clone"
  if ((${#dirty[@]})); then git diff --binary HEAD | git -C "$patch_clone" apply --whitespace=nowarn; fi
  current_framework=$(sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' staging/cloud-provider/Cargo.toml)
  IFS=. read -r fmaj fmin fpatch <<<"${current_framework%%-*}"
  next_framework="$fmaj.$fmin.$((fpatch + 1))"
  (
    cd "$patch_clone"
    sed -i "0,/^## framework /s//## framework $next_framework\n\n- A fix (publish round trip).\n\n&/" CHANGELOG.md
    echo '// a framework fix' >>staging/cloud-provider/src/lib.rs
    CARGO_TARGET_DIR="$target" hack/release.sh bump-framework "$next_framework" >"$work/bump-framework.log" 2>&1 ||
      { cat "$work/bump-framework.log"; exit 1; }
    git -c user.name=roundtrip -c user.email=roundtrip@localhost commit --quiet -am "framework $next_framework"
  ) || fail "hack/release.sh bump-framework $next_framework failed (above)"
  out=$("$patch_clone/hack/publish-staging.sh" --registry rcp-test --no-verify 2>&1) || { echo "$out"; fail "publishing the framework patch release failed"; }
  echo "$out" | grep -E "^publish-staging:   |uploading" || true
  for c in k8s-controller-manager k8s-cloud-provider k8s-cloud-provider-testkit; do
    grep -q "uploading $c $next_framework" <<<"$out" || { echo "$out"; fail "$c $next_framework was not uploaded"; }
  done
  [[ $(grep -c '^publish-staging: uploading' <<<"$out") == 3 ]] || { echo "$out"; fail "only the three framework crates should be uploaded"; }
  [[ $(grep -c 'already published with the same \(checksum\|files\)' <<<"$out") == $((staged_count - 3)) ]] ||
    { echo "$out"; fail "the providers' crates should be recognised as published (their caret accepts $next_framework)"; }

  if ((skip_semver == 0)); then
    step "API check against the last release (hack/semver-checks.sh)"
    hack/semver-checks.sh
  fi

  step "build examples/cloud-provider-sample from the registry"
  prepare_sample
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

  step "the sample: cargo fmt, cargo clippy, its unit tests, its boundary rules (cargo deny, its deny.toml)"
  (cd "$sample" && cargo fmt --check && CARGO_TARGET_DIR=$target cargo clippy --quiet --bin cloud-controller-manager-sample -- -D warnings &&
    CARGO_TARGET_DIR=$target cargo test --quiet --bin cloud-controller-manager-sample &&
    cargo deny --offline --color never check bans) || fail "the sample is not clean (cargo fmt, cargo clippy, cargo test or cargo deny)"
fi
if [[ $part == sample ]]; then
  step "done"
  exit 0
fi

msrv=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
step "each published crate type-checked alone and documented as docs.rs does, with Rust $msrv (its rust-version)"
# Each crate as downloaded from the registry, outside the repository (none of its cargo
# configuration applies): `cargo check` (it builds alone, from its package, against its
# siblings as published), then `cargo doc` with the features and rustdoc arguments of its
# [package.metadata.docs.rs]. Both with the toolchain of the declared rust-version (the MSRV
# check; hack/install-test-deps.sh installs it); docs.rs uses a nightly.
rustup run "$msrv" cargo --version >/dev/null 2>&1 ||
  fail "Rust $msrv (the staged crates' rust-version) is not installed: run hack/install-test-deps.sh"
docs="$work/docs"
mkdir -p "$docs"
members=()
head_commit=$(git rev-parse HEAD)
while read -r name version; do
  curl -sSfL "$registry_api/api/v1/crates/$name/$version/download" | tar -xz -C "$docs"
  members+=("\"$name-$version\"")
  # What a legal review and a reader of the crate need: the licence, the notice, the commit.
  for f in LICENSE NOTICE; do
    cmp -s "$docs/$name-$version/$f" "$f" || fail "$name as published lacks the repository's $f"
  done
  vcs=$(jq -c . "$docs/$name-$version/.cargo_vcs_info.json") || fail "$name as published has no .cargo_vcs_info.json"
  [[ $(jq -r .git.sha1 <<<"$vcs") == "$head_commit" ]] || fail "$name as published names commit $vcs, not $head_commit"
  [[ $(jq -r '.git.dirty // false' <<<"$vcs") == "$([[ ${#dirty[@]} -gt 0 ]] && echo true || echo false)" ]] ||
    fail "$name as published says $vcs, and the working tree is $([[ ${#dirty[@]} -gt 0 ]] && echo dirty || echo clean)"
done < <(cargo metadata --no-deps --format-version 1 --offline |
  jq -r '.packages[] | select(.manifest_path | contains("/staging/")) | "\(.name) \(.version)"')
printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' "$(IFS=,; echo "${members[*]}")" >"$docs/Cargo.toml"
cp Cargo.lock "$docs/Cargo.lock"
while IFS='|' read -r name all_features features rustdoc_args; do
  flags=()
  [[ $all_features == true ]] && flags+=(--all-features)
  [[ -n "$features" ]] && flags+=(--features "$features")
  (cd "$docs" && CARGO_TARGET_DIR="$target" rustup run "$msrv" cargo check --quiet -p "$name" "${flags[@]}") ||
    fail "$name, as published, does not build on its own with Rust $msrv (its rust-version)"
  (cd "$docs" && RUSTDOCFLAGS="$rustdoc_args -D warnings" CARGO_TARGET_DIR="$target" \
    rustup run "$msrv" cargo doc --quiet --no-deps -p "$name" "${flags[@]}") ||
    fail "the documentation of $name does not build as docs.rs builds it (Rust $msrv)"
  echo "[publish-roundtrip]   $name: checked and documented with Rust $msrv (all-features: $all_features, features: ${features:-none}, rustdoc: ${rustdoc_args:-none})"
done < <(cd "$docs" && cargo metadata --no-deps --format-version 1 |
  jq -r '.packages[] | (.metadata.docs.rs // {}) as $d
    | "\(.name)|\($d["all-features"] // false)|\(($d.features // []) | join(","))|\(($d["rustdoc-args"] // []) | join(" "))"')

step "the framework crates and the sample with the lowest versions their manifests allow"
# A vendor's lock file may hold the oldest versions our requirements accept: each framework
# crate as published, and the sample, resolved with `-Z direct-minimal-versions` (their direct
# dependencies at the lowest version their requirement allows, the rest as usual) and
# type-checked. A cargo -Z flag, on the pinned stable toolchain through RUSTC_BOOTSTRAP=1 (no
# nightly needed). The providers' crates are left out: the AWS SDK alone would double the run.
minimal="$work/minimal"
mkdir -p "$minimal"
framework=()
for c in k8s-controller-manager k8s-cloud-provider k8s-cloud-provider-testkit; do
  dir=$(cd "$docs" && ls -d "$c"-[0-9]*)
  cp -r "$docs/$dir" "$minimal/"
  framework+=("\"$dir\"")
done
printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' "$(IFS=,; echo "${framework[*]}")" >"$minimal/Cargo.toml"
(cd "$minimal" && RUSTC_BOOTSTRAP=1 cargo update --quiet -Z direct-minimal-versions &&
  K8S_OPENAPI_ENABLED_VERSION=1.37 CARGO_TARGET_DIR="$target" cargo check --quiet --workspace) >"$work/minimal.log" 2>&1 ||
  { cat "$work/minimal.log"; fail "the framework crates do not build with the lowest versions their manifests allow (above)"; }
(cd "$sample" && RUSTC_BOOTSTRAP=1 cargo update --quiet -Z direct-minimal-versions &&
  CARGO_TARGET_DIR="$target" cargo check --quiet --all-targets) >"$work/sample-minimal.log" 2>&1 ||
  { cat "$work/sample-minimal.log"; fail "the sample does not build with the lowest versions its manifest allows (above)"; }
echo "[publish-roundtrip]   lowest direct versions: $(cd "$minimal" && cargo tree --quiet --depth 1 -e normal --prefix none 2>/dev/null | sed 's/ (\*)$//' | grep -E '^(kube|k8s-openapi|tokio|hyper|rustls|clap|serde) ' | sort -u | paste -sd, - | sed 's/,/, /g')"

step "done"
