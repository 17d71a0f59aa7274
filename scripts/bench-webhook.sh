#!/usr/bin/env bash
# Benchmark of the admission webhook against a LIVE control plane (goal: ≤ 5 ms median added
# per pod). Starts a real control plane with the webhook (scripts/kube-cluster.sh up DIR
# --webhook), a Node object and a ResourceSlice of 8 GPUs, then creates PODS pods one after
# another through the API server (one kept-alive HTTPS connection, python3's http.client) in
# each of three namespaces:
#   - plain:   pods without GPU limits (the registration's matchConditions keep them away
#              from the webhook: the API server's own cost);
#   - limits:  the same pods with `gpuslice.io/memory: 1Gi` (sent to the webhook, which
#              patches them; the first one creates the shape's template, the others reuse it;
#              the namespace has no ResourceQuota: the budget check lists none);
#   - budget:  the same pods in a namespace whose ResourceQuota names
#              limits.gpuslice.io/memory (large enough for all): each pod is also booked in
#              the quota's status (docs/quotas.md).
# Prints, per kind, the median and p99 of the create round trip and the creates per second,
# and the differences of the medians and p99s: what the webhook adds per pod, and what the
# budget's booking adds beside the webhook without a budget. Rotating the three kinds spreads
# the load of the shared machine over all.
#
#   scripts/bench-webhook.sh [PODS]          (default 300)
#
# Environment: CARGO_TARGET_DIR (where the release build goes), GPUSLICE_BIN_DIR (gpuslice
# from there instead, unbuilt), and those of
# scripts/kube-cluster.sh (GPUSLICE_KUBE_BIN_DIR, GPUSLICE_KUBE_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
pods=${1:-300}
target=${CARGO_TARGET_DIR:-$PWD/target}
bin_dir=${GPUSLICE_BIN_DIR:-}
if [ -z "$bin_dir" ]; then
  cargo build --release -p gpuslice >&2
  bin_dir=$target/release
fi
cluster=$(mktemp -d /tmp/gpuslice-bench-webhook.XXXXXX)
cleanup() {
  scripts/kube-cluster.sh down "$cluster" || true
  rmdir "$cluster" 2>/dev/null || true
}
trap cleanup EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
GPUSLICE_BIN_DIR=$bin_dir scripts/kube-cluster.sh up "$cluster" --webhook >&2
python3 - "$cluster" "$pods" <<'PY'
import http.client, json, ssl, statistics, sys, time
from urllib.parse import urlparse
d, n = sys.argv[1], int(sys.argv[2])
env = dict(l.strip().split("=", 1) for l in open(f"{d}/cluster.env") if "=" in l)
u = urlparse(env["API_URL"])
ctx = ssl.create_default_context(cafile=f"{d}/pki/ca.crt")
ctx.load_cert_chain(f"{d}/pki/admin.crt", f"{d}/pki/admin.key")
conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx)
def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    if r.status >= 300: raise SystemExit(f"{method} {path}: {r.status} {data[:300]}")
    return json.loads(data)
call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench"}})
call("POST", "/apis/resource.k8s.io/v1/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpuslice.io"}, "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpuslice.io\""}}]}})
dev = lambda i: {"name": f"gpu-{i}", "allowMultipleAllocations": True,
    "attributes": {"uuid": {"string": f"GPU-00000000-0000-0000-0000-00000000000{i}"}, "index": {"int": i}, "productName": {"string": "NVIDIA H200"}},
    "capacity": {"memory": {"value": "141Gi", "requestPolicy": {"default": "141Gi", "validRange": {"min": "1Mi", "step": "1Mi", "max": "141Gi"}}},
                 "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1", "max": "100"}}}}}
call("POST", "/apis/resource.k8s.io/v1/resourceslices", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "bench-gpuslice.io"},
     "spec": {"driver": "gpuslice.io", "nodeName": "bench", "pool": {"name": "bench", "generation": 1, "resourceSliceCount": 1}, "devices": [dev(i) for i in range(8)]}})
kinds = ("plain", "limits", "budget")
for ns in kinds:
    call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
call("POST", "/api/v1/namespaces/budget/resourcequotas", {"apiVersion": "v1", "kind": "ResourceQuota",
     "metadata": {"name": "gpu", "namespace": "budget"}, "spec": {"hard": {"limits.gpuslice.io/memory": "1Pi"}}})
# Pods need the namespace's service account (the ServiceAccount admission plugin).
for ns in kinds:
    while True:
        conn.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default"); r = conn.getresponse(); r.read()
        if r.status == 200: break
        time.sleep(0.2)
# A new quota books nothing until the webhook has counted it (docs/quotas.md): wait for its used.
while True:
    conn.request("GET", "/api/v1/namespaces/budget/resourcequotas/gpu"); r = conn.getresponse(); q = json.loads(r.read())
    if "limits.gpuslice.io/memory" in q.get("status", {}).get("used", {}): break
    time.sleep(0.2)
def pod(ns, i):
    c = {"name": "main", "image": "gpuslice.invalid/bench:1"}
    if ns != "plain": c["resources"] = {"limits": {"gpuslice.io/memory": "1Gi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": ns},
            "spec": {"nodeName": "bench", "containers": [c]}}
# Warm-up (TLS to the webhook, the template): not counted.
for ns in kinds:
    for i in range(5): call("POST", f"/api/v1/namespaces/{ns}/pods", pod(ns, f"w{i}"))
lat = {k: [] for k in kinds}; wall = {k: 0.0 for k in kinds}
for i in range(n):
    for ns in kinds[i % 3:] + kinds[:i % 3]:
        t = time.perf_counter(); p = call("POST", f"/api/v1/namespaces/{ns}/pods", pod(ns, i)); dt = time.perf_counter() - t
        lat[ns].append(dt * 1000); wall[ns] += dt
        if ns != "plain" and not p["spec"].get("resourceClaims"): raise SystemExit(f"pod {i} was not mutated: {p['spec']}")
used = call("GET", "/api/v1/namespaces/budget/resourcequotas/gpu")["status"]["used"]["limits.gpuslice.io/memory"]
def q(v, p): v = sorted(v); return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
for ns in kinds:
    print(f"{ns:7} pods={n} median={statistics.median(lat[ns]):.2f} ms p99={q(lat[ns], .99):.2f} ms throughput={n / wall[ns]:.0f} creates/s (sequential)")
def added(a, b): return f"median {statistics.median(lat[a]) - statistics.median(lat[b]):.2f} ms, p99 {q(lat[a], .99) - q(lat[b], .99):.2f} ms"
print(f"added by the webhook (limits - plain): {added('limits', 'plain')}")
print(f"added by the budget check (budget - limits): {added('budget', 'limits')}; the quota's used: {used} ({n + 5} pods of 1Gi)")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
