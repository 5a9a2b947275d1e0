#!/usr/bin/env bash
# Publishes the staged crates to crates.io in dependency order (cargo orders them).
# Default is a dry run. To publish for real:
#   CARGO_REGISTRY_TOKEN=... hack/publish-staging.sh --execute
# Never run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=dry-run
case "${1:-}" in
  ""|--dry-run) mode=dry-run ;;
  --execute) mode=execute ;;
  *) echo "usage: $0 [--dry-run|--execute]" >&2; exit 2 ;;
esac
# Not `mapfile < <(…)`: that ignores the script's exit status (a publishable crate outside
# staging/ must stop this script).
staged=$(hack/staged-crates.sh)
mapfile -t crates <<<"$staged"
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
if [[ $mode == execute ]]; then
  if [[ -z "${CARGO_REGISTRY_TOKEN:-}" ]]; then
    echo "publish-staging: --execute needs CARGO_REGISTRY_TOKEN" >&2
    exit 2
  fi
  if [[ -n "$(git status --porcelain)" ]]; then
    echo "publish-staging: the working tree is dirty; commit first" >&2
    exit 2
  fi
  echo "publish-staging: publishing ${crates[*]}"
  cargo publish --locked "${args[@]}"
else
  echo "publish-staging: dry run of ${crates[*]} (pass --execute with CARGO_REGISTRY_TOKEN to publish)"
  cargo publish --locked --dry-run --allow-dirty "${args[@]}"
fi
