#!/usr/bin/env bash
# Builds an OCI image of a cloud-controller-manager without pulling anything from an image
# registry and without a container daemon: Debian's umoci writes an OCI image layout whose only
# layer is a root filesystem made here from
#   - the binary (cargo build, --profile release by default),
#   - the shared libraries it links (from Debian's libc6 / libgcc-s1, found with ldd),
#   - the CA certificates (Debian's ca-certificates bundle), and
#   - /etc/passwd + /etc/group naming the non-root user 65532 ("nonroot") it runs as.
# The image config: entrypoint = the binary, user 65532:65532, no shell, no package manager.
# Containerfile documents the same image for docker/podman/buildah users.
#
#   hack/build-image.sh [--profile release|dev] [--arch amd64|arm64] [--out DIR] aws|vsphere|openstack ...
#
# --arch arm64 cross-compiles (Rust's aarch64-unknown-linux-gnu target, Debian's
# gcc-aarch64-linux-gnu as linker, the libraries from Debian's libc6-arm64-cross); the default
# is the host's amd64. hack/release-image.sh puts both into one multi-arch image.
#
# Output, per provider, in DIR (default target/images): <binary>/ (an OCI image layout, tag =
# the version; <binary>-arm64/ for arm64), <binary>.oci.tar (the same as an OCI archive) and
# <binary>.rootfs.tar (the root filesystem, for `podman build -f Containerfile`). Push it with
# skopeo, e.g.
#   skopeo copy oci:target/images/cloud-controller-manager-aws:0.1.0 \
#     docker://registry.example.com/rust-cloud-provider/cloud-controller-manager-aws:0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=release
ARCH=amd64
OUT=""
PROVIDERS=()
while (($#)); do
  case "$1" in
    --profile) PROFILE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    aws|vsphere|openstack) PROVIDERS+=("$1"); shift ;;
    *) echo "build-image: unknown argument $1 (providers: aws, vsphere, openstack)" >&2; exit 2 ;;
  esac
done
((${#PROVIDERS[@]})) || { echo "build-image: name a provider (aws, vsphere, openstack)" >&2; exit 2; }
command -v umoci >/dev/null || { echo "build-image: umoci is not installed (apt-get install umoci; hack/install-test-deps.sh does it)" >&2; exit 1; }
OUT=${OUT:-$PWD/target/images}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 --offline | jq -r .target_directory)
VERSION=$(cargo metadata --no-deps --format-version 1 --offline | jq -r '.packages[] | select(.name=="k8s-cloud-provider") | .version')
case "$PROFILE" in release) PROFILE_DIR=release ;; dev|debug) PROFILE=dev; PROFILE_DIR=debug ;; *) echo "build-image: --profile release|dev" >&2; exit 2 ;; esac

case "$ARCH" in
  amd64) TARGET_ARGS=(); EXE_DIR="$TARGET_DIR/$PROFILE_DIR"; STRIP=strip; SUFFIX="" ;;
  arm64)
    command -v aarch64-linux-gnu-gcc >/dev/null || { echo "build-image: --arch arm64 needs Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (apt-get install them)" >&2; exit 1; }
    rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu \
      || { echo "build-image: --arch arm64 needs Rust's target: rustup target add aarch64-unknown-linux-gnu" >&2; exit 1; }
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    TARGET_ARGS=(--target aarch64-unknown-linux-gnu)
    EXE_DIR="$TARGET_DIR/aarch64-unknown-linux-gnu/$PROFILE_DIR"; STRIP=aarch64-linux-gnu-strip; SUFFIX=-arm64 ;;
  *) echo "build-image: --arch amd64|arm64" >&2; exit 2 ;;
esac
# cross_libs EXE: the loader and libraries an aarch64 binary links (ldd cannot run it), as
# "<path in the image> <file here>" lines, from Debian's cross libc.
cross_libs() {
  local interp needed
  interp=$(aarch64-linux-gnu-readelf -l "$1" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  echo "$interp /usr/aarch64-linux-gnu/lib/$(basename "$interp")"
  for needed in $(aarch64-linux-gnu-readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    echo "/lib/aarch64-linux-gnu/$needed /usr/aarch64-linux-gnu/lib/$needed"
  done
}

for provider in "${PROVIDERS[@]}"; do
  bin=cloud-controller-manager-$provider
  echo "[build-image] cargo build --profile $PROFILE ${TARGET_ARGS[*]} --bin $bin"
  cargo build --locked --quiet --profile "$PROFILE" "${TARGET_ARGS[@]}" --bin "$bin"
  exe="$EXE_DIR/$bin"
  if [[ $ARCH == amd64 ]]; then
    libs=$(ldd "$exe" | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]+/{print $1}' | sort -u)
    lib_map=$(for lib in $libs; do echo "$lib $(readlink -f "$lib")"; done)
  else
    lib_map=$(cross_libs "$exe")
    libs=$(awk '{print $2}' <<<"$lib_map")
  fi

  layout="$OUT/$bin$SUFFIX"
  rm -rf "$layout" "$OUT/$bin$SUFFIX.rootfs.tar" "$OUT/$bin$SUFFIX.oci.tar"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  umoci init --layout "$layout"
  umoci new --image "$layout:$VERSION"
  umoci unpack --rootless --image "$layout:$VERSION" "$work/bundle" >/dev/null
  root="$work/bundle/rootfs"
  # One entrypoint path for every provider (see Containerfile).
  install -D -m 0755 "$exe" "$root/usr/local/bin/cloud-controller-manager"
  # A dev build's debug information (most of its size) stays out of the image.
  [[ $PROFILE == dev ]] && "$STRIP" --strip-debug "$root/usr/local/bin/cloud-controller-manager"
  # The dynamic loader and every library the binary links, at the paths it asks for.
  while read -r path file; do
    [[ -n "$path" ]] && install -D -m 0755 "$(readlink -f "$file")" "$root$path"
  done <<<"$lib_map"
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  # Which Debian packages the libraries come from (a label, for scanners and for people).
  debs=$(for f in $libs /etc/ssl/certs/ca-certificates.crt /usr/share/ca-certificates; do
    dpkg -S "$f" 2>/dev/null | cut -d: -f1 | tr -d ' '; done | tr ',' '\n' | sort -u | paste -sd, -)
  (cd "$root" && tar --numeric-owner --owner=0 --group=0 -cf "$OUT/$bin$SUFFIX.rootfs.tar" .)
  umoci repack --image "$layout:$VERSION" "$work/bundle" >/dev/null
  umoci config --image "$layout:$VERSION" \
    --config.entrypoint /usr/local/bin/cloud-controller-manager \
    --config.user 65532:65532 \
    --config.workingdir / \
    --config.label "org.opencontainers.image.title=$bin" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.source=https://github.com/rust-cloud-provider/rust-cloud-provider" \
    --config.label "io.rust-cloud-provider.debian-packages=${debs:-unknown}" \
    --os linux --architecture "$ARCH" --author rust-cloud-provider
  umoci gc --layout "$layout"
  rm -rf "$work"
  trap - EXIT
  (cd "$layout" && tar -cf "$OUT/$bin$SUFFIX.oci.tar" oci-layout index.json blobs)
  echo "[build-image] $layout:$VERSION ($ARCH)  image $(du -sk "$layout/blobs" | cut -f1) KiB (compressed layer + config), rootfs $(du -sk "$OUT/$bin$SUFFIX.rootfs.tar" | cut -f1) KiB"
done
