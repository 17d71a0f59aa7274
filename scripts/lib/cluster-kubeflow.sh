# The test cluster's Kubeflow (`up … --kubeflow`): the training operator, Trainer v2 and JobSet.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh after scripts/lib/gomodule.sh, cluster-process.sh and
# cluster-dns.sh. Builds the pinned releases from their Go modules (tests/kubeflow/
# training-operator: the v1 training operator, PyTorchJob; tests/kubeflow/trainer: Trainer v2's
# controller manager and JobSet's), cached like the Kubernetes binaries, and runs them on the
# host against the API server with their CRDs applied from the modules' own manifests and
# their admission webhooks registered by URL (docs/kubeflow.md). Uses
# REPO, DIR, BIN, die, log and the sourcing script's helpers.

KF_OPERATOR_SRC="$REPO/tests/kubeflow/training-operator"
KF_OPERATOR_CACHE_ROOT="${GPUSLICE_KUBEFLOW_OPERATOR_CACHE:-/var/cache/gpuslice/kubeflow-training-operator}"
KF_TRAINER_SRC="$REPO/tests/kubeflow/trainer"
KF_TRAINER_CACHE_ROOT="${GPUSLICE_KUBEFLOW_TRAINER_CACHE:-/var/cache/gpuslice/kubeflow-trainer}"
KF_OPERATOR_MODULE=github.com/kubeflow/training-operator
KF_TRAINER_MODULE=github.com/kubeflow/trainer/v2
KF_JOBSET_MODULE=sigs.k8s.io/jobset

# build_kubeflow_operator: prints the cached bin directory holding training-operator.v1.
build_kubeflow_operator() {
  local go release key start
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(module_version "$KF_OPERATOR_SRC" "$KF_OPERATOR_MODULE")"
  [ -n "$release" ] || die "$KF_OPERATOR_SRC/go.mod requires no $KF_OPERATOR_MODULE version"
  key="$(gomodule_key "$go" "$KF_OPERATOR_SRC" go.mod go.sum -- "-s -w" "CGO_ENABLED=0" training-operator.v1)"
  gomodule_build --go "$go" --cache "$KF_OPERATOR_CACHE_ROOT" --cache-var GPUSLICE_KUBEFLOW_OPERATOR_CACHE \
    --entry "training-operator-$release-$key" --bin training-operator.v1 --src "$KF_OPERATOR_SRC" \
    --env CGO_ENABLED=0 --what "the Kubeflow training operator $release" --failed "the training operator" \
    --timed "training operator $release" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "-s -w" "$KF_OPERATOR_MODULE/cmd/training-operator.v1"
}

# build_kubeflow_trainer: prints the cached bin directory holding trainer-controller-manager
# and jobset.
build_kubeflow_trainer() {
  local go release jobset key start
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(module_version "$KF_TRAINER_SRC" "$KF_TRAINER_MODULE")"
  jobset="$(module_version "$KF_TRAINER_SRC" "$KF_JOBSET_MODULE")"
  [ -n "$release" ] && [ -n "$jobset" ] || die "$KF_TRAINER_SRC/go.mod requires no $KF_TRAINER_MODULE or $KF_JOBSET_MODULE version"
  key="$(gomodule_key "$go" "$KF_TRAINER_SRC" go.mod go.sum -- "-s -w" "CGO_ENABLED=0" trainer-controller-manager jobset)"
  gomodule_build --go "$go" --cache "$KF_TRAINER_CACHE_ROOT" --cache-var GPUSLICE_KUBEFLOW_TRAINER_CACHE \
    --entry "trainer-$release-jobset-$jobset-$key" --bin trainer-controller-manager --bin jobset \
    --src "$KF_TRAINER_SRC" --env CGO_ENABLED=0 \
    --what "Kubeflow Trainer $release and JobSet $jobset" --failed "Trainer and JobSet" \
    --timed "Trainer $release and JobSet $jobset" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "-s -w" "$KF_TRAINER_MODULE/cmd/trainer-controller-manager" "$KF_JOBSET_MODULE"
}

# build_kubeflow: both builds; prints their two bin directories, one a line.
build_kubeflow() {
  build_kubeflow_operator
  build_kubeflow_trainer
}

# --- running them ---------------------------------------------------------------------------------

# Where the training operator's and Trainer's certificate rotators look for the serving
# certificate (a constant of both, which would be a mounted Secret in their pods): each runs
# in a mount namespace of its own with DIR/kubeflow/certs bound there (start_bound), so two
# clusters' operators serve their own; the host keeps the empty mount point. JobSet takes its
# directory from its configuration.
KF_ROTATOR_CERT_DIR=/tmp/k8s-webhook-server/serving-certs
# The image of the init container the training operator gives a PyTorchJob's workers (it waits
# until the master's Service name resolves); upstream's default cannot be pulled here.
KF_INIT_IMAGE="${GPUSLICE_KUBEFLOW_INIT_IMAGE:-docker.io/library/alpine:3.10}"

# kf_ready PORT: a controller manager's /readyz on PORT of 127.0.0.1 answers 200.
kf_ready() {
  curl -fs --max-time 5 "http://127.0.0.1:$1/readyz"
}

# kf_apply WHAT FILE...: server-side apply of FILE... (the CRDs are too large for the
# last-applied annotation of a client-side apply).
kf_apply() {
  local what="$1"
  shift
  local args=() f
  for f in "$@"; do args+=(-f "$f"); done
  logged "kubeflow-apply" "applying $what" \
    kubectl_admin apply --server-side --force-conflicts "${args[@]}"
}

# kf_module_dir SRC MODULE: the module's source in the Go module cache (downloaded by the build).
kf_module_dir() {
  local go
  go="$(gomodule_go)"
  (cd "$1" && "$go" list -mod=readonly -m -f '{{.Dir}}' "$2") ||
    die "cannot find the source of $2 required by $1/go.mod (go mod download)"
}

# kf_webhooks MANIFEST NAME PORT KEEP: the webhook configurations of MANIFEST (an operator's
# kubebuilder webhook manifest) registered by URL: each kept webhook (its name matches the
# regular expression KEEP) calls https://127.0.0.1:PORT<its path> with DIR/pki/ca.crt as its
# CA bundle; each configuration is named NAME-<mutating|validating>, not the name the
# operator's certificate rotator injects its own CA into. Pod webhooks get the object
# selector upstream's kustomize patch gives them (JobSet's pods only).
kf_webhooks() {
  python3 - "$1" "$2" "$3" "$4" "$DIR/pki/ca.crt" <<'PY'
import base64, re, sys, yaml
manifest, name, port, keep, ca = sys.argv[1:6]
bundle = base64.b64encode(open(ca, "rb").read()).decode()
out = []
for conf in yaml.safe_load_all(open(manifest)):
    if not conf:
        continue
    kind = "mutating" if conf["kind"].startswith("Mutating") else "validating"
    hooks = []
    for w in conf.get("webhooks", []):
        if not re.search(keep, w["name"]):
            continue
        path = w["clientConfig"]["service"]["path"]
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
        if w["rules"][0]["resources"] == ["pods"]:
            w["objectSelector"] = {"matchExpressions": [
                {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
        hooks.append(w)
    if hooks:
        conf["metadata"] = {"name": f"{name}-{kind}"}
        conf["webhooks"] = hooks
        out.append(conf)
yaml.safe_dump_all(out, sys.stdout)
PY
}

# kf_init_template: the training operator's init container of PyTorchJob workers (its
# --pytorch-init-container-template-file), upstream's but for the test: busybox's nslookup
# fails when any name of the resolver's search list is unknown, though the master's is
# found, so the loop waits for an answer ("Name:") instead of nslookup's status.
kf_init_template() {
  cat <<'YAML'
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}} | grep -q "^Name:"; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
YAML
}

# start_kubeflow: the CRDs, namespaces and empty certificate Secrets the operators expect,
# then the training operator (PyTorchJob), JobSet and Trainer's controller manager, each
# until its /readyz answers, then their webhooks registered by URL (kf_webhooks): all three
# serve DIR/pki/kubeflow-webhooks.crt.
start_kubeflow() {
  local op_bin tr_bin op_src tr_src js_src kf="$DIR/kubeflow" p w
  op_bin="$(build_kubeflow_operator)"
  tr_bin="$(build_kubeflow_trainer)"
  op_src="$(kf_module_dir "$KF_OPERATOR_SRC" "$KF_OPERATOR_MODULE")"
  tr_src="$(kf_module_dir "$KF_TRAINER_SRC" "$KF_TRAINER_MODULE")"
  js_src="$(kf_module_dir "$KF_TRAINER_SRC" "$KF_JOBSET_MODULE")"
  mkdir -p "$kf/certs"
  kf_apply "the Kubeflow CRDs (PyTorchJob, TrainJob, (Cluster)TrainingRuntime, JobSet)" \
    "$op_src/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" \
    "$tr_src"/manifests/base/crds/trainer.kubeflow.org_*.yaml \
    "$js_src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
  logged kubeflow-crds "waiting for the Kubeflow CRDs to be established" \
    kubectl_admin wait --for condition=established --timeout=60s \
    crd/pytorchjobs.kubeflow.org crd/trainjobs.trainer.kubeflow.org \
    crd/clustertrainingruntimes.trainer.kubeflow.org crd/trainingruntimes.trainer.kubeflow.org \
    crd/jobsets.jobset.x-k8s.io
  # The namespaces the operators take for their own (no service-account namespace file on
  # the host) and the Secrets their certificate rotators fill in.
  local ns
  for ns in kubeflow:training-operator-webhook-cert kubeflow-system:kubeflow-trainer-webhook-cert; do
    kubectl_admin create namespace "${ns%%:*}" >/dev/null 2>&1 || true
    logged kubeflow-secret "creating the Secret ${ns#*:}" \
      kubectl_admin create secret generic "${ns#*:}" --namespace "${ns%%:*}"
  done
  # One serving certificate for the three webhook servers.
  sign kubeflow-webhooks "/CN=kubeflow-webhooks" "$WEBHOOK_EXT"
  cp "$DIR/pki/kubeflow-webhooks.crt" "$kf/certs/tls.crt"
  cp "$DIR/pki/kubeflow-webhooks.key" "$kf/certs/tls.key"

  p="$(free_port)"
  w="$(free_port)"
  kf_init_template >"$kf/pytorch-init-container.yaml"
  start_bound training-operator "$kf/certs" "$KF_ROTATOR_CERT_DIR" \
    "$op_bin/training-operator.v1" --kubeconfig "$DIR/kubeconfig" \
    --enable-scheme pytorchjob --metrics-bind-address 0 --health-probe-bind-address "127.0.0.1:$p" \
    --webhook-server-port "$w" --pytorch-init-container-image "$KF_INIT_IMAGE" \
    --pytorch-init-container-template-file "$kf/pytorch-init-container.yaml"
  wait_for training-operator "being ready on 127.0.0.1:$p" kf_ready "$p"
  kf_webhooks "$op_src/manifests/base/webhook/manifests.yaml" gpuslice-test-training-operator "$w" \
    '^validator\.pytorchjob\.' >"$kf/webhooks.yaml"

  p="$(free_port)"
  w="$(free_port)"
  cat >"$kf/jobset-config.yaml" <<YAML
# Written by scripts/kube-cluster.sh up --kubeflow: JobSet on the host, its own certificates.
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  port: $w
  certDir: $kf/certs
health:
  healthProbeBindAddress: 127.0.0.1:$p
metrics:
  bindAddress: "0"
YAML
  start jobset "$tr_bin/jobset" --kubeconfig "$DIR/kubeconfig" --config "$kf/jobset-config.yaml"
  wait_for jobset "being ready on 127.0.0.1:$p" kf_ready "$p"
  echo --- >>"$kf/webhooks.yaml"
  kf_webhooks "$js_src/config/components/webhook/manifests.yaml" gpuslice-test-jobset "$w" . >>"$kf/webhooks.yaml"

  p="$(free_port)"
  w="$(free_port)"
  start_bound trainer "$kf/certs" "$KF_ROTATOR_CERT_DIR" \
    "$tr_bin/trainer-controller-manager" --kubeconfig "$DIR/kubeconfig" \
    --metrics-bind-address 0 --health-probe-bind-address "127.0.0.1:$p" --webhook-server-port "$w"
  wait_for trainer "being ready on 127.0.0.1:$p" kf_ready "$p"
  echo --- >>"$kf/webhooks.yaml"
  kf_webhooks "$tr_src/manifests/base/webhook/manifests.yaml" gpuslice-test-trainer "$w" . >>"$kf/webhooks.yaml"
  logged kubeflow-webhooks "registering the Kubeflow operators' webhooks" kubectl_admin apply -f "$kf/webhooks.yaml"
}

# stop_kubeflow: the operators (before the node's pods are deleted: they would recreate
# them) and their files (a no-op when `up` started none). The mount point stays: another
# cluster's operators may have their certificates bound on it.
stop_kubeflow() {
  [ -d "$DIR/kubeflow" ] || return 0
  stop_one trainer
  stop_one jobset
  stop_one training-operator
  rm -rf "$DIR/kubeflow"
}
