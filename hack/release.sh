#!/usr/bin/env bash
# Releases of the staged crates: one version for the whole workspace, bumped together with
# every exact sibling pin, described in CHANGELOG.md, published once, recorded.
#
#   hack/release.sh bump VERSION     set [workspace.package] version and every `=OLD` pin of
#                                    [workspace.dependencies] to VERSION (and the sample's
#                                    dependencies, the deploy manifests' image tag and the
#                                    Helm charts' versions), update
#                                    Cargo.lock;
#                                    refused without a "## VERSION" section in CHANGELOG.md
#   hack/release.sh check            the version in Cargo.toml has its CHANGELOG.md section and
#                                    is above the last release (hack/last-release); run by CI
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
changelog_has() { grep -qE "^## \[?$(sed 's/\./\\./g' <<<"$1")\]?( |$)" CHANGELOG.md 2>/dev/null; }
last_release() {
  [[ -f hack/last-release ]] || return 0
  # shellcheck disable=SC1091
  (source hack/last-release && echo "$version $commit")
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
    # The sample provider depends on the staged crates by version, as a vendor does.
    sed -i -E "s/^(k8s-[a-z-]+|vsphere-api) = \"$old\"\$/\1 = \"$new\"/" examples/cloud-provider-sample/Cargo.toml
    # The image tag the deploy manifests name is the version (hack/build-image.sh tags so).
    sed -i "s/^\( *newTag: \)$old\$/\1$new/" deploy/*/base/kustomization.yaml deploy/*/overlays/*/kustomization.yaml
    # The Helm charts' version and appVersion are the crates' too; their files/base.yaml is
    # rendered from the bases again.
    sed -i -e "s/^version: $old\$/version: $new/" -e "s/^appVersion: \"$old\"\$/appVersion: \"$new\"/" charts/*/Chart.yaml
    hack/render-charts.sh
    left=$(grep -rn --include=Cargo.toml "\"=$old\"" . --exclude-dir=target --exclude-dir=.git || true)
    [[ -z "$left" ]] || fail "pins of $old left after the bump:"$'\n'"$left"
    cargo update --workspace --offline --quiet
    # The fuzz crate (outside the workspace) has its own lock file naming the staged crates.
    (cd fuzz && cargo update --workspace --offline --quiet)
    echo "release: $old -> $new (workspace version and $pins sibling pins; Cargo.lock updated)"
    echo "release: next: commit, then hack/release.sh publish"
    ;;
  image)
    exec hack/release-image.sh "$@"
    ;;
  check)
    version=$(current_version)
    is_semver "$version" || fail "Cargo.toml's workspace version '$version' is not a version"
    changelog_has "$version" || fail "CHANGELOG.md has no '## $version' section for the workspace version $version"
    read -r last_version last_commit <<<"$(last_release)"
    if [[ -n "${last_version:-}" ]]; then
      [[ "$version" == "$last_version" ]] || version_gt "$version" "$last_version" ||
        fail "the workspace version $version is below the last release $last_version"
      echo "release: version $version (last release $last_version from ${last_commit:0:12}); CHANGELOG.md has its section"
    else
      echo "release: version $version (nothing released yet); CHANGELOG.md has its section"
    fi
    ;;
  publish)
    "$0" check
    version=$(current_version)
    read -r last_version _ <<<"$(last_release)"
    [[ "$version" != "${last_version:-}" ]] || fail "$version is the last release already: bump first (hack/release.sh bump <version>)"
    if [[ "${1:-}" == --registry ]]; then
      where="registry '${2:?--registry needs a name}'"
      hack/publish-staging.sh --registry "$2" "${@:3}"
    else
      where="crates.io"
      hack/publish-staging.sh --execute "$@"
    fi
    cat > hack/last-release <<EOF
# The last release of the staged crates (written by hack/release.sh publish): the version
# and the commit it was published from. hack/semver-checks.sh compares the API with it.
version=$version
commit=$(git rev-parse HEAD)
published_to="$where"
EOF
    echo "release: $version published to $where; commit hack/last-release"
    ;;
  *) usage ;;
esac
