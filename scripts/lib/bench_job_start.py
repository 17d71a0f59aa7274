"""Job start (create -> every rank Running) on the two-node Kubeflow cluster, a PyTorchJob whose
ranks ask gpuslice limits beside the same job without, for scripts/bench-job-start.sh: one
running cluster (scripts/kube-cluster.sh up DIR --node A --node B --webhook --kubeflow).

Each job is a PyTorchJob of RANKS workers (no Master: the operator then adds no init
container, which would wait on DNS) running IMAGE; the sliced job's ranks ask
`gpuslice.io/gpus: 1` and `gpuslice.io/memory: 1Gi`, which the webhook turns into a claim of
each rank and, the ranks being one job's, a required anti-affinity that keeps them one per
node; the plain job's ranks ask nothing. PAIRS pairs of jobs, interleaved (the sliced one
first in even pairs, second in odd ones), one job at a time: each timed from just before its
create call to the first read (the API polled every 10 ms) where all its RANKS pods are
Running, split at the first read where all are bound to a node; then deleted, and the next
created once its pods and their claims are gone. The API client and polling are
scripts/lib/bench_pod_start.py's. Prints every sample, then the medians and ratios.

    bench_job_start.py API_URL PKI_DIR PAIRS RANKS IMAGE
"""

import statistics
import sys
import time

from bench_pod_start import NS, call, connect, wait  # the same client, polling and bounds

API, PKI, PAIRS, RANKS, IMAGE = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
connect(API, PKI)

LABEL = "training.kubeflow.org/job-name"
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"


def job(name, sliced):
    container = {"name": "pytorch", "image": IMAGE, "imagePullPolicy": "Never"}
    if sliced:
        container["resources"] = {"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "1Gi"}}
    spec = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": False, "containers": [container]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": {
                "Worker": {"replicas": RANKS, "restartPolicy": "Never", "template": {"spec": spec}}}}}


def pods(name):
    return call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={LABEL}%3D{name}")["items"]


def start(name, sliced):
    """(create -> all Running, create -> all bound) in seconds, and the ranks' nodes."""
    bound = None
    nodes = []
    t0 = time.monotonic()
    call("POST", JOBS, job(name, sliced))

    def running():
        nonlocal bound, nodes
        ps = pods(name)
        if len(ps) < RANKS:
            return False
        if bound is None and all(p["spec"].get("nodeName") for p in ps):
            bound = time.monotonic() - t0
            nodes = sorted(p["spec"]["nodeName"] for p in ps)
        return all(p["status"].get("phase") == "Running" for p in ps)

    wait(f"job {name}'s {RANKS} ranks Running", running)
    took = time.monotonic() - t0
    call("DELETE", f"{JOBS}/{name}?propagationPolicy=Background")
    wait(f"job {name} gone", lambda: call("GET", f"{JOBS}/{name}", ok404=True) is None)
    for p in pods(name):
        call("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}?gracePeriodSeconds=0", ok404=True)
    wait(f"job {name}'s pods gone", lambda: not pods(name))
    wait("the ranks' claims gone", lambda: not call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"])
    return took, bound if bound is not None else took, nodes


# One unmeasured job of each kind first: the first containers of the nodes pay for caches.
for sliced in (True, False):
    start(f"warm-{'sliced' if sliced else 'plain'}", sliced)
samples = {True: [], False: []}
for i in range(PAIRS):
    for sliced in ((True, False) if i % 2 == 0 else (False, True)):
        kind = "sliced" if sliced else "plain"
        total, bound, nodes = start(f"j{i}-{kind}", sliced)
        samples[sliced].append((total, bound, total - bound))
        print(f"pair {i} {kind}: create -> {RANKS} ranks Running {total * 1000:.0f} ms "
              f"(all bound after {bound * 1000:.0f} ms, then {(total - bound) * 1000:.0f} ms on the nodes; "
              f"nodes {','.join(nodes)})", flush=True)


def med(sliced, k):
    return statistics.median(x[k] for x in samples[sliced])


# A job that waited seconds rather than milliseconds: a kubelet that retried a rank only at
# its resync (docs/kubernetes-dra.md, "A prepare the node authorizer refused").
for sliced in (True, False):
    slow = [x[0] for x in samples[sliced] if x[0] > 5]
    print(f"{'with' if sliced else 'without'} slices: {len(slow)} of {PAIRS} jobs took over 5 s"
          + (f" ({', '.join(f'{t:.1f} s' for t in slow)})" if slow else ""))
for k, what in ((0, "create -> all Running"), (1, "create -> all bound"), (2, "bound -> Running (the nodes)")):
    w, wo = med(True, k), med(False, k)
    print(f"{PAIRS} pairs of {RANKS}-rank jobs; median {what}: with slices {w * 1000:.0f} ms, "
          f"without {wo * 1000:.0f} ms; ratio {w / wo:.2f}")
