# What the test cluster's Go builds are (Kubernetes, containerd, nerdctl, helm): module, flags, cache key.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh after scripts/lib/gomodule.sh, which does the building
# (find, lock, build, check and prune a keyed cache entry); this file says what each build
# is. Uses REPO, die and log of the sourcing script.

KUBE_SRC="$REPO/tests/kube"
CACHE_ROOT="${GPUSLICE_KUBE_CACHE:-/var/cache/gpuslice/kube}"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd)

NODE_SRC="$REPO/tests/node"
NODE_CACHE_ROOT="${GPUSLICE_NODE_CACHE:-/var/cache/gpuslice/node}"
NODE_BINARIES=(containerd ctr containerd-shim-runc-v2)
# Build tags: no btrfs/zfs/devmapper snapshotters (they need C headers; the node uses native).
NODE_TAGS="no_btrfs no_devmapper no_zfs"

NERDCTL_SRC="$REPO/tests/nerdctl"
NERDCTL_CACHE_ROOT="${GPUSLICE_NERDCTL_CACHE:-/var/cache/gpuslice/nerdctl}"

HELM_SRC="$REPO/tests/helm"
HELM_CACHE_ROOT="${GPUSLICE_HELM_CACHE:-/var/cache/gpuslice/helm}"

# check_bin_dir DIR VAR BIN...: every BIN is an executable in DIR, which VAR or the cache gave.
check_bin_dir() {
  local dir="$1" var="$2" b
  shift 2
  for b in "$@"; do
    [ -x "$dir/$b" ] || die "$dir/$b is missing ($var or the cache holds an incomplete build)"
  done
}

# --- Kubernetes (tests/kube): control plane, kubectl, kubelet and etcd --------------------------

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
    check_bin_dir "$GPUSLICE_KUBE_BIN_DIR" GPUSLICE_KUBE_BIN_DIR "${BINARIES[@]}"
    echo "$GPUSLICE_KUBE_BIN_DIR"
    return
  fi
  local go release key ldflags b bins=()
  go="$(gomodule_go)"
  release="$(k8s_release)"
  [ -n "$release" ] || die "$KUBE_SRC/go.mod requires no k8s.io/kubernetes version"
  ldflags="$(build_ldflags "$release")"
  # The key covers every Go file, go.mod and go.sum of the module except cmd/allocbench (a
  # benchmark of the DRA allocator, built by scripts/bench-dra-allocator.sh): editing it must
  # not rebuild the cluster.
  local files
  mapfile -t files < <(cd "$KUBE_SRC" && find . -path ./cmd/allocbench -prune -o -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print | LC_ALL=C sort)
  key="$(gomodule_key "$go" "$KUBE_SRC" "${files[@]}" -- "$ldflags" "${BINARIES[@]}")"
  for b in "${BINARIES[@]}"; do bins+=(--bin "$b"); done
  gomodule_build --go "$go" --cache "$CACHE_ROOT" --cache-var GPUSLICE_KUBE_CACHE \
    --entry "$release-$key" "${bins[@]}" --src "$KUBE_SRC" \
    --what "Kubernetes $release control-plane binaries and kubelet" --failed "the Kubernetes binaries" -- \
    -mod=readonly -trimpath -ldflags "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet ./cmd/etcd
}

# --- containerd 2.x (tests/node): the node's containerd, ctr and runc shim ----------------------

containerd_release() {
  gomodule_release "$NODE_SRC" github.com/containerd/containerd/v2
}

node_ldflags() {
  echo "-s -w -X github.com/containerd/containerd/v2/version.Version=$1"
}

# Prints the cached bin directory of containerd, ctr and the runc shim, building it first.
build_node_binaries() {
  if [ -n "${GPUSLICE_NODE_BIN_DIR:-}" ]; then
    check_bin_dir "$GPUSLICE_NODE_BIN_DIR" GPUSLICE_NODE_BIN_DIR "${NODE_BINARIES[@]}"
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

# --- helm (tests/helm): the chart tests install packaging/helm/gpuslice with it -----------------

# Prints the path of the cached helm, building it first (a cold build takes minutes).
build_helm_binary() {
  if [ -n "${GPUSLICE_HELM_BIN:-}" ]; then
    [ -x "$GPUSLICE_HELM_BIN" ] || die "GPUSLICE_HELM_BIN=$GPUSLICE_HELM_BIN is not an executable"
    echo "$GPUSLICE_HELM_BIN"
    return
  fi
  local go release key ldflags start bin
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(gomodule_release "$HELM_SRC" helm.sh/helm/v4)"
  [ -n "$release" ] || die "$HELM_SRC/go.mod requires no helm.sh/helm/v4 version"
  ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$release"
  key="$(gomodule_key "$go" "$HELM_SRC" -- "$ldflags" "CGO_ENABLED=0")"
  bin="$(gomodule_build --go "$go" --cache "$HELM_CACHE_ROOT" --cache-var GPUSLICE_HELM_CACHE \
    --entry "helm-$release-$key" --bin helm --src "$HELM_SRC" --env CGO_ENABLED=0 \
    --what "helm $release" --failed helm --timed "helm $release" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "$ldflags" helm.sh/helm/v4/cmd/helm)"
  echo "$bin/helm"
}
