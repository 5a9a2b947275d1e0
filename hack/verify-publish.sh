#!/usr/bin/env bash
# Packages and verifies every staged crate on its own, in dependency order, the way
# `cargo publish` would (cargo >= 1.90 resolves not-yet-published siblings through a local
# registry overlay). A staged crate that cannot be published alone (a path dependency without
# a version, a dependency on a publish = false crate, code that only builds inside the
# workspace) fails here. Prints the order and the packaged size of each crate.
#
# --allow-dirty: this check is about manifests and code, not about the git state.
set -euo pipefail
cd "$(dirname "$0")/.."
# Not `mapfile < <(…)`: that ignores the script's exit status (a publishable crate outside
# staging/ must stop this script).
staged=$(hack/staged-crates.sh)
mapfile -t crates <<<"$staged"
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
log=$(mktemp); trap 'rm -f "$log"' EXIT
target=$(cargo metadata --no-deps --format-version 1 --offline | jq -r .target_directory)
# The verification builds each packaged crate against its packaged siblings, which cargo treats
# as registry crates: their build artifacts are reused by name and version, never checked
# against the sources, and each sibling is extracted once per version. A staged crate changed
# without a version bump would thus be verified against its stale build: drop the registry
# copies of our staged crates and their artifacts first (the workspace's path builds are kept).
# shellcheck source=hack/lib-registry.sh
source hack/lib-registry.sh
drop_registry_copies "$target"
if ! cargo package --locked --allow-dirty "${args[@]}" >"$log" 2>&1; then
  cat "$log"
  echo "verify-publish: FAILED: a staged crate cannot be packaged/built on its own (see above)" >&2
  exit 1
fi
echo "verify-publish: ${#crates[@]} staged crates package and build on their own, in this order:"
n=0
grep -E '^\s+Packaging ' "$log" | awk '{print $2, $3}' | while read -r name version; do
  n=$((n + 1))
  file="$target/package/$name-${version#v}.crate"
  printf '  %d. %-36s %-8s %8s bytes (.crate)\n' "$n" "$name" "$version" "$(stat -c %s "$file")"
done
