# shellcheck shell=bash
# Test registries on 127.0.0.1 (cargo-http-registry, installed by hack/install-test-deps.sh),
# for hack/publish-roundtrip.sh and hack/semver-checks.sh. Source it; needs $work (a temporary
# directory the caller removes) and adds the registries' pids to $registry_pids.

registry_pids=()
stop_registries() {
  local p
  for p in "${registry_pids[@]}"; do kill "$p" 2>/dev/null || true; done
}

# start_registry NAME: a fresh registry on an ephemeral port, known to cargo as NAME through
# the environment (CARGO_REGISTRIES_<NAME>_INDEX/_TOKEN; no cargo configuration file changes).
# Sets registry_api to its HTTP address.
start_registry() {
  local name=$1 dir="$work/$1" i
  command -v cargo-http-registry >/dev/null ||
    { echo "cargo-http-registry is not installed: run hack/install-test-deps.sh" >&2; return 1; }
  cargo-http-registry --addr 127.0.0.1:0 "$dir" >"$work/$name.log" 2>&1 &
  registry_pids+=($!)
  for ((i = 0; i < 100; i++)); do
    [[ -s "$dir/config.json" ]] && break
    sleep 0.1
  done
  [[ -s "$dir/config.json" ]] || { echo "registry $name did not start: $(cat "$work/$name.log")" >&2; return 1; }
  local upper=${name^^}; upper=${upper//-/_}
  export "CARGO_REGISTRIES_${upper}_INDEX=file://$dir"
  # cargo sends a token with every publish; the test registry checks none.
  export "CARGO_REGISTRIES_${upper}_TOKEN=test-registry-has-no-tokens"
  registry_api=$(jq -r .api "$dir/config.json")
  echo "registry '$name': index file://$dir, API $registry_api"
}

# drop_registry_copies: the build artifacts and cargo's downloads of the staged crates as
# built from test registries. Every run's registry is new (its own source ID), so nothing is
# reused from them; without this each run would add its copies to the shared target directory.
drop_registry_copies() {
  local target=$1 c dep_info hash home=${CARGO_HOME:-$HOME/.cargo}
  for c in $(hack/staged-crates.sh); do
    for dep_info in "$target"/debug/deps/"${c//-/_}"-*.d; do
      [[ -f "$dep_info" ]] && grep -q '/registry/src/-' "$dep_info" || continue
      hash=${dep_info##*-}; hash=${hash%.d}
      rm -rf "$target"/debug/.fingerprint/"$c-$hash" "$target"/debug/deps/*"-$hash".*
    done
  done
  # file:// registries are kept by cargo under `-<hash>` (no host name).
  local d
  for d in "$home"/registry/index/-* "$home"/registry/cache/-* "$home"/registry/src/-*; do
    [[ -d "$d" ]] || continue
    if compgen -G "$d/k8s-cloud-provider*" >/dev/null || [[ -e "$d/.cache/k8/s-/k8s-cloud-provider" ]]; then
      rm -rf "$d"
    fi
  done
}
