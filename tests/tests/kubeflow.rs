//! Kubeflow jobs on two real nodes of one machine (`scripts/kube-cluster.sh up DIR --node
//! node-a=CONFIG --node node-b=CONFIG --webhook --kubeflow`): each node its own kubelet,
//! containerd 2.x and gpuslice kubelet plugin on two simulated GPUs; pods of one node reach
//! the other's by a Service name through the cluster DNS (CoreDNS) over the pod network; a
//! PyTorchJob of the real training operator whose ranks ask `gpuslice.io/*` limits (turned
//! into claims by the webhook, which also keeps a job's ranks one per node) lands one rank
//! per node, the ranks rendezvous at
//! MASTER_ADDR/MASTER_PORT as torch.distributed's TCP store would, the job Succeeds and its
//! slices are released once it is deleted; a PyTorchJob of four one-GPU ranks on the four
//! GPUs runs two, one per node, and leaves two Pending with the scheduler's anti-affinity
//! reason rather than two ranks on one GPU; a TrainJob of Kubeflow Trainer v2 (on JobSet) from
//! a ClusterTrainingRuntime whose ranks ask HAMi's limits does the same, and so does one whose
//! pod template names a ResourceClaimTemplate of its own (the webhook writes no claim then, but
//! still keeps the ranks one per node). One cluster for every case: it costs minutes.

use std::collections::BTreeSet;

use gpuslice_e2e::kube::{wait_for, KubeCluster};
use gpuslice_e2e::kube_node::{KubeNodes, APP_IMAGE, NS, STEP};
use gpuslice_e2e::{lock, Resource, TestNode};
use serde_json::{json, Value};

/// Two GPU models, so that the simulated GPUs of the two nodes have different UUIDs (a
/// simulated UUID is derived from the model and the index).
const MODEL_A: &str = "NVIDIA H100 80GB HBM3";
const MODEL_B: &str = "NVIDIA H100 PCIe";

#[test]
#[ignore = "starts a control plane, two real nodes, CoreDNS and the Kubeflow operators; the README's test command runs it"]
fn a_pytorchjob_across_two_nodes_rendezvouses_on_its_slices() {
    let _s = lock(&[Resource::KubeNode]);
    let a = TestNode::with_models(&[(MODEL_A, "80Gi"), (MODEL_A, "80Gi")]);
    let b = TestNode::with_models(&[(MODEL_B, "80Gi"), (MODEL_B, "80Gi")]);
    let kn = KubeNodes::up(
        &[("node-a", &a), ("node-b", &b)],
        &["--webhook", "--kubeflow"],
    );
    a_pod_reaches_a_pod_of_the_other_node_by_service_name(&kn);
    pytorchjob_ranks_land_one_per_node_and_rendezvous(&kn, &[&a, &b]);
    four_one_gpu_ranks_never_share_a_gpu(&kn, &[&a, &b]);
    trainjob_ranks_with_hami_limits_rendezvous(&kn, &[&a, &b]);
    trainjob_ranks_with_claim_templates_in_the_runtime_rendezvous(&kn, &[&a, &b]);
}

/// A pod on node-a fetches a page from a pod on node-b through the headless Service `echo-b`
/// (cluster DNS gives the pod's address; the hosts' routes carry the traffic).
fn a_pod_reaches_a_pod_of_the_other_node_by_service_name(kn: &KubeNodes) {
    let c = &kn.first.cluster;
    c.create(&pod_on(
        "echo-b",
        "node-b",
        "mkdir -p /www && echo \"served by $(hostname)\" > /www/index.html && exec httpd -f -p 8080 -h /www",
    ))
    .unwrap();
    c.create(&json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo-b", "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"app": "echo-b"}, "ports": [{"port": 8080}]},
    }))
    .unwrap();
    c.create(&pod_on(
        "fetch-a",
        "node-a",
        "until page=$(wget -qO- http://echo-b:8080/); do sleep 1; done; echo \"GOT $page\"; exec sleep 3600",
    ))
    .unwrap();
    let server = kn.first.wait_running("echo-b");
    let client = kn.first.wait_running("fetch-a");
    assert_eq!(server["spec"]["nodeName"], "node-b", "{}", server["spec"]);
    assert_eq!(client["spec"]["nodeName"], "node-a", "{}", client["spec"]);
    // Each node's pods are on its own subnet: the page crossed the host's routing.
    let (sip, cip) = (
        server["status"]["podIP"].as_str().unwrap_or_default(),
        client["status"]["podIP"].as_str().unwrap_or_default(),
    );
    assert!(
        kn.in_subnet("node-b", sip) && kn.in_subnet("node-a", cip),
        "server {sip} on node-b's subnet, client {cip} on node-a's"
    );
    kn.first.wait_log("fetch-a", "GOT served by echo-b");
    for p in ["fetch-a", "echo-b"] {
        kn.first.delete_pod(p);
    }
    c.kubectl(&["delete", "service", "echo-b", "-n", NS]);
}

/// A pod running `script` in the test image on node `node`, labelled `app: name`.
fn pod_on(name: &str, node: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": APP_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

/// Each rank stores "rank=R node=N gpus=U1,U2," (the GPU UUIDs its slice holds, from the
/// limits gpuslice gives the container) at the master's store, MASTER_ADDR:MASTER_PORT, as
/// torch.distributed's TCP store would: rank 0's store (one `nc -l -e` a connection) answers
/// `stored` once it has written the line, and a rank sends again until it reads that answer
/// (a line sent twice counts once). A plain `nc -l` would close its side at once, its stdin
/// being empty, and busybox's nc exits 0 on that close even before it has read the line it
/// was to send: the rank would end, its line never sent. The master waits until every rank is
/// stored and checks that no GPU is repeated, as NCCL would refuse a repeated GPU.
/// PyTorchJob's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else torchrun's
/// that Trainer sets (PET_NODE_RANK, PET_NNODES, PET_MASTER_ADDR, PET_MASTER_PORT).
const RANK: &str = r#"set -e
RANK=${RANK:-$PET_NODE_RANK} WORLD_SIZE=${WORLD_SIZE:-$PET_NNODES}
MASTER_ADDR=${MASTER_ADDR:-$PET_MASTER_ADDR} MASTER_PORT=${MASTER_PORT:-$PET_MASTER_PORT}
gpus=$(grep -o '"uuid" *: *"[^"]*"' /run/gpuslice/limits.json | sed 's/.*"\([^"]*\)"$/\1/' | sort | tr '\n' ,)
me="rank=$RANK node=$NODE_NAME gpus=$gpus"
echo "$me"
if [ "$RANK" = 0 ]; then
  cat > /tmp/store <<'STORE'
#!/bin/sh
read -r line && [ -n "$line" ] && echo "$line" >> /tmp/all && echo stored
STORE
  chmod +x /tmp/store
  echo "$me" > /tmp/all
  until [ "$(sed -n 's/^rank=\([0-9]*\) .*/\1/p' /tmp/all | sort -u | wc -l)" -ge "$WORLD_SIZE" ]; do
    nc -l -p "$MASTER_PORT" -e /tmp/store || true
  done
  sort -u /tmp/all > /tmp/ranks
  sed 's/^/ARRIVED /' /tmp/ranks
  ranks=$(sed -n 's/^rank=\([0-9]*\) .*/\1/p' /tmp/ranks | sort -u | wc -l)
  dup=$(sed -n 's/.*gpus=//p' /tmp/ranks | tr , '\n' | grep . | sort | uniq -d)
  [ "$(wc -l < /tmp/ranks)" = "$WORLD_SIZE" ] || { echo "RENDEZVOUS-FAILED: $ranks ranks in $(wc -l < /tmp/ranks) lines"; exit 1; }
  [ -z "$dup" ] || { echo "RENDEZVOUS-FAILED: GPUs repeated: $dup"; exit 1; }
  echo RENDEZVOUS-OK
else
  until [ "$(echo "$me" | nc "$MASTER_ADDR" "$MASTER_PORT")" = stored ]; do sleep 1; done
fi
"#;

/// A replica of the job: two GPUs of 4Gi each, the port the operator reads MASTER_PORT from;
/// no placement of its own (the webhook keeps the ranks one per node).
fn replica() -> Value {
    json!({
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {"spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "pytorch",
                "image": APP_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", RANK],
                "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "resources": {"limits": {"gpuslice.io/gpus": "2", "gpuslice.io/memory": "4Gi"}},
            }],
        }},
    })
}

fn pytorchjob_ranks_land_one_per_node_and_rendezvous(kn: &KubeNodes, nodes: &[&TestNode]) {
    let c = &kn.first.cluster;
    // The webhook learns the nodes' GPUs from their ResourceSlices in the background: a
    // rank created before would be refused. It knows them once it refuses three GPUs.
    wait_for("the webhook to know the nodes' two GPUs", STEP, || {
        let probe = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": NS},
            "spec": {"containers": [{"name": "c", "image": APP_IMAGE,
                "resources": {"limits": {"gpuslice.io/gpus": "3"}}}]},
        });
        let out = c.kubectl_output(
            &["create", "--dry-run=server", "-f", "-"],
            Some(probe.to_string().as_bytes()),
        );
        String::from_utf8_lossy(&out.stderr)
            .contains("at most 2 GPUs")
            .then_some(())
    });
    let job = "rdzv";
    create_pytorchjob(c, job, json!({"Master": replica(), "Worker": replica()}));
    let (succeeded, last) = wait_finished(kn, "pytorchjob", job, "Succeeded");
    let master_log = c
        .kubectl_output(&["logs", "-n", NS, &format!("{job}-master-0")], None)
        .stdout;
    let master_log = String::from_utf8_lossy(&master_log).into_owned();
    let worker_log = c
        .kubectl_output(&["logs", "-n", NS, &format!("{job}-worker-0")], None)
        .stdout;
    assert_eq!(
        succeeded,
        Some(true),
        "PyTorchJob {job} did not succeed: {}\nmaster's log:\n{master_log}\nworker's log:\n{}\npods:\n{}\n{}\ntraining operator:\n{}",
        last["status"],
        String::from_utf8_lossy(&worker_log),
        c.kubectl(&["get", "pods", "-n", NS, "-o", "wide"]),
        kn.logs(),
        kn.first.log_tail("training-operator", 30),
    );
    assert_rendezvous(&master_log, 2);
    delete_and_assert_released(
        kn,
        nodes,
        "pytorchjob",
        job,
        "training.kubeflow.org/job-name",
    );
}

/// Creates PyTorchJob `name` of `replicas` (its pytorchReplicaSpecs), its pods kept once done.
fn create_pytorchjob(c: &KubeCluster, name: &str, replicas: Value) {
    c.create(&json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": replicas},
    }))
    .unwrap();
}

/// A PyTorchJob of four ranks of one GPU (4Gi) each, written with no placement, on the two
/// nodes of two GPUs: the webhook's anti-affinity on the job's label runs one rank per node,
/// each on a GPU of its own, and leaves the two others Pending with the scheduler's
/// anti-affinity reason, though the free GPUs beside the running ranks would hold them: two
/// ranks never share a node, hence never a GPU. Every rank carries the rule (its annotation).
/// Workers only, rank 0 the master: with a Master replica the operator holds the workers in
/// an init container until the master's name resolves, so whether the placed ranks run would
/// depend on which two the scheduler placed.
fn four_one_gpu_ranks_never_share_a_gpu(kn: &KubeNodes, nodes: &[&TestNode]) {
    let c = &kn.first.cluster;
    let job = "four";
    let label = "training.kubeflow.org/job-name";
    let mut worker = replica();
    worker["replicas"] = json!(4);
    let container = &mut worker["template"]["spec"]["containers"][0];
    container["resources"]["limits"] =
        json!({"gpuslice.io/gpus": "1", "gpuslice.io/memory": "4Gi"});
    container["env"] = json!([
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['training.kubeflow.org/replica-index']"}}},
        {"name": "WORLD_SIZE", "value": "4"},
        {"name": "MASTER_ADDR", "value": format!("{job}-worker-0")},
        {"name": "MASTER_PORT", "value": "23456"},
    ]);
    create_pytorchjob(c, job, json!({"Worker": worker}));
    let selector = format!("{label}={job}");
    let mut last = Value::Null;
    // Two ranks Running and two Unschedulable for the anti-affinity.
    let split = gpuslice_e2e::kube_node::wait_for_or(STEP, || {
        last = c.get_json(&["pods", "-n", NS, "-l", &selector]);
        let pods = last["items"].as_array()?;
        let running: Vec<&Value> = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .collect();
        let refused: Vec<&Value> = pods
            .iter()
            .filter(|p| {
                p["status"]["phase"] == "Pending"
                    && p["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter().any(|k| {
                            k["type"] == "PodScheduled"
                                && k["reason"] == "Unschedulable"
                                && k["message"]
                                    .as_str()
                                    .is_some_and(|m| m.contains("anti-affinity"))
                        })
                    })
            })
            .collect();
        (pods.len() == 4 && running.len() == 2 && refused.len() == 2).then(|| {
            let names = |ps: &[&Value]| -> Vec<String> {
                ps.iter()
                    .map(|p| {
                        p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string()
                    })
                    .collect()
            };
            (names(&running), names(&refused))
        })
    });
    let Some((running, refused)) = split else {
        panic!(
            "PyTorchJob {job}: not two ranks Running and two Unschedulable for anti-affinity:
{}
{}
{}",
            c.kubectl(&["get", "pods", "-n", NS, "-o", "wide"]),
            last,
            kn.logs()
        );
    };
    for name in &refused {
        let events = kn.first.events(name);
        assert!(
            events
                .lines()
                .any(|l| l.starts_with("FailedScheduling") && l.contains("anti-affinity")),
            "{name}: no FailedScheduling naming the anti-affinity: {events}"
        );
    }
    assert_kept_apart(&last, label, job);
    // The running ranks: one per node, one GPU each, no GPU twice (their own word: the GPUs
    // of the limits gpuslice gave their container).
    let lines: Vec<String> = running
        .iter()
        .map(|name| {
            let log = kn.first.wait_log(name, "gpus=");
            log.lines()
                .find(|l| l.starts_with("rank="))
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_ranks_apart(&lines, 1, &format!("running ranks {running:?}"));
    delete_and_assert_released(kn, nodes, "pytorchjob", job, label);
}

/// A rank's report line (`rank=R node=N gpus=UUID,UUID …`): its node and the distinct GPU
/// UUIDs of its slice.
fn rank_report(line: &str) -> (String, BTreeSet<String>) {
    let field = |k: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(k))
            .unwrap_or_default()
            .to_string()
    };
    let gpus = field("gpus=")
        .split(',')
        .filter(|g| !g.is_empty())
        .map(str::to_string)
        .collect();
    (field("node="), gpus)
}

/// Every pod of `pods` (a list) carries the rule in its annotation and the job's (`label=job`)
/// anti-affinity term as its only required one: the webhook's, none written by the user.
fn assert_kept_apart(pods: &Value, label: &str, job: &str) {
    for p in pods["items"].as_array().into_iter().flatten() {
        assert_eq!(
            p["metadata"]["annotations"]["placement.gpuslice.io/rule"],
            format!("one node per rank of job {label}={job}: NCCL refuses two ranks on one GPU"),
            "{}",
            p["metadata"]
        );
        assert_eq!(
            p["spec"]["affinity"]["podAntiAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"],
            json!([{"labelSelector": {"matchLabels": {label: job}}, "topologyKey": "kubernetes.io/hostname"}]),
            "{}",
            p["spec"]
        );
    }
}

/// The master's log says every rank of two arrived, each from its own node with a slice of
/// `per_rank` distinct GPUs, and no GPU repeated.
fn assert_rendezvous(master_log: &str, per_rank: usize) {
    assert!(master_log.contains("RENDEZVOUS-OK"), "{master_log}");
    let arrived: Vec<&str> = master_log
        .lines()
        .filter_map(|l| l.strip_prefix("ARRIVED "))
        .collect();
    assert_eq!(arrived.len(), 2, "{master_log}");
    assert_ranks_apart(&arrived, per_rank, master_log);
}

/// Two ranks' report lines: one rank on each node, each with `per_rank` distinct GPUs, no
/// GPU repeated between them; `context` is said on a failure.
fn assert_ranks_apart<S: AsRef<str>>(lines: &[S], per_rank: usize, context: &str) {
    let mut ranks_nodes = BTreeSet::new();
    let mut all_gpus = BTreeSet::new();
    for line in lines {
        let line = line.as_ref();
        let (node, gpus) = rank_report(line);
        ranks_nodes.insert(node);
        assert_eq!(
            gpus.len(),
            per_rank,
            "{per_rank} distinct GPU(s) a rank: {line}"
        );
        all_gpus.extend(gpus);
    }
    assert_eq!(
        ranks_nodes,
        BTreeSet::from(["node-a".to_string(), "node-b".to_string()]),
        "one rank per node: {context}"
    );
    assert_eq!(
        all_gpus.len(),
        per_rank * lines.len(),
        "no GPU repeated: {context}"
    );
}

/// Waits until the job (`kind` `name`) has its condition `done` (`Some(true)`) or `Failed`
/// (`Some(false)`), `None` past the time a job of two ranks may take; and the job as last read.
fn wait_finished(kn: &KubeNodes, kind: &str, name: &str, done: &str) -> (Option<bool>, Value) {
    let c = &kn.first.cluster;
    let mut last = Value::Null;
    let finished = gpuslice_e2e::kube_node::wait_for_or(STEP * 2, || {
        last = c.get_json(&[kind, name, "-n", NS]);
        let conds = last["status"]["conditions"].as_array()?;
        let has = |t: &str| {
            conds
                .iter()
                .any(|k| k["type"] == t && k["status"] == "True")
        };
        if has("Failed") {
            return Some(false);
        }
        has(done).then_some(true)
    });
    (finished, last)
}

/// Deleted, the job (`kind` `name`) takes its pods (labelled `label=name`) with it and every
/// slice is released on both nodes.
fn delete_and_assert_released(
    kn: &KubeNodes,
    nodes: &[&TestNode],
    kind: &str,
    name: &str,
    label: &str,
) {
    let c = &kn.first.cluster;
    c.kubectl(&["delete", kind, name, "-n", NS, "--wait=true"]);
    wait_for(&format!("{kind} {name}'s pods to be gone"), STEP, || {
        let pods = c.get_json(&["pods", "-n", NS, "-l", &format!("{label}={name}")]);
        pods["items"].as_array()?.is_empty().then_some(())
    });
    for (i, node) in nodes.iter().enumerate() {
        wait_for(&format!("node {i}'s slices to be released"), STEP, || {
            node.reservations().is_empty().then_some(())
        });
    }
}

/// A ClusterTrainingRuntime `name` (torch) of one replicated Job, `node`, one pod per node,
/// whose container `node` runs [`RANK`]; no placement of its own (the webhook keeps the ranks
/// one per node) and no slice (the caller adds one).
fn torch_runtime(name: &str) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {
                        "terminationGracePeriodSeconds": 1,
                        "automountServiceAccountToken": false,
                        "containers": [{
                            "name": "node",
                            "image": APP_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", RANK],
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        }],
                    }}},
                },
            }]}},
        },
    })
}

/// The label JobSet gives a TrainJob's pods (its JobSet bears the TrainJob's name).
const JOBSET_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

/// Creates TrainJob `job` from `runtime` with `trainer` as its `spec.trainer`, waits until it
/// completes (a failure or a timeout says the ranks' state and the operators' logs) and gives
/// rank 0's log.
fn run_trainjob(kn: &KubeNodes, job: &str, runtime: &str, trainer: Value) -> String {
    let c = &kn.first.cluster;
    c.create(&json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job, "namespace": NS},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }))
    .unwrap();
    let (completed, last) = wait_finished(kn, "trainjob", job, "Complete");
    let selector = format!("{JOBSET_LABEL}={job},batch.kubernetes.io/job-completion-index=0");
    let out = c.kubectl_output(&["logs", "-n", NS, "-l", &selector, "--tail=-1"], None);
    let master_log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        completed,
        Some(true),
        "TrainJob {job} did not complete: {}\nrank 0's log:\n{master_log}\npods:\n{}\n{}\ntrainer:\n{}\njobset:\n{}",
        last["status"],
        c.kubectl(&["get", "pods", "-n", NS, "-o", "wide"]),
        kn.logs(),
        kn.first.log_tail("trainer", 30),
        kn.first.log_tail("jobset", 30),
    );
    master_log
}

/// A TrainJob from a ClusterTrainingRuntime (Trainer v2 makes a JobSet of one replicated Job,
/// one pod per node): each rank asks HAMi's limits (two GPUs of 4096 MiB, in a namespace
/// labelled for HAMi compatibility), the ranks land one per node (the webhook's anti-affinity
/// on the JobSet's label; the runtime asks no placement), rendezvous at PET_MASTER_ADDR:PET_MASTER_PORT (the pod name of rank
/// 0 under the JobSet's headless Service), the TrainJob completes and its slices are
/// released once it is deleted.
fn trainjob_ranks_with_hami_limits_rendezvous(kn: &KubeNodes, nodes: &[&TestNode]) {
    let c = &kn.first.cluster;
    c.kubectl(&["label", "namespace", NS, "gpuslice.io/hami-compat=true"]);
    let runtime = "gpuslice-torch";
    c.create(&torch_runtime(runtime)).unwrap();
    let job = "rdzv-tj";
    let master_log = run_trainjob(
        kn,
        job,
        runtime,
        json!({
            "numNodes": 2,
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"}},
        }),
    );
    assert_rendezvous(&master_log, 2);
    delete_and_assert_released(kn, nodes, "trainjob", job, JOBSET_LABEL);
}

/// A TrainJob from a ClusterTrainingRuntime whose pod template names a ResourceClaimTemplate
/// of the namespace (`resourceClaims`, and `resources.claims` in its container: one GPU of
/// 4Gi of gpuslice's DeviceClass) and asks no limits: each rank gets its own claim from that
/// template, unchanged (the webhook writes none), and the webhook still keeps the ranks one
/// per node (its anti-affinity on the JobSet's label and the rule's annotation on both
/// ranks); the ranks rendezvous, each on a GPU of its own, the TrainJob completes and every
/// slice is released once it is deleted.
fn trainjob_ranks_with_claim_templates_in_the_runtime_rendezvous(
    kn: &KubeNodes,
    nodes: &[&TestNode],
) {
    let c = &kn.first.cluster;
    let template = "rank-4gi";
    c.create(&gpuslice_e2e::kube_node::claim_template(
        template, "4Gi", "50",
    ))
    .unwrap();
    let runtime = "gpuslice-torch-claims";
    let mut rt = torch_runtime(runtime);
    let pod = &mut rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
        ["template"]["spec"];
    let own = json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
    pod["resourceClaims"] = own.clone();
    pod["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    c.create(&rt).unwrap();
    let job = "rdzv-claims";
    let master_log = run_trainjob(kn, job, runtime, json!({"numNodes": 2}));
    assert_rendezvous(&master_log, 1);
    let pods = c.get_json(&["pods", "-n", NS, "-l", &format!("{JOBSET_LABEL}={job}")]);
    let ranks = pods["items"].as_array().map_or(0, Vec::len);
    assert_eq!(ranks, 2, "{pods}");
    assert_kept_apart(&pods, JOBSET_LABEL, job);
    for p in pods["items"].as_array().into_iter().flatten() {
        assert_eq!(p["spec"]["resourceClaims"], own, "{}", p["spec"]);
    }
    delete_and_assert_released(kn, nodes, "trainjob", job, JOBSET_LABEL);
}
