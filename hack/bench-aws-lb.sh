#!/usr/bin/env bash
# Benchmark: N LoadBalancer Services provisioned and deleted by cloud-controller-manager-aws on
# kube-apiserver + moto; prints the time until every Service has its ingress hostname, the
# deletion time and the ELB/ELBv2/EC2 calls by operation. Not part of the tests.
#   hack/bench-aws-lb.sh [--services 20] [--nodes 3] [--type clb|nlb] [-- <extra CCM flags>]
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-test-deps.sh >/dev/null
cargo build --quiet --bin cloud-controller-manager-aws
exec cargo run --quiet -p rcp-e2e --bin bench-aws-lb -- "$@"
