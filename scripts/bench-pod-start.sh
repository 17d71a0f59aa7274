#!/usr/bin/env bash
# Benchmark of pod start on a real node (goal: a pod with a slice claim starts in at
# most 1.1 x the time of the same pod without one): for each mode, capacity (the pinned 1.37,
# consumable capacity on) and slots (the same with DRAConsumableCapacity=false on every
# component, so the plugin publishes slots), `scripts/kube-cluster.sh up DIR --node NAME` (real
# kubelet, containerd 2.x, runc, the gpuslice kubelet plugin on a simulated H200), then PAIRS
# pairs of pods, one with a claim from a template and one without, interleaved and one at a
# time, timed from create to phase Running (scripts/lib/bench_pod_start.py): prints each sample,
# the medians and their ratio. The container is the node's pause image (busybox sh waiting).
# Takes the e2e tests' locks (the machine lock shared, both kube-node slots' locks exclusive:
# its cluster runs in slot 0, and no test's cluster runs beside it in slot 1), so it waits for
# running kube-node tests and keeps the next ones out.
# With BENCH_STATE=tmpfs the node's gpuslice state and CDI specs live on /dev/shm, as
# /run/gpuslice and /var/run/cdi do on a node (the cluster script's default puts them under
# DIR, here on disk); everything else stays where the cluster script puts it.
#
#   [BENCH_STATE=tmpfs] scripts/bench-pod-start.sh [PAIRS] [MODES]
#                                                   (root; defaults 15 and "capacity slots")
#
# Environment: those of scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_NODE_BIN_DIR,
# GPUSLICE_BIN_DIR with the release gpuslice and gpuslice-runtime, GPUSLICE_SIM_DIR with the
# simulated driver of scripts/build-portable.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-15}
modes=${2:-capacity slots}
cluster=""
cleanup() {
  if [ -n "$cluster" ]; then
    scripts/kube-cluster.sh down "$cluster" >/dev/null 2>&1 || true
    rm -rf "$cluster"
  fi
  if [ -n "${GPUSLICE_NODE_STATE_ROOT:-}" ]; then rm -rf "$GPUSLICE_NODE_STATE_ROOT"; fi
}
trap cleanup EXIT
# shellcheck source=scripts/lib/bench-node.sh
. scripts/lib/bench-node.sh
exec 8>/run/lock/gpuslice-e2e.lock
flock -s 8
exec 9>/run/lock/gpuslice-e2e.kube-node.lock
flock 9
exec 7>/run/lock/gpuslice-e2e.kube-node-1.lock
flock 7
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs); node state on ${BENCH_STATE:-disk}"
for mode in $modes; do
  cluster=$(mktemp -d /tmp/gpuslice-bench-pod-start.XXXXXX)
  bench_state_root
  args=()
  [ "$mode" = slots ] && args=(--feature-gates DRAConsumableCapacity=false)
  if ! GPUSLICE_KUBE_SLOT=0 scripts/kube-cluster.sh up "$cluster" --node bench-node "${args[@]}" 2>"$cluster.up.log"; then
    tail -30 "$cluster.up.log" >&2
    exit 1
  fi
  rm -f "$cluster.up.log"
  api=$(sed -n 's/^API_URL=//p' "$cluster/cluster.env")
  python3 scripts/lib/bench_pod_start.py "$api" "$cluster/pki" "$mode" "$pairs" localhost/gpuslice-node-pause:1
  echo "load average after $mode: $(cut -d' ' -f1-3 /proc/loadavg)"
  scripts/kube-cluster.sh down "$cluster" >/dev/null 2>&1
  rm -rf "$cluster"
  cluster=""
  if [ -n "${GPUSLICE_NODE_STATE_ROOT:-}" ]; then rm -rf "$GPUSLICE_NODE_STATE_ROOT"; fi
done
