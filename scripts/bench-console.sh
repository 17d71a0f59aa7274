#!/usr/bin/env bash
# Benchmark of the console on a large cluster.
# Starts the suite's real control plane (scripts/kube-cluster.sh up) and fills it with
#   - NODES Node objects (no kubelet), each with a synthetic ResourceSlice of driver
#     gpuslice.io holding 8 GPUs of the shape `gpuslice kubelet-plugin` publishes
#     (kube/api/src/slices.rs: attributes uuid, index, productName, numaNode; capacities
#     memory 141Gi and cores 100 with their request policies; allowMultipleAllocations),
#   - CLAIMS ResourceClaims (20Gi, 10 cores each) whose status.allocation is written as the
#     scheduler writes it (consumedCapacity), spread over the nodes' GPUs,
#   - a real Prometheus (Debian's) holding 65 minutes of history of every series the console
#     charts (written by promtool before it starts: each GPU's memory used and utilisation,
#     each claim's slice series, each node's cAdvisor CPU and memory) and scraping the same
#     series live from a static file served on loopback,
# then measures
#   - the first page load of `/` of `gpuslice console --prometheus` in real headless
#     Debian chromium through playwright-core (tests/browser/bench.js): RUNS fresh browser
#     contexts, navigation start to load event, min/median/max, with the number of queries
#     the console asked Prometheus per load (its own prometheus_http_requests_total; the
#     script fails above 4: one instant query and three range queries),
#   - the wall time of `kubectl-gpuslice nodes` on the same cluster (hyperfine, RUNS runs),
# and prints a table, with the load average before and after (the machines are shared).
# Needs Debian's prometheus (prometheus and promtool) beside the rest.
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
prom_pid=
files_pid=
cleanup() {
  [ -z "$console_pid" ] || kill "$console_pid" 2>/dev/null || true
  [ -z "$prom_pid" ] || kill "$prom_pid" 2>/dev/null || true
  [ -z "$files_pid" ] || kill "$files_pid" 2>/dev/null || true
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

# Prometheus: the live series (a static file on loopback) and their history (promtool).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
files_port=$(free_port)
prom_port=$(free_port)
mkdir -p "$work/live" "$work/prometheus"
python3 - "$work" "$nodes" "$claims" "$files_port" <<'EOF'
import sys, time, uuid
work, nodes, claims, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
GPUS, GIB = 8, 1 << 30
now = int(time.time())
names = [f"bench-node-{n:03d}" for n in range(nodes)]
series = []  # (name, labels, value now, kind)
for n, name in enumerate(names):
    for i in range(GPUS):
        u = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'bench-{n}-{i}')}"
        series.append(("gpuslice_gpu_memory_used_bytes", {"node": name, "uuid": u, "index": str(i)}, (i + 1) * GIB, "gauge"))
        series.append(("gpuslice_gpu_utilization_ratio", {"node": name, "uuid": u, "index": str(i)}, 0.25, "gauge"))
    series.append(("container_cpu_usage_seconds_total", {"node": name, "id": "/"}, 10000.0 + n, "counter"))
    series.append(("container_memory_working_set_bytes", {"node": name, "id": "/"}, (8 + n % 8) * GIB, "gauge"))
for c in range(claims):
    node, gpu = c % nodes, (c // nodes) % GPUS
    u = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'bench-{node}-{gpu}')}"
    l = {"node": names[node], "reservation": f"r-{c:04d}", "namespace": "default", "uuid": u, "index": str(gpu)}
    series.append(("gpuslice_slice_memory_limit_bytes", l, 20 * GIB, "gauge"))
    series.append(("gpuslice_slice_memory_used_bytes", l, (c % 4) * GIB, "gauge"))
    series.append(("gpuslice_slice_compute_limit_ratio", l, 0.1, "gauge"))
    series.append(("gpuslice_slice_compute_used_ratio", l, 0.05 * (c % 3), "gauge"))
def fmt(labels):
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
with open(f"{work}/live/metrics", "w") as f:
    for name, labels, v, _ in series:
        f.write(f"{name}{{{fmt(labels)}}} {v}\n")
# History: one sample a minute for 65 minutes up to 30 s ago; counters rising to their value now.
times = [now - 65 * 60 + 60 * k for k in range(65)]
with open(f"{work}/history.om", "w") as f:
    by = {}
    for s in series:
        by.setdefault(s[0], []).append(s)
    for name, all_ in by.items():
        f.write(f"# TYPE {name} gauge\n")  # rate() reads any series; OpenMetrics counters need _total families
        for _, labels, v, kind in all_:
            labels = dict(labels, job="bench", instance=f"127.0.0.1:{port}")
            for k, t in enumerate(times):
                x = v - (now - t) * 0.5 if kind == "counter" else v * (0.5 + 0.5 * ((k % 10) / 10))
                f.write(f"{name}{{{fmt(labels)}}} {x} {t}\n")
    f.write("# EOF\n")
EOF
promtool tsdb create-blocks-from openmetrics "$work/history.om" "$work/prometheus/data" >/dev/null
python3 -m http.server --bind 127.0.0.1 --directory "$work/live" "$files_port" >/dev/null 2>&1 &
files_pid=$!
cat >"$work/prometheus/prometheus.yml" <<EOF
global: {scrape_interval: 15s}
scrape_configs:
- job_name: bench
  honor_labels: true
  static_configs: [{targets: ['127.0.0.1:$files_port']}]
EOF
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
prom="http://127.0.0.1:$prom_port"
gpus_in_prometheus() {
  curl -sf "$prom/api/v1/query?query=count(gpuslice_gpu_memory_used_bytes)" | grep -q "\"$((nodes * 8))\""
}
for _ in $(seq 120); do gpus_in_prometheus && break; sleep 0.5; done
gpus_in_prometheus || { echo "bench-console: Prometheus never held the $((nodes * 8)) GPUs' series:" >&2; tail -20 "$work/prometheus.log" >&2; exit 1; }
# The queries Prometheus answered (its own counter of HTTP requests to the query APIs).
queries() {
  curl -sf "$prom/metrics" | awk '/^prometheus_http_requests_total\{.*handler="\/api\/v1\/query(_range)?"/ { s += $NF } END { print s + 0 }'
}
echo "prometheus: $((nodes * 8)) GPUs, $claims slices, $nodes nodes' cAdvisor, 65 minutes of history"

"$target/release/gpuslice" console --listen 127.0.0.1:0 --kubeconfig "$cluster/kubeconfig" \
  --prometheus "$prom" >"$work/console.out" 2>"$work/console.err" &
console_pid=$!
url=
for _ in $(seq 100); do
  url=$(sed -n 's|^gpuslice console: listening on \(http://[^/]*\)/$|\1|p' "$work/console.out")
  [ -n "$url" ] && break
  kill -0 "$console_pid" 2>/dev/null || { echo "bench-console: gpuslice console exited:" >&2; cat "$work/console.err" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "bench-console: gpuslice console printed no listening line" >&2; exit 1; }

before=$(queries)
page=$(node tests/browser/bench.js "$url" "$runs" "$nodes") || {
  echo "bench-console: the page load benchmark failed; console log:" >&2
  cat "$work/console.err" >&2
  exit 1
}
after=$(queries)
hyperfine --runs "$runs" --warmup 1 --export-json "$work/nodes.json.out" --style none \
  "$target/release/kubectl-gpuslice --kubeconfig $cluster/kubeconfig nodes" >/dev/null
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$page" "$work/nodes.json.out" "$runs" "$before" "$after" <<'EOF'
import json, sys
page = json.loads(sys.argv[1])
per_load = (int(sys.argv[5]) - int(sys.argv[4])) / int(sys.argv[3])
r = json.load(open(sys.argv[2]))["results"][0]
ms = lambda s: s * 1000
print()
print(f"| measurement ({sys.argv[3]} runs) | min | median | max |")
print("|---|---|---|---|")
print(f"| first load of / in headless chromium (navigation start → load event) | {page['min']:.0f} ms | {page['median']:.0f} ms | {page['max']:.0f} ms |")
print(f"| kubectl-gpuslice nodes (wall) | {ms(r['min']):.0f} ms | {ms(r['median']):.0f} ms | {ms(r['max']):.0f} ms |")
print()
print(f"Prometheus queries per load of /: {per_load:g} (bound: 4)")
print("goal: first load of / ≤ 1000 ms median:", "met" if page["median"] <= 1000 else "NOT met")
sys.exit(0 if per_load <= 4 else 1)
EOF
