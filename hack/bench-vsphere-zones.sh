#!/usr/bin/env bash
# Benchmark: N Nodes with zone/region tags initialised by cloud-controller-manager-vsphere on
# kube-apiserver + vcsim; prints the vCenter SOAP and REST requests per Node (counted by a
# proxy in front of vcsim). Not part of the tests.
#   hack/bench-vsphere-zones.sh [--release] [--nodes 100]
# RCP_CCM_BINARY=<path> measures another build of the binary (e.g. an older commit's).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib-bench.sh
BENCH_CCM=cloud-controller-manager-vsphere bench_main bench-vsphere-zones "$@"
