#!/usr/bin/env bash
# Shared by the hack/bench-*.sh scripts (sourced): `bench_main <bench binary> [args...]`
# installs the test servers, builds $BENCH_CCM (default cloud-controller-manager-aws; release with `--release`
# given before `--`, debug otherwise) and runs the benchmark binary of `tests/` with the other
# arguments.
bench_main() {
  local bench=$1; shift
  hack/install-test-deps.sh >/dev/null
  local profile=() args=() after_separator=0 a
  for a in "$@"; do
    if ((after_separator == 0)) && [[ "$a" == --release ]]; then
      profile=(--release)
      export RCP_CCM_PROFILE=release
      continue
    fi
    [[ "$a" == -- ]] && after_separator=1
    args+=("$a")
  done
  cargo build --quiet "${profile[@]}" --bin "${BENCH_CCM:-cloud-controller-manager-aws}"
  exec cargo run --quiet -p rcp-e2e --bin "$bench" -- "${args[@]}"
}
