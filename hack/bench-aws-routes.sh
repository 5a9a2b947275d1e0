#!/usr/bin/env bash
# Benchmark: the route controller of cloud-controller-manager-aws creates one route per Node
# (N initialised Nodes with /26 pod CIDRs) on kube-apiserver + moto; prints the time until
# every route exists and every Node's NetworkUnavailable is False, the EC2 calls by operation
# (burst and idle passes), CPU seconds and peak RSS. Not part of the tests.
#   hack/bench-aws-routes.sh [--release] [--nodes 1000] [--idle-seconds 30] [-- <extra CCM flags>]
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib-bench.sh
bench_main bench-aws-routes "$@"
