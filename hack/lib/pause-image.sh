#!/usr/bin/env bash
# The Pod sandbox ("pause") image of the real-node cluster, built here instead of pulled: the
# static pause program hack/install-test-deps.sh compiles from the Kubernetes module's source,
# packed by umoci as an OCI archive whose tag is 3.4.1 (hack/lib/kube-node.sh imports it as
# rcp.local/pause:3.4.1, containerd's sandbox image).
#
#   hack/lib/pause-image.sh PAUSE-BINARY OUT.tar
set -euo pipefail
pause=$1 out=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umoci init --layout "$work/layout"
umoci new --image "$work/layout:3.4.1"
umoci unpack --rootless --image "$work/layout:3.4.1" "$work/bundle" >/dev/null
install -m 0755 "$pause" "$work/bundle/rootfs/pause"
umoci repack --image "$work/layout:3.4.1" "$work/bundle" >/dev/null
umoci config --image "$work/layout:3.4.1" --config.entrypoint /pause --config.user 65535:65535 \
  --os linux --architecture amd64
umoci gc --layout "$work/layout"
(cd "$work/layout" && tar -cf "$out.tmp" oci-layout index.json blobs)
mv "$out.tmp" "$out"
