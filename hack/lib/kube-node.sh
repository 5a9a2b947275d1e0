#!/usr/bin/env bash
# One Kubernetes node of the real-node cluster (hack/local-up-cluster.sh, tests/src/kube_node.rs):
# containerd and kubelet in a network and a mount namespace of their own, so that two
# nodes run side by side on one machine like two machines, and nothing of the host is changed or
# left behind.
#
#   unshare --net --mount --propagation private -- hack/lib/kube-node.sh DIR
#
# Network: the caller moves one end of a veth pair into this namespace as eth0 (its other end,
# in the host's namespace, holds 169.254.123.1 and a route to this node's address); this script
# gives eth0 the node's address (DIR/node-ip: the cloud's address for the machine, so the Node's
# InternalIP, Pods with host networking and the kubelet all answer there) and a route back to
# 169.254.123.1 only: nothing here can reach any other address. What the node dials (the API
# server, the cloud's endpoints) it dials on 127.0.0.1, where the caller forwards those ports
# to the host's 127.0.0.1.
#
# DIR holds what the caller prepared: kubelet.kubeconfig, kubelet.yaml (a KubeletConfiguration),
# kubelet.args (one kubelet flag per line), cni-template.json (containerd renders the node's CNI
# configuration from it once kubelet knows the Node's Pod CIDR), node-ip, optionally extra-ips, machine-id, hosts (the
# node's /etc/hosts) and registry-cas (lines "HOST CA-FILE"), and images.list (lines "ARCHIVE NAME": OCI
# archives imported into containerd, tagged NAME:<their tag>, before kubelet starts). This script
# writes containerd.toml and the node's state (containerd/, kubelet/, log/, run/, lib/, cni/) into
# DIR, and logs to DIR/containerd.log and DIR/kubelet.log.
#
# In the node's mount namespace, private directories cover the fixed host paths the kubelet and
# containerd use (/run, /var/log, /var/lib/kubelet via /var/lib, /usr/libexec/kubernetes), and the
# three kernel settings kubelet insists on writing (kernel.panic, kernel.panic_on_oops,
# vm.overcommit_memory) are covered by files holding the values it wants, so the host's are never
# changed. Every process of the node (containerd, its shims, the Pods, kubelet) runs in the cgroup
# /rcp-node-<pid> of each hierarchy; kubelet puts the Pods under it (cgroupRoot). On SIGTERM or
# SIGINT the node stops: kubelet and containerd are stopped, every process left in that cgroup is
# killed and the cgroups are removed (the network namespace goes with its last process).
set -euo pipefail

DIR=$(cd "$1" && pwd)
NAME=$(basename "$DIR")
CG="rcp-node-$$"
log() { printf '[kube-node %s] %s\n' "$NAME" "$*" >&2; }

# Every cgroup hierarchy: the v1 ones (the named systemd one included) and, on a hybrid machine,
# the unified one, where runc also places containers.
hierarchies=()
for h in /sys/fs/cgroup/*/; do
  h=${h%/}
  [[ -f "$h/cgroup.procs" ]] && hierarchies+=("$h")
done

cleanup() {
  trap - EXIT TERM INT
  [[ -n ${KUBELET_PID:-} ]] && kill -TERM "$KUBELET_PID" 2>/dev/null || true
  [[ -n ${CONTAINERD_PID:-} ]] && kill -TERM "$CONTAINERD_PID" 2>/dev/null || true
  sleep 0.5
  # Everything in the node's cgroups but this script: shims, Pods, whatever outlived its parent.
  local round pids h
  for round in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(find "${hierarchies[0]}/$CG" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | grep -vx "$$" || true)
    [[ -z $pids ]] && break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  # The cgroups, deepest first (this script leaves them first: a cgroup with a process in it
  # cannot be removed).
  for h in "${hierarchies[@]}"; do
    echo $$ > "$h/cgroup.procs" 2>/dev/null || true
    find "$h/$CG" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  log "stopped"
}
trap cleanup EXIT
trap 'exit 0' TERM INT

# Nodes of test processes killed without a chance to clean up (SIGKILL): their cgroups outlive
# them with the shims and Pods inside (containerd and kubelet die with this script: pdeathsig).
for stale in "${hierarchies[0]}"/rcp-node-*/; do
  [[ -d $stale ]] || continue
  owner=$(basename "$stale"); owner=${owner#rcp-node-}
  kill -0 "$owner" 2>/dev/null && continue
  for _ in 1 2 3 4 5; do
    pids=$(find "$stale" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
    [[ -z $pids ]] && break
    kill -KILL $pids 2>/dev/null || true; sleep 0.2
  done
  for h in "${hierarchies[@]}"; do find "$h/rcp-node-$owner" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
done

# The node's cgroups; this script (so every process it starts) joins them. cpuset needs its CPUs
# and memory nodes set before a process may join.
for h in "${hierarchies[@]}"; do
  mkdir -p "$h/$CG"
  if [[ -f "$h/cpuset.cpus" ]]; then
    cat "$h/cpuset.cpus" > "$h/$CG/cpuset.cpus"
    cat "$h/cpuset.mems" > "$h/$CG/cpuset.mems"
  fi
  echo $$ > "$h/$CG/cgroup.procs"
done

# Private host paths. /var/lib holds nothing either process needs from the host (containerd's
# root and state, kubelet's root, CNI's IP allocations are all given explicitly under DIR).
mkdir -p "$DIR"/{run,log,lib/kubelet,libexec,containerd/root,containerd/state,kubelet,cni-ipam,sysctl}
mount -t tmpfs -o mode=755 tmpfs /run
mount --bind "$DIR/log" /var/log
mount --bind "$DIR/lib" /var/lib
if [[ -d /usr/libexec ]]; then mount --bind "$DIR/libexec" /usr/libexec; fi
# Host names the node resolves its own way (e.g. a registry's, to 127.0.0.1), when given.
if [[ -f "$DIR/hosts" ]]; then mount --bind "$DIR/hosts" /etc/hosts; fi
# The machine's UUID, when given (DIR/machine-id): without DMI data the kubelet reports
# /etc/machine-id as the Node's systemUUID, which a VM's BIOS UUID is on vSphere.
if [[ -f "$DIR/machine-id" ]]; then mount --bind "$DIR/machine-id" /etc/machine-id; fi
for s in kernel/panic:10 kernel/panic_on_oops:1 vm/overcommit_memory:1; do
  f=$DIR/sysctl/${s%%:*}; mkdir -p "$(dirname "$f")"; echo "${s##*:}" > "$f"
  mount --bind "$f" "/proc/sys/${s%%:*}"
done

mkdir -p "$DIR/cni"
NODE_IP=$(cat "$DIR/node-ip")
for ((i = 0; i < 100; i++)); do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.1; done
ip link show eth0 >/dev/null 2>&1 || { log "no eth0 was moved into the node's network namespace"; exit 1; }
ip link set lo up
ip addr add "$NODE_IP/32" dev eth0
# Addresses of the node that the cloud does not know (DIR/extra-ips, one a line; tests of a
# kubelet --node-ip the CCM must refuse).
while read -r extra || [[ -n $extra ]]; do
  [[ -z $extra ]] || ip addr add "$extra/32" dev eth0
done < <(cat "$DIR/extra-ips" 2>/dev/null || true)
ip link set eth0 up
ip route add 169.254.123.1/32 dev eth0 src "$NODE_IP"

cat > "$DIR/containerd.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$DIR/containerd.sock"
[ttrpc]
  address = "$DIR/containerd.ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "rcp.local/pause:3.4.1"
  # Root here may lack CAP_SYS_RESOURCE: runc could not lower the sandbox's oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni"
    conf_template = "$DIR/cni-template.json"
EOF
# Registries with a CA of their own (lines "HOST CA-FILE" in DIR/registry-cas).
while read -r host ca; do
  [[ -n $host ]] || continue
  printf '[plugins."io.containerd.grpc.v1.cri".registry.configs."%s".tls]\n  ca_file = "%s"\n' "$host" "$ca" >> "$DIR/containerd.toml"
done < <(cat "$DIR/registry-cas" 2>/dev/null || true)

setpriv --pdeathsig KILL -- containerd --config "$DIR/containerd.toml" > "$DIR/containerd.log" 2>&1 &
CONTAINERD_PID=$!
for ((i = 0; i < 300; i++)); do
  ctr --address "$DIR/containerd.sock" version >/dev/null 2>&1 && break
  kill -0 "$CONTAINERD_PID" 2>/dev/null || { tail -n 20 "$DIR/containerd.log" >&2; log "containerd exited"; exit 1; }
  sleep 0.1
done
while read -r archive name; do
  [[ -n $archive ]] || continue
  ctr --address "$DIR/containerd.sock" -n k8s.io images import --base-name "$name" "$archive" >> "$DIR/containerd.log" 2>&1 \
    || { log "importing $archive as $name failed (log: $DIR/containerd.log)"; exit 1; }
done < <(cat "$DIR/images.list" 2>/dev/null || true)
log "containerd ready (pid $CONTAINERD_PID), images imported"

mapfile -t kubelet_args < "$DIR/kubelet.args"
setpriv --pdeathsig KILL -- kubelet --config="$DIR/kubelet.yaml" --kubeconfig="$DIR/kubelet.kubeconfig" \
  --container-runtime-endpoint="unix://$DIR/containerd.sock" \
  --image-service-endpoint="unix://$DIR/containerd.sock" \
  --root-dir="$DIR/kubelet" --cert-dir="$DIR/kubelet/pki" --volume-plugin-dir="$DIR/kubelet/volume-plugins" \
  --cgroup-root="/$CG" \
  "${kubelet_args[@]}" > "$DIR/kubelet.log" 2>&1 &
KUBELET_PID=$!
echo "$KUBELET_PID" > "$DIR/kubelet.pid"
echo "$CONTAINERD_PID" > "$DIR/containerd.pid"
log "kubelet started (pid $KUBELET_PID)"
# Runs until kubelet or containerd ends, or the node is stopped.
wait -n "$KUBELET_PID" "$CONTAINERD_PID" || true
log "kubelet or containerd exited"
exit 1
