"""The stock scheduler placing gpuslice claims on many nodes without kubelets, for
scripts/bench-dra-scheduler.sh: one mode (capacity or slots) against one running control plane.

Creates NODES Node objects (status patched so pods fit) with one ResourceSlice each of 8
H200-sized GPUs, published as the kubelet plugin publishes them in that mode, then CLAIMS
claims of 1 to 4 units of 1/SLOTS of a GPU (ResourceClaims and one pod each), and times create → every
pod bound. Then replaces the slices with fragmented ones (every GPU with SLOTS - 1 of its
SLOTS units free, as after bookings of the node paths) and times the decision on a claim of a whole GPU,
which fits nowhere: the pod's PodScheduled condition turning False, with its reason.

    bench_dra_scheduler.py API_URL PKI_DIR MODE NODES CLAIMS SLOTS
"""

import json
import ssl
import sys
import time
import urllib.error
import urllib.request

API, PKI, MODE, NODES, CLAIMS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
SLOTS = int(sys.argv[6])
GPUS = 8
GPU_MIB = 143360  # an H200's 141 GiB rounded down to 1 MiB steps, as the plugin publishes it
SLOT_MIB = GPU_MIB // SLOTS
NS = "default"

ctx = ssl.create_default_context(cafile=f"{PKI}/ca.crt")
ctx.load_cert_chain(f"{PKI}/admin.crt", f"{PKI}/admin.key")


def call(method, path, body=None, content="application/json"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Content-Type", content)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()[:500]}")


def node(name):
    call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    call("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"capacity": res, "allocatable": res}},
         "application/merge-patch+json")


def attrs(name, i):
    return {"uuid": {"string": f"GPU-{name}-{i}"}, "index": {"int": i},
            "productName": {"string": "NVIDIA H200"}}


def devices(name, free_slots):
    """The devices of one node: capacity devices offering free_slots units of each GPU, or
    free_slots slot devices of each GPU."""
    out = []
    for i in range(GPUS):
        if MODE == "capacity":
            mib = free_slots * SLOT_MIB
            out.append({
                "name": f"gpu-{i}", "allowMultipleAllocations": True, "attributes": attrs(name, i),
                "capacity": {
                    "memory": {"value": f"{mib}Mi", "requestPolicy": {
                        "default": f"{mib}Mi", "validRange": {"min": "1Mi", "step": "1Mi", "max": f"{mib}Mi"}}},
                    "cores": {"value": "100", "requestPolicy": {
                        "default": "0", "validRange": {"min": "0", "step": "1", "max": "100"}}},
                },
            })
        else:
            for j in range(free_slots):
                a = attrs(name, i)
                a["slot"] = {"int": j}
                out.append({"name": f"gpu-{i}-slot-{j}", "attributes": a,
                            "capacity": {"memory": {"value": f"{SLOT_MIB}Mi"}, "cores": {"value": str(100 // SLOTS)}}})
    return out


def publish(name, free_slots, generation):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-gpuslice.io"},
            "spec": {"driver": "gpuslice.io", "nodeName": name,
                     "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices(name, free_slots)}}
    if generation == 1:
        call("POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    else:
        old = call("GET", f"/apis/resource.k8s.io/v1/resourceslices/{name}-gpuslice.io")
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        call("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{name}-gpuslice.io", body)


def claim(name, eighths):
    if MODE == "capacity":
        exactly = {"deviceClassName": "gpuslice.io", "count": 1,
                   "capacity": {"requests": {"memory": f"{eighths * SLOT_MIB}Mi", "cores": "0"}}}
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    else:
        exactly = {"deviceClassName": "slots.gpuslice.io", "count": eighths}
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}],
                            "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}]}}
    call("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
         {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec})
    call("POST", f"/api/v1/namespaces/{NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"bench": "1"}},
        "spec": {"tolerations": [{"operator": "Exists"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "gpuslice.invalid/never-pulled:1",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})


def pods():
    return call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]


names = [f"node-{n:03d}" for n in range(NODES)]
for n in names:
    node(n)
    publish(n, SLOTS, 1)

t0 = time.monotonic()
for c in range(CLAIMS):
    claim(f"c{c:04d}", 1 + c % 4)
created = time.monotonic() - t0
while True:
    items = pods()
    bound = sum(1 for p in items if p["spec"].get("nodeName"))
    if bound == CLAIMS:
        break
    if time.monotonic() - t0 > 900:
        raise SystemExit(f"{MODE}: only {bound} of {CLAIMS} pods bound after 900 s")
    time.sleep(0.2)
took = time.monotonic() - t0
print(f"{MODE}: {CLAIMS} claims of 1-4 of {SLOTS} units on {NODES} nodes x {GPUS} GPUs: created in {created:.1f} s, "
      f"all bound in {took:.1f} s: {CLAIMS / took:.1f} pods/s", flush=True)

# Fragmented: every GPU keeps SLOTS - 1 units free; a claim of a whole GPU fits nowhere.
for c in range(CLAIMS):
    call("DELETE", f"/api/v1/namespaces/{NS}/pods/c{c:04d}?gracePeriodSeconds=0")
    call("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/c{c:04d}")
while pods():
    time.sleep(0.2)
for n in names:
    publish(n, SLOTS - 1, 2)
time.sleep(2)  # the scheduler's informers see the new slices
t0 = time.monotonic()
claim("whole", SLOTS)
while True:
    p = call("GET", f"/api/v1/namespaces/{NS}/pods/whole")
    cond = [c for c in p.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
    if cond and cond[0]["status"] == "False":
        break
    if p["spec"].get("nodeName"):
        raise SystemExit(f"{MODE}: the whole-GPU claim was bound to {p['spec']['nodeName']}")
    if time.monotonic() - t0 > 300:
        raise SystemExit(f"{MODE}: no decision on the whole-GPU claim after 300 s")
    time.sleep(0.05)
print(f"{MODE}: a claim of a whole GPU on {NODES} nodes x {GPUS} GPUs each with {SLOTS - 1}/{SLOTS} free: "
      f"decided in {time.monotonic() - t0:.2f} s ({cond[0]['reason']}: {cond[0].get('message', '')[:160]})",
      flush=True)
