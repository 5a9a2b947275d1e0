#!/usr/bin/env bash
# Prints the publishable workspace members (one per line) and fails if any of them lives
# outside staging/: only staged crates are published from this repository.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --no-deps --format-version 1 --offline | jq -r --arg root "$PWD/" '
  .packages[] | select(.publish == null or (.publish | length) > 0)
  | "\(.name) \(.manifest_path | ltrimstr($root))"' | while read -r name path; do
  if [[ "$path" != staging/* ]]; then
    echo "staged-crates: $name ($path) is publishable but not under staging/: set publish = false" >&2
    exit 1
  fi
  echo "$name"
done
