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
#   hack/build-image.sh [--profile release|dev] [--out DIR] aws|vsphere|openstack ...
#
# Output, per provider, in DIR (default target/images): <binary>/ (an OCI image layout, tag =
# the version), <binary>.oci.tar (the same as an OCI archive) and <binary>.rootfs.tar (the root
# filesystem, for `podman build -f Containerfile`). Push it with skopeo, e.g.
#   skopeo copy oci:target/images/cloud-controller-manager-aws:0.1.0 \
#     docker://registry.example.com/rust-cloud-provider/cloud-controller-manager-aws:0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=release
OUT=""
PROVIDERS=()
while (($#)); do
  case "$1" in
    --profile) PROFILE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
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

for provider in "${PROVIDERS[@]}"; do
  bin=cloud-controller-manager-$provider
  echo "[build-image] cargo build --profile $PROFILE --bin $bin"
  cargo build --locked --quiet --profile "$PROFILE" --bin "$bin"
  exe="$TARGET_DIR/$PROFILE_DIR/$bin"
  libs=$(ldd "$exe" | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]+/{print $1}' | sort -u)

  layout="$OUT/$bin"
  rm -rf "$layout" "$OUT/$bin.rootfs.tar" "$OUT/$bin.oci.tar"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  umoci init --layout "$layout"
  umoci new --image "$layout:$VERSION"
  umoci unpack --rootless --image "$layout:$VERSION" "$work/bundle" >/dev/null
  root="$work/bundle/rootfs"
  # One entrypoint path for every provider (see Containerfile).
  install -D -m 0755 "$exe" "$root/usr/local/bin/cloud-controller-manager"
  # A dev build's debug information (most of its size) stays out of the image.
  [[ $PROFILE == dev ]] && strip --strip-debug "$root/usr/local/bin/cloud-controller-manager"
  # The dynamic loader and every library the binary links, at the paths it asks for.
  for lib in $libs; do install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"; done
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  # Which Debian packages the libraries come from (a label, for scanners and for people).
  debs=$(for f in $libs /etc/ssl/certs/ca-certificates.crt /usr/share/ca-certificates; do
    dpkg -S "$f" 2>/dev/null | cut -d: -f1 | tr -d ' '; done | tr ',' '\n' | sort -u | paste -sd, -)
  (cd "$root" && tar --numeric-owner --owner=0 --group=0 -cf "$OUT/$bin.rootfs.tar" .)
  umoci repack --image "$layout:$VERSION" "$work/bundle" >/dev/null
  umoci config --image "$layout:$VERSION" \
    --config.entrypoint /usr/local/bin/cloud-controller-manager \
    --config.user 65532:65532 \
    --config.workingdir / \
    --config.label "org.opencontainers.image.title=$bin" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.source=https://github.com/rust-cloud-provider/rust-cloud-provider" \
    --config.label "io.rust-cloud-provider.debian-packages=${debs:-unknown}" \
    --os linux --architecture amd64 --author rust-cloud-provider
  umoci gc --layout "$layout"
  rm -rf "$work"
  trap - EXIT
  (cd "$layout" && tar -cf "$OUT/$bin.oci.tar" oci-layout index.json blobs)
  echo "[build-image] $layout:$VERSION  image $(du -sk "$layout/blobs" | cut -f1) KiB (compressed layer + config), rootfs $(du -sk "$OUT/$bin.rootfs.tar" | cut -f1) KiB"
done
