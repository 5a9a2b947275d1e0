#!/usr/bin/env bash
# Installs every real server the tests need, idempotently, into a cache outside the repository:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider/
#     kubernetes-v1.37.2/{kube-apiserver,kubelet,kube-controller-manager,kube-scheduler,kubectl,etcd,pause}
#                                             built from Go modules (hack/kube/go.mod, go.sum)
#     kubernetes-v1.34.4/{kube-apiserver,kubelet,kube-controller-manager,kube-scheduler}
#                                             the window's oldest minor (hack/kube-oldest/go.mod)
#     aws-cloud-controller-manager-v1.37.1/   k8s.io/cloud-provider-aws from Go modules (hack/aws-ccm)
#     helm-v3.22.0/                           helm from Go modules (hack/helm)
#     go/{mod,build}/                         Go's module and build caches for those builds
#     moto-5.2.5/venv/                        moto[server] from PyPI in a venv
#     vcsim-0.24.2/{vcsim,govc}               built from Debian's govmomi sources (Debian's Go 1.19)
#     docker-registry-2.8.2+ds1-1/            Debian's docker-registry, unpacked (never installed)
#     (rustup)                                the staged crates' rust-version toolchain (minimal profile)
#     cargo-deny-0.20.2/bin/cargo-deny        cargo install --locked
#     cargo-nextest-0.9.143/bin/cargo-nextest  cargo install --locked (only when none is installed)
#     cargo-http-registry-0.1.8/bin/…         cargo install --locked (the test registry)
#     cargo-semver-checks-0.51.0/bin/…        cargo install --locked (hack/semver-checks.sh)
#     (system)                                Debian's OpenStack Zed packages (hack/openstack.sh install)
#     bin/                                    symlinks to all of the above
#     bin-oldest/                             the same, with the oldest minor's four Kubernetes binaries
#
# Each step prints a progress line, skips itself when its result is already cached (keyed by
# version), and on failure says which step failed and where its log is.
#
# Environment:
#   RCP_CACHE_DIR   override the cache directory
#   RCP_SKIP        space-separated steps to skip (apt kubernetes kubernetes-oldest aws-ccm helm moto vcsim docker-registry msrv
#                   cargo-deny cargo-nextest cargo-http-registry cargo-semver-checks openstack)
#   RCP_ONLY        space-separated steps to do, the others skipped (e.g. RCP_ONLY=cargo-semver-checks)
set -euo pipefail

PROJECT=rust-cloud-provider
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/$PROJECT}"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# The one place the Kubernetes version is pinned: hack/kube/go.mod.
KUBE_MODULE_DIR="$ROOT/hack/kube"
KUBE_VERSION=$(awk '{ for (i = 1; i < NF; i++) if ($i == "k8s.io/kubernetes" && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$KUBE_MODULE_DIR/go.mod")
KUBE_DIR="$CACHE/kubernetes-$KUBE_VERSION"
KUBE_FULL_CMDS=(kube-apiserver kubelet kube-controller-manager kube-scheduler kubectl etcd)
# Debian's Go, for the 1.19-era govmomi sources of vcsim (a current Go refuses their GOPATH build).
DEBIAN_GO=/usr/lib/go-1.19/bin/go
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
skipped() {
  [[ -n "${RCP_ONLY:-}" && " $RCP_ONLY " != *" $1 "* ]] || [[ " ${RCP_SKIP:-} " == *" $1 "* ]]
}
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
# 1. Debian packages: Debian's Go 1.19 and the govmomi libraries (vcsim), tools, the container
#    runtime. (etcd and kubectl come with Kubernetes, step 2.)
if ! skipped apt; then
  pkgs=()
  [[ -x $DEBIAN_GO ]] || pkgs+=(golang-go)
  have rsync || pkgs+=(rsync)
  have xz || pkgs+=(xz-utils)
  have openssl || pkgs+=(openssl)
  [[ -d /usr/share/gocode/src/github.com/vmware/govmomi ]] || pkgs+=(golang-github-vmware-govmomi-dev)
  [[ -d /usr/share/gocode/src/github.com/kr/pretty ]] || pkgs+=(golang-github-kr-pretty-dev)
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
    step apt "cached (Debian's Go, rsync, govmomi sources, jq, umoci, containerd, runc, CNI plugins, gcc present)"
  fi
fi
for tool in jq umoci containerd runc; do
  target=$(sys_which "$tool" || true)
  if [[ -z "$target" || ! -x "$target" ]]; then
    step apt "FAILED: no executable \`$tool\` on PATH after installing packages (see $LOGS/apt.log)"
    exit 1
  fi
  ln -sfn "$(readlink -f "$target")" "$BIN/$tool"
done

# ---------------------------------------------------------------------------------------------
# build_kubernetes MODULE_DIR OUT_DIR full|control: builds the Kubernetes commands of the Go module
# in MODULE_DIR (which requires k8s.io/kubernetes, see hack/kube/go.mod) into OUT_DIR, unless the
# binaries there were built from the same go.mod and go.sum. "full" builds KUBE_FULL_CMDS and the
# pause program; "control" the API server, kubelet, controller-manager and scheduler only.
modern_go() {
  local want g have_v
  want=$(awk '$1 == "go" { print $2; exit }' "$1/go.mod")
  for g in /usr/local/go/bin/go "$(sys_which go || true)"; do
    [[ -x $g ]] || continue
    have_v=$(GOTOOLCHAIN=local "$g" env GOVERSION 2>/dev/null | sed 's/^go//')
    if [[ -n $have_v && $(printf '%s\n%s\n' "$want" "$have_v" | sort -V | head -1) == "$want" ]]; then
      echo "$g"; return 0
    fi
  done
  step kubernetes "FAILED: building Kubernetes needs Go >= $want (looked at /usr/local/go/bin/go and go on PATH)"
  exit 1
}
build_kubernetes() {
  local mod=$1 out=$2 what=$3 version stamp go cmds pkgs c
  version=$(awk '{ for (i = 1; i < NF; i++) if ($i == "k8s.io/kubernetes" && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$mod/go.mod")
  stamp=$(find "$mod" -name go.mod -o -name go.sum -o -name '*.go' | sort | xargs cat | sha256sum | cut -c1-16)
  if [[ $what == full ]]; then cmds=("${KUBE_FULL_CMDS[@]}"); else cmds=(kube-apiserver kubelet kube-controller-manager kube-scheduler); fi
  if [[ $(cat "$out/.stamp" 2>/dev/null) == "$stamp" ]]; then
    step kubernetes "cached: ${cmds[*]} $version ($out)"
    return 0
  fi
  go=$(modern_go "$mod")
  step kubernetes "building ${cmds[*]} $version from Go modules with $($go env GOVERSION) (~8 min on 2 cores when cold)"
  mkdir -p "$out" "$KUBE_GO_CACHE/mod" "$KUBE_GO_CACHE/build"
  pkgs=()
  for c in "${cmds[@]}"; do
    if [[ $c == etcd ]]; then pkgs+=(./etcd); else pkgs+=("k8s.io/kubernetes/cmd/$c"); fi
  done
  local major=${version#v}; major=${major%%.*}
  local minor=${version#v*.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  go_module_build kubernetes "$mod" "$go" -ldflags "$ldflags" -o "$out.tmp/" "${pkgs[@]}"
  if [[ $what == full ]]; then
    # The sandbox every Pod starts with (what the registry.k8s.io/pause image holds), static.
    local src
    src=$(cd "$mod" && GOFLAGS=-mod=readonly GOMODCACHE="$KUBE_GO_CACHE/mod" "$go" list -m -f '{{.Dir}}' k8s.io/kubernetes)
    run_logged kubernetes "$LOGS/kubernetes.log" gcc -Os -static -Wall -Werror \
      -DVERSION="\"3.10-$version\"" -o "$out.tmp/pause" "$src/build/pause/linux/pause.c"
  fi
  for c in "${cmds[@]}"; do
    [[ -s "$out.tmp/$c" ]] || { step kubernetes "FAILED: the build wrote no $c (log: $LOGS/kubernetes.log)"; exit 1; }
  done
  echo "$stamp" > "$out.tmp/.stamp"
  rm -rf "$out" && mv "$out.tmp" "$out"
  step kubernetes "built: $("$out/kube-apiserver" --version) in $out"
}
KUBE_GO_CACHE="$CACHE/go"
# go_module_build STEP MODULE_DIR GO ARGS...: `GO build ARGS` in MODULE_DIR (its go.mod and
# go.sum as committed, nothing fetched but modules), Go's caches in the project cache, logged to
# $LOGS/STEP.log. The Go builds (Kubernetes, the upstream AWS CCM, helm) are a third of a cold
# run's CPU: the compiler collects its garbage 4 times less often (GOGC=400: more memory, ~1-2 GB
# per compile at most, less CPU) and writes no debug information (the linker drops it anyway
# with -w).
go_module_build() {
  local name=$1 mod=$2 go=$3; shift 3
  mkdir -p "$KUBE_GO_CACHE/mod" "$KUBE_GO_CACHE/build"
  (cd "$mod" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw -buildvcs=false" GOGC=400 \
    GOMODCACHE="$KUBE_GO_CACHE/mod" GOCACHE="${GOCACHE:-$KUBE_GO_CACHE/build}" \
    run_logged "$name" "$LOGS/$name.log" "$go" build -trimpath -gcflags=all=-dwarf=false "$@")
}

# ---------------------------------------------------------------------------------------------
# 2. Kubernetes from Go modules (hack/kube/go.mod pins the one version, go.sum is committed):
#    kube-apiserver and etcd (every test), kubectl, and for the real-node cluster
#    (hack/local-up-cluster.sh, tests/tests/real_cluster.rs) kubelet, kube-controller-manager,
#    kube-scheduler and the Pod sandbox ("pause") program from the module's build/pause/linux/pause.c.
#    etcd is etcd's own server at the version Kubernetes pins (hack/kube/etcd). One `go build`
#    for all of them (they share most packages); Go's module and build caches live in the
#    project cache, so a cold run starts from nothing and a warm one rebuilds nothing.
if ! skipped kubernetes; then
  build_kubernetes "$KUBE_MODULE_DIR" "$KUBE_DIR" full
  for cmd in "${KUBE_FULL_CMDS[@]}" pause; do ln -sfn "$KUBE_DIR/$cmd" "$BIN/$cmd"; done
fi
# The oldest minor of the tested window (hack/kube-oldest/go.mod): its API server, kubelet,
# controller-manager and scheduler, in bin-oldest/ beside the newest's other test servers
# (made at the end of this script). hack/test.sh runs the core scenarios with
# RCP_TEST_BIN_DIR=bin-oldest.
KUBE_OLDEST_MODULE_DIR="$ROOT/hack/kube-oldest"
KUBE_OLDEST_VERSION=$(awk '{ for (i = 1; i < NF; i++) if ($i == "k8s.io/kubernetes" && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$KUBE_OLDEST_MODULE_DIR/go.mod")
KUBE_OLDEST_DIR="$CACHE/kubernetes-$KUBE_OLDEST_VERSION"
if ! skipped kubernetes-oldest; then
  build_kubernetes "$KUBE_OLDEST_MODULE_DIR" "$KUBE_OLDEST_DIR" control
fi
# ---------------------------------------------------------------------------------------------
# 2b. The newest upstream AWS cloud-controller-manager (k8s.io/cloud-provider-aws, pinned in
#     hack/aws-ccm/go.mod), for the side-by-side tests and benchmarks.
AWS_CCM_MODULE_DIR="$ROOT/hack/aws-ccm"
AWS_CCM_VERSION=$(awk '{ for (i = 1; i < NF; i++) if ($i == "k8s.io/cloud-provider-aws" && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$AWS_CCM_MODULE_DIR/go.mod")
AWS_CCM_DIR="$CACHE/aws-cloud-controller-manager-$AWS_CCM_VERSION"
if ! skipped aws-ccm; then
  stamp=$(cat "$AWS_CCM_MODULE_DIR/go.mod" "$AWS_CCM_MODULE_DIR/go.sum" | sha256sum | cut -c1-16)
  if [[ $(cat "$AWS_CCM_DIR/.stamp" 2>/dev/null) == "$stamp" && -x "$AWS_CCM_DIR/aws-cloud-controller-manager" ]]; then
    step aws-ccm "cached: aws-cloud-controller-manager $AWS_CCM_VERSION"
  else
    go=$(modern_go "$AWS_CCM_MODULE_DIR")
    step aws-ccm "building aws-cloud-controller-manager $AWS_CCM_VERSION from k8s.io/cloud-provider-aws (~3 min after Kubernetes)"
    rm -rf "$AWS_CCM_DIR.tmp" && mkdir -p "$AWS_CCM_DIR.tmp" "$KUBE_GO_CACHE/mod" "$KUBE_GO_CACHE/build"
    go_module_build aws-ccm "$AWS_CCM_MODULE_DIR" "$go" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$AWS_CCM_VERSION" \
      -o "$AWS_CCM_DIR.tmp/aws-cloud-controller-manager" k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager
    echo "$stamp" > "$AWS_CCM_DIR.tmp/.stamp"
    rm -rf "$AWS_CCM_DIR" && mv "$AWS_CCM_DIR.tmp" "$AWS_CCM_DIR"
    step aws-ccm "built: aws-cloud-controller-manager $AWS_CCM_VERSION"
  fi
  ln -sfn "$AWS_CCM_DIR/aws-cloud-controller-manager" "$BIN/aws-cloud-controller-manager"
fi

# ---------------------------------------------------------------------------------------------
# 2c. helm (helm.sh/helm/v3, pinned in hack/helm/go.mod): the charts in charts/ are linted,
#     rendered and installed on the real-node cluster with it.
HELM_MODULE_DIR="$ROOT/hack/helm"
HELM_VERSION=$(awk '{ for (i = 1; i < NF; i++) if ($i == "helm.sh/helm/v3" && $(i + 1) ~ /^v/) { print $(i + 1); exit } }' "$HELM_MODULE_DIR/go.mod")
HELM_DIR="$CACHE/helm-$HELM_VERSION"
if ! skipped helm; then
  stamp=$(cat "$HELM_MODULE_DIR/go.mod" "$HELM_MODULE_DIR/go.sum" | sha256sum | cut -c1-16)
  if [[ $(cat "$HELM_DIR/.stamp" 2>/dev/null) == "$stamp" && -x "$HELM_DIR/helm" ]]; then
    step helm "cached: helm $HELM_VERSION"
  else
    go=$(modern_go "$HELM_MODULE_DIR")
    step helm "building helm $HELM_VERSION from helm.sh/helm/v3 (~1 min after Kubernetes)"
    rm -rf "$HELM_DIR.tmp" && mkdir -p "$HELM_DIR.tmp" "$KUBE_GO_CACHE/mod" "$KUBE_GO_CACHE/build"
    go_module_build helm "$HELM_MODULE_DIR" "$go" \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$HELM_DIR.tmp/helm" helm.sh/helm/v3/cmd/helm
    echo "$stamp" > "$HELM_DIR.tmp/.stamp"
    rm -rf "$HELM_DIR" && mv "$HELM_DIR.tmp" "$HELM_DIR"
    step helm "built: helm $HELM_VERSION"
  fi
  ln -sfn "$HELM_DIR/helm" "$BIN/helm"
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
      (cd "$G" && GOPATH="$W/gopath:/usr/share/gocode" GO111MODULE=off CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS= \
        run_logged vcsim "$LOGS/vcsim.log" "$DEBIAN_GO" build -trimpath -ldflags '-s -w' -o "$VC_DIR/$prog.tmp" "./$prog")
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

# The test tools are built without their crates' fat LTO and single codegen unit, and at
# opt-level 0: a test tool needs no smallest, fastest binary (what they spend their time on is
# waiting for rustc, the tests and the registry), and on 2 cores these builds are most of a
# cold install (cargo-nextest: ~14 min with its own profile, beside the Kubernetes builds).
# Measured on an idle 2-core machine: cargo-deny 50 s at opt-level 0, 87 s at 1, and
# hack/verify-deps.sh takes 1.9 s with either; cargo-semver-checks 102 s at 0 (~13 min at 1
# beside the Kubernetes build), its comparisons a fraction of a second of hack/semver-checks.sh
# (the rustdoc builds are the rest).
# tool_release: the environment of such a build, to prefix `cargo install` with.
tool_release() {
  echo env CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=debuginfo
}
# One target directory for the four tools: a dependency they share at the same version and
# features (tokio, serde, syn, clap, regex, …) is built once, not once per tool. Removed once
# the last tool is installed.
TOOLS_TARGET="$CACHE/build/cargo-tools-target"

# ---------------------------------------------------------------------------------------------
# 4b. The staged crates' declared minimum Rust (rust-version in Cargo.toml), through rustup:
#     hack/publish-roundtrip.sh checks and documents every published crate with it.
MSRV=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^rust-version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml")
if ! skipped msrv; then
  [[ -n "$MSRV" ]] || { step msrv "FAILED: no rust-version in [workspace.package] of Cargo.toml"; exit 1; }
  if rustup run "$MSRV" rustc --version >/dev/null 2>&1; then
    step msrv "present: $(rustup run "$MSRV" rustc --version)"
  else
    step msrv "rustup toolchain install $MSRV --profile minimal"
    run_logged msrv "$LOGS/msrv.log" rustup toolchain install "$MSRV" --profile minimal
    step msrv "installed: $(rustup run "$MSRV" rustc --version)"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 5. cargo-deny, pinned.
CD_DIR="$CACHE/cargo-deny-$CARGO_DENY_VERSION"
if ! skipped cargo-deny; then
  if [[ -x "$CD_DIR/bin/cargo-deny" ]] && "$CD_DIR/bin/cargo-deny" --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
    step cargo-deny "cached: $("$CD_DIR/bin/cargo-deny" --version)"
  else
    step cargo-deny "cargo install --locked cargo-deny $CARGO_DENY_VERSION (~1 min)"
    run_logged cargo-deny "$LOGS/cargo-deny.log" $(tool_release) cargo install --locked --root "$CD_DIR" \
      --target-dir "$TOOLS_TARGET" cargo-deny --version "$CARGO_DENY_VERSION"
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
    run_logged cargo-nextest "$LOGS/cargo-nextest.log" $(tool_release) cargo install --locked --root "$NT_DIR" \
      --target-dir "$TOOLS_TARGET" --no-default-features --features default-no-update \
      cargo-nextest --version "$CARGO_NEXTEST_VERSION"
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
    run_logged "$name" "$LOGS/$name.log" $(tool_release) cargo install --locked --root "$dir" \
      --target-dir "$TOOLS_TARGET" "$crate" --version "$version"
    step "$name" "installed: $crate $version"
  fi
  ln -sfn "$dir/bin/$crate" "$BIN/$crate"
}
cargo_tool cargo-http-registry cargo-http-registry "$CARGO_HTTP_REGISTRY_VERSION" 2
cargo_tool cargo-semver-checks cargo-semver-checks "$CARGO_SEMVER_CHECKS_VERSION" 2
# Kept for cargo-semver-checks when a run leaves it for later (hack/test.sh builds it beside
# the tests): what it shares with the others is built already.
skipped cargo-semver-checks || rm -rf "$TOOLS_TARGET"

# ---------------------------------------------------------------------------------------------
# 7. OpenStack (keystone, glance, placement, nova, neutron, octavia, barbican, MariaDB, RabbitMQ) from
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

if ! skipped kubernetes-oldest; then
  rm -rf "$CACHE/bin-oldest" && mkdir -p "$CACHE/bin-oldest"
  for link in "$BIN"/*; do ln -sfn "$(readlink -f "$link")" "$CACHE/bin-oldest/$(basename "$link")"; done
  for cmd in kube-apiserver kubelet kube-controller-manager kube-scheduler; do
    ln -sfn "$KUBE_OLDEST_DIR/$cmd" "$CACHE/bin-oldest/$cmd"
  done
  step kubernetes "the window's oldest: $("$KUBE_OLDEST_DIR/kube-apiserver" --version) in $CACHE/bin-oldest"
fi
step done "in $(($(date +%s) - START)) s; binaries in $BIN:"
for b in etcd kube-apiserver kubelet kube-controller-manager kube-scheduler pause kubectl aws-cloud-controller-manager moto_server vcsim govc docker-registry cargo-deny cargo-nextest cargo-http-registry cargo-semver-checks; do
  if [[ -e "$BIN/$b" ]]; then printf '    %-15s -> %s\n' "$b" "$(readlink -f "$BIN/$b")"; fi
done
