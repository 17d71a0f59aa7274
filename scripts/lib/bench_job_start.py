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
Running, split at the first reads where all exist, all have their claims named in their
status (at once for the plain job) and all are bound to a node, and also to the moment the
last rank's process began (its first output, as its node's containerd timestamped it; both
nodes run on this machine's clock); then deleted, and the next
created once its pods and their claims are gone. The API client and polling are
scripts/lib/bench_pod_start.py's. Prints every sample, then the medians and ratios.

    bench_job_start.py API_URL PKI_DIR PAIRS RANKS IMAGE
"""

import calendar
import random
import re
import statistics
import sys
import time
import urllib.request

import bench_pod_start
from bench_pod_start import NS, call, connect, wait  # the same client, polling and bounds

API, PKI, PAIRS, RANKS, IMAGE = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
connect(API, PKI)

LABEL = "training.kubeflow.org/job-name"
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"


# Each rank's first act is one line of output, which the node's containerd timestamps (ns) as
# it reads it: when the rank's process began, without the kubelet's lag in reporting phase
# Running (it learns that a container started at its next relist of the runtime, up to a
# second on). Then it waits, as the image's own command does.
COMMAND = ["/bin/sh", "-c", "echo started; trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"]


def job(name, sliced):
    container = {"name": "pytorch", "image": IMAGE, "imagePullPolicy": "Never", "command": COMMAND}
    if sliced:
        container["resources"] = {"limits": {"gpuslice.io/gpus": "1", "gpuslice.io/memory": "1Gi"}}
    spec = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": False, "containers": [container]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": {
                "Worker": {"replicas": RANKS, "restartPolicy": "Never", "template": {"spec": spec}}}}}


def pods(name):
    return call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={LABEL}%3D{name}")["items"]


def started_at(pod):
    """The wall-clock time (seconds since the epoch) of the first line rank `pod` printed, as
    its node's containerd timestamped it (RFC 3339 with nanoseconds, UTC)."""
    req = urllib.request.Request(f"{bench_pod_start.API}/api/v1/namespaces/{NS}/pods/{pod}/log"
                                 "?timestamps=true&limitBytes=4096")
    with urllib.request.urlopen(req, context=bench_pod_start.ctx, timeout=30) as r:
        first = r.read().decode().split("\n", 1)[0]
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z started$", first)
    if not m:
        raise SystemExit(f"rank {pod} has not printed its start line; its log begins: {first[:200]!r}")
    whole = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    return whole + float("0." + (m.group(2) or "0"))


def start(name, sliced):
    """The job's start, split at the first read where each step held for all its ranks: the
    ranks created (the operator's creates and their admission), their claims made and named
    in the pods' status (the resource claim controller; at once for a plain job), all bound
    (the scheduler), all Running (the nodes); and when the last rank's process began (its
    first output, timestamped by its node's containerd): the seconds from create to each, and
    the ranks' nodes."""
    steps = {}
    nodes = []
    wall0 = time.time()
    t0 = time.monotonic()
    call("POST", JOBS, job(name, sliced))

    def mark(step, held):
        if step not in steps and held:
            steps[step] = time.monotonic() - t0
        return step in steps

    def running():
        nonlocal nodes
        ps = pods(name)
        if not mark("created", len(ps) >= RANKS):
            return False
        # A sliced rank has one claim of the webhook's; a plain one none to wait for.
        mark("claimed", all(any(c.get("resourceClaimName") for c in p["status"].get("resourceClaimStatuses") or [])
                            or not p["spec"].get("resourceClaims") for p in ps))
        if "bound" not in steps and all(p["spec"].get("nodeName") for p in ps):
            mark("claimed", True)
            mark("bound", True)
            nodes = sorted(p["spec"]["nodeName"] for p in ps)
        return mark("running", all(p["status"].get("phase") == "Running" for p in ps))

    wait(f"job {name}'s {RANKS} ranks Running", running)
    steps["started"] = max(started_at(p["metadata"]["name"]) for p in pods(name)) - wall0
    call("DELETE", f"{JOBS}/{name}?propagationPolicy=Background")
    wait(f"job {name} gone", lambda: call("GET", f"{JOBS}/{name}", ok404=True) is None)
    for p in pods(name):
        call("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}?gracePeriodSeconds=0", ok404=True)
    wait(f"job {name}'s pods gone", lambda: not pods(name))
    wait("the ranks' claims gone", lambda: not call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"])
    return steps, nodes


# One unmeasured job of each kind first: the first containers of the nodes pay for caches.
for sliced in (True, False):
    start(f"warm-{'sliced' if sliced else 'plain'}", sliced)
samples = {True: [], False: []}
for i in range(PAIRS):
    for sliced in ((True, False) if i % 2 == 0 else (False, True)):
        kind = "sliced" if sliced else "plain"
        steps, nodes = start(f"j{i}-{kind}", sliced)
        samples[sliced].append(steps)
        print(f"pair {i} {kind}: create -> {RANKS} ranks Running {steps['running'] * 1000:.0f} ms "
              f"(all created after {steps['created'] * 1000:.0f} ms, claims named after "
              f"{steps['claimed'] * 1000:.0f} ms, all bound after {steps['bound'] * 1000:.0f} ms, "
              f"all processes begun after {steps['started'] * 1000:.0f} ms; nodes {','.join(nodes)})",
              flush=True)


def med(sliced, part):
    return statistics.median(part(x) for x in samples[sliced])


# A job that waited seconds rather than milliseconds: a kubelet that retried a rank only at
# its resync (docs/kubernetes-dra.md, "A prepare the node authorizer refused").
for sliced in (True, False):
    slow = [x["running"] for x in samples[sliced] if x["running"] > 5]
    print(f"{'with' if sliced else 'without'} slices: {len(slow)} of {PAIRS} jobs took over 5 s"
          + (f" ({', '.join(f'{t:.1f} s' for t in slow)})" if slow else ""))
PARTS = (
    ("create -> all Running", lambda x: x["running"]),
    ("create -> all ranks' processes begun", lambda x: x["started"]),
    ("create -> all bound", lambda x: x["bound"]),
    ("bound -> Running (the nodes)", lambda x: x["running"] - x["bound"]),
    ("bound -> processes begun (the nodes)", lambda x: x["started"] - x["bound"]),
    ("create -> all ranks created (the operator, admission)", lambda x: x["created"]),
    ("created -> claims named (the resource claim controller)", lambda x: x["claimed"] - x["created"]),
    ("claims named -> all bound (the scheduler)", lambda x: x["bound"] - x["claimed"]),
)


def interval(part, rounds=2000, seed=1):
    """A 95 % interval of the ratio of the medians of `part`, sliced over plain: the pairs drawn
    again with replacement `rounds` times (a bootstrap; the seed fixed, so a run's samples
    always give the same interval): how far the run's ratio can be trusted."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        picked = [rng.randrange(PAIRS) for _ in range(PAIRS)]
        w = statistics.median(part(samples[True][i]) for i in picked)
        wo = statistics.median(part(samples[False][i]) for i in picked)
        ratios.append(w / wo)
    ratios.sort()
    return ratios[int(rounds * 0.025)], ratios[int(rounds * 0.975) - 1]


TOTALS = ("create -> all Running", "create -> all ranks' processes begun")
for what, part in PARTS:
    w, wo = med(True, part), med(False, part)
    ci = ""
    if what in TOTALS and PAIRS >= 10:
        lo, hi = interval(part)
        ci = f" (95 % interval over the pairs {lo:.2f}-{hi:.2f})"
    print(f"{PAIRS} pairs of {RANKS}-rank jobs; median {what}: with slices {w * 1000:.0f} ms, "
          f"without {wo * 1000:.0f} ms" + (f"; ratio {w / wo:.2f}{ci}" if wo >= 0.001 else ""))


def histograms(path):
    """The sums and counts of the histograms served at `path` (Prometheus text), by metric
    name and kind: lists of (labels, value)."""
    with urllib.request.urlopen(bench_pod_start.API + path, context=bench_pod_start.ctx,
                                timeout=30) as r:
        text = r.read().decode()
    series = {}
    for line in text.splitlines():
        m = re.match(r'(\w+)_(sum|count)\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3)))
            series.setdefault((m.group(1), m.group(2)), []).append((labels, float(m.group(4))))
    return series


def mean(series, metric, **want):
    """The mean in ms of `metric` over its series whose labels hold `want` (a value, or a test
    of the value), and the count."""
    def holds(labels):
        return all(b(labels.get(a, "")) if callable(b) else labels.get(a) == b for a, b in want.items())
    picked = [sum(v for labels, v in series.get((metric, k), []) if holds(labels)) for k in ("sum", "count")]
    return (picked[0] / picked[1] * 1000, int(picked[1])) if picked[1] else (None, 0)


def show(who, rows):
    for what, (ms, n) in rows:
        print(f"{who}, mean over the run: {what}: " + (f"{ms:.1f} ms ({n} calls)" if n else "no calls"))


# The API server's and the kubelets' own account of the calls on a rank's way to its node, over
# the whole run (the warm-up jobs, both kinds and the deletions included).
api = histograms("/metrics")
rows = [(f"webhook {name} (the API server's call)",
         mean(api, "apiserver_admission_webhook_admission_duration_seconds", name=name))
        for name in ("pods.gpuslice.io", "claims.gpuslice.io")]
for what, verb, resource, sub in (("create a pod", "POST", "pods", ""),
                                  ("create a claim", "POST", "resourceclaims", ""),
                                  ("write a pod's status (its claim's name)", "APPLY", "pods", "status"),
                                  ("write a claim's status (its allocation)", "PUT", "resourceclaims", "status"),
                                  ("update a claim (the scheduler's finalizer; its removal on deletion)",
                                   "PUT", "resourceclaims", ""),
                                  ("patch a pod's status (the kubelets' reports; the scheduler's nomination)",
                                   "PATCH", "pods", "status"),
                                  ("bind a pod", "POST", "pods", "binding")):
    rows.append((f"{what}: {verb} {resource}{'/' + sub if sub else ''}",
                 mean(api, "apiserver_request_duration_seconds", verb=verb, resource=resource, subresource=sub)))
show("API server", rows)
# On each node: the kubelet's whole prepare of a pod's claims (reading them, the plugin's call)
# and the plugin's NodePrepareResources call alone.
for node in sorted(n["metadata"]["name"] for n in call("GET", "/api/v1/nodes")["items"]):
    kubelet = histograms(f"/api/v1/nodes/{node}/proxy/metrics")
    show(f"kubelet {node}", [
        ("prepare a pod's claims", mean(kubelet, "dra_operations_duration_seconds",
                                        operation_name="PrepareResources", is_error="false")),
        ("the plugin's NodePrepareResources", mean(kubelet, "dra_grpc_operations_duration_seconds",
                                                   driver_name="gpuslice.io",
                                                   method_name=lambda m: m.endswith("/NodePrepareResources"))),
    ])
