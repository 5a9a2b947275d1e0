#!/usr/bin/env bash
# cargo-deny checks, offline:
#   - always: bans (the boundaries of deny.toml), licenses, sources; and the bans of
#     hack/deny-staging.toml (nothing published depends on cmd/, providers/, tests/, hack/);
#   - advisories: only when RCP_ADVISORY_DB names a directory holding the RustSec advisory
#     database's files (CI: ../shared/advisory-db). cargo-deny wants a git checkout named
#     advisory-db-3157b0e258782691 under its db-path, so the files are copied into a git repo in
#     the cache (once per snapshot) and deny.toml's db-path is pointed at it.
# Says which of the two it did.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
if ! command -v cargo-deny >/dev/null; then
  echo "verify-deps: cargo-deny not found; run hack/install-test-deps.sh" >&2
  exit 1
fi

cargo deny --offline --color never check bans licenses sources
cargo deny --offline --color never --config hack/deny-staging.toml check bans

if [[ -z "${RCP_ADVISORY_DB:-}" ]]; then
  {
    echo "######################################################################################"
    echo "# WARNING verify-deps: the RustSec ADVISORY CHECK WAS SKIPPED (no RCP_ADVISORY_DB)."
    echo "# Bans, licenses and sources were checked; known vulnerabilities were NOT. Set"
    echo "# RCP_ADVISORY_DB to a directory with the RustSec advisory database's files (.ci/run"
    echo "# uses ../shared/advisory-db when it exists), or RCP_REQUIRE_ADVISORIES=1 to fail here."
    echo "######################################################################################"
  } >&2
  if [[ -n "${RCP_REQUIRE_ADVISORIES:-}" ]]; then exit 1; fi
  exit 0
fi
if [[ ! -d "$RCP_ADVISORY_DB/crates" ]]; then
  echo "verify-deps: RCP_ADVISORY_DB=$RCP_ADVISORY_DB has no crates/ directory: not a RustSec advisory database" >&2
  exit 1
fi
snapshot=$( (cat "$RCP_ADVISORY_DB/SNAPSHOT" 2>/dev/null || find "$RCP_ADVISORY_DB" -type f -newer /dev/null | wc -l) | tr -c 'a-zA-Z0-9\n' '_' | head -c 80)
DB_ROOT="$CACHE/advisory-dbs/$snapshot"
DB="$DB_ROOT/advisory-db-3157b0e258782691"
if [[ ! -d "$DB/.git" ]]; then
  rm -rf "$DB_ROOT"; mkdir -p "$DB"
  cp -r "$RCP_ADVISORY_DB"/. "$DB"/
  git -C "$DB" init -q
  git -C "$DB" add -A
  git -C "$DB" -c user.name=verify-deps -c user.email=verify-deps@localhost commit -q -m "snapshot $snapshot"
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed "s|^db-path = .*|db-path = \"$DB_ROOT\"|" deny.toml > "$tmp/deny.toml"
cargo deny --offline --color never --config "$tmp/deny.toml" check advisories
echo "verify-deps: bans, licenses, sources and advisories checked (RustSec snapshot: $(cat "$RCP_ADVISORY_DB/SNAPSHOT" 2>/dev/null || echo unknown))"
