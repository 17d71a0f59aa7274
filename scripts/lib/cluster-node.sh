# The test cluster's node (`up DIR --node NAME`): containerd, CNI, kubelet and gpuslice's plugin.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh. Everything of the node lives under DIR/node: containerd
# 2.x (scripts/lib/cluster-build.sh) with its own root, state, socket and config, Debian's runc
# and CNI plugins, the pause image (scripts/lib/cluster-pause-image.sh), the release's kubelet
# and `gpuslice kubelet-plugin` on a simulated GPU node. The CNI bridges, the subnets, the
# kubelets' cgroups and containerd's default NRI socket are the host's: one cluster with
# nodes per slot (KUBE_SLOT, GPUSLICE_KUBE_SLOT of `up`), each slot's names and addresses its
# own. Several nodes (`--node A --node B`, scripts/lib/cluster-nodes.sh) each get what
# select_node gives them: the first is the node above, unchanged; each further one its
# directory DIR/node-NAME, components named NAME-suffixed (kubelet-NAME…), a bridge and subnet
# of its own and its kubelet's cgroups under /gpuslice-node-NAME. Uses REPO, DIR, BIN,
# KUBE_SLOT, die and log of the sourcing script,
# scripts/lib/cluster-process.sh, cluster-pki.sh and cluster-control-plane.sh. Sets NODE,
# NODE_BIN (containerd's binaries), GBIN (gpuslice's), NODE_CONFIG (the node's gpuslice
# config) and KUBELET_ADDRESS (IP:PORT).

CNI_BIN_DIR=/usr/lib/cni
PAUSE_IMAGE=localhost/gpuslice-node-pause:1

# The most nodes one cluster has (`up` checks): a slot's subnets are 10.244.(77 + 32 × slot +
# index).0/24.
MAX_NODES=32

# select_node INDEX NAME: the node's directory, component names, bridge, subnet, cgroup root
# and NRI socket. In slot 0, index 0 is the one node of `up --node NAME` (DIR/node, gskube0
# on 10.244.77.0/24, cgroups at the hierarchy's root, containerd's default NRI socket);
# index N > 0: DIR/node-NAME, gskubeN on 10.244.(77+N).0/24 (routed to the others' through
# the host), cgroups under /gpuslice-node-NAME. In slot S > 0, every node: bridge gskubeN-sS
# on 10.244.(77+32S+N).0/24, cgroups under /gpuslice-sS-nodeN, an NRI socket in its
# containerd's directory (slot 0's first node holds the host's).
select_node() {
  local i="$1" name="$2" slot="${KUBE_SLOT:-0}"
  if [ "$i" -eq 0 ]; then
    NODE="$DIR/node"
    NODE_TAG=""
  else
    NODE="$DIR/node-$name"
    NODE_TAG="-$name"
  fi
  if [ "$slot" -eq 0 ]; then
    CNI_BRIDGE="gskube$i"
    NODE_CGROUP_ROOT=""
    [ "$i" -eq 0 ] || NODE_CGROUP_ROOT="/gpuslice-node-$name"
  else
    CNI_BRIDGE="gskube$i-s$slot"
    NODE_CGROUP_ROOT="/gpuslice-s$slot-node$i"
  fi
  NODE_NRI_SOCKET=""
  [ "$slot" -eq 0 ] && [ "$i" -eq 0 ] || NODE_NRI_SOCKET="$NODE/containerd/nri.sock"
  CNI_SUBNET="10.244.$((77 + MAX_NODES * slot + i)).0/24"
  C_CONTAINERD="containerd$NODE_TAG"
  C_KUBELET="kubelet$NODE_TAG"
  C_PLUGIN="gpuslice-kubelet-plugin$NODE_TAG"
  NODE_SELECTED=1
}

# node_selected: the node select_node chose, else the first.
node_selected() {
  [ -n "${NODE_SELECTED:-}" ] || select_node 0 ""
}

# --- what the node runs -------------------------------------------------------------------------

# gpuslice's binaries: GPUSLICE_BIN_DIR, else the workspace's release or debug build.
gpuslice_bin_dir() {
  local d
  if [ -n "${GPUSLICE_BIN_DIR:-}" ]; then
    d="$GPUSLICE_BIN_DIR"
  elif [ -x "$REPO/target/release/gpuslice" ]; then
    d="$REPO/target/release"
  else
    d="$REPO/target/debug"
  fi
  { [ -x "$d/gpuslice" ] && [ -x "$d/gpuslice-runtime" ]; } ||
    die "$d has no gpuslice and gpuslice-runtime: build them (scripts/build.sh) or set GPUSLICE_BIN_DIR"
  echo "$d"
}

# The simulated driver, probe and shim: GPUSLICE_SIM_DIR, else target/portable, else the build.
sim_dir() {
  local d="${GPUSLICE_SIM_DIR:-$REPO/target/portable}"
  if [ -e "$d/libgpuslice_shim.so" ] && [ -e "$d/libcuda.so.1" ]; then
    echo "$d"
  else
    echo "$GBIN"
  fi
}

# toml_get FILE KEY.PATH DEFAULT: one string value of a TOML file.
toml_get() {
  python3 - "$@" <<'PY'
import sys, tomllib
path, key, default = sys.argv[1:4]
with open(path, "rb") as f:
    v = tomllib.load(f)
for k in key.split("."):
    v = v.get(k) if isinstance(v, dict) else None
print(v if isinstance(v, str) else default)
PY
}

# --- configuration --------------------------------------------------------------------------------

# The node's gpuslice config: NODE_CONFIG_GIVEN (`--node NAME=CONFIG`), else (one node only)
# GPUSLICE_CONFIG, else a simulated node written under the node's directory.
node_gpuslice_config() {
  local given="${NODE_CONFIG_GIVEN:-}"
  # GPUSLICE_CONFIG is the one node's: several nodes must not share a state directory.
  [ -n "$given" ] || [ -n "${SEVERAL_NODES:-}" ] || given="${GPUSLICE_CONFIG:-}"
  if [ -n "$given" ]; then
    [ -f "$given" ] || die "the gpuslice config $given of node ${NODE_NAME_NOW:-} is not a file"
    NODE_CONFIG="$(cd "$(dirname "$given")" && pwd)/$(basename "$given")"
    return
  fi
  local g="$NODE/gpuslice" kept sim
  # Where the node keeps its gpuslice state and CDI specs: under its directory, or under
  # GPUSLICE_NODE_STATE_ROOT (a tmpfs, as /run/gpuslice and /var/run/cdi are on a node).
  kept="$g"
  [ -z "${GPUSLICE_NODE_STATE_ROOT:-}" ] || kept="$GPUSLICE_NODE_STATE_ROOT/$(basename "$NODE")"
  sim="$(sim_dir)"
  mkdir -p "$g" "$kept/state" "$kept/cdi"
  NODE_CONFIG="$g/config.toml"
  cat >"$NODE_CONFIG" <<TOML
# Written by scripts/kube-cluster.sh up --node: a simulated GPU node for tests and demos.
state_dir = "$kept/state"
[shim]
library = "$sim/libgpuslice_shim.so"
[cdi]
spec_dir = "$kept/cdi"
[inventory]
source = "simulated"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
TOML
  logged "cdi-generate$NODE_TAG" "gpuslice cdi generate" \
    "$GBIN/gpuslice" --config "$NODE_CONFIG" cdi generate --sim-driver "$sim"
}

# write_containerd_config: DIR/node/containerd/config.toml (and config.base.toml, the same
# before gpuslice registers itself), CDI specs read from the node config's cdi.spec_dir.
write_containerd_config() {
  local c="$NODE/containerd" cdi
  cdi="$(toml_get "$NODE_CONFIG" cdi.spec_dir /var/run/cdi)"
  mkdir -p "$c/root" "$c/state" "$NODE/runc"
  cat >"$c/config.toml" <<TOML
# Written by scripts/kube-cluster.sh up --node: the test node's containerd 2.x.
version = 3
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.opt"]

[grpc]
  address = "$c/containerd.sock"

[ttrpc]
  address = "$c/containerd.sock.ttrpc"

[plugins]
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "native"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$PAUSE_IMAGE"
  [plugins."io.containerd.cri.v1.runtime"]
    enable_cdi = true
    cdi_spec_dirs = ["$cdi"]
    # Sandboxes ask for oom_score_adj -998; a test host in a container may not lower it.
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$CNI_BIN_DIR"]
      conf_dir = "$NODE/cni/net.d"
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        snapshotter = "native"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$NODE/runc"
          SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
TOML
  # Every node's NRI socket but slot 0's first one (containerd's default path) is its own.
  [ -z "$NODE_NRI_SOCKET" ] || cat >>"$c/config.toml" <<TOML
  [plugins."io.containerd.nri.v1.nri"]
    socket_path = "$NODE_NRI_SOCKET"
TOML
  # What the harness wrote, before gpuslice registered itself: `configure --remove` must
  # give this back.
  cp "$c/config.toml" "$c/config.base.toml"
}

# write_cni_config: the pods' network, Debian's bridge (CNI_BRIDGE, a gateway on CNI_SUBNET)
# with host-local addresses kept under DIR/node/cni/ipam, and loopback.
write_cni_config() {
  mkdir -p "$NODE/cni/net.d" "$NODE/cni/ipam"
  cat >"$NODE/cni/net.d/10-gpuslice-node$NODE_TAG.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "gpuslice-node$NODE_TAG",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE/cni/ipam",
        "ranges": [[{"subnet": "$CNI_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
JSON
}

# write_kubelet_config IP PORT HEALTHZ_PORT: DIR/node/kubelet-config.yaml.
write_kubelet_config() {
  local ip="$1" port="$2" healthz="$3"
  cat >"$NODE/kubelet-config.yaml" <<YAML
# Written by scripts/kube-cluster.sh up --node: test-harness settings for this host (hybrid
# cgroup v1, no systemd, a container), not the product's.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$NODE/containerd/containerd.sock
address: $ip
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization:
  mode: AlwaysAllow
failSwapOn: false
podLogsDir: $NODE/pod-logs
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
YAML
  # A further node's pods, and those of a cluster in another slot, in cgroups of their own
  # (two kubelets on one /kubepods would remove each other's pods' cgroups as orphans).
  [ -z "$NODE_CGROUP_ROOT" ] || echo "cgroupRoot: $NODE_CGROUP_ROOT" >>"$NODE/kubelet-config.yaml"
  # With the cluster's DNS (scripts/lib/cluster-dns.sh), pods resolve Services through it.
  [ -z "${CLUSTER_DNS_IP:-}" ] || printf 'clusterDNS: [%s]\nclusterDomain: %s\n' \
    "$CLUSTER_DNS_IP" "$CLUSTER_DOMAIN" >>"$NODE/kubelet-config.yaml"
}

# node_cgroup_dirs: the cgroup root's directory in each hierarchy of the host (none for slot
# 0's first node, whose root is the hierarchies' own).
node_cgroup_dirs() {
  [ -n "$NODE_CGROUP_ROOT" ] || return 0
  local h
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -e "$h/cgroup.procs" ] || continue
    echo "${h%/}$NODE_CGROUP_ROOT"
  done
}

# node_ip: the kubelet's node IP (it refuses a loopback one): the address of the default
# route, else the first of the machine's; nothing when there is none.
node_ip() {
  local ip
  ip="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)" || true
  [ -n "$ip" ] || ip="$(hostname -I 2>/dev/null | awk '{ print $1 }')" || true
  echo "$ip"
}

# --- readiness ----------------------------------------------------------------------------------

ctr_node() {
  "$NODE_BIN/ctr" --address "$NODE/containerd/containerd.sock" --namespace k8s.io "$@"
}

ctr_ready() {
  ctr_node version
}

cri_ready() {
  # The CRI plugin is loaded (containerd 2.x reports it under plugins).
  ctr_node plugins ls | grep -E 'io\.containerd\.grpc\.v1 +cri +.* ok'
}

node_ready() {
  kubectl_admin get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

node_slice() {
  kubectl_admin get resourceslices -o 'jsonpath={range .items[*]}{.spec.nodeName}/{.spec.driver}{"\n"}{end}' |
    grep -qx "$1/gpuslice.io"
}

# --- up -----------------------------------------------------------------------------------------

# start_containerd: containerd with gpuslice registered, until its CRI plugin serves, then the
# pause image imported.
start_containerd() {
  write_containerd_config
  write_cni_config
  logged "configure-containerd$NODE_TAG" "gpuslice configure containerd" \
    "$GBIN/gpuslice" --config "$NODE_CONFIG" configure containerd --config-path "$NODE/containerd/config.toml"

  # containerd hands its environment to the shims: PATH finds this build's shim first.
  start "$C_CONTAINERD" env PATH="$NODE_BIN:$PATH" "$NODE_BIN/containerd" --config "$NODE/containerd/config.toml"
  wait_for "$C_CONTAINERD" "answering on $NODE/containerd/containerd.sock" ctr_ready
  wait_for "$C_CONTAINERD" "loading its CRI plugin" cri_ready
  mkdir -p "$NODE/images"
  pause_image "$NODE/images/pause.tar"
  # --local: containerd 2.x's transfer service unpacks only for its default snapshotter.
  logged "pause-import$NODE_TAG" "importing the pause image" \
    ctr_node images import --local --snapshotter native "$NODE/images/pause.tar"
}

# start_kubelet NAME: the kubelet of Node NAME, with a client certificate of the group
# system:nodes, until the Node is Ready; KUBELET_ADDRESS is where it serves.
start_kubelet() {
  local name="$1" ip port healthz
  sign_client "node-$name" "/O=system:nodes/CN=system:node:$name"
  kubeconfig "$NODE/kubelet.kubeconfig" "node-$name"
  ip="$(node_ip)"
  [ -n "$ip" ] || fail_up "this machine has no IPv4 address other than loopback for the kubelet's node IP"
  port="$(free_port)"
  healthz="$(free_port)"
  write_kubelet_config "$ip" "$port" "$healthz"
  mkdir -p "$NODE/kubelet" "$NODE/pod-logs"
  local cg
  for cg in $(node_cgroup_dirs); do
    mkdir -p "$cg" || fail_up "cannot create the cgroup $cg of node $name"
  done
  # shellcheck disable=SC2153 # BIN: the Kubernetes binaries, set by `up`
  start "$C_KUBELET" "$BIN/kubelet" --config "$NODE/kubelet-config.yaml" \
    --kubeconfig "$NODE/kubelet.kubeconfig" --root-dir "$NODE/kubelet" \
    --cert-dir "$NODE/kubelet/pki" --hostname-override "$name" --node-ip "$ip" \
    --node-labels nvidia.com/gpu.present=true --v 2 \
    ${FEATURE_GATES:+"--feature-gates=$FEATURE_GATES"}
  # shellcheck disable=SC2034 # logged by scripts/kube-cluster.sh
  KUBELET_ADDRESS="$ip:$port"
  wait_for "$C_KUBELET" "making Node $name Ready" node_ready "$name"
}

# start_kubelet_plugin NAME: `gpuslice kubelet-plugin` for Node NAME, until it has published
# the node's ResourceSlice, serves its DRA socket and the kubelet has registered it.
start_kubelet_plugin() {
  local name="$1"
  # The plugin registers itself with the kubelet through the kubelet's plugin watcher
  # directory, as on a real node (its registration socket accepts the kubelet's socket-path
  # :authority: kube/plugin/src/h2_relay.rs).
  start "$C_PLUGIN" "$GBIN/gpuslice" --config "$NODE_CONFIG" kubelet-plugin \
    --node-name "$name" --kubeconfig "$DIR/kubeconfig" \
    --plugin-dir "$NODE/kubelet/plugins/gpuslice.io" \
    --registration-dir "$NODE/kubelet/plugins_registry"
  wait_for "$C_PLUGIN" "publishing the ResourceSlice of $name" node_slice "$name"
  wait_for "$C_PLUGIN" "serving $NODE/kubelet/plugins/gpuslice.io/dra.sock" \
    test -S "$NODE/kubelet/plugins/gpuslice.io/dra.sock"
  wait_for "$C_PLUGIN" "being registered by the kubelet" \
    grep -q "registered with the kubelet" "$DIR/logs/$C_PLUGIN.log"
}

# start_node NAME: everything of the node select_node chose (the first by default), after the
# control plane is up; the caller stops what `up` started should this fail.
start_node() {
  local name="$1"
  node_selected
  mkdir -p "$NODE"
  NODE_BIN="$(build_node_binaries)"
  echo "$NODE_BIN" >"$NODE/bin-dir"
  GBIN="$(gpuslice_bin_dir)"
  local p
  for p in bridge host-local loopback; do
    [ -x "$CNI_BIN_DIR/$p" ] || fail_up "$CNI_BIN_DIR/$p is missing (package containernetworking-plugins): run scripts/install-deps.sh"
  done
  command -v runc >/dev/null || fail_up "runc is missing: run scripts/install-deps.sh"
  node_gpuslice_config
  start_containerd
  start_kubelet "$name"
  start_kubelet_plugin "$name"
  logged "node-objects$NODE_TAG" "applying the DeviceClasses, the slot-claim policy and the RuntimeClass" \
    kubectl_admin apply -f "$REPO/packaging/kubernetes/dra/deviceclass.yaml" \
    -f "$REPO/packaging/kubernetes/dra/deviceclass-slots.yaml" \
    -f "$REPO/packaging/kubernetes/dra/slot-claims-policy.yaml" \
    -f "$REPO/packaging/kubernetes/runtimeclass.yaml"
}

# --- down ---------------------------------------------------------------------------------------

# Pids whose command line names the node's directory (containerd's shims outlive it), except
# ours.
node_leftover_pids() {
  local p
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [ "$p" != $$ ] || continue
    { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$NODE/" && echo "$p"
  done
  return 0
}

# drain_node: with the kubelet and the API still up, delete every workload and pod so that
# the kubelet tears them down (CNI, DRA unprepare, volumes).
drain_node() {
  alive kubelet && alive kube-apiserver || return 0
  kubectl_admin delete deployments,replicasets,statefulsets,daemonsets,jobs --all --all-namespaces \
    --wait=false >/dev/null 2>&1 || true
  KUBECTL_TIMEOUT=70s kubectl_admin delete pods --all --all-namespaces \
    --wait=true --timeout=60s >/dev/null 2>&1 || log "some pods were not gone within 60 s; stopping the node anyway"
}

# stop_node: stops the processes of the node select_node chose (the first by default) and
# removes its files (a no-op without that node).
stop_node() {
  node_selected
  [ -d "$NODE" ] || return 0
  stop_one "$C_PLUGIN"
  stop_one "$C_KUBELET"
  if alive "$C_CONTAINERD"; then
    NODE_BIN="$(cat "$NODE/bin-dir" 2>/dev/null || true)"
    if [ -n "$NODE_BIN" ] && [ -x "$NODE_BIN/ctr" ]; then
      local t
      for t in $(ctr_node tasks ls -q 2>/dev/null); do
        ctr_node tasks kill -s KILL "$t" >/dev/null 2>&1 || true
      done
      sleep 1
      for t in $(ctr_node tasks ls -q 2>/dev/null); do
        ctr_node tasks delete -f "$t" >/dev/null 2>&1 || true
      done
    fi
  fi
  stop_one "$C_CONTAINERD"
  local p
  for p in $(node_leftover_pids); do
    kill -KILL "$p" 2>/dev/null || true
  done
  # Mounts under the node's dirs (the kubelet's volumes, sandbox files), deepest first.
  local m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$NODE/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  if [ -d "$NODE/runc" ]; then
    local c
    for c in "$NODE/runc"/*; do
      [ -e "$c" ] || continue
      runc --root "$NODE/runc" delete --force "$(basename "$c")" >/dev/null 2>&1 || true
    done
  fi
  ip link delete "$CNI_BRIDGE" >/dev/null 2>&1 || true
  # The kubelet's cgroups for the pods it ran (cgroupfs driver): empty once the pods are gone.
  local cg dirs
  if [ -n "$NODE_CGROUP_ROOT" ]; then
    dirs="$(node_cgroup_dirs)"
  else
    dirs="$(echo /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods)"
  fi
  for cg in $dirs; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$NODE"
}
