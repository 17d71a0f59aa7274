#!/usr/bin/env bash
# Benchmark of a job's start on two real nodes (goal: a PyTorchJob whose ranks ask slices has
# all its ranks Running in at most 1.1 x the time of the same job without): one cluster,
# `scripts/kube-cluster.sh up DIR --node node-a --node node-b --webhook --kubeflow` (two real
# kubelets and containerd 2.x, each with the gpuslice kubelet plugin on its own simulated
# H200; the webhook; the Kubeflow training operator), then PAIRS pairs of PyTorchJobs of RANKS
# workers, one with `gpuslice.io/gpus: 1` and `gpuslice.io/memory: 1Gi` limits per rank (the
# webhook's claim and one-rank-per-node anti-affinity) and one without, interleaved and one
# job at a time, timed from create to every rank Running and to the last rank's first output
# (scripts/lib/bench_job_start.py): prints each sample, the medians of each part (the
# operator's creates, the claim controller, the scheduler, the nodes) and their ratios, and
# the API server's and kubelets' mean time of each call on a rank's way. The container is the
# nodes' pause image (busybox sh printing one line, then waiting). Takes the e2e tests' locks
# (the machine lock shared, the kube-node lock exclusive), so it waits for a running kube-node
# test and keeps the next one out.
# With BENCH_STATE=tmpfs each node's gpuslice state and CDI specs live on /dev/shm, as
# /run/gpuslice and /var/run/cdi do on a node (the cluster script's own node configs put them
# under DIR, here on disk); everything else stays where the cluster script puts it.
# BENCH_FEATURE_GATES=Name=bool,… passes --feature-gates to the cluster's components (e.g. to
# try a scheduler setting); unset, every component runs with its release's defaults.
#
#   [BENCH_STATE=tmpfs] [BENCH_FEATURE_GATES=…] scripts/bench-job-start.sh [PAIRS] [RANKS]
#                                     (root; defaults 10 and 2, at most one rank per node
#                                      with slices: 2)
#
# Environment: those of scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_NODE_BIN_DIR,
# GPUSLICE_BIN_DIR with the release gpuslice and gpuslice-runtime, GPUSLICE_SIM_DIR with the
# simulated driver of scripts/build-portable.sh; the Kubeflow and CoreDNS builds are cached).
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-10}
ranks=${2:-2}
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
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs); node state on ${BENCH_STATE:-disk}"
bench_state_root
cluster=$(mktemp -d /tmp/gpuslice-bench-job-start.XXXXXX)
gates=()
if [ -n "${BENCH_FEATURE_GATES:-}" ]; then gates=(--feature-gates "$BENCH_FEATURE_GATES"); fi
if ! scripts/kube-cluster.sh up "$cluster" --node node-a --node node-b --webhook --kubeflow \
  "${gates[@]}" 2>"$cluster.up.log"; then
  tail -30 "$cluster.up.log" >&2
  exit 1
fi
rm -f "$cluster.up.log"
api=$(sed -n 's/^API_URL=//p' "$cluster/cluster.env")
# The webhook learns the nodes' GPUs from their ResourceSlices in the background: wait until
# a dry run of a sliced pod is admitted.
kubectl=$(sed -n 's/^BIN_DIR=//p' "$cluster/cluster.env")/kubectl
kc() { KUBECONFIG="$cluster/kubeconfig" "$kubectl" "$@"; }
for _ in $(seq 120); do
  if printf '%s' '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probe","namespace":"default"},"spec":{"containers":[{"name":"c","image":"x","resources":{"limits":{"gpuslice.io/memory":"1Gi"}}}]}}' |
    kc create --dry-run=server -f - >/dev/null 2>&1; then
    break
  fi
  sleep 1
done
PYTHONPATH=scripts/lib python3 scripts/lib/bench_job_start.py "$api" "$cluster/pki" "$pairs" "$ranks" \
  localhost/gpuslice-node-pause:1
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
