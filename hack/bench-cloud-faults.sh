#!/usr/bin/env bash
# Benchmark: load balancers of cloud-controller-manager-aws under AWS API faults. A fault proxy
# between the CCM and moto answers a share of the API requests with RequestLimitExceeded /
# Throttling, 500, 503, connection resets, 0.5-2 s delays or lost answers (forwarded, then 500).
# Runs the same scenario (N Services through create, a port added, a switch to an NLB, deletion)
# three times: without faults (the baseline), with --share of mixed faults, and with
# --throttle-share (default 0.12) of throttling only: above 10 % the region's shared back-off
# (60 s x the throttled share before every request) slows every request down. Prints for each:
# the time to converge, HTTP requests (amplification against the baseline), provider calls,
# throttled attempts. CI runs the 30 % mixed form with 2 Services. Each step of a lifecycle may
# take up to 420 s (six failed syncs in a row back off 315 s). The throttling run has --throttle-services Services (default 1) and up to
# --throttle-limit seconds a step (default 900): at 12 % throttling every request of the region
# first waits ~7 s, as upstream's back-off does, so 5 Services' ~400 requests, one Service
# synced at a time, cannot finish in any useful time. A run that fails (did not converge, left
# something behind) makes the script exit 1 after all three.
#   hack/bench-cloud-faults.sh [--release] [--services 5] [--share 0.3] [--throttle-share 0.12]
#        [--throttle-services 1] [--throttle-limit 900]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
services=5 share=0.3 throttle_share=0.12 throttle_services=1 throttle_limit=900 profile=()
while (($#)); do
  case "$1" in
    --services) services=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --throttle-share) throttle_share=$2; shift 2 ;;
    --throttle-limit) throttle_limit=$2; shift 2 ;;
    --throttle-services) throttle_services=$2; shift 2 ;;
    --release) profile=(--release); export RCP_CCM_PROFILE=release; shift ;;
    *) echo "usage: $0 [--release] [--services N] [--share 0.3] [--throttle-share 0.12] [--throttle-services 1] [--throttle-limit 900]" >&2; exit 2 ;;
  esac
done
hack/install-test-deps.sh >/dev/null
cargo build --quiet "${profile[@]}" --bin cloud-controller-manager-aws
failed=()
# run SHARE KINDS [LIMIT_SECS] [SERVICES]: one run of the scenario; its figures, or what a failed run left behind (and
# the CCM's warnings and errors about it). A failed run is named at the end and makes the
# script exit 1.
run() {
  local log status=0
  log=$(mktemp)
  RCP_FAULT_SERVICES=${4:-$services} RCP_FAULT_SHARE=$1 RCP_FAULT_KINDS=$2 RCP_FAULT_LIMIT_SECS=${3:-420} \
    cargo test --quiet -p rcp-e2e --test e2e \
    -- --exact reliability::load_balancers_converge_under_30_percent_cloud_faults --nocapture >"$log" 2>&1 || status=$?
  grep -E -A3 '^faults|FAIL|panicked|Error:|did not converge|left behind' "$log" || true
  if ((status != 0)); then
    failed+=("$1 $2")
    echo "-- the run failed (exit $status); the CCM's warnings and errors, and what it said about the leftovers:"
    grep -E ' (WARN|ERROR) |^node-group rules' "$log" | tail -10 || true
  fi
  rm -f "$log"
}
echo "== baseline (no faults)"; run 0 all
echo "== $share mixed faults"; run "$share" all
echo "== $throttle_share throttling only ($throttle_services Service(s))"; run "$throttle_share" throttle "$throttle_limit" "$throttle_services"
if ((${#failed[@]})); then
  echo "bench-cloud-faults: ${#failed[@]} run(s) failed (share, kinds): $(printf '[%s] ' "${failed[@]}")" >&2
  exit 1
fi
