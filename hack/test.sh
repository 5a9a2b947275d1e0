#!/usr/bin/env bash
# The project's test command (README): installs the real test servers (cached), then runs the
# formatting, lint, boundary and dependency checks, the documentation build and every test.
#
#   hack/test.sh            everything
#   hack/test.sh -- ARGS    extra arguments for `cargo nextest run` (e.g. a test filter)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
NEXTEST_ARGS=()
if [[ "${1:-}" == "--" ]]; then shift; NEXTEST_ARGS=("$@"); fi

START=$(date +%s)
t0=$START
phase() {
  local now; now=$(date +%s)
  printf '[test.sh] %-34s (previous step %3d s, total %4d s)\n' "$1" $((now - t0)) $((now - START))
  t0=$now
}

phase "install test servers (Kubernetes and the upstream AWS CCM build in the background)"
# The Go builds of Kubernetes and of the upstream AWS CCM take ~15 min of a cold run. They run
# in the background while the other servers install and the Rust checks and builds below run,
# which leave one of the two cores idle much of the time (the AWS SDK's largest crates compile
# alone); the tests wait for them.
GO_STEPS="kubernetes aws-ccm helm"
OTHER_STEPS="moto vcsim docker-registry cargo-deny cargo-nextest cargo-http-registry openstack"
# What only the checks after the main test run need (the oldest minor's Kubernetes, the API
# check's tool): built beside the tests (see below).
BESIDE_TESTS_STEPS="kubernetes-oldest cargo-semver-checks"
GO_BUILDS_LOG="$CACHE/logs/go-builds.log"
mkdir -p "$CACHE/logs"
RCP_SKIP="${RCP_SKIP:-} $GO_STEPS $OTHER_STEPS $BESIDE_TESTS_STEPS" hack/install-test-deps.sh
# In a session of its own, so that a failing step below stops the builds with it.
RCP_SKIP="${RCP_SKIP:-} apt $OTHER_STEPS $BESIDE_TESTS_STEPS" setsid hack/install-test-deps.sh >"$GO_BUILDS_LOG" 2>&1 &
GO_BUILDS_PID=$!
BESIDE_TESTS_PID=
OPENSTACK_PID=
stop_background() {
  [[ -z $GO_BUILDS_PID ]] || kill -- -"$GO_BUILDS_PID" 2>/dev/null || true
  # (The services it started already are stopped by `hack/openstack.sh stop` in the trap.)
  [[ -z $OPENSTACK_PID ]] || kill -- -"$OPENSTACK_PID" 2>/dev/null || true
  [[ -z $BESIDE_TESTS_PID ]] || kill -- -"$BESIDE_TESTS_PID" 2>/dev/null || true
}
trap stop_background EXIT
# await_background PID_VAR LOG FAILURE: waits for the job whose PID is in PID_VAR (then cleared,
# so stop_background leaves it alone); when it failed, prints LOG and FAILURE and exits.
await_background() {
  local pid=${!1}
  if ! wait "$pid"; then
    cat "$2"; echo "[test.sh] $3" >&2; exit 1
  fi
  printf -v "$1" ''
}
RCP_SKIP="${RCP_SKIP:-} apt $GO_STEPS $BESIDE_TESTS_STEPS" hack/install-test-deps.sh
export PATH="$CACHE/bin:$PATH"
# One OpenStack for the whole run (the OpenStack tests would start it on first use, under a
# lock), started now beside the checks and builds below (its first start on a machine makes the
# databases' seed: ~1.5 min of CPU off the tests' path); stopped when this script exits.
OPENSTACK_LOG="$CACHE/logs/openstack-start.log"
setsid hack/openstack.sh start >"$OPENSTACK_LOG" 2>&1 &
OPENSTACK_PID=$!
trap 'stop_background; hack/openstack.sh stop >/dev/null 2>&1 || true' EXIT

phase "cargo fetch"
# Every platform's crates, so the offline metadata of the boundary and cargo-deny checks works.
cargo fetch --locked --quiet

phase "cargo fmt --check"
cargo fmt --all --check

phase "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

phase "verify boundaries"
hack/verify-boundaries --report

phase "verify dependencies (cargo-deny)"
hack/verify-deps.sh

phase "release version and changelog (hack/release.sh check)"
hack/release.sh check

phase "publish round trip: test registry, resumed and refused publishes, the sample provider"
# The staged crates published with the real `cargo publish` to a registry on 127.0.0.1 (a
# failure injected and resumed, the same versions again, a changed crate refused, a framework
# patch release), and examples/cloud-provider-sample built from the registry
# (tests/tests/sample_provider.rs runs it). The API check and the packaging checks run beside
# the tests (below).
hack/publish-roundtrip.sh --skip-semver --until-sample

# (The staged crates' documentation is built with -D warnings by the round trip above, as
# docs.rs builds it from the published crates.)

phase "wait for the Kubernetes and upstream AWS CCM builds"
await_background GO_BUILDS_PID "$GO_BUILDS_LOG" "building Kubernetes or the upstream AWS CCM failed"
cat "$GO_BUILDS_LOG"
# Everything the tests use is cached now: this only links bin/ completely.
RCP_SKIP="${RCP_SKIP:-} $BESIDE_TESTS_STEPS" hack/install-test-deps.sh | grep -E '^\[install-test-deps\] (done|.*FAILED)'

phase "build the binaries the tests run"
# Tests start these with `cargo build --bin <name>` (paths::workspace_binary); built here, one by
# one exactly so, that is a no-op inside the tests instead of a build under the tests' load
# (which made tests time out waiting for it).
for bin in cloud-controller-manager-aws cloud-controller-manager-vsphere cloud-controller-manager-openstack fake-cloud-controller-manager ecr-credential-provider local-up-cluster; do
  cargo build --locked --quiet --bin "$bin"
done

phase "wait for the shared OpenStack (hack/openstack.sh)"
await_background OPENSTACK_PID "$OPENSTACK_LOG" "hack/openstack.sh start failed"

phase "build the tests (cargo nextest run --no-run)"
# Built before the work beside the tests starts: at idle priority it still slowed this build
# twofold on 2 cores (cold CI at f875d63: 11 min 45 s beside the oldest minor's Go build, 5 min
# 44 s without it at baee644); what runs then is mostly waiting on servers.
cargo nextest run --workspace --locked --profile ci --no-run "${NEXTEST_ARGS[@]}"

phase "doc tests (cargo test --doc --workspace)"
# After the test build, whose libraries (the workspace's feature set) they link: only the
# examples themselves are compiled here (a separate feature set per package cost ~40 s cold).
cargo test --doc --workspace --locked --quiet

phase "cargo nextest run --workspace (the checks that need no test server beside it)"
# Beside the tests, on CPU they leave idle (SCHED_IDLE: the tests' processes always come
# first; on 2 cores they leave ~1/5 of it): the oldest minor's Kubernetes build
# (hack/install-test-deps.sh), the API check against the last release (hack/semver-checks.sh,
# which builds cargo-semver-checks when it has something to compare) and the packaging checks
# (hack/publish-roundtrip.sh --packaging-only: each published crate checked alone and documented
# with the declared rust-version, the lowest versions the manifests allow). In a target directory of their own: the tests' `cargo build`
# would otherwise wait for their builds' lock. The oldest minor's build comes first and leaves
# OLDEST_READY: its scenarios run after the tests while the checks may still go on.
BESIDE_TESTS_LOG="$CACHE/logs/beside-tests.log"
BESIDE_TESTS_TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/beside-tests"
OLDEST_READY="$CACHE/logs/oldest-minor-ready"
rm -f "$OLDEST_READY"
export BESIDE_TESTS_TARGET OLDEST_READY
# SCHED_IDLE where the machine allows it (any user may lower a process's priority), else nice.
idle_priority=(nice -n 19)
chrt --idle 0 true 2>/dev/null && idle_priority=(chrt --idle 0)
setsid "${idle_priority[@]}" bash -c '
  set -e
  RCP_SKIP="${RCP_SKIP:-} apt msrv cargo-semver-checks '"$GO_STEPS $OTHER_STEPS"'" hack/install-test-deps.sh
  touch "$OLDEST_READY"
  export CARGO_TARGET_DIR="$BESIDE_TESTS_TARGET"
  echo "[beside-tests] API check against the last release (hack/semver-checks.sh)"
  hack/semver-checks.sh
  hack/publish-roundtrip.sh --packaging-only
' >"$BESIDE_TESTS_LOG" 2>&1 &
BESIDE_TESTS_PID=$!
# Every moto server leaves the IAM actions of the calls our programs made in RCP_AWS_CALLS_DIR
# (tests/src/moto.rs), checked against the shipped IAM policies after the run.
RCP_AWS_CALLS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rcp-aws-calls.XXXXXX")
export RCP_AWS_CALLS_DIR
cargo nextest run --workspace --locked --profile ci "${NEXTEST_ARGS[@]}"

phase "the AWS calls moto saw against the IAM policies (hack/verify-iam-calls.sh)"
# The whole suite's calls (a filtered run may make none of a program's).
if ((${#NEXTEST_ARGS[@]} == 0)); then
  hack/verify-iam-calls.sh "$RCP_AWS_CALLS_DIR"
else
  echo "[test.sh] a filtered run: the IAM check needs the whole suite's calls; skipped"
fi

phase "wait for the oldest minor's Kubernetes (built beside the tests)"
while [[ ! -e $OLDEST_READY ]]; do
  if ! kill -0 "$BESIDE_TESTS_PID" 2>/dev/null; then
    await_background BESIDE_TESTS_PID "$BESIDE_TESTS_LOG" "building the oldest minor's Kubernetes beside the tests failed (above)"
    [[ -e $OLDEST_READY ]] || { cat "$BESIDE_TESTS_LOG"; echo "[test.sh] the work beside the tests ended before the oldest minor's Kubernetes was built" >&2; exit 1; }
  fi
  sleep 2
done

phase "the window's oldest minor: core scenarios on $(readlink -f "$CACHE/bin-oldest/kube-apiserver" | sed 's|.*/kubernetes-\(v[^/]*\)/.*|\1|')"
# The same test binary with the oldest tested minor's API server, kubelet, controller-manager
# and scheduler (README "Kubernetes versions"): Node initialisation, a Classic ELB, an NLB, an
# OpenStack load balancer, vSphere Nodes, and on real kubelets the AWS fail-over scenario and
# the ECR pull. (The vSphere scenario on real kubelets, 167 s of this step's serial 291 s, runs
# on 1.37 only: what it adds to the AWS one on kubelets is the provider, shown here on the API
# server.)
RCP_TEST_BIN_DIR="$CACHE/bin-oldest" cargo nextest run --workspace --locked --profile ci \
  -E 'test(=cloud_controllers::tainted_node_is_initialised_with_labels_provider_id_and_addresses)
    | test(=aws_lb::classic::classic_elb_with_annotations_follows_nodes_and_leaves_nothing_behind)
    | test(=aws_lb::nlb::nlb_with_target_groups_targets_and_node_rules_and_a_type_switch_leave_nothing)
    | test(=openstack_lb::annotations::annotations_reach_octavia_and_follow_changes)
    | test(=vsphere::nodes_are_found_by_uuid_in_both_byte_orders_and_by_guest_host_name)
    | test(=real_cluster::aws_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over)
    | test(=real_cluster::the_kubelet_pulls_from_ecr_with_the_credentials_of_ecr_credential_provider)'

# The checks beside the tests went on at idle priority through the oldest minor's scenarios.
phase "wait for the checks beside the tests"
await_background BESIDE_TESTS_PID "$BESIDE_TESTS_LOG" "a check beside the tests failed (above)"
grep -E '^\[(install-test-deps|publish-roundtrip|beside-tests)\]|^semver-checks:|Summary|Finished' "$BESIDE_TESTS_LOG" || true

phase "done"
echo "[test.sh] all checks passed in $(( $(date +%s) - START )) s ($ROOT)"
