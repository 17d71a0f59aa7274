#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for tests and demos (DESIGN §7): etcd (in-process
# embed), kube-apiserver, kube-scheduler and kube-controller-manager of the release pinned in
# tests/kube/go.mod, built from its Go modules and cached outside the checkout; with --node, a
# node for the local machine too: containerd 2.x (built from the Go module pinned in
# tests/node/go.mod), runc and CNI from Debian, the release's kubelet and the gpuslice kubelet
# plugin on a simulated GPU node.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/kube-cluster.sh COMMAND [ARGS]

  up DIR        Start a control plane whose files all live under DIR (created if missing):
                etcd (data in DIR/etcd), kube-apiserver (--authorization-mode=Node,RBAC),
                kube-scheduler and kube-controller-manager, each on a free port of 127.0.0.1,
                with a CA, serving and client certificates and service-account keys made by
                openssl in DIR/pki. Writes the admin kubeconfig to DIR/kubeconfig, pids to
                DIR/pids, logs to DIR/logs and the endpoints to DIR/cluster.env. Returns once
                the API answers and the default namespace has its service account; on a
                timeout or a crash it prints the failing component's log tail, stops what it
                started and exits 1.
  up DIR --node NAME
                The same, plus a node NAME for this machine, its files under DIR/node:
                containerd 2.x (own root, state, socket and config, CDI on, native
                snapshotter; gpuslice-runtime registered as handler `gpuslice` by
                `gpuslice configure containerd`), CNI (Debian's bridge, host-local and
                loopback plugins, bridge gskube0 on 10.244.77.0/24), a pause image built
                here from busybox-static and imported with ctr, the release's kubelet
                (KubeletConfiguration DIR/node/kubelet-config.yaml: cgroupfs driver,
                failCgroupV1 false; root dir DIR/node/kubelet), and `gpuslice
                kubelet-plugin` registered with that kubelet. Applies the DeviceClass
                gpuslice.io and the RuntimeClass gpuslice. Returns once the Node is Ready
                and its ResourceSlice is published; adds the node's paths to
                DIR/cluster.env. One node per machine at a time.
  down DIR      Stop what `up DIR` started (only the pids it recorded) and remove what it
                wrote. With a node: first deletes the workloads and pods through the API
                (so the kubelet tears them down: CNI, DRA unprepare), then stops the plugin,
                the kubelet, what containerd still runs and containerd, unmounts what is
                mounted under DIR and removes DIR/node and the bridge. Idempotent: a second
                call, or one for a DIR never used, does nothing.
  build         Build the binaries if the cache has none for the current sources, and print
                their directory (kube-apiserver, kube-scheduler, kube-controller-manager,
                kubectl, kubelet, etcd).
  build-node    The same for the node's containerd, ctr and containerd-shim-runc-v2
                (tests/node); prints their directory.
  build-nerdctl The same for nerdctl (tests/nerdctl), which the suite runs against the
                node's containerd; prints the path of the nerdctl binary and logs what
                it cost (cold: the build; warm: the cache lookup).
  --help        This text.

Environment:
  GPUSLICE_KUBE_BIN_DIR   use the binaries in this directory instead of the cache
  GPUSLICE_KUBE_CACHE     cache root (default /var/cache/gpuslice/kube); entries are
                          <release>-<hash of tests/kube's go.mod, go.sum and sources>/bin
  GPUSLICE_KUBE_TIMEOUT   seconds `up` waits for each component (default 240)
  GPUSLICE_NODE_BIN_DIR   (--node) use containerd, ctr and containerd-shim-runc-v2 from here
  GPUSLICE_NODE_CACHE     (--node) their cache root (default /var/cache/gpuslice/node);
                          entries are <containerd version>-<hash of tests/node's go.mod and go.sum>/bin
  GPUSLICE_NERDCTL_BIN    (build-nerdctl) use this nerdctl instead of the cache
  GPUSLICE_NERDCTL_CACHE  (build-nerdctl) its cache root (default /var/cache/gpuslice/nerdctl);
                          entries are nerdctl-<version>-<hash of tests/nerdctl's files>/bin
  GPUSLICE_BIN_DIR        (--node) gpuslice and gpuslice-runtime (default target/release, else
                          target/debug)
  GPUSLICE_CONFIG         (--node) the node's gpuslice config; default: one written under
                          DIR/node/gpuslice for a simulated node with one NVIDIA H200 (141Gi),
                          whose CDI inventory is taken with the simulated driver of
                          GPUSLICE_SIM_DIR (default target/portable, else GPUSLICE_BIN_DIR)
EOF
}

REPO="$(cd "$(dirname "$0")/.." && pwd)"
KUBE_SRC="$REPO/tests/kube"
CACHE_ROOT="${GPUSLICE_KUBE_CACHE:-/var/cache/gpuslice/kube}"
TIMEOUT="${GPUSLICE_KUBE_TIMEOUT:-240}"
# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd)

die() {
  echo "kube-cluster: $*" >&2
  exit 1
}

log() { echo "kube-cluster: $*" >&2; }

# --- build ------------------------------------------------------------------------------------

# The Go builds (find, lock, build, check and prune a keyed cache entry) are scripts/lib/gomodule.sh's.
# shellcheck source=lib/gomodule.sh
. "$REPO/scripts/lib/gomodule.sh"

k8s_release() {
  gomodule_release "$KUBE_SRC" k8s.io/kubernetes
}

# How the binaries are built; part of the cache key, so a change here rebuilds.
build_ldflags() {
  local release="$1" v=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  local major minor
  major="${release#v}"
  major="${major%%.*}"
  minor="${release#v*.}"
  minor="${minor%%.*}"
  local x f
  x=""
  for f in "$v" "$c"; do
    x="$x -X $f.gitVersion=$release -X $f.gitMajor=$major -X $f.gitMinor=$minor -X $f.gitTreeState=clean"
  done
  echo "-s -w$x"
}

# Prints the cached bin directory, building it first when missing.
build_binaries() {
  if [ -n "${GPUSLICE_KUBE_BIN_DIR:-}" ]; then
    check_bin_dir "$GPUSLICE_KUBE_BIN_DIR"
    echo "$GPUSLICE_KUBE_BIN_DIR"
    return
  fi
  local go release key ldflags b bins=()
  go="$(gomodule_go)"
  release="$(k8s_release)"
  [ -n "$release" ] || die "$KUBE_SRC/go.mod requires no k8s.io/kubernetes version"
  ldflags="$(build_ldflags "$release")"
  key="$(gomodule_key "$go" "$KUBE_SRC" -- "$ldflags" "${BINARIES[@]}")"
  for b in "${BINARIES[@]}"; do bins+=(--bin "$b"); done
  gomodule_build --go "$go" --cache "$CACHE_ROOT" --cache-var GPUSLICE_KUBE_CACHE \
    --entry "$release-$key" "${bins[@]}" --src "$KUBE_SRC" \
    --what "Kubernetes $release control-plane binaries and kubelet" --failed "the Kubernetes binaries" -- \
    -mod=readonly -trimpath -ldflags "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet ./cmd/etcd
}

check_bin_dir() {
  local b
  for b in "${BINARIES[@]}"; do
    [ -x "$1/$b" ] || die "$1/$b is missing (GPUSLICE_KUBE_BIN_DIR or the cache holds an incomplete build)"
  done
}

# --- node: containerd 2.x, CNI, pause image, kubelet, gpuslice kubelet-plugin ----------------

NODE_SRC="$REPO/tests/node"
NODE_CACHE_ROOT="${GPUSLICE_NODE_CACHE:-/var/cache/gpuslice/node}"
# Node components in start order; stopped in reverse before the control plane.
NODE_COMPONENTS=(containerd kubelet gpuslice-kubelet-plugin)
NODE_BINARIES=(containerd ctr containerd-shim-runc-v2)
CNI_BIN_DIR=/usr/lib/cni
CNI_BRIDGE=gskube0
CNI_SUBNET=10.244.77.0/24
PAUSE_IMAGE=localhost/gpuslice-node-pause:1

containerd_release() {
  gomodule_release "$NODE_SRC" github.com/containerd/containerd/v2
}

node_ldflags() {
  echo "-s -w -X github.com/containerd/containerd/v2/version.Version=$1"
}

# Build tags: no btrfs/zfs/devmapper snapshotters (they need C headers; the node uses native).
NODE_TAGS="no_btrfs no_devmapper no_zfs"

check_node_bin_dir() {
  local b
  for b in "${NODE_BINARIES[@]}"; do
    [ -x "$1/$b" ] || die "$1/$b is missing (GPUSLICE_NODE_BIN_DIR or the cache holds an incomplete build)"
  done
}

# Prints the cached bin directory of containerd, ctr and the runc shim, building it first.
build_node_binaries() {
  if [ -n "${GPUSLICE_NODE_BIN_DIR:-}" ]; then
    check_node_bin_dir "$GPUSLICE_NODE_BIN_DIR"
    echo "$GPUSLICE_NODE_BIN_DIR"
    return
  fi
  local go release key ldflags b bins=()
  go="$(gomodule_go)"
  release="$(containerd_release)"
  [ -n "$release" ] || die "$NODE_SRC/go.mod requires no github.com/containerd/containerd/v2 version"
  ldflags="$(node_ldflags "$release")"
  # The key covers go.mod and go.sum only: tests/node holds no Go sources.
  key="$(gomodule_key "$go" "$NODE_SRC" go.mod go.sum -- "$ldflags" "CGO_ENABLED=0 $NODE_TAGS" "${NODE_BINARIES[@]}")"
  for b in "${NODE_BINARIES[@]}"; do bins+=(--bin "$b"); done
  gomodule_build --go "$go" --cache "$NODE_CACHE_ROOT" --cache-var GPUSLICE_NODE_CACHE \
    --entry "containerd-$release-$key" "${bins[@]}" --src "$NODE_SRC" --env CGO_ENABLED=0 \
    --what "containerd $release (containerd, ctr, containerd-shim-runc-v2)" --failed containerd -- \
    -mod=readonly -trimpath -tags "$NODE_TAGS" -ldflags "$ldflags" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
}

# --- nerdctl (tests/nerdctl): the nerdctl release the suite runs against containerd 2.x --------

NERDCTL_SRC="$REPO/tests/nerdctl"
NERDCTL_CACHE_ROOT="${GPUSLICE_NERDCTL_CACHE:-/var/cache/gpuslice/nerdctl}"

nerdctl_release() {
  gomodule_release "$NERDCTL_SRC" github.com/containerd/nerdctl/v2
}

nerdctl_ldflags() {
  echo "-s -w -X github.com/containerd/nerdctl/v2/pkg/version.Version=$1"
}

# Prints the path of the cached nerdctl, building it first (a cold build takes minutes, a
# cached one the key's hashing: both are logged).
build_nerdctl_binary() {
  if [ -n "${GPUSLICE_NERDCTL_BIN:-}" ]; then
    [ -x "$GPUSLICE_NERDCTL_BIN" ] || die "GPUSLICE_NERDCTL_BIN=$GPUSLICE_NERDCTL_BIN is not an executable"
    echo "$GPUSLICE_NERDCTL_BIN"
    return
  fi
  local go release key ldflags start bin
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(nerdctl_release)"
  [ -n "$release" ] || die "$NERDCTL_SRC/go.mod requires no github.com/containerd/nerdctl/v2 version"
  ldflags="$(nerdctl_ldflags "$release")"
  key="$(gomodule_key "$go" "$NERDCTL_SRC" -- "$ldflags" "CGO_ENABLED=0")"
  bin="$(gomodule_build --go "$go" --cache "$NERDCTL_CACHE_ROOT" --cache-var GPUSLICE_NERDCTL_CACHE \
    --entry "nerdctl-$release-$key" --bin nerdctl --src "$NERDCTL_SRC" --env CGO_ENABLED=0 \
    --what "nerdctl $release" --failed nerdctl --timed "nerdctl $release" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "$ldflags" github.com/containerd/nerdctl/v2/cmd/nerdctl)"
  echo "$bin/nerdctl"
}

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
  [ -x "$d/gpuslice" ] && [ -x "$d/gpuslice-runtime" ] ||
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

# The node's gpuslice config: GPUSLICE_CONFIG, else a simulated node written under DIR/node.
node_gpuslice_config() {
  if [ -n "${GPUSLICE_CONFIG:-}" ]; then
    [ -f "$GPUSLICE_CONFIG" ] || die "GPUSLICE_CONFIG=$GPUSLICE_CONFIG is not a file"
    NODE_CONFIG="$(cd "$(dirname "$GPUSLICE_CONFIG")" && pwd)/$(basename "$GPUSLICE_CONFIG")"
    return
  fi
  local g="$NODE/gpuslice" sim
  sim="$(sim_dir)"
  mkdir -p "$g/state" "$g/cdi"
  NODE_CONFIG="$g/config.toml"
  cat >"$NODE_CONFIG" <<TOML
# Written by scripts/kube-cluster.sh up --node: a simulated GPU node for tests and demos.
state_dir = "$g/state"
[shim]
library = "$sim/libgpuslice_shim.so"
[cdi]
spec_dir = "$g/cdi"
[inventory]
source = "simulated"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
TOML
  "$GBIN/gpuslice" --config "$NODE_CONFIG" cdi generate --sim-driver "$sim" >"$DIR/logs/cdi-generate.log" 2>&1 ||
    die "gpuslice cdi generate failed: $(cat "$DIR/logs/cdi-generate.log")"
}

# json_string S: S as a JSON string.
json_string() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}

# blob DIR FILE: moves FILE into the layout's blobs; prints "sha256:<hex> <size>".
blob() {
  local blobs="$1/blobs/sha256" hex size
  mkdir -p "$blobs"
  hex="$(sha256sum "$2" | cut -d' ' -f1)"
  size="$(stat -c %s "$2")"
  mv "$2" "$blobs/$hex"
  echo "sha256:$hex $size"
}

# pause_image FILE: an OCI image layout archive of the pause image (busybox-static, whose sh
# waits until SIGTERM), for `ctr images import`.
pause_image() {
  local out="$1" work="$NODE/images/pause" layer config manifest
  command -v busybox >/dev/null && busybox --list 2>/dev/null | grep -qx sh ||
    die "busybox (package busybox-static) is missing: run scripts/install-deps.sh"
  local busybox
  busybox="$(command -v busybox)"
  ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static: install busybox-static"
  rm -rf "$work"
  mkdir -p "$work/rootfs/bin" "$work/layout"
  cp "$busybox" "$work/rootfs/bin/busybox"
  ln -s busybox "$work/rootfs/bin/sh"
  tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/layer.tar" .
  read -r layer layer_size < <(blob "$work/layout" "$work/layer.tar")
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/bin/sh","-c","trap \\"exit 0\\" TERM INT; while :; do sleep 3600 & wait; done"]},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
    "$layer" >"$work/config.json"
  read -r config config_size < <(blob "$work/layout" "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
  read -r manifest manifest_size < <(blob "$work/layout" "$work/manifest.json")
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$PAUSE_IMAGE" >"$work/layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
  tar -C "$work/layout" -cf "$out" oci-layout index.json blobs
  rm -rf "$work"
}

ctr_node() {
  "$NODE_BIN/ctr" --address "$NODE/containerd/containerd.sock" --namespace k8s.io "$@"
}

write_containerd_config() {
  local c="$NODE/containerd" cdi
  cdi="$(toml_get "$NODE_CONFIG" cdi.spec_dir /var/run/cdi)"
  mkdir -p "$c/root" "$c/state" "$NODE/runc" "$NODE/cni/net.d" "$NODE/cni/ipam"
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
  # What the harness wrote, before gpuslice registered itself: `configure --remove` must
  # give this back.
  cp "$c/config.toml" "$c/config.base.toml"
  cat >"$NODE/cni/net.d/10-gpuslice-node.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "gpuslice-node",
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
}

node_ready() {
  kubectl_admin get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

node_slice() {
  kubectl_admin get resourceslices -o 'jsonpath={range .items[*]}{.spec.nodeName}/{.spec.driver}{"\n"}{end}' |
    grep -qx "$1/gpuslice.io"
}

ctr_ready() {
  ctr_node version
}

cri_ready() {
  # The CRI plugin is loaded (containerd 2.x reports it under plugins).
  ctr_node plugins ls | grep -E 'io\.containerd\.grpc\.v1 +cri +.* ok'
}

# node_die MESSAGE: a node step failed: stop what `up` started, then fail.
node_die() {
  echo "kube-cluster: $*" >&2
  stop_all
  exit 1
}

# start_node NAME: everything of the node, after the control plane is up.
start_node() {
  local name="$1"
  NODE="$DIR/node"
  # Whatever fails from here on (a build, a missing tool, a component) stops what `up` started.
  trap '[ -n "${NODE_UP:-}" ] || stop_all' EXIT
  mkdir -p "$NODE"
  NODE_BIN="$(build_node_binaries)"
  echo "$NODE_BIN" >"$NODE/bin-dir"
  GBIN="$(gpuslice_bin_dir)"
  local p
  for p in bridge host-local loopback; do
    [ -x "$CNI_BIN_DIR/$p" ] || node_die "$CNI_BIN_DIR/$p is missing (package containernetworking-plugins): run scripts/install-deps.sh"
  done
  command -v runc >/dev/null || node_die "runc is missing: run scripts/install-deps.sh"
  node_gpuslice_config
  write_containerd_config
  "$GBIN/gpuslice" --config "$NODE_CONFIG" configure containerd --config-path "$NODE/containerd/config.toml" \
    >"$DIR/logs/configure-containerd.log" 2>&1 ||
    node_die "gpuslice configure containerd failed: $(cat "$DIR/logs/configure-containerd.log")"

  # containerd hands its environment to the shims: PATH finds this build's shim first.
  start containerd env PATH="$NODE_BIN:$PATH" "$NODE_BIN/containerd" --config "$NODE/containerd/config.toml"
  wait_for containerd "answering on $NODE/containerd/containerd.sock" ctr_ready
  wait_for containerd "loading its CRI plugin" cri_ready
  mkdir -p "$NODE/images"
  pause_image "$NODE/images/pause.tar"
  # --local: containerd 2.x's transfer service unpacks only for its default snapshotter.
  ctr_node images import --local --snapshotter native "$NODE/images/pause.tar" \
    >"$DIR/logs/pause-import.log" 2>&1 || node_die "importing the pause image failed: $(cat "$DIR/logs/pause-import.log")"

  sign "node-$name" "/O=system:nodes/CN=system:node:$name" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  kubeconfig "$NODE/kubelet.kubeconfig" "node-$name"
  local port healthz ip
  # The kubelet refuses a loopback node IP: the address of the default route, else the first.
  ip="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)"
  [ -n "$ip" ] || ip="$(hostname -I 2>/dev/null | awk '{ print $1 }')"
  [ -n "$ip" ] || node_die "this machine has no IPv4 address other than loopback for the kubelet's node IP"
  port="$(free_port)"
  healthz="$(free_port)"
  write_kubelet_config "$ip" "$port" "$healthz"
  mkdir -p "$NODE/kubelet" "$NODE/pod-logs"
  start kubelet "$BIN/kubelet" --config "$NODE/kubelet-config.yaml" \
    --kubeconfig "$NODE/kubelet.kubeconfig" --root-dir "$NODE/kubelet" \
    --cert-dir "$NODE/kubelet/pki" --hostname-override "$name" --node-ip "$ip" \
    --node-labels nvidia.com/gpu.present=true --v 2
  wait_for kubelet "making Node $name Ready" node_ready "$name"

  # The plugin registers itself with the kubelet through the kubelet's plugin watcher
  # directory, as on a real node (its registration socket accepts the kubelet's socket-path
  # :authority: kube/plugin/src/authority.rs).
  start gpuslice-kubelet-plugin "$GBIN/gpuslice" --config "$NODE_CONFIG" kubelet-plugin \
    --node-name "$name" --kubeconfig "$DIR/kubeconfig" \
    --plugin-dir "$NODE/kubelet/plugins/gpuslice.io" \
    --registration-dir "$NODE/kubelet/plugins_registry"
  wait_for gpuslice-kubelet-plugin "publishing the ResourceSlice of $name" node_slice "$name"
  wait_for gpuslice-kubelet-plugin "serving $NODE/kubelet/plugins/gpuslice.io/dra.sock" \
    test -S "$NODE/kubelet/plugins/gpuslice.io/dra.sock"
  wait_for gpuslice-kubelet-plugin "being registered by the kubelet" \
    grep -q "registered with the kubelet" "$DIR/logs/gpuslice-kubelet-plugin.log"
  kubectl_admin apply -f "$REPO/packaging/kubernetes/dra/deviceclass.yaml" \
    -f "$REPO/packaging/kubernetes/runtimeclass.yaml" >"$DIR/logs/node-objects.log" 2>&1 ||
    node_die "applying the DeviceClass and RuntimeClass failed: $(cat "$DIR/logs/node-objects.log")"
  {
    echo "NODE_NAME=$name"
    echo "NODE_DIR=$NODE"
    echo "NODE_BIN_DIR=$NODE_BIN"
    echo "CONTAINERD_SOCKET=$NODE/containerd/containerd.sock"
    echo "CONTAINERD_CONFIG=$NODE/containerd/config.toml"
    echo "CTR=$NODE_BIN/ctr"
    echo "KUBELET_ROOT=$NODE/kubelet"
    echo "KUBELET_CONFIG=$NODE/kubelet-config.yaml"
    echo "GPUSLICE_CONFIG=$NODE_CONFIG"
    echo "GPUSLICE_BIN_DIR=$GBIN"
    echo "PAUSE_IMAGE=$PAUSE_IMAGE"
  } >>"$DIR/cluster.env"
  NODE_UP=1
  log "node $name up: kubelet on $ip:$port, containerd $NODE/containerd/containerd.sock"
}

# Pids whose command line names DIR/node/ (containerd's shims outlive it), except ours.
node_leftover_pids() {
  local p
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [ "$p" != $$ ] || continue
    { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$DIR/node/" && echo "$p"
  done
  return 0
}

# drain_node: with the kubelet and the API still up, delete every workload and pod so that
# the kubelet tears them down (CNI, DRA unprepare, volumes).
drain_node() {
  alive kubelet && alive kube-apiserver || return 0
  kubectl_admin delete deployments,replicasets,statefulsets,daemonsets,jobs --all --all-namespaces \
    --wait=false >/dev/null 2>&1 || true
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout=70s delete pods --all --all-namespaces \
    --wait=true --timeout=60s >/dev/null 2>&1 || log "some pods were not gone within 60 s; stopping the node anyway"
}

# stop_node: stops the node's processes and removes its files (a no-op without a node).
stop_node() {
  NODE="$DIR/node"
  [ -d "$NODE" ] || return 0
  stop_one gpuslice-kubelet-plugin
  stop_one kubelet
  if alive containerd; then
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
  stop_one containerd
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
  local cg
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$NODE"
}

# --- up ---------------------------------------------------------------------------------------

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ossl ARGS...: openssl, quiet unless it fails.
ossl() {
  local out
  out="$(openssl "$@" 2>&1)" || die "openssl $* failed: $out"
}

# gen_key FILE: an EC P-256 private key.
gen_key() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$1"
}

# sign NAME SUBJECT EXTENSIONS: DIR/pki/NAME.{key,crt} signed by the cluster CA.
sign() {
  local name="$1" subj="$2" ext="$3" pki="$DIR/pki"
  gen_key "$pki/$name.key"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  ossl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$pki/$name.ext" \
    -out "$pki/$name.crt"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

make_pki() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  gen_key "$pki/ca.key"
  ossl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpuslice-test-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt"
  local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  sign apiserver "/CN=kube-apiserver" "$server"
  sign admin "/O=system:masters/CN=kubernetes-admin" "$client"
  sign kube-scheduler "/CN=system:kube-scheduler" "$client"
  sign kube-controller-manager "/CN=system:kube-controller-manager" "$client"
  sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  gen_key "$pki/sa.key"
  ossl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
}

# kubeconfig FILE USER: a kubeconfig for the API server with DIR/pki/USER.{crt,key}.
kubeconfig() {
  local file="$1" user="$2" k=("$BIN/kubectl" --kubeconfig "$1")
  "${k[@]}" config set-cluster gpuslice-test --server "$API_URL" \
    --certificate-authority "$DIR/pki/ca.crt" --embed-certs >/dev/null
  "${k[@]}" config set-credentials "$user" --client-certificate "$DIR/pki/$user.crt" \
    --client-key "$DIR/pki/$user.key" --embed-certs >/dev/null
  "${k[@]}" config set-context gpuslice-test --cluster gpuslice-test --user "$user" >/dev/null
  "${k[@]}" config use-context gpuslice-test >/dev/null
  chmod 600 "$file"
}

# start NAME ARGS...: starts a component in its own session, stdin closed, output to its log.
start() {
  local name="$1"
  shift
  setsid "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

# running PID: the process exists and is not a zombie (a component that crashed while `up`,
# its parent, still runs stays a zombie until `up` exits).
running() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

alive() {
  local pid
  pid="$(cat "$DIR/pids/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid"
}

fail_component() {
  local name="$1" why="$2"
  {
    echo "kube-cluster: $name $why; last lines of $DIR/logs/$name.log:"
    tail -n 40 "$DIR/logs/$name.log" 2>/dev/null | sed 's/^/  | /'
  } >&2
  stop_all
  exit 1
}

# wait_for NAME WHAT COMMAND...: until COMMAND succeeds, NAME still runs, and TIMEOUT allows.
wait_for() {
  local name="$1" what="$2"
  shift 2
  local deadline=$(($(date +%s) + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || fail_component "$name" "exited before $what"
    [ "$(date +%s)" -lt "$deadline" ] || fail_component "$name" "did not get to $what within $TIMEOUT s"
    sleep 0.5
  done
}

healthz() {
  curl -fsk --max-time 5 "https://127.0.0.1:$1/healthz"
}

kubectl_admin() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout=5s "$@"
}

cmd_up() {
  [ $# -ge 1 ] || die "up needs a directory: scripts/kube-cluster.sh up DIR"
  DIR="$1"
  shift
  local node_name=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --node)
        [ $# -ge 2 ] || die "--node needs a node name: scripts/kube-cluster.sh up DIR --node NAME"
        [[ "$2" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
          die "--node '$2' is not a node name: lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit"
        node_name="$2"
        shift 2 ;;
      *) die "unknown argument to up: '$1' (accepted: DIR, --node NAME)" ;;
    esac
  done
  local created=""
  [ -e "$DIR" ] || created=1
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  local c
  for c in "${COMPONENTS[@]}"; do
    if alive "$c"; then
      die "$DIR already runs a cluster ($c is pid $(cat "$DIR/pids/$c.pid")): run 'scripts/kube-cluster.sh down $DIR' first"
    fi
  done
  for c in pki etcd logs pids kubeconfigs kubeconfig cluster.env node; do
    [ ! -e "$DIR/$c" ] || die "$DIR/$c exists from an earlier run: run 'scripts/kube-cluster.sh down $DIR' first, or give an empty directory"
  done
  for c in openssl curl python3 setsid flock; do
    command -v "$c" >/dev/null || die "$c is missing: run scripts/install-deps.sh"
  done
  BIN="$(build_binaries)"
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/kubeconfigs"
  [ -z "$created" ] || : >"$DIR/pids/created-dir"
  echo "BIN_DIR=$BIN" >"$DIR/cluster.env"

  make_pki

  start etcd "$BIN/etcd" --data-dir "$DIR/etcd" --url-file "$DIR/etcd.url"
  wait_for etcd "serving" test -s "$DIR/etcd.url"
  local etcd_url
  etcd_url="$(cat "$DIR/etcd.url")"
  echo "ETCD_URL=$etcd_url" >>"$DIR/cluster.env"

  local api_port
  api_port="$(free_port)"
  API_URL="https://127.0.0.1:$api_port"
  start kube-apiserver "$BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="$etcd_url" \
    --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --client-ca-file="$DIR/pki/ca.crt" \
    --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$DIR/pki/sa.pub" \
    --service-account-signing-key-file="$DIR/pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --profiling=false
  echo "API_URL=$API_URL" >>"$DIR/cluster.env"
  kubeconfig "$DIR/kubeconfig" admin
  wait_for kube-apiserver "answering /readyz on $API_URL" kubectl_admin get --raw /readyz

  local cm_port sched_port
  cm_port="$(free_port)"
  kubeconfig "$DIR/kubeconfigs/kube-controller-manager.kubeconfig" kube-controller-manager
  local kc="$DIR/kubeconfigs/kube-controller-manager.kubeconfig"
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$cm_port" --leader-elect=false \
    --root-ca-file="$DIR/pki/ca.crt" \
    --service-account-private-key-file="$DIR/pki/sa.key" \
    --cluster-signing-cert-file="$DIR/pki/ca.crt" --cluster-signing-key-file="$DIR/pki/ca.key" \
    --use-service-account-credentials=true \
    --profiling=false
  echo "CONTROLLER_MANAGER_URL=https://127.0.0.1:$cm_port" >>"$DIR/cluster.env"

  sched_port="$(free_port)"
  kubeconfig "$DIR/kubeconfigs/kube-scheduler.kubeconfig" kube-scheduler
  kc="$DIR/kubeconfigs/kube-scheduler.kubeconfig"
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false \
    --profiling=false
  echo "SCHEDULER_URL=https://127.0.0.1:$sched_port" >>"$DIR/cluster.env"

  wait_for kube-controller-manager "answering /healthz on port $cm_port" healthz "$cm_port"
  wait_for kube-scheduler "answering /healthz on port $sched_port" healthz "$sched_port"
  # Pods can be created once the service-account controller has made `default` and the
  # root CA publisher the namespace's kube-root-ca.crt.
  wait_for kube-controller-manager "creating the default service account" \
    kubectl_admin get serviceaccount default --namespace default
  wait_for kube-controller-manager "publishing kube-root-ca.crt" \
    kubectl_admin get configmap kube-root-ca.crt --namespace default
  log "control plane up: $API_URL, admin kubeconfig $DIR/kubeconfig"
  [ -z "$node_name" ] || start_node "$node_name"
}

# --- down -------------------------------------------------------------------------------------

# stop_one NAME: SIGTERM, then SIGKILL after 20 s, for the pid recorded in DIR/pids/NAME.pid,
# only while that pid is still the process `up` started (its command line names DIR).
stop_one() {
  local name="$1" file="$DIR/pids/$1.pid" pid i
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 40); do
      running "$pid" || break
      sleep 0.5
    done
    if running "$pid"; then
      log "$name (pid $pid) did not stop on SIGTERM within 20 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 20); do
        running "$pid" || break
        sleep 0.5
      done
    fi
    running "$pid" && die "$name (pid $pid) is still running after SIGKILL"
  fi
  rm -f "$file"
}

stop_all() {
  local i
  stop_node
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_one "${COMPONENTS[$i]}"
  done
}

cmd_down() {
  [ $# -eq 1 ] || die "down needs exactly one directory: scripts/kube-cluster.sh down DIR"
  [ -d "$1" ] || return 0
  DIR="$(cd "$1" && pwd)"
  BIN="$(sed -n 's/^BIN_DIR=//p' "$DIR/cluster.env" 2>/dev/null || true)"
  [ -z "$BIN" ] || drain_node
  stop_all
  local created=""
  [ ! -e "$DIR/pids/created-dir" ] || created=1
  rm -rf "$DIR/pki" "$DIR/etcd" "$DIR/etcd.url" "$DIR/logs" "$DIR/pids" "$DIR/kubeconfigs" \
    "$DIR/kubeconfig" "$DIR/cluster.env"
  # A directory `up` made goes too, unless someone put something else in it.
  [ -z "$created" ] || rmdir "$DIR" 2>/dev/null || true
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  build) shift; [ $# -eq 0 ] || die "build takes no arguments"; build_binaries ;;
  build-node) shift; [ $# -eq 0 ] || die "build-node takes no arguments"; build_node_binaries ;;
  build-nerdctl) shift; [ $# -eq 0 ] || die "build-nerdctl takes no arguments"; build_nerdctl_binary ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "kube-cluster: unknown command '$1' (accepted: up, down, build, build-node, build-nerdctl, --help)" >&2; exit 2 ;;
esac
