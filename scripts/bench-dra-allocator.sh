#!/usr/bin/env bash
# Benchmark of Kubernetes' own DRA allocator on gpuslice's slot-mode devices: the code the
# scheduler runs per node to place claims (k8s.io/dynamic-resource-allocation/structured at the
# release tests/kube pins), each allocator variant of that release (stable: what 1.34/1.35
# run; incubating: 1.36+; experimental: alpha gates), for the claim shapes that once made it
# search past the scheduler's 10 s per-node filter timeout (SchedulerError on every node) and
# for what the webhook writes and the policy admits now. Prints one Markdown table row per
# shape, node and variant: the decision, its time and the allocator's search steps
# (docs/benchmarks.md, "DRA allocator"). No cluster: the allocator runs in-process.
#
#   scripts/bench-dra-allocator.sh [allocbench flags]   e.g. -only after -variants stable
#
# Flags of tests/kube/cmd/allocbench: -variants LIST (stable,incubating,experimental),
# -timeout D (10s, the scheduler's DRASchedulerFilterTimeout), -slots N (6,
# dra.slots_per_gpu), -gpus G (8: the larger node), -only TEXT (shapes whose name has TEXT).
#
# Environment:
#   GPUSLICE_ALLOCBENCH_CACHE   cache root of the built program (default
#                               /var/cache/gpuslice/allocbench); entries are <release>-<hash of
#                               cmd/allocbench, go.mod, go.sum and the recipe>
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
die() {
  echo "bench-dra-allocator: $*" >&2
  exit 1
}
log() {
  echo "bench-dra-allocator: $*" >&2
}
# shellcheck source=scripts/lib/gomodule.sh
. "$REPO/scripts/lib/gomodule.sh"

src="$REPO/tests/kube"
go="$(gomodule_go)"
release="$(gomodule_release "$src" k8s.io/dynamic-resource-allocation)"
[ -n "$release" ] || die "$src/go.mod requires no k8s.io/dynamic-resource-allocation version"
mapfile -t files < <(cd "$src" && find cmd/allocbench -name '*.go' | LC_ALL=C sort)
key="$(gomodule_key "$go" "$src" go.mod go.sum "${files[@]}" -- "-trimpath")"
bin="$(gomodule_build --go "$go" --cache "${GPUSLICE_ALLOCBENCH_CACHE:-/var/cache/gpuslice/allocbench}" \
  --cache-var GPUSLICE_ALLOCBENCH_CACHE --entry "$release-$key" --bin allocbench --src "$src" \
  --what "the DRA allocator benchmark ($release)" --failed "tests/kube/cmd/allocbench" -- \
  -mod=readonly -trimpath ./cmd/allocbench)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
"$bin/allocbench" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
