#!/usr/bin/env bash
# Publishes the staged crates, in dependency order (cargo orders them), with the real
# `cargo publish`.
#
#   hack/publish-staging.sh                        dry run against crates.io (the default)
#   CARGO_REGISTRY_TOKEN=… hack/publish-staging.sh --execute
#                                                  publish to crates.io (never run by CI)
#   hack/publish-staging.sh --registry NAME        publish to the registry NAME of cargo's
#                                                  configuration ([registries.NAME] in a
#                                                  config.toml, or CARGO_REGISTRIES_NAME_INDEX
#                                                  and CARGO_REGISTRIES_NAME_TOKEN)
#
# Options:
#   --rev REV       publish the staged crates as they are at git revision REV (e.g. the last
#                   release, as the baseline of hack/semver-checks.sh); default: HEAD
#   --allow-dirty   publish the working tree's files, uncommitted changes included (only with
#                   --registry: never to crates.io)
#   --no-verify     do not build each packaged crate before uploading it
#
# Every crate's version is looked up in the registry first: when the registry already has any
# of them, nothing is published (a version is published once; bump it with hack/release.sh).
#
# Publishing to another registry than crates.io: cargo publishes a path dependency as a
# dependency on crates.io unless the manifest names a registry, so the crates are published
# from a copy of the tree whose [workspace.dependencies] name the registry for the staged
# siblings. The copy's sources are exactly those of REV (or the working tree); nothing in the
# repository is changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
mode=dry-run registry="" rev="" allow_dirty=0 verify=()
while (($#)); do
  case "$1" in
    --dry-run) mode=dry-run ;;
    --execute) mode=execute ;;
    --registry) registry=${2:?--registry needs a registry name}; shift ;;
    --rev) rev=${2:?--rev needs a git revision}; shift ;;
    --allow-dirty) allow_dirty=1 ;;
    --no-verify) verify=(--no-verify) ;;
    -h|--help) usage ;;
    *) echo "publish-staging: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
say() { echo "publish-staging: $*"; }
fail() { echo "publish-staging: $*" >&2; exit 1; }
[[ -n "$registry" ]] && mode=registry
if [[ $allow_dirty == 1 && $mode == execute ]]; then
  fail "--allow-dirty is refused for crates.io: commit first"
fi
if [[ $allow_dirty == 1 && -n "$rev" ]]; then
  fail "--allow-dirty and --rev exclude each other"
fi

# The staged crates and their versions at the revision published.
staged=$(hack/staged-crates.sh)
mapfile -t crates <<<"$staged"
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done

if [[ $mode == dry-run ]]; then
  say "dry run of ${crates[*]} (pass --execute with CARGO_REGISTRY_TOKEN to publish to crates.io, or --registry NAME)"
  exec cargo publish --locked --dry-run --allow-dirty "${args[@]}"
fi

# The tree to publish: a copy of REV's (or the working tree's) tracked files.
work=$(mktemp -d "${TMPDIR:-/tmp}/publish-staging.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree="$work/tree"
mkdir -p "$tree"
if [[ -n "$rev" ]]; then
  commit=$(git rev-parse --verify --quiet "$rev^{commit}") ||
    fail "revision '$rev' is not in this clone (a shallow clone? fetch it, or the tags, first)"
  git archive "$commit" | tar -x -C "$tree"
else
  if [[ $allow_dirty == 0 && -n "$(git status --porcelain --untracked-files=no)" ]]; then
    fail "the working tree has uncommitted changes; commit first (or --allow-dirty for a test registry)"
  fi
  commit=$(git rev-parse HEAD)
  git ls-files -z | xargs -0 cp --parents -t "$tree"
fi
cd "$tree"

# name version, one line per staged crate, from the copy's own manifests.
versions=$(cargo metadata --no-deps --format-version 1 --offline |
  jq -r --arg crates "${crates[*]}" '($crates | split(" ")) as $c | .packages[] | select(.name as $n | $c | index($n)) | "\(.name) \(.version)"')

registry_flag=()
shown="crates.io"
if [[ $mode == registry ]]; then
  registry_flag=(--registry "$registry")
  shown="registry '$registry'"
  # The staged siblings are published as dependencies on this registry.
  pattern=$(IFS='|'; echo "${crates[*]}")
  sed -i -E "/^($pattern) = \\{/ s/ \\}\$/, registry = \"$registry\" }/" Cargo.toml
  n=$(grep -cE "^($pattern) = \\{.*registry = \"$registry\"" Cargo.toml || true)
  ((n == ${#crates[@]})) ||
    fail "Cargo.toml's [workspace.dependencies] should list the ${#crates[@]} staged crates as '<name> = { path = …, version = … }'; found $n"
else
  [[ -n "${CARGO_REGISTRY_TOKEN:-}" ]] || fail "--execute needs CARGO_REGISTRY_TOKEN"
fi

# A version the registry already has is never published again.
already=()
while read -r name version; do
  out=$(cd "$work" && cargo info --quiet "${registry_flag[@]}" "$name@$version" 2>&1) && {
    already+=("$name $version"); continue; }
  grep -q "could not find \`$name@$version\`" <<<"$out" ||
    fail "could not look up $name $version in $shown: $out"
done <<<"$versions"
if ((${#already[@]})); then
  fail "refused: $shown already has $(IFS=,; echo "${already[*]}" | sed 's/,/, /g'); nothing was published. Bump the version first (hack/release.sh bump <version>)."
fi

say "publishing to $shown from $(git -C "$ROOT" rev-parse --short "$commit")$([[ $allow_dirty == 1 ]] && echo ' with uncommitted changes'):"
sed 's/^/  /' <<<"$versions"
# --allow-dirty: the copy is not a git checkout (its sources are REV's or the working tree's,
# checked above).
cargo publish --locked --allow-dirty "${verify[@]}" "${registry_flag[@]}" "${args[@]}"
say "published ${#crates[@]} crates to $shown"
