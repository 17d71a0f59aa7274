#!/usr/bin/env bash
# Benchmark of the DRA kubelet plugin against a LIVE control plane (goal: prepare of one
# claim ≤ 50 ms median). Starts a real control plane (scripts/kube-cluster.sh up), a simulated
# node of 8 H200-sized GPUs (scripts/lib/bench-node.sh, state and CDI specs
# on tmpfs as /run/gpuslice is on a node), and runs the release build of
# kube/plugin/examples/bench_prepare_live.rs, which
#   - creates the Node object and the DeviceClass of packaging/kubernetes/dra/,
#   - starts the release `gpuslice kubelet-plugin` STARTS times and times, from the spawn,
#     its dra.sock and the node's ResourceSlice arriving on an API watch,
#   - creates CLAIMS claims (512Mi, 1 core) with one pod each, which the real scheduler
#     allocates and binds to the node,
#   - plays the kubelet over dra.sock: one NodePrepareResources per claim (timed), then one
#     NodeUnprepareResources per claim (timed), and checks the registry is empty again.
# Prints the load average before and after (the machines are shared) and what
# `kubectl get resourceslices -o yaml` shows at the end.
#
#   scripts/bench-dra.sh [CLAIMS] [STARTS]          (root; defaults 250 and 5)
#
# Environment: CARGO_TARGET_DIR (where the release build goes), GPUSLICE_PORTABLE_DIR (the
# shim and simulated driver of scripts/build-portable.sh; default $CARGO_TARGET_DIR/portable),
# and those of scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_KUBE_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
claims=${1:-250}
starts=${2:-5}
target=${CARGO_TARGET_DIR:-$PWD/target}
portable=${GPUSLICE_PORTABLE_DIR:-$target/portable}
if [ ! -f "$portable/libgpuslice_shim.so" ] || [ ! -f "$portable/libcuda.so.1" ]; then
  echo "bench-dra: no portable build (shim, simulated driver) in $portable: run scripts/build-portable.sh or set GPUSLICE_PORTABLE_DIR" >&2
  exit 1
fi
cargo build --release -p gpuslice --bin gpuslice >&2
cargo build --release -p gpuslice-kube --example bench_prepare_live >&2
bin=$target/release/gpuslice

work=$(mktemp -d /dev/shm/gpuslice-bench-dra.XXXXXX)
cluster=$(mktemp -d /tmp/gpuslice-bench-dra-cluster.XXXXXX)
cleanup() {
  scripts/kube-cluster.sh down "$cluster" || true
  rmdir "$cluster" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=scripts/lib/bench-node.sh
. scripts/lib/bench-node.sh
bench_node_config "$work" "$portable" >"$work/config.toml"
"$bin" --config "$work/config.toml" cdi generate --sim-driver "$portable" >/dev/null

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
scripts/kube-cluster.sh up "$cluster"
"$target/release/examples/bench_prepare_live" "$cluster/kubeconfig" "$bin" \
  "$work/config.toml" "$work" bench-node "$claims" "$starts"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

kubectl_bin=$(sed -n 's/^BIN_DIR=//p' "$cluster/cluster.env")/kubectl
echo "kubectl get resourceslices -o yaml:"
"$kubectl_bin" --kubeconfig "$cluster/kubeconfig" get resourceslices -o yaml
