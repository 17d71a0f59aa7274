#!/usr/bin/env bash
# Benchmark of the stock scheduler placing gpuslice claims, capacity mode beside slot mode in
# one run (goal: slot mode ≥ 0.5 × capacity mode's pods/s, no exponential search).
# For each mode, a real control plane (scripts/kube-cluster.sh up: the pinned 1.37 for capacity
# mode; the same binaries with --emulated-version 1.34 for slot mode, the allocator a 1.34/1.35
# cluster runs), NODES Node objects without kubelets, each with one ResourceSlice of 8
# H200-sized GPUs as the kubelet plugin publishes them in that mode (SLOTS slots per GPU in slot
# mode, default 6 as dra.slots_per_gpu), CLAIMS claims of 1-4 units of 1/SLOTS of a GPU with one
# pod each: prints create → all bound and pods/s. Then every GPU is fragmented (SLOTS - 1 units
# free) and a claim of a whole GPU, which fits nowhere, is timed to the scheduler's decision
# (scripts/lib/bench_dra_scheduler.py).
#
#   scripts/bench-dra-scheduler.sh [NODES] [CLAIMS] [SLOTS]      (defaults 100, 300 and 6)
#
# Environment: those of scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_KUBE_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-100}
claims=${2:-300}
slots=${3:-6}
cluster=""
cleanup() {
  if [ -n "$cluster" ]; then
    scripts/kube-cluster.sh down "$cluster" || true
    rmdir "$cluster" 2>/dev/null || true
  fi
}
trap cleanup EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
for mode in capacity slots; do
  cluster=$(mktemp -d /tmp/gpuslice-bench-sched.XXXXXX)
  args=()
  [ "$mode" = slots ] && args=(--emulated-version 1.34)
  scripts/kube-cluster.sh up "$cluster" "${args[@]}" 2>/dev/null
  bin=$(sed -n 's/^BIN_DIR=//p' "$cluster/cluster.env")
  api=$(sed -n 's/^API_URL=//p' "$cluster/cluster.env")
  "$bin/kubectl" --kubeconfig "$cluster/kubeconfig" apply \
    -f packaging/kubernetes/dra/deviceclass.yaml -f packaging/kubernetes/dra/deviceclass-slots.yaml >/dev/null
  python3 scripts/lib/bench_dra_scheduler.py "$api" "$cluster/pki" "$mode" "$nodes" "$claims" "$slots"
  scripts/kube-cluster.sh down "$cluster" 2>/dev/null
  rmdir "$cluster" 2>/dev/null || true
  cluster=""
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
