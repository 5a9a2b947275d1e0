#!/usr/bin/env bash
# Benchmark: the CCM's secure port under connection floods (tests/tests/secure_port_load.rs, one
# test at a time). Each flood (1,200 idle TLS connections or connections that never start TLS
# from 600 addresses, the CCM limited to 1,024 open files; 512 connections sending unfinished
# 400 KB request heads; a flood of RSA handshakes; made-up tokens) is held for --seconds while
# /healthz is probed once a second with curl. Prints, per flood, the probes answered, the slowest
# answer, the longest run of failures and the CCM's peak RSS. CI runs the same tests with the
# floods held for 20 s.
#   hack/bench-secure-port.sh [--release] [--seconds 60]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
export PATH="$CACHE/bin:$PATH"
seconds=60 profile=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --release) profile=(--release); export RCP_CCM_PROFILE=release; shift ;;
    *) echo "usage: $0 [--release] [--seconds 60]" >&2; exit 2 ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "--seconds $seconds: a whole number of seconds above 0" >&2; exit 2; }
hack/install-test-deps.sh >/dev/null
cargo build --quiet "${profile[@]}" --bin fake-cloud-controller-manager
echo "[bench-secure-port] commit $(git rev-parse --short HEAD), floods held ${seconds} s, $(nproc) cores"
RCP_FLOOD_SECONDS=$seconds cargo test --quiet -p rcp-e2e --test e2e -- secure_port_load:: \
  --test-threads 1 --nocapture 2>&1 | sed -n -E 's/^.*(secure port)/\1/p; /^test result/p'
