#!/usr/bin/env bash
# The project's main job (README): a local cluster with an emulated cloud and a CCM.
# Until the AWS provider exists this builds the per-provider binaries and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --bins -p cloud-controller-manager-aws -p cloud-controller-manager-vsphere
echo "local-up-cluster: built target/debug/cloud-controller-manager-{aws,vsphere}."
echo "local-up-cluster: the local cluster with moto and the AWS CCM is not available yet (needs the AWS provider)."
