#!/usr/bin/env bash
# Benchmark: N LoadBalancer Services provisioned and deleted by cloud-controller-manager-aws on
# kube-apiserver + moto; prints the time until every Service has its ingress hostname, the
# deletion time and the ELB/ELBv2/EC2 calls by operation. Not part of the tests.
#   hack/bench-aws-lb.sh [--release] [--services 20] [--nodes 3] [--type clb|nlb] [--shared-elb-security-group] [-- <extra CCM flags>]
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib-bench.sh
bench_main bench-aws-lb "$@"
