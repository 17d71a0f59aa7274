#!/usr/bin/env bash
# Benchmark of the console on a large cluster.
# Starts the suite's real control plane (scripts/kube-cluster.sh up) and fills it with
#   - NODES Node objects (no kubelet), each with a synthetic ResourceSlice of driver
#     gpuslice.io holding 8 GPUs of the shape `gpuslice kubelet-plugin` publishes
#     (kube/plugin/src/slices.rs: attributes uuid, index, productName, numaNode; capacities
#     memory 141Gi and cores 100 with their request policies; allowMultipleAllocations),
#   - CLAIMS ResourceClaims (20Gi, 10 cores each) whose status.allocation is written as the
#     scheduler writes it (consumedCapacity), spread over the nodes' GPUs,
# then measures
#   - the first page load of `/` of `gpuslice console` (no Prometheus) in real headless
#     Debian chromium through playwright-core (tests/browser/bench.js): RUNS fresh browser
#     contexts, navigation start to load event, min/median/max,
#   - the wall time of `kubectl-gpuslice nodes` on the same cluster (hyperfine, RUNS runs),
# and prints a table, with the load average before and after (the machines are shared).
#
#   scripts/bench-console.sh [NODES] [CLAIMS] [RUNS]      (root; defaults 100, 300, 15)
#
# Environment: CARGO_TARGET_DIR (where the release build goes) and those of
# scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_KUBE_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-100}
claims=${2:-300}
runs=${3:-15}
target=${CARGO_TARGET_DIR:-$PWD/target}

cargo build --release -p gpuslice --bin gpuslice -p gpuslice-console --bin kubectl-gpuslice >&2
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  npm ci --prefix tests/browser --no-audit --no-fund >&2 || {
    echo "bench-console: npm ci --prefix tests/browser failed (npm and chromium come from scripts/install-deps.sh)" >&2
    exit 1
  }
fi
[ -x /usr/bin/chromium ] || { echo "bench-console: /usr/bin/chromium is missing: run scripts/install-deps.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/gpuslice-bench-console.XXXXXX)
cluster="$work/cluster"
mkdir "$cluster"
console_pid=
cleanup() {
  [ -z "$console_pid" ] || kill "$console_pid" 2>/dev/null || true
  scripts/kube-cluster.sh down "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
scripts/kube-cluster.sh up "$cluster" >&2
kubectl=$(sed -n 's/^BIN_DIR=//p' "$cluster/cluster.env")/kubectl
k() { "$kubectl" --kubeconfig "$cluster/kubeconfig" --request-timeout=60s "$@"; }
k create -f packaging/kubernetes/dra/deviceclass.yaml >/dev/null

# The objects, as JSON Lists: nodes and slices, claims, and the claims' allocations.
python3 - "$work" "$nodes" "$claims" <<'EOF'
import json, sys, uuid
work, nodes, claims = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
GPUS, MEM, CORES = 8, "141Gi", "100"
def device(n, i):
    return {
        "name": f"gpu-{i}",
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'bench-{n}-{i}')}"},
            "index": {"int": i},
            "productName": {"string": "NVIDIA H200"},
            "resource.kubernetes.io/numaNode": {"int": i // 4},
        },
        "capacity": {
            "memory": {"value": MEM, "requestPolicy": {"default": MEM, "validRange": {"min": "1Mi", "step": "1Mi", "max": MEM}}},
            "cores": {"value": CORES, "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1", "max": CORES}}},
        },
    }
names = [f"bench-node-{n:03d}" for n in range(nodes)]
objects = []
for n, name in enumerate(names):
    objects.append({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    objects.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": f"{name}-gpuslice.io"},
                    "spec": {"driver": "gpuslice.io", "nodeName": name,
                             "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                             "devices": [device(n, i) for i in range(GPUS)]}})
json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, open(f"{work}/nodes.json", "w"))
cl, alloc = [], []
for c in range(claims):
    name = f"bench-claim-{c:04d}"
    # Spread: claim c on node c % nodes, GPU (c // nodes) % 8: 20Gi and 10 cores each.
    node, gpu = names[c % nodes], (c // nodes) % GPUS
    cl.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                   "deviceClassName": "gpuslice.io", "count": 1,
                   "capacity": {"requests": {"memory": "20Gi", "cores": "10"}}}}]}}})
    alloc.append((name, {"status": {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpuslice.io", "pool": node, "device": f"gpu-{gpu}",
        "shareID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        "consumedCapacity": {"memory": "20Gi", "cores": "10"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}))
json.dump({"apiVersion": "v1", "kind": "List", "items": cl}, open(f"{work}/claims.json", "w"))
import os
os.mkdir(f"{work}/allocations")
for name, patch in alloc:
    json.dump(patch, open(f"{work}/allocations/{name}", "w"))
EOF
k create -f "$work/nodes.json" >/dev/null
k create -f "$work/claims.json" >/dev/null
# The allocations, as the scheduler writes them (status subresource), 8 at a time.
export -f k
export kubectl cluster
ls "$work/allocations" | xargs -P 8 -I{} bash -c \
  'k patch resourceclaim "$1" -n default --subresource=status --type=merge --patch-file "$2/$1" >/dev/null' _ {} "$work/allocations"
allocated=$(k get resourceclaims -n default -o json | python3 -c 'import json,sys; print(sum(1 for c in json.load(sys.stdin)["items"] if c.get("status",{}).get("allocation")))')
[ "$allocated" = "$claims" ] || { echo "bench-console: only $allocated of $claims claims allocated" >&2; exit 1; }
echo "cluster: $nodes nodes × 8 GPUs in ResourceSlices, $claims allocated ResourceClaims"

"$target/release/gpuslice" console --listen 127.0.0.1:0 --kubeconfig "$cluster/kubeconfig" \
  >"$work/console.out" 2>"$work/console.err" &
console_pid=$!
url=
for _ in $(seq 100); do
  url=$(sed -n 's|^gpuslice console: listening on \(http://[^/]*\)/$|\1|p' "$work/console.out")
  [ -n "$url" ] && break
  kill -0 "$console_pid" 2>/dev/null || { echo "bench-console: gpuslice console exited:" >&2; cat "$work/console.err" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "bench-console: gpuslice console printed no listening line" >&2; exit 1; }

page=$(node tests/browser/bench.js "$url" "$runs" "$nodes") || {
  echo "bench-console: the page load benchmark failed; console log:" >&2
  cat "$work/console.err" >&2
  exit 1
}
hyperfine --runs "$runs" --warmup 1 --export-json "$work/nodes.json.out" --style none \
  "$target/release/kubectl-gpuslice --kubeconfig $cluster/kubeconfig nodes" >/dev/null
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$page" "$work/nodes.json.out" "$runs" <<'EOF'
import json, sys
page = json.loads(sys.argv[1])
r = json.load(open(sys.argv[2]))["results"][0]
ms = lambda s: s * 1000
print()
print(f"| measurement ({sys.argv[3]} runs) | min | median | max |")
print("|---|---|---|---|")
print(f"| first load of / in headless chromium (navigation start → load event) | {page['min']:.0f} ms | {page['median']:.0f} ms | {page['max']:.0f} ms |")
print(f"| kubectl-gpuslice nodes (wall) | {ms(r['min']):.0f} ms | {ms(r['median']):.0f} ms | {ms(r['max']):.0f} ms |")
print()
print("goal: first load of / ≤ 1000 ms median:", "met" if page["median"] <= 1000 else "NOT met")
EOF
