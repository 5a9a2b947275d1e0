#!/usr/bin/env bash
# Benchmark: load balancers of cloud-controller-manager-aws under AWS API faults. A fault proxy
# between the CCM and moto answers a share of the API requests with RequestLimitExceeded /
# Throttling, 500, 503, connection resets, 0.5-2 s delays or lost answers (forwarded, then 500).
# Runs the same scenario (N Services through create, a port added, a switch to an NLB, deletion)
# three times: without faults (the baseline), with --share of mixed faults, and with
# --throttle-share (default 0.12) of throttling only: above 10 % the region's shared back-off
# (60 s x the throttled share before every request) slows every request down. Prints for each:
# the time to converge, HTTP requests (amplification against the baseline), provider calls,
# throttled attempts. CI runs the 30 % mixed form with 2 Services.
#   hack/bench-cloud-faults.sh [--release] [--services 5] [--share 0.3] [--throttle-share 0.12]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
services=5 share=0.3 throttle_share=0.12 profile=()
while (($#)); do
  case "$1" in
    --services) services=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --throttle-share) throttle_share=$2; shift 2 ;;
    --release) profile=(--release); export RCP_CCM_PROFILE=release; shift ;;
    *) echo "usage: $0 [--release] [--services N] [--share 0.3] [--throttle-share 0.12]" >&2; exit 2 ;;
  esac
done
hack/install-test-deps.sh >/dev/null
cargo build --quiet "${profile[@]}" --bin cloud-controller-manager-aws
run() {
  RCP_FAULT_SERVICES=$services RCP_FAULT_SHARE=$1 RCP_FAULT_KINDS=$2 \
    cargo test --quiet -p rcp-e2e --test reliability \
    -- --exact load_balancers_converge_under_30_percent_cloud_faults --nocapture 2>&1 | grep -E -A3 '^faults|FAIL|panicked|Error:|did not converge|left behind' || true
}
echo "== baseline (no faults)"; run 0 all
echo "== $share mixed faults"; run "$share" all
echo "== $throttle_share throttling only"; run "$throttle_share" throttle
