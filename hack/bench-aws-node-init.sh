#!/usr/bin/env bash
# Benchmark: N tainted Nodes initialised by cloud-controller-manager-aws on kube-apiserver +
# moto; prints wall time, EC2 calls by operation and peak RSS. Not part of the tests.
#   hack/bench-aws-node-init.sh [--release] [--nodes 1000] [-- <extra CCM flags, e.g. --kube-api-qps=1000>]
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib-bench.sh
bench_main bench-aws-node-init "$@"
