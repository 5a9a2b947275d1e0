#!/usr/bin/env bash
# The project's main job: a local Kubernetes cluster (the version hack/kube/go.mod pins) with real nodes, and the CCM running
# the way users run it. etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
# 127.0.0.1; two kubelets with containerd, each in network and mount namespaces of its own that
# hold its cloud machine's address; an emulated AWS (moto: a cluster VPC and three instances).
# The CCM's image (hack/build-image.sh) is imported into each node and the CCM applied with
# `kubectl apply -k deploy/aws/overlays/local`: a DaemonSet Pod on each control-plane Node
# (leader election between them) initialises the kubelets' Nodes, and the LoadBalancer Service
# `hello` gets an ELB. Prints what a user looks at, runs until Ctrl-C, then cleans up everything
# it started (nothing of the host is changed). Needs root (kubelet, namespaces, cgroups).
# Set LOCAL_UP_EXIT_AFTER_START=1 to stop right after printing (used by CI).
#
#   hack/local-up-cluster.sh [--provider aws|openstack|vsphere]
#
# --provider openstack runs the same on the real OpenStack of hack/openstack.sh (started if
# needed, left running: `hack/openstack.sh stop` stops it) with three nova servers and
# deploy/openstack/overlays/local (an Octavia load balancer with a floating IP for `hello`).
# --provider vsphere runs it on vcsim (three VMs, zone and region tags) with
# deploy/vsphere/overlays/local (no load balancer: vSphere's CCM serves none).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
  echo "hack/local-up-cluster.sh: run it as root (kubelet and containerd need it, and the nodes are namespaces and cgroups)" >&2
  exit 1
fi
provider=aws
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --provider=*) provider=${!i#--provider=} ;;
    --provider) j=$((i + 1)); provider=${!j:-} ;;
  esac
done
case "$provider" in aws|openstack|vsphere) ;; *) echo "hack/local-up-cluster.sh: --provider aws|openstack|vsphere, not '$provider'" >&2; exit 2 ;; esac
# Only what this provider's cluster needs: the Kubernetes binaries, the runtime and this cloud's
# emulation (not the test suite's tools, the oldest minor, the upstream AWS CCM or helm; not
# the ~365 OpenStack packages for AWS or vSphere).
skip="${RCP_SKIP:-} kubernetes-oldest aws-ccm helm msrv cargo-deny cargo-nextest cargo-http-registry cargo-semver-checks docker-registry"
[[ $provider == aws ]] || skip+=" moto"
[[ $provider == vsphere ]] || skip+=" vcsim"
[[ $provider == openstack ]] || skip+=" openstack"
RCP_SKIP="$skip" hack/install-test-deps.sh | grep -v 'cached' || true
# The image is the release build, as users run it (its first build takes ~15 min on 2 cores);
# RCP_IMAGE_PROFILE=dev for a quicker debug build (CI's smoke runs: tests/tests/real_cluster_local_up.rs).
export RCP_IMAGE_PROFILE=${RCP_IMAGE_PROFILE:-release}
echo "[local-up-cluster] the CCM image is the $RCP_IMAGE_PROFILE build of cloud-controller-manager-$provider"
cargo build --quiet --locked --bin local-up-cluster
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 --offline | jq -r .target_directory)
exec "$TARGET_DIR/debug/local-up-cluster" "$@"
