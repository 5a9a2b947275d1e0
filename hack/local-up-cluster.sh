#!/usr/bin/env bash
# The project's main job: a local cluster (etcd + kube-apiserver v1.20.2) with an emulated AWS
# (moto), three tainted Nodes, and cloud-controller-manager-aws initialising them. Prints the
# Nodes as a user sees them, runs until Ctrl-C, then cleans up everything it started.
# Set LOCAL_UP_EXIT_AFTER_START=1 to stop right after printing (used by CI).
#
#   hack/local-up-cluster.sh [--provider aws|openstack]
#
# --provider openstack runs the same demo on the real OpenStack of hack/openstack.sh (started if
# needed, left running: `hack/openstack.sh stop` stops it) with cloud-controller-manager-openstack.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-test-deps.sh | grep -v 'cached' || true
cargo build --quiet --locked --bin cloud-controller-manager-aws --bin cloud-controller-manager-openstack --bin local-up-cluster
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 --offline | jq -r .target_directory)
exec "$TARGET_DIR/debug/local-up-cluster" "$@"
