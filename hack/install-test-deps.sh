#!/usr/bin/env bash
# Installs every real server the tests need, idempotently, into a cache outside the repository:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider/
#     kube-apiserver-v1.20.2/kube-apiserver   built from Debian's `kubernetes` source package
#     kube-node-v1.20.2/{kubelet,kube-controller-manager,kube-scheduler,pause}   the same tree
#     moto-5.2.5/venv/                        moto[server] from PyPI in a venv
#     vcsim-0.24.2/{vcsim,govc}               built from Debian's govmomi sources
#     docker-registry-2.8.2+ds1-1/            Debian's docker-registry, unpacked (never installed)
#     cargo-deny-0.20.2/bin/cargo-deny        cargo install --locked
#     cargo-nextest-0.9.143/bin/cargo-nextest  cargo install --locked (only when none is installed)
#     cargo-http-registry-0.1.8/bin/…         cargo install --locked (the test registry)
#     cargo-semver-checks-0.51.0/bin/…        cargo install --locked (hack/semver-checks.sh)
#     (system)                                Debian's OpenStack Zed packages (hack/openstack.sh install)
#     bin/                                    symlinks to all of the above + etcd + kubectl
#
# Each step prints a progress line, skips itself when its result is already cached (keyed by
# version), and on failure says which step failed and where its log is.
#
# Environment:
#   RCP_CACHE_DIR   override the cache directory
#   RCP_SKIP        space-separated steps to skip (apt kube-apiserver kube-node moto vcsim docker-registry cargo-deny
#                   cargo-nextest cargo-http-registry cargo-semver-checks openstack)
set -euo pipefail

PROJECT=rust-cloud-provider
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/$PROJECT}"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
KUBE_VERSION=v1.20.2
MOTO_VERSION=5.2.5
BOTO3_VERSION=1.44.5
GOVMOMI_VERSION=0.24.2
GOVMOMI_DEB_VERSION=0.24.2-3
REGISTRY_DEB_VERSION=2.8.2+ds1-1
CARGO_DENY_VERSION=0.20.2
CARGO_NEXTEST_VERSION=0.9.143
CARGO_HTTP_REGISTRY_VERSION=0.1.8
CARGO_SEMVER_CHECKS_VERSION=0.51.0
mkdir -p "$BIN" "$LOGS"

START=$(date +%s)
step() { printf '[install-test-deps] %-16s %s\n' "$1" "$2"; }
skipped() { [[ " ${RCP_SKIP:-} " == *" $1 "* ]]; }
# run_logged STEP LOGFILE CMD...: runs a command with its output in a log; on failure prints
# the step, the exit code and the log's tail, then exits.
run_logged() {
  local name=$1 log=$2; shift 2
  local rc=0
  "$@" >>"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    step "$name" "FAILED (exit $rc) running: $*"
    step "$name" "last lines of $log:"
    tail -n 25 "$log" | sed 's/^/    /'
    exit 1
  fi
}

# Lookups of system tools ignore our own bin/ directory: hack/test.sh puts it on PATH, and
# `command -v etcd` would otherwise find bin/etcd and re-link it to itself.
SYS_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$BIN" | paste -sd: -)
have() { PATH="$SYS_PATH" command -v "$1" >/dev/null; }
sys_which() { PATH="$SYS_PATH" command -v "$1"; }

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
# need_apt: one clear line, then exit, when packages are missing and cannot be installed here.
need_apt() {
  if ! command -v apt-get >/dev/null; then
    step apt "FAILED: missing $*, and apt-get is not here: hack/test.sh needs a Debian (bookworm) machine"
    exit 1
  fi
  if [[ -n "$SUDO" ]] && ! sudo -n true 2>/dev/null; then
    step apt "FAILED: missing $*: run as root, or as a user with password-less sudo, to install them"
    exit 1
  fi
}

# A private apt configuration with a deb-src entry for the system's own Debian mirror; the
# system's sources are not changed.
APT_DIR="$CACHE/apt"
apt_src_opts() {
  echo "-oDir::Etc::SourceList=/dev/null -oDir::Etc::SourceParts=$APT_DIR/sources -oDir::State::Lists=$APT_DIR/lists -oDir::Cache=$APT_DIR/cache"
}
prepare_apt_src() {
  [[ -f "$APT_DIR/.updated" ]] && return 0
  mkdir -p "$APT_DIR/sources" "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
  local uri
  uri=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | awk '{print $2}' || true)
  if [[ -z "$uri" ]]; then
    uri=$(grep -h -m1 -E '^deb .*debian' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' || true)
  fi
  if [[ -z "$uri" ]]; then
    step apt-src "FAILED: cannot find the Debian mirror URI in /etc/apt/sources.list(.d)"
    exit 1
  fi
  cat >"$APT_DIR/sources/src.sources" <<EOF
Types: deb-src
URIs: $uri
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # shellcheck disable=SC2046
  run_logged apt-src "$LOGS/apt-src.log" apt-get $(apt_src_opts) update
  touch "$APT_DIR/.updated"
}

# ---------------------------------------------------------------------------------------------
# 1. Debian packages: etcd, Go, rsync, govmomi libraries; kubectl only when none is installed.
if ! skipped apt; then
  pkgs=()
  have etcd || pkgs+=(etcd-server)
  have go || pkgs+=(golang-go)
  have rsync || pkgs+=(rsync)
  have xz || pkgs+=(xz-utils)
  have openssl || pkgs+=(openssl)
  [[ -d /usr/share/gocode/src/github.com/vmware/govmomi ]] || pkgs+=(golang-github-vmware-govmomi-dev)
  [[ -d /usr/share/gocode/src/github.com/kr/pretty ]] || pkgs+=(golang-github-kr-pretty-dev)
  have kubectl || pkgs+=(kubernetes-client)
  have jq || pkgs+=(jq)
  have umoci || pkgs+=(umoci)
  # The real-node cluster: a container runtime, its OCI runtime, Pod networking (bridge,
  # host-local, loopback, portmap in /usr/lib/cni) and a C compiler for the static pause program.
  have containerd || pkgs+=(containerd)
  have runc || pkgs+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || pkgs+=(containernetworking-plugins)
  have gcc || pkgs+=(gcc)
  [[ -f /usr/lib/x86_64-linux-gnu/libc.a || -n $(ls /usr/lib/*/libc.a 2>/dev/null) ]] || pkgs+=(libc6-dev)
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] || pkgs+=(ca-certificates)
  python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv)
  if ((${#pkgs[@]})); then
    need_apt "${pkgs[*]}"
    step apt "installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! $SUDO apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$LOGS/apt.log" 2>&1; then
      run_logged apt "$LOGS/apt.log" $SUDO apt-get update
      run_logged apt "$LOGS/apt.log" $SUDO apt-get install -y --no-install-recommends "${pkgs[@]}"
    fi
  else
    step apt "cached (etcd, go, rsync, govmomi sources, kubectl, jq, umoci, containerd, runc, CNI plugins, gcc present)"
  fi
fi
for tool in etcd kubectl jq umoci containerd runc; do
  target=$(sys_which "$tool" || true)
  if [[ -z "$target" || ! -x "$target" ]]; then
    step apt "FAILED: no executable \`$tool\` on PATH after installing packages (see $LOGS/apt.log)"
    exit 1
  fi
  ln -sfn "$(readlink -f "$target")" "$BIN/$tool"
done

# ---------------------------------------------------------------------------------------------
# 2. Kubernetes v1.20.2 from Debian's kubernetes source package: kube-apiserver (every test), and
#    for the real-node cluster (hack/local-up-cluster.sh, tests/tests/real_cluster.rs) kubelet,
#    kube-controller-manager, kube-scheduler and the Pod sandbox ("pause") program. Whatever is
#    missing is built in one `make` from one unpacked tree (the binaries share most packages),
#    which is then deleted; the source tarball and Go's build cache stay.
KA_DIR="$CACHE/kube-apiserver-$KUBE_VERSION"
KN_DIR="$CACHE/kube-node-$KUBE_VERSION"
KUBE_CMDS=()
if ! skipped kube-apiserver; then
  if [[ -x "$KA_DIR/kube-apiserver" ]] && "$KA_DIR/kube-apiserver" --version 2>/dev/null | grep -q "$KUBE_VERSION"; then
    step kube-apiserver "cached: $("$KA_DIR/kube-apiserver" --version)"
  else
    KUBE_CMDS+=(kube-apiserver)
  fi
fi
if ! skipped kube-node; then
  missing=0
  for cmd in kubelet kube-controller-manager kube-scheduler; do
    "$KN_DIR/$cmd" --version 2>/dev/null | grep -q "$KUBE_VERSION" || { KUBE_CMDS+=("$cmd"); missing=1; }
  done
  [[ -x "$KN_DIR/pause" ]] || { KUBE_CMDS+=(pause); missing=1; }
  ((missing)) || step kube-node "cached: kubelet, kube-controller-manager, kube-scheduler, pause ($KUBE_VERSION)"
fi
if ((${#KUBE_CMDS[@]})); then
  step kubernetes "building ${KUBE_CMDS[*]} $KUBE_VERSION from Debian's kubernetes source package (~8 min for kube-apiserver, ~6 more for the node binaries)"
  prepare_apt_src
  W="$CACHE/build/kubernetes"
  mkdir -p "$W" "$KA_DIR" "$KN_DIR"
  if ! ls "$W"/kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
    # shellcheck disable=SC2046
    (cd "$W" && run_logged kubernetes "$LOGS/kubernetes.log" apt-get $(apt_src_opts) source --download-only kubernetes)
  fi
  if [[ ! -d "$W/kubernetes-1.20.2" ]]; then
    run_logged kubernetes "$LOGS/kubernetes.log" tar xzf "$(ls "$W"/kubernetes_*.orig.tar.gz | head -1)" -C "$W"
  fi
  src=$(ls -d "$W"/kubernetes-1.20*/ | head -1)
  whats=()
  for cmd in "${KUBE_CMDS[@]}"; do
    [[ $cmd == pause ]] && continue
    # A half-failed earlier build leaves an empty binary behind that make would consider done.
    find "$src/_output" -type f -name "$cmd" -size 0 -delete 2>/dev/null || true
    whats+=("cmd/$cmd")
  done
  if ((${#whats[@]})); then
    mkdir -p "$src/.go/src/k8s.io"
    ln -sfn ../../.. "$src/.go/src/k8s.io/kubernetes"
    (cd "$src" && GOPATH="$src/.go" GOFLAGS=-mod=vendor CGO_ENABLED=0 GOTOOLCHAIN=local \
      KUBE_GIT_VERSION=$KUBE_VERSION KUBE_GIT_TREE_STATE=clean \
      run_logged kubernetes "$LOGS/kubernetes.log" make WHAT="${whats[*]}")
  fi
  for cmd in "${KUBE_CMDS[@]}"; do
    dir=$KN_DIR; [[ $cmd == kube-apiserver ]] && dir=$KA_DIR
    if [[ $cmd == pause ]]; then
      # The sandbox every Pod starts with (what the registry.k8s.io/pause image holds), static.
      run_logged kubernetes "$LOGS/kubernetes.log" gcc -Os -static -Wall -Werror \
        -DVERSION="\"3.4.1-$KUBE_VERSION\"" -o "$dir/pause.tmp" "$src/build/pause/linux/pause.c"
      mv "$dir/pause.tmp" "$dir/pause"
      continue
    fi
    built=$(find "$src/_output" -type f -name "$cmd" -size +1M | head -1)
    if [[ -z "$built" ]]; then
      step kubernetes "FAILED: build finished but no $cmd binary in $src/_output (log: $LOGS/kubernetes.log)"
      exit 1
    fi
    cp "$built" "$dir/$cmd.tmp" && mv "$dir/$cmd.tmp" "$dir/$cmd"
  done
  rm -rf "$W/kubernetes-1.20"*   # the unpacked tree (~1 GB with build output); the tarball stays
  step kubernetes "built: ${KUBE_CMDS[*]}"
fi
skipped kube-apiserver || ln -sfn "$KA_DIR/kube-apiserver" "$BIN/kube-apiserver"
if ! skipped kube-node; then
  for cmd in kubelet kube-controller-manager kube-scheduler pause; do ln -sfn "$KN_DIR/$cmd" "$BIN/$cmd"; done
fi

# ---------------------------------------------------------------------------------------------
# 3. moto server (PyPI) in a venv.
MOTO_DIR="$CACHE/moto-$MOTO_VERSION"
if ! skipped moto; then
  if [[ -x "$MOTO_DIR/venv/bin/moto_server" ]] && [[ -f "$MOTO_DIR/.done" ]]; then
    step moto "cached: moto $MOTO_VERSION"
  else
    step moto "installing moto[server]==$MOTO_VERSION boto3==$BOTO3_VERSION into a venv"
    rm -rf "$MOTO_DIR"
    mkdir -p "$MOTO_DIR"
    run_logged moto "$LOGS/moto.log" python3 -m venv "$MOTO_DIR/venv"
    run_logged moto "$LOGS/moto.log" "$MOTO_DIR/venv/bin/pip" install --disable-pip-version-check \
      "moto[server]==$MOTO_VERSION" "boto3==$BOTO3_VERSION"
    touch "$MOTO_DIR/.done"
    step moto "installed moto $MOTO_VERSION"
  fi
  ln -sfn "$MOTO_DIR/venv/bin/moto_server" "$BIN/moto_server"
fi

# ---------------------------------------------------------------------------------------------
# 4. vcsim (and govc) from Debian's govmomi source package.
VC_DIR="$CACHE/vcsim-$GOVMOMI_VERSION"
if ! skipped vcsim; then
  if [[ -x "$VC_DIR/vcsim" && -x "$VC_DIR/govc" ]]; then
    step vcsim "cached: vcsim $GOVMOMI_VERSION"
  else
    step vcsim "building vcsim + govc $GOVMOMI_VERSION from Debian's govmomi sources"
    prepare_apt_src
    W="$CACHE/build/govmomi"
    rm -rf "$W/gopath" "$W/orig"
    mkdir -p "$W/orig" "$VC_DIR"
    if ! ls "$W"/golang-github-vmware-govmomi_*.orig.tar.* >/dev/null 2>&1; then
      # shellcheck disable=SC2046
      (cd "$W" && run_logged vcsim "$LOGS/vcsim.log" apt-get $(apt_src_opts) source --download-only \
        "golang-github-vmware-govmomi=$GOVMOMI_DEB_VERSION")
    fi
    run_logged vcsim "$LOGS/vcsim.log" tar -C "$W/orig" -xf "$(ls "$W"/golang-github-vmware-govmomi_*.orig.tar.* | head -1)"
    G="$W/gopath/src/github.com/vmware/govmomi"
    mkdir -p "$G"
    # Overlay: the packaged library dirs as symlinks plus the two program dirs copied in (a bare
    # directory would shadow the root package).
    for e in /usr/share/gocode/src/github.com/vmware/govmomi/*; do ln -s "$e" "$G/"; done
    cp -r "$W/orig/govmomi-$GOVMOMI_VERSION/vcsim" "$W/orig/govmomi-$GOVMOMI_VERSION/govc" "$G/"
    for prog in vcsim govc; do
      (cd "$G" && GOPATH="$W/gopath:/usr/share/gocode" GO111MODULE=off CGO_ENABLED=0 GOTOOLCHAIN=local \
        run_logged vcsim "$LOGS/vcsim.log" go build -trimpath -ldflags '-s -w' -o "$VC_DIR/$prog.tmp" "./$prog")
      mv "$VC_DIR/$prog.tmp" "$VC_DIR/$prog"
    done
    rm -rf "$W/gopath" "$W/orig"
    step vcsim "built vcsim + govc $GOVMOMI_VERSION"
  fi
  ln -sfn "$VC_DIR/vcsim" "$BIN/vcsim"
  ln -sfn "$VC_DIR/govc" "$BIN/govc"
fi

# ---------------------------------------------------------------------------------------------
# 4b. Debian's docker-registry (the Distribution registry) for the ECR pull through the kubelet's
#     credential provider (tests/tests/real_cluster.rs): the package is unpacked, not installed,
#     so no registry service is ever started on the machine.
REG_DIR="$CACHE/docker-registry-$REGISTRY_DEB_VERSION"
if ! skipped docker-registry; then
  if [[ -x "$REG_DIR/usr/bin/docker-registry" ]]; then
    step docker-registry "cached: docker-registry $REGISTRY_DEB_VERSION"
  else
    step docker-registry "unpacking Debian's docker-registry $REGISTRY_DEB_VERSION"
    W="$CACHE/build/docker-registry"
    rm -rf "$W" && mkdir -p "$W"
    (cd "$W" && run_logged docker-registry "$LOGS/docker-registry.log" apt-get download "docker-registry=$REGISTRY_DEB_VERSION") || {
      run_logged docker-registry "$LOGS/docker-registry.log" $SUDO apt-get update
      (cd "$W" && run_logged docker-registry "$LOGS/docker-registry.log" apt-get download "docker-registry=$REGISTRY_DEB_VERSION")
    }
    rm -rf "$REG_DIR.tmp" && mkdir -p "$REG_DIR.tmp"
    run_logged docker-registry "$LOGS/docker-registry.log" dpkg-deb -x "$(ls "$W"/docker-registry_*.deb | head -1)" "$REG_DIR.tmp"
    rm -rf "$REG_DIR" && mv "$REG_DIR.tmp" "$REG_DIR" && rm -rf "$W"
    step docker-registry "unpacked: $("$REG_DIR/usr/bin/docker-registry" --version 2>&1 | head -1)"
  fi
  ln -sfn "$REG_DIR/usr/bin/docker-registry" "$BIN/docker-registry"
fi

# ---------------------------------------------------------------------------------------------
# 5. cargo-deny, pinned.
CD_DIR="$CACHE/cargo-deny-$CARGO_DENY_VERSION"
if ! skipped cargo-deny; then
  if [[ -x "$CD_DIR/bin/cargo-deny" ]] && "$CD_DIR/bin/cargo-deny" --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
    step cargo-deny "cached: $("$CD_DIR/bin/cargo-deny" --version)"
  else
    step cargo-deny "cargo install --locked cargo-deny $CARGO_DENY_VERSION (~5 min)"
    run_logged cargo-deny "$LOGS/cargo-deny.log" cargo install --locked --root "$CD_DIR" \
      --target-dir "$CACHE/build/cargo-deny-target" cargo-deny --version "$CARGO_DENY_VERSION"
    rm -rf "$CACHE/build/cargo-deny-target"
    step cargo-deny "installed: $("$CD_DIR/bin/cargo-deny" --version)"
  fi
  ln -sfn "$CD_DIR/bin/cargo-deny" "$BIN/cargo-deny"
fi

# ---------------------------------------------------------------------------------------------
# 6. cargo-nextest (the test runner of hack/test.sh), when the machine has none.
NT_DIR="$CACHE/cargo-nextest-$CARGO_NEXTEST_VERSION"
if ! skipped cargo-nextest; then
  if cargo nextest --version >/dev/null 2>&1 && [[ ! -L "$BIN/cargo-nextest" ]]; then
    step cargo-nextest "present: $(cargo nextest --version | head -1)"
  elif [[ -x "$NT_DIR/bin/cargo-nextest" ]]; then
    step cargo-nextest "cached: $("$NT_DIR/bin/cargo-nextest" nextest --version | head -1)"
    ln -sfn "$NT_DIR/bin/cargo-nextest" "$BIN/cargo-nextest"
  else
    step cargo-nextest "cargo install --locked cargo-nextest $CARGO_NEXTEST_VERSION (~6 min)"
    run_logged cargo-nextest "$LOGS/cargo-nextest.log" cargo install --locked --root "$NT_DIR" \
      --target-dir "$CACHE/build/cargo-nextest-target" cargo-nextest --version "$CARGO_NEXTEST_VERSION"
    rm -rf "$CACHE/build/cargo-nextest-target"
    ln -sfn "$NT_DIR/bin/cargo-nextest" "$BIN/cargo-nextest"
    step cargo-nextest "installed: $("$NT_DIR/bin/cargo-nextest" nextest --version | head -1)"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 6b. The publishing tools: cargo-http-registry (a crates.io-compatible registry with the
#     publish API, serving a local directory on 127.0.0.1; hack/publish-roundtrip.sh) and
#     cargo-semver-checks (hack/semver-checks.sh), pinned.
# cargo_tool STEP CRATE VERSION MINUTES: installs CRATE VERSION (its binary named CRATE) once.
cargo_tool() {
  local name=$1 crate=$2 version=$3 minutes=$4 dir="$CACHE/$2-$3"
  skipped "$name" && return 0
  if [[ -x "$dir/bin/$crate" ]]; then
    step "$name" "cached: $crate $version"
  else
    step "$name" "cargo install --locked $crate $version (~$minutes min)"
    # Without the crates' fat LTO and single codegen unit: a test tool needs no smallest,
    # fastest binary, and on 2 cores they are most of the install time.
    run_logged "$name" "$LOGS/$name.log" env CARGO_PROFILE_RELEASE_LTO=off \
      CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 cargo install --locked --root "$dir" \
      --target-dir "$CACHE/build/$name-target" "$crate" --version "$version"
    rm -rf "$CACHE/build/$name-target"
    step "$name" "installed: $crate $version"
  fi
  ln -sfn "$dir/bin/$crate" "$BIN/$crate"
}
cargo_tool cargo-http-registry cargo-http-registry "$CARGO_HTTP_REGISTRY_VERSION" 2
cargo_tool cargo-semver-checks cargo-semver-checks "$CARGO_SEMVER_CHECKS_VERSION" 10

# ---------------------------------------------------------------------------------------------
# 7. OpenStack (keystone, glance, placement, nova, neutron, octavia, MariaDB, RabbitMQ) from
#    Debian's packages, for the OpenStack provider's tests; configured and run by
#    hack/openstack.sh, never as system services.
if ! skipped openstack; then
  t_os=$(date +%s)
  if RCP_CACHE_DIR="$CACHE" "$(dirname "$0")/openstack.sh" install >>"$LOGS/openstack.log" 2>&1; then
    step openstack "$(tail -n 1 "$LOGS/openstack.log" | sed 's/^\[openstack\] //') ($(($(date +%s) - t_os)) s)"
  else
    step openstack "FAILED (log: $LOGS/openstack.log):"
    tail -n 25 "$LOGS/openstack.log" | sed 's/^/    /'
    exit 1
  fi
fi

step done "in $(($(date +%s) - START)) s; binaries in $BIN:"
for b in etcd kube-apiserver kubelet kube-controller-manager kube-scheduler pause kubectl moto_server vcsim govc docker-registry cargo-deny cargo-nextest cargo-http-registry cargo-semver-checks; do
  if [[ -e "$BIN/$b" ]]; then printf '    %-15s -> %s\n' "$b" "$(readlink -f "$BIN/$b")"; fi
done
