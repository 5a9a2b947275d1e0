#!/usr/bin/env bash
# The released image of each provider: one multi-arch OCI image (linux/amd64 and linux/arm64)
# per cloud-controller-manager, tagged with the crates' version, from the release build.
#
#   hack/release-image.sh [--out DIR] [--push REGISTRY/PREFIX] [--profile release|dev]
#                         [--arches "amd64 arm64"] aws|vsphere|openstack ...
#
# (--profile dev --arches amd64 makes the same index over the debug build of the host's
# architecture only: tests/tests/real_cluster.rs has the kubelets pull that through a registry.)
#
# For each provider: hack/build-image.sh --profile release for amd64 (natively) and arm64
# (cross-compiled: `rustup target add aarch64-unknown-linux-gnu`, Debian's gcc-aarch64-linux-gnu
# and libc6-dev-arm64-cross), then an OCI image index over both manifests, annotated with the
# version, the source and the crates linked into the binary (`cargo tree`, the SBOM people ask
# for first), written as an OCI layout DIR/release/<binary>/ (tag = version) and an OCI archive
# DIR/release/<binary>.oci.tar. The arm64 binary is checked to be an aarch64 ELF and, when
# Debian's qemu-user is installed, run (`--version`) in its own root file system.
# --push copies each image (index, both manifests, their blobs) with skopeo when installed, e.g.
#   hack/release-image.sh --push registry.example.com/rust-cloud-provider aws
# Takes ~15 min per provider and architecture on 2 cores (fat LTO).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/target/images
PUSH=""
PROFILE=release
ARCHES="amd64 arm64"
PROVIDERS=()
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --push) PUSH=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --arches) ARCHES=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    aws|vsphere|openstack) PROVIDERS+=("$1"); shift ;;
    *) echo "release-image: unknown argument $1 (providers: aws, vsphere, openstack)" >&2; exit 2 ;;
  esac
done
((${#PROVIDERS[@]})) || { echo "release-image: name a provider (aws, vsphere, openstack)" >&2; exit 2; }
mkdir -p "$OUT/release"
OUT=$(cd "$OUT" && pwd)
VERSION=$(cargo metadata --no-deps --format-version 1 --offline | jq -r '.packages[] | select(.name=="k8s-cloud-provider") | .version')
SOURCE=https://github.com/rust-cloud-provider/rust-cloud-provider

# blob FILE: stores FILE in the layout as a blob; prints "sha256:<hex> <size>".
blob() {
  local hex size
  hex=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$dst/blobs/sha256/$hex"
  echo "sha256:$hex $size"
}

for provider in "${PROVIDERS[@]}"; do
  bin=cloud-controller-manager-$provider
  for arch in $ARCHES; do
    hack/build-image.sh --profile "$PROFILE" --arch "$arch" --out "$OUT" "$provider"
  done

  # The arm64 binary is what it says.
  if [[ " $ARCHES " == *" arm64 "* ]]; then
    rootfs=$(mktemp -d)
    tar -C "$rootfs" -xf "$OUT/$bin-arm64.rootfs.tar"
    elf=$(file -b "$rootfs/usr/local/bin/cloud-controller-manager" 2>/dev/null || aarch64-linux-gnu-readelf -h "$rootfs/usr/local/bin/cloud-controller-manager" | grep Machine)
    [[ $elf == *aarch64* || $elf == *AArch64* ]] || { echo "release-image: the arm64 binary is not an aarch64 ELF: $elf" >&2; exit 1; }
    echo "[release-image] arm64 binary: $elf"
    if command -v qemu-aarch64 >/dev/null; then
      echo "[release-image] under qemu-aarch64: $(qemu-aarch64 -L "$rootfs" "$rootfs/usr/local/bin/cloud-controller-manager" --version)"
    fi
    rm -rf "$rootfs"
  fi

  dst="$OUT/release/$bin"
  rm -rf "$dst" "$dst.oci.tar"
  mkdir -p "$dst/blobs/sha256"
  manifests=()
  for arch in $ARCHES; do
    src="$OUT/$bin"; [[ $arch == arm64 ]] && src="$OUT/$bin-arm64"
    cp -n "$src"/blobs/sha256/* "$dst/blobs/sha256/"
    manifests+=("$(jq -c --arg arch "$arch" '.manifests[0] | {mediaType, digest, size, platform: {architecture: $arch, os: "linux"}}' "$src/index.json")")
  done
  # The crates linked into the binary (the same for both architectures: no target-specific
  # dependency differs between them).
  crates=$(cargo tree --locked --offline -e normal --prefix none -p "$bin" 2>/dev/null | sed 's/ (.*//; s/ v/@/' | sort -u | paste -sd, -)
  printf '%s\n' "${manifests[@]}" | jq -s \
    --arg version "$VERSION" --arg title "$bin" --arg source "$SOURCE" --arg crates "$crates" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: .,
      annotations: {
        "org.opencontainers.image.title": $title,
        "org.opencontainers.image.version": $version,
        "org.opencontainers.image.source": $source,
        "io.rust-cloud-provider.crates": $crates
      }
    }' >"$dst/index-blob.json"
  read -r digest size < <(blob "$dst/index-blob.json")
  rm "$dst/index-blob.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$dst/oci-layout"
  jq -n --arg digest "$digest" --argjson size "$size" --arg version "$VERSION" '{
    schemaVersion: 2,
    manifests: [{
      mediaType: "application/vnd.oci.image.index.v1+json", digest: $digest, size: $size,
      annotations: {"org.opencontainers.image.ref.name": $version}
    }]
  }' >"$dst/index.json"
  (cd "$dst" && tar -cf "$dst.oci.tar" oci-layout index.json blobs)
  echo "[release-image] $bin:$VERSION  index $digest"
  for m in "${manifests[@]}"; do
    jq -r '"  linux/\(.platform.architecture)  manifest \(.digest)"' <<<"$m"
  done
  echo "  $(du -sk "$dst/blobs" | cut -f1) KiB in all; crates linked: $(tr ',' '\n' <<<"$crates" | wc -l)"
  if [[ -n $PUSH ]]; then
    command -v skopeo >/dev/null || { echo "release-image: --push needs skopeo (apt-get install skopeo)" >&2; exit 1; }
    skopeo copy --all "oci:$dst:$VERSION" "docker://$PUSH/$bin:$VERSION"
  fi
done
