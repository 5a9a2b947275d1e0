#!/usr/bin/env bash
# Releases of the staged crates, in two trains (docs/versioning.md), each version described in
# CHANGELOG.md, published once, recorded:
#   - the framework (k8s-controller-manager, k8s-cloud-provider, k8s-cloud-provider-testkit):
#     the version in their manifests, required by the other crates with a caret;
#   - the providers (k8s-legacy-cloud-provider-{aws,vsphere,openstack}, vsphere-api) at the
#     workspace version, the version of the CCM binaries, images and charts too.
#
#   hack/release.sh bump VERSION     set [workspace.package] version and every `=OLD` pin of
#                                    [workspace.dependencies] to VERSION (and the deploy
#                                    manifests' image tag and the Helm charts' versions), update
#                                    Cargo.lock;
#                                    refused without a "## VERSION" section in CHANGELOG.md
#   hack/release.sh bump-framework VERSION
#                                    set the framework crates' version, their requirement in
#                                    [workspace.dependencies] and the sample's dependencies to
#                                    VERSION, update Cargo.lock; refused without a
#                                    "## framework VERSION" section in CHANGELOG.md
#   hack/release.sh check            both versions have their CHANGELOG.md sections and are not
#                                    below the last release (hack/last-release); run by CI
#   hack/release.sh publish [--registry NAME] [OPTION…]
#                                    check, then publish (hack/publish-staging.sh: crates.io
#                                    with --execute, or the registry NAME; OPTIONs go to it,
#                                    e.g. --owner LOGIN, required for crates.io; a run that
#                                    stops part-way is resumed by running it again) and record
#                                    the release in hack/last-release (commit that file)
#   hack/release.sh image [OPTION…] aws|vsphere|openstack …
#                                    the released images: multi-arch (linux/amd64 + linux/arm64)
#                                    OCI images of the version, built by hack/release-image.sh
#                                    (OPTIONs go to it, e.g. --push REGISTRY/PREFIX)
#
# hack/last-release names the version last published and the commit it was published from:
# hack/semver-checks.sh compares the staged crates' API with it.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "release: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

current_version() {
  sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' Cargo.toml
}
FRAMEWORK_CRATES=(controller-manager cloud-provider cloud-provider-testkit)
framework_version() {
  sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' staging/cloud-provider/Cargo.toml
}
# is_semver V: MAJOR.MINOR.PATCH with an optional pre-release (no build metadata).
is_semver() { [[ "$1" =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; }
# version_gt A B: A > B by semver precedence (a pre-release is below its release).
version_gt() {
  [[ "$1" == "$2" ]] && return 1
  local a=${1%%-*} b=${2%%-*}
  if [[ "$a" == "$b" ]]; then
    # Same core: the release beats its pre-releases; pre-releases compare as text.
    [[ "$1" != *-* ]] && return 0
    [[ "$2" != *-* ]] && return 1
    [[ "$1" > "$2" ]]; return
  fi
  [[ "$(printf '%s\n%s\n' "$a" "$b" | sort -V | tail -n1)" == "$a" ]]
}
# changelog_has VERSION [PREFIX]: CHANGELOG.md has a "## [PREFIX ]VERSION" section.
changelog_has() {
  local prefix=${2:+$2 }
  grep -qE "^## ${prefix}\[?$(sed 's/\./\\./g' <<<"$1")\]?( |$)" CHANGELOG.md 2>/dev/null
}
# last_release: "VERSION FRAMEWORK_VERSION COMMIT" of the last release (before the trains were
# split the framework had the workspace version).
last_release() {
  [[ -f hack/last-release ]] || return 0
  # shellcheck disable=SC1091
  (source hack/last-release && echo "$version ${framework_version:-$version} $commit")
}

cmd=${1:-}; shift || true
case "$cmd" in
  bump)
    new=${1:-}; [[ -n "$new" ]] || usage
    is_semver "$new" || fail "'$new' is not a version (MAJOR.MINOR.PATCH[-PRE])"
    old=$(current_version)
    version_gt "$new" "$old" || fail "$new is not above the current version $old"
    changelog_has "$new" || fail "CHANGELOG.md has no '## $new' section: describe the release there first"
    # [workspace.package] version, then every exact pin of a sibling.
    sed -i "/^\[workspace.package\]/,/^\[/ s/^version = \"$old\"\$/version = \"$new\"/" Cargo.toml
    pins=$(grep -c "version = \"=$old\"" Cargo.toml || true)
    sed -i "s/version = \"=$old\"/version = \"=$new\"/g" Cargo.toml
    # The image tag the deploy manifests name is the version (hack/build-image.sh tags so).
    sed -i "s/^\( *newTag: \)$old\$/\1$new/" deploy/*/base/kustomization.yaml deploy/*/overlays/*/kustomization.yaml
    # The Helm charts' version and appVersion are the crates' too; their files/base.yaml is
    # rendered from the bases again.
    sed -i -e "s/^version: $old\$/version: $new/" -e "s/^appVersion: \"$old\"\$/appVersion: \"$new\"/" charts/*/Chart.yaml
    hack/render-charts.sh
    # (The framework crates pin each other in their own manifests, at their own version.)
    left=$(grep -rn --include=Cargo.toml "\"=$old\"" . --exclude-dir=target --exclude-dir=.git \
      --exclude-dir=controller-manager --exclude-dir=cloud-provider --exclude-dir=cloud-provider-testkit || true)
    [[ -z "$left" ]] || fail "pins of $old left after the bump:"$'\n'"$left"
    cargo update --workspace --offline --quiet
    # The fuzz crate (outside the workspace) has its own lock file naming the staged crates.
    (cd fuzz && { cargo update --workspace --offline --quiet 2>/dev/null || cargo update --workspace --quiet; })
    echo "release: $old -> $new (workspace version and $pins sibling pins; Cargo.lock updated)"
    echo "release: next: commit, then hack/release.sh publish"
    ;;
  bump-framework)
    new=${1:-}; [[ -n "$new" ]] || usage
    is_semver "$new" || fail "'$new' is not a version (MAJOR.MINOR.PATCH[-PRE])"
    old=$(framework_version)
    version_gt "$new" "$old" || fail "$new is not above the framework's current version $old"
    changelog_has "$new" framework || fail "CHANGELOG.md has no '## framework $new' section: describe the release there first"
    for c in "${FRAMEWORK_CRATES[@]}"; do
      # The crate's version and its exact pins of its siblings.
      sed -i -e "/^\[package\]/,/^\[/ s/^version = \"$old\"\$/version = \"$new\"/" \
        -e "s/version = \"=$old\"/version = \"=$new\"/g" "staging/$c/Cargo.toml"
      grep -q "^version = \"$new\"\$" "staging/$c/Cargo.toml" || fail "staging/$c/Cargo.toml is not at $old"
    done
    # The other crates' caret requirement ([workspace.dependencies]) is the lowest framework
    # version they need: it moves only when the new version is not compatible with it (before
    # 1.0 a new minor), so that a framework patch release needs no release of the providers.
    # (Raise it by hand when a provider starts using something new.)
    required=$(sed -n -E 's/^k8s-cloud-provider = \{ path = "[^"]+", version = "([^"]+)" \}$/\1/p' Cargo.toml)
    compatible() { # compatible A B: B satisfies ^A
      local a=${1%%-*} b=${2%%-*}
      IFS=. read -r a1 a2 _ <<<"$a"; IFS=. read -r b1 b2 _ <<<"$b"
      if [[ $a1 == 0 ]]; then [[ $b1 == 0 && $a2 == "$b2" ]]; else [[ $a1 == "$b1" ]]; fi
    }
    if compatible "$required" "$new"; then
      echo "release: the other crates keep requiring the framework ^$required (compatible with $new)"
    else
      sed -i -E "s/^((k8s-cloud-provider|k8s-controller-manager|k8s-cloud-provider-testkit) = \{ path = \"[^\"]+\", version = )\"$required\"/\1\"$new\"/" Cargo.toml
      echo "release: the other crates now require the framework ^$new ($required is not compatible)"
    fi
    # The sample provider depends on the crates by version as a vendor does: the new one.
    sed -i -E "s/^(k8s-cloud-provider|k8s-cloud-provider-testkit) = \"$old\"\$/\1 = \"$new\"/" examples/cloud-provider-sample/Cargo.toml
    manifests=(examples/cloud-provider-sample/Cargo.toml)
    for c in "${FRAMEWORK_CRATES[@]}"; do manifests+=("staging/$c/Cargo.toml"); done
    left=$(grep -nE "\"=$old\"|^(k8s-cloud-provider|k8s-cloud-provider-testkit) = \"$old\"" "${manifests[@]}" || true)
    [[ -z "$left" ]] || fail "requirements of the framework $old left after the bump:"$'\n'"$left"
    cargo update --workspace --offline --quiet
    (cd fuzz && { cargo update --workspace --offline --quiet 2>/dev/null || cargo update --workspace --quiet; })
    echo "release: framework $old -> $new (${FRAMEWORK_CRATES[*]}, their requirements, the sample; Cargo.lock updated)"
    echo "release: next: commit, then hack/release.sh publish"
    ;;
  image)
    exec hack/release-image.sh "$@"
    ;;
  check)
    version=$(current_version)
    framework=$(framework_version)
    is_semver "$version" || fail "Cargo.toml's workspace version '$version' is not a version"
    is_semver "$framework" || fail "staging/cloud-provider/Cargo.toml's version '$framework' is not a version"
    changelog_has "$version" || fail "CHANGELOG.md has no '## $version' section for the workspace version $version"
    changelog_has "$framework" framework || fail "CHANGELOG.md has no '## framework $framework' section for the framework version $framework"
    for c in "${FRAMEWORK_CRATES[@]}"; do
      v=$(sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' "staging/$c/Cargo.toml")
      [[ "$v" == "$framework" ]] || fail "staging/$c/Cargo.toml is at '$v', the framework at $framework: the framework crates are released together"
    done
    read -r last_version last_framework last_commit <<<"$(last_release)"
    if [[ -n "${last_version:-}" ]]; then
      [[ "$version" == "$last_version" ]] || version_gt "$version" "$last_version" ||
        fail "the workspace version $version is below the last release $last_version"
      [[ "$framework" == "$last_framework" ]] || version_gt "$framework" "$last_framework" ||
        fail "the framework version $framework is below the last release $last_framework"
      echo "release: providers $version, framework $framework (last release $last_version / $last_framework from ${last_commit:0:12}); CHANGELOG.md has their sections"
    else
      echo "release: providers $version, framework $framework (nothing released yet); CHANGELOG.md has their sections"
    fi
    ;;
  publish)
    "$0" check
    version=$(current_version)
    framework=$(framework_version)
    read -r last_version last_framework _ <<<"$(last_release)"
    [[ "$version" != "${last_version:-}" || "$framework" != "${last_framework:-}" ]] ||
      fail "providers $version and framework $framework are the last release already: bump first (hack/release.sh bump <version> or bump-framework <version>)"
    if [[ "${1:-}" == --registry ]]; then
      where="registry '${2:?--registry needs a name}'"
      hack/publish-staging.sh --registry "$2" "${@:3}"
    else
      where="crates.io"
      hack/publish-staging.sh --execute "$@"
    fi
    cat > hack/last-release <<EOF
# The last release of the staged crates (written by hack/release.sh publish): the providers'
# version, the framework's, and the commit they were published from. hack/semver-checks.sh
# compares the API with it.
version=$version
framework_version=$framework
commit=$(git rev-parse HEAD)
published_to="$where"
EOF
    echo "release: providers $version, framework $framework published to $where; commit hack/last-release"
    ;;
  *) usage ;;
esac
