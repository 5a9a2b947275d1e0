#!/usr/bin/env bash
# Benchmark: crash trials. cloud-controller-manager-aws runs against kube-apiserver + moto; each
# trial takes one Service through its whole load-balancer life (classic ELB, a port added, a
# switch to an NLB, deletion) while the CCM is SIGKILLed at a random moment spread over that
# life and restarted at once. After every converged step the cloud (read from moto directly) must
# hold exactly one load balancer for the Service and, after the deletion, nothing of it; at the
# end nothing cluster-owned may be left. Prints each trial and the totals: trials, leaks,
# duplicates, convergence after a kill (median, max). CI runs the same test with 5 trials.
#   hack/bench-crash-trials.sh [--release] [--trials 100]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
trials=100 profile=()
while (($#)); do
  case "$1" in
    --trials) trials=$2; shift 2 ;;
    --release) profile=(--release); export RCP_CCM_PROFILE=release; shift ;;
    *) echo "usage: $0 [--release] [--trials N]" >&2; exit 2 ;;
  esac
done
hack/install-test-deps.sh >/dev/null
cargo build --quiet "${profile[@]}" --bin cloud-controller-manager-aws
RCP_CRASH_TRIALS=$trials exec cargo test --quiet -p rcp-e2e --test e2e \
  -- --exact reliability::crash_trials_leave_no_leaked_or_duplicated_cloud_resources --nocapture
