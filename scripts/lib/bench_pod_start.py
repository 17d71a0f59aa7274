"""Pod start (create -> Running) on a real node, a pod with a gpuslice claim beside the same pod
without one, for scripts/bench-pod-start.sh: one mode (capacity or slots) against one running
cluster with its node (scripts/kube-cluster.sh up DIR --node NAME).

Creates a ResourceClaimTemplate of that mode (capacity: 1Gi and 10 % of a GPU of the class
gpuslice.io; slots: one slot of slots.gpuslice.io, constrained to one GPU), then PAIRS pairs of
pods, interleaved (the claimed one first in even pairs, second in odd ones), one pod at a time:
each is timed from just before its create call to the first read of phase Running (the API
polled every 10 ms; the first read naming its node splits the time into scheduling and the
node's part: kubelet, the plugin's prepare, containerd, runc), then deleted, and the next
created once it and its claim are gone. Prints every sample, then the medians and ratios.

    bench_pod_start.py API_URL PKI_DIR MODE PAIRS IMAGE
"""

import json
import ssl
import statistics
import sys
import time
import urllib.error
import urllib.request

NS = "default"
POLL = 0.01
TIMEOUT = 120
# Set by connect() (and main()); scripts/lib/bench_job_start.py uses the same client.
API = ctx = None
MODE = IMAGE = None


def connect(api, pki):
    """The client of call(): the API server at `api`, the admin's certificate of `pki`."""
    global API, ctx
    API = api
    ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
    ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")


def call(method, path, body=None, ok404=False):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if ok404 and e.code == 404:
            return None
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()[:500]}")


def template():
    if MODE == "capacity":
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 1,
                                              "capacity": {"requests": {"memory": "1Gi", "cores": "10"}}}}
        devices = {"requests": [request]}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 1}}
        devices = {"requests": [request],
                   "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}]}
    call("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates",
         {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
          "metadata": {"name": "bench"}, "spec": {"spec": {"devices": devices}}})


def pod(name, claimed):
    container = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never"}
    spec = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": False, "containers": [container]}
    if claimed:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "bench"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait(what, probe):
    deadline = time.monotonic() + TIMEOUT
    while True:
        v = probe()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {TIMEOUT} s waiting for {what}")
        time.sleep(POLL)


def start(name, claimed):
    """(create -> Running, create -> bound to the node) in seconds."""
    body = pod(name, claimed)
    bound = None
    t0 = time.monotonic()
    call("POST", f"/api/v1/namespaces/{NS}/pods", body)

    def running():
        nonlocal bound
        p = call("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        if bound is None and p["spec"].get("nodeName"):
            bound = time.monotonic() - t0
        return p["status"].get("phase") == "Running"

    wait(f"pod {name} Running", running)
    took = time.monotonic() - t0
    call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
    wait(f"pod {name} gone", lambda: call("GET", f"/api/v1/namespaces/{NS}/pods/{name}", ok404=True) is None)
    # The claim made from the template goes with the pod, once the kubelet has unprepared it.
    wait("the pod's claim gone", lambda: not call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"])
    return took, bound if bound is not None else took


def main():
    global MODE, IMAGE
    api, pki, MODE, pairs, IMAGE = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    connect(api, pki)
    template()
    # One unmeasured pod of each kind first: the first container of a node pays for caches.
    for claimed in (True, False):
        start(f"warm-{'claim' if claimed else 'plain'}", claimed)
    samples = {True: [], False: []}
    for i in range(pairs):
        for claimed in ((True, False) if i % 2 == 0 else (False, True)):
            total, bound = start(f"p{i}-{'claim' if claimed else 'plain'}", claimed)
            samples[claimed].append((total, bound, total - bound))
            print(f"{MODE} pair {i} {'claim' if claimed else 'plain'}: create -> Running {total * 1000:.0f} ms "
                  f"(bound after {bound * 1000:.0f} ms, then {(total - bound) * 1000:.0f} ms on the node)", flush=True)

    def med(claimed, k):
        return statistics.median(x[k] for x in samples[claimed])

    for k, what in ((0, "create -> Running"), (1, "create -> bound"), (2, "bound -> Running (the node)")):
        w, wo = med(True, k), med(False, k)
        print(f"{MODE}: {pairs} pairs; median {what}: with a claim {w * 1000:.0f} ms, "
              f"without {wo * 1000:.0f} ms; ratio {w / wo:.2f}")


if __name__ == "__main__":
    main()
