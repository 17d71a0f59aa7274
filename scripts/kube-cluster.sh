#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for tests and demos: etcd (in-process
# embed), kube-apiserver, kube-scheduler and kube-controller-manager of the release pinned in
# tests/kube/go.mod, built from its Go modules and cached outside the checkout; with --node, a
# node for the local machine too: containerd 2.x (built from the Go module pinned in
# tests/node/go.mod), runc and CNI from Debian, the release's kubelet and the gpuslice kubelet
# plugin on a simulated GPU node.
#
# This file is the command line (`--help`) and the lifecycle: `up` (which step runs when, what
# DIR/cluster.env records), `down` and the builds' commands. Each job is in scripts/lib/:
#   gomodule.sh               building a pinned Go module into a keyed cache
#   cluster-build.sh          what the Kubernetes, containerd and nerdctl builds are
#   cluster-process.sh        starting, waiting for and stopping a component by its pid file
#   cluster-pki.sh            the CA, certificates, service-account keys and kubeconfigs
#   cluster-control-plane.sh  etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   cluster-node.sh           the node: containerd, CNI and kubelet config and start, teardown
#   cluster-pause-image.sh    the node's pause image, built from busybox-static
#   cluster-webhook.sh        `--webhook`: gpuslice's admission webhook and its registration
#   cluster-restart.sh        `restart`: the control plane and the node again, gates changed
#   cluster-kueue.sh          `--kueue` and `build-kueue`: Kueue, its CRDs and webhooks
#   cluster-nodes.sh          several nodes (`--node A --node B`), each as cluster-node.sh makes one
#   cluster-dns.sh            CoreDNS for Services (several nodes or --kubeflow), its build
#   cluster-kubeflow.sh       `--kubeflow`: the training operator, Trainer v2 and JobSet, their builds
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/kube-cluster.sh COMMAND [ARGS]

  up DIR        Start a control plane whose files all live under DIR (created if missing):
                etcd (data in DIR/etcd), kube-apiserver (--authorization-mode=Node,RBAC),
                kube-scheduler and kube-controller-manager, each on a free port of 127.0.0.1,
                with a CA, serving and client certificates and service-account keys made by
                openssl in DIR/pki. Writes the admin kubeconfig to DIR/kubeconfig, pids to
                DIR/pids, logs to DIR/logs and the endpoints to DIR/cluster.env. Returns once
                the API answers and the default namespace has its service account; on a
                timeout or a crash it prints the failing component's log tail, stops what it
                started and exits 1.
  up DIR --node NAME[=CONFIG]
                The same, plus a node NAME for this machine, its files under DIR/node:
                containerd 2.x (own root, state, socket and config, CDI on, native
                snapshotter; gpuslice-runtime registered as handler `gpuslice` by
                `gpuslice configure containerd`), CNI (Debian's bridge, host-local and
                loopback plugins, bridge gskube0 on 10.244.77.0/24), a pause image built
                here from busybox-static and imported with ctr, the release's kubelet
                (KubeletConfiguration DIR/node/kubelet-config.yaml: cgroupfs driver,
                failCgroupV1 false; root dir DIR/node/kubelet), and `gpuslice
                kubelet-plugin` registered with that kubelet. Applies the DeviceClasses
                gpuslice.io and slots.gpuslice.io, the ValidatingAdmissionPolicy
                slots.gpuslice.io and the RuntimeClass gpuslice. Returns once the Node is Ready
                and its ResourceSlice is published; adds the node's paths to
                DIR/cluster.env. CONFIG: the node's gpuslice config (default
                GPUSLICE_CONFIG). One cluster with nodes per slot at a time
                (GPUSLICE_KUBE_SLOT below: what the names and addresses here are in
                slot 0, the default).
  up DIR --node A[=CONFIG] --node B[=CONFIG] …
                Several nodes on this machine, each with its own containerd, kubelet,
                gpuslice config (CONFIG, else a simulated H200 written under its directory)
                and `gpuslice kubelet-plugin`. The first is the node above (DIR/node, its
                paths in DIR/cluster.env); the Nth (N ≥ 1) has DIR/node-NAME, components
                named NAME-suffixed (kubelet-NAME, containerd-NAME,
                gpuslice-kubelet-plugin-NAME), bridge gskubeN on 10.244.(77+N).0/24 and its
                kubelet's cgroups under /gpuslice-node-NAME. Pods of all nodes reach each
                other through the host's routes. Starts the cluster DNS first (below). Every
                node's paths are in its directory's node.env; DIR/cluster.env lists NODES
                and NODE_DIRS.
  up DIR … --dns
                Cluster DNS (implied by several nodes and by --kubeflow): CoreDNS (built from
                tests/coredns, cached) on the host, answering for cluster.local from the API
                server on port 53 of 10.244.0.10 (added to the loopback link as
                lo:gskdns; 10.244.0.(10+S), lo:gskdnsS in slot S), every
                kubelet's clusterDNS. Services without kube-proxy: headless ones (what
                PyTorchJob and JobSet make) resolve to their pods' IPs; a ClusterIP is not
                routed. Adds DNS_IP to DIR/cluster.env.
  up DIR … --kubeflow
                Also the Kubeflow training operator (PyTorchJob only), JobSet and Kubeflow
                Trainer v2's controller manager (tests/kubeflow, built and cached by
                build-kubeflow) as host processes with the admin kubeconfig, after their CRDs
                (from the modules' manifests) are applied; returns once each answers
                /readyz; their admission webhooks (from the modules' manifests) are
                registered by URL with a certificate signed by DIR/pki/ca.crt
                (DIR/kubeflow/webhooks.yaml; docs/kubeflow.md). PyTorchJob workers' init
                container image: GPUSLICE_KUBEFLOW_INIT_IMAGE.
  up DIR … --webhook
                Also starts `gpuslice webhook --hami-compat` (GPUSLICE_BIN_DIR) on a free
                port of 127.0.0.1 with a serving certificate signed by DIR/pki/ca.crt
                (DIR/pki/webhook.{crt,key}), and registers it by URL with the
                MutatingWebhookConfiguration gpuslice-webhook (failurePolicy Fail,
                sideEffects NoneOnDryRun, only pods naming gpuslice.io/* or nvidia.com/gpu*
                resources; DIR/webhook.yaml), and applies the ValidatingAdmissionPolicy
                annotations.gpuslice.io (packaging/kubernetes/annotations-policy.yaml: a
                pod's slice-request annotations cannot change after its creation). Adds
                WEBHOOK_URL to DIR/cluster.env.
  up DIR … --kueue
                Also starts Kueue's manager (the release pinned in tests/kueue/go.mod, built
                by build-kueue) as a process of this machine against the cluster: applies
                its CRDs (the module's config/components/crd; conversions of v1beta1 sent to
                the manager), creates the namespace kueue-system, runs it with
                DIR/kueue/config.yaml (ports of 127.0.0.1, no leader election, the batch/job
                integration, and gpuslice's part of packaging/helm/kueue-values.yaml: the
                feature gates and resource mappings that charge gpuslice.io/memory,
                docs/quotas.md) and a serving certificate signed by DIR/pki/ca.crt, waits
                for its /readyz, then registers its webhooks by URL
                (kueue-{mutating,validating}-webhook-configuration, the module's
                config/components/webhook; DIR/kueue/webhooks.yaml). Runs in a mount
                namespace of its own that binds DIR/kueue/certs on /etc/kueue/metrics/certs
                (Kueue's compiled-in metrics certificate path; the host gets that empty
                directory as a mount point): needs root. Adds KUEUE_WEBHOOK_URL and
                KUEUE_BIN_DIR to DIR/cluster.env.
  up DIR --feature-gates LIST
                Pass LIST (Name=bool,…, e.g. DRAConsumableCapacity=false) as --feature-gates
                to every component started: kube-apiserver, kube-scheduler,
                kube-controller-manager and, with --node, the kubelet. Recorded in
                DIR/cluster.env as FEATURE_GATES.
  up DIR --emulated-version X.Y
                Run the control plane (API server, scheduler, controller manager) as release
                X.Y with the pinned binaries' --emulated-version (1.34 to the pinned release):
                the APIs served and the feature gates' defaults are X.Y's. The kubelet has no
                emulation. Recorded in DIR/cluster.env as EMULATED_VERSION.
  restart DIR [--feature-gates LIST]
                What an upgrade or a feature-gate flip does to a running cluster: restarts
                kube-apiserver, kube-controller-manager and kube-scheduler and, with a node,
                then the kubelet and then `gpuslice kubelet-plugin` (both stopped while the
                API server restarts), each on its ports and files, with
                --feature-gates=LIST (without it: none, the release's defaults).
                etcd, containerd and the pods' containers keep running: objects and running
                pods stay. Replaces FEATURE_GATES in DIR/cluster.env (removed without LIST).
                Returns once the API answers, the controllers are healthy and, with a node,
                the Node is Ready and the restarted plugin is registered with its
                ResourceSlice published; on a timeout it prints the component's log tail and
                exits 1, leaving the cluster to `down`.
  down DIR      Stop what `up DIR` started (only the pids it recorded) and remove what it
                wrote. With a node: first deletes the workloads and pods through the API
                (so the kubelet tears them down: CNI, DRA unprepare), then stops the plugin,
                the kubelet, what containerd still runs and containerd, unmounts what is
                mounted under DIR and removes DIR/node and the bridge. Idempotent: a second
                call, or one for a DIR never used, does nothing.
  build         Build the binaries if the cache has none for the current sources, and print
                their directory (kube-apiserver, kube-scheduler, kube-controller-manager,
                kubectl, kubelet, etcd).
  build-node    The same for the node's containerd, ctr and containerd-shim-runc-v2
                (tests/node); prints their directory.
  build-nerdctl The same for nerdctl (tests/nerdctl), which the suite runs against the
                node's containerd; prints the path of the nerdctl binary and logs what
                it cost (cold: the build; warm: the cache lookup).
  build-helm    The same for helm (tests/helm), with which the suite installs the chart
                packaging/helm/gpuslice; prints the path of the helm binary.
  build-kueue   The same for Kueue's manager (tests/kueue), with the module's CRDs and
                webhook manifests beside it (../crd, ../webhook); prints the directory of
                the kueue binary and logs what it cost (cold: the build; warm: the lookup).
  build-dns     The same for CoreDNS (tests/coredns); prints the path of the coredns binary.
  build-kubeflow
                The same for the training operator (tests/kubeflow/training-operator) and
                for Trainer v2 with JobSet (tests/kubeflow/trainer); prints their two
                directories and logs what each cost (cold: the build; warm: the lookup).
  --help        This text.

Environment:
  GPUSLICE_KUBE_BIN_DIR   use the binaries in this directory instead of the cache
  GPUSLICE_KUBE_CACHE     cache root (default /var/cache/gpuslice/kube); entries are
                          <release>-<hash of tests/kube's go.mod, go.sum and sources>/bin
  GPUSLICE_KUBE_TIMEOUT   seconds `up` waits for each component (default 240)
  GPUSLICE_KUBE_SLOT      (up) the slot S, 0 to 3 (default 0), of a cluster with nodes: up to
                          four run on one machine at once, one per slot, each with the host's
                          names and addresses of its slot. Slot 0 is the names above; in slot
                          S > 0 node N has bridge gskubeN-sS on 10.244.(77+32S+N).0/24, its
                          kubelet's cgroups under /gpuslice-sS-nodeN and containerd's NRI
                          socket in its directory, and the cluster DNS is 10.244.0.(10+S).
                          Kubeflow's and Kueue's operators read their certificates in mount
                          namespaces of their own. At most 32 nodes per cluster. Recorded as
                          KUBE_SLOT in DIR/cluster.env, which `down` reads; the caller keeps
                          two clusters out of one slot (tests: a lock per slot,
                          tests/src/env.rs).
  GPUSLICE_NODE_BIN_DIR   (--node) use containerd, ctr and containerd-shim-runc-v2 from here
  GPUSLICE_NODE_CACHE     (--node) their cache root (default /var/cache/gpuslice/node);
                          entries are <containerd version>-<hash of tests/node's go.mod and go.sum>/bin
  GPUSLICE_NERDCTL_BIN    (build-nerdctl) use this nerdctl instead of the cache
  GPUSLICE_NERDCTL_CACHE  (build-nerdctl) its cache root (default /var/cache/gpuslice/nerdctl);
                          entries are nerdctl-<version>-<hash of tests/nerdctl's files>/bin
  GPUSLICE_HELM_BIN       (build-helm) use this helm instead of the cache
  GPUSLICE_HELM_CACHE     (build-helm) its cache root (default /var/cache/gpuslice/helm);
                          entries are helm-<version>-<hash of tests/helm's go.mod and go.sum>/bin
  GPUSLICE_KUEUE_BIN_DIR  (--kueue, build-kueue) use the kueue binary in this directory (with
                          ../crd and ../webhook/manifests.yaml beside it) instead of the cache
  GPUSLICE_KUEUE_CACHE    (--kueue, build-kueue) its cache root (default
                          /var/cache/gpuslice/kueue); entries are
                          kueue-<version>-<hash of tests/kueue's go.mod and go.sum>
  GPUSLICE_BIN_DIR        (--node) gpuslice and gpuslice-runtime (default target/release, else
                          target/debug)
  GPUSLICE_COREDNS_CACHE  CoreDNS's cache root (default /var/cache/gpuslice/coredns)
  GPUSLICE_COREDNS_BIN    use this coredns instead of the cache
  GPUSLICE_KUBEFLOW_OPERATOR_CACHE, GPUSLICE_KUBEFLOW_TRAINER_CACHE
                          the Kubeflow builds' cache roots (default
                          /var/cache/gpuslice/kubeflow-training-operator, …/kubeflow-trainer)
  GPUSLICE_KUBEFLOW_INIT_IMAGE
                          (--kubeflow) the image of PyTorchJob workers' init container
                          (default upstream's docker.io/library/alpine:3.10)
  GPUSLICE_CONFIG         (--node) the node's gpuslice config; default: one written under
                          DIR/node/gpuslice for a simulated node with one NVIDIA H200 (141Gi),
                          whose CDI inventory is taken with the simulated driver of
                          GPUSLICE_SIM_DIR (default target/portable, else GPUSLICE_BIN_DIR)
  GPUSLICE_NODE_STATE_ROOT
                          (--node) a simulated node written here keeps its gpuslice state and
                          CDI specs in ROOT/<its directory's name>/{state,cdi} rather than under
                          its directory (the benchmarks put ROOT on /dev/shm, in memory as
                          /run/gpuslice and /var/run/cdi are on a node); the caller removes it
EOF
}

REPO="$(cd "$(dirname "$0")/.." && pwd)"
TIMEOUT="${GPUSLICE_KUBE_TIMEOUT:-240}"
# The clusters with nodes that may run on one machine at once, each in its slot
# (GPUSLICE_KUBE_SLOT): what they hold of the host is named and addressed per slot.
KUBE_SLOTS=4
# Components in start order; `down` stops them in reverse (after the node's).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

die() {
  echo "kube-cluster: $*" >&2
  exit 1
}

log() { echo "kube-cluster: $*" >&2; }

# shellcheck source=lib/gomodule.sh
. "$REPO/scripts/lib/gomodule.sh"
# shellcheck source=lib/cluster-build.sh
. "$REPO/scripts/lib/cluster-build.sh"
# shellcheck source=lib/cluster-process.sh
. "$REPO/scripts/lib/cluster-process.sh"
# shellcheck source=lib/cluster-pki.sh
. "$REPO/scripts/lib/cluster-pki.sh"
# shellcheck source=lib/cluster-control-plane.sh
. "$REPO/scripts/lib/cluster-control-plane.sh"
# shellcheck source=lib/cluster-pause-image.sh
. "$REPO/scripts/lib/cluster-pause-image.sh"
# shellcheck source=lib/cluster-node.sh
. "$REPO/scripts/lib/cluster-node.sh"
# shellcheck source=lib/cluster-webhook.sh
. "$REPO/scripts/lib/cluster-webhook.sh"
# shellcheck source=lib/cluster-restart.sh
. "$REPO/scripts/lib/cluster-restart.sh"
# shellcheck source=lib/cluster-kueue.sh
. "$REPO/scripts/lib/cluster-kueue.sh"
# shellcheck source=lib/cluster-nodes.sh
. "$REPO/scripts/lib/cluster-nodes.sh"
# shellcheck source=lib/cluster-dns.sh
. "$REPO/scripts/lib/cluster-dns.sh"
# shellcheck source=lib/cluster-kubeflow.sh
. "$REPO/scripts/lib/cluster-kubeflow.sh"

# --- up ---------------------------------------------------------------------------------------

# env_add KEY VALUE: records KEY=VALUE in DIR/cluster.env, as soon as it holds (a failed `up`
# leaves what it got to, for `down`).
env_add() {
  echo "$1=$2" >>"$DIR/cluster.env"
}

cmd_up() {
  [ $# -ge 1 ] || die "up needs a directory: scripts/kube-cluster.sh up DIR"
  DIR="$1"
  shift
  local node_specs=() webhook="" kueue="" dns="" kubeflow=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --node)
        [ $# -ge 2 ] || die "--node needs a node name: scripts/kube-cluster.sh up DIR --node NAME[=CONFIG]"
        [[ "${2%%=*}" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
          die "--node '${2%%=*}' is not a node name: lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit"
        node_spec_check "$2" "${node_specs[@]}"
        node_specs+=("$2")
        shift 2 ;;
      --webhook) webhook=1; shift ;;
      --kueue) kueue=1; shift ;;
      --dns) dns=1; shift ;;
      --kubeflow) kubeflow=1; dns=1; shift ;;
      --feature-gates)
        [[ $# -ge 2 && "$2" =~ ^[A-Za-z0-9]+=(true|false)(,[A-Za-z0-9]+=(true|false))*$ ]] ||
          die "--feature-gates needs a list Name=true|false,… (e.g. DRAConsumableCapacity=false), not '${2:-}'"
        FEATURE_GATES="$2"
        shift 2 ;;
      --emulated-version)
        [[ $# -ge 2 && "$2" =~ ^1\.[0-9]+$ ]] ||
          die "--emulated-version needs a release major.minor such as 1.34, not '${2:-}'"
        EMULATED_VERSION="$2"
        shift 2 ;;
      *) die "unknown argument to up: '$1' (accepted: DIR, --node NAME[=CONFIG] (repeatable), --feature-gates LIST, --emulated-version X.Y, --webhook, --kueue, --dns, --kubeflow)" ;;
    esac
  done
  KUBE_SLOT="${GPUSLICE_KUBE_SLOT:-0}"
  [[ "$KUBE_SLOT" =~ ^[0-$((KUBE_SLOTS - 1))]$ ]] ||
    die "GPUSLICE_KUBE_SLOT must be a slot from 0 to $((KUBE_SLOTS - 1)), not '$KUBE_SLOT'"
  local created=""
  [ -e "$DIR" ] || created=1
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  local c
  for c in "${COMPONENTS[@]}"; do
    if alive "$c"; then
      die "$DIR already runs a cluster ($c is pid $(cat "$DIR/pids/$c.pid")): run 'scripts/kube-cluster.sh down $DIR' first"
    fi
  done
  [ ${#node_specs[@]} -le "$MAX_NODES" ] || die "at most $MAX_NODES nodes in one cluster, not ${#node_specs[@]}"
  [ ${#node_specs[@]} -lt 2 ] || dns=1
  for c in pki etcd logs pids kubeconfigs kubeconfig cluster.env node webhook.yaml kueue coredns kubeflow; do
    [ ! -e "$DIR/$c" ] || die "$DIR/$c exists from an earlier run: run 'scripts/kube-cluster.sh down $DIR' first, or give an empty directory"
  done
  for c in openssl curl python3 setsid flock; do
    command -v "$c" >/dev/null || die "$c is missing: run scripts/install-deps.sh"
  done
  BIN="$(build_binaries)"
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/kubeconfigs"
  [ -z "$created" ] || : >"$DIR/pids/created-dir"
  echo "BIN_DIR=$BIN" >"$DIR/cluster.env"
  env_add KUBE_SLOT "$KUBE_SLOT"
  [ -z "${FEATURE_GATES:-}" ] || env_add FEATURE_GATES "$FEATURE_GATES"
  [ -z "${EMULATED_VERSION:-}" ] || env_add EMULATED_VERSION "$EMULATED_VERSION"

  make_pki
  start_etcd
  env_add ETCD_URL "$ETCD_URL"
  start_apiserver
  env_add API_URL "$API_URL"
  kubeconfig "$DIR/kubeconfig" admin
  wait_apiserver
  start_controller_manager
  env_add CONTROLLER_MANAGER_URL "https://127.0.0.1:$CONTROLLER_MANAGER_PORT"
  start_scheduler
  env_add SCHEDULER_URL "https://127.0.0.1:$SCHEDULER_PORT"
  wait_controllers
  log "control plane up: $API_URL, admin kubeconfig $DIR/kubeconfig"
  [ -z "$webhook" ] || up_webhook
  [ -z "$kueue" ] || up_kueue
  [ -z "$dns" ] || up_dns
  if [ ${#node_specs[@]} -eq 1 ]; then
    NODE_CONFIG_GIVEN=""
    [ "${node_specs[0]}" = "${node_specs[0]%%=*}" ] || NODE_CONFIG_GIVEN="${node_specs[0]#*=}"
    up_node "${node_specs[0]%%=*}"
  elif [ ${#node_specs[@]} -gt 1 ]; then
    up_nodes "${node_specs[@]}"
  fi
  [ -z "$kubeflow" ] || up_kubeflow
}

# node_spec_check SPEC EARLIER...: SPEC (NAME or NAME=CONFIG) names a node none of EARLIER
# names, and its CONFIG, when given, is a file.
node_spec_check() {
  local spec="$1" e
  shift
  for e in "$@"; do
    [ "${e%%=*}" != "${spec%%=*}" ] || die "--node ${spec%%=*} is given twice"
  done
  [ "$spec" = "${spec%%=*}" ] || [ -f "${spec#*=}" ] ||
    die "--node $spec: ${spec#*=} is not a file (NAME=CONFIG names the node's gpuslice config)"
}

# up_dns: the cluster DNS (scripts/lib/cluster-dns.sh) before any kubelet, which points its
# pods at it.
up_dns() {
  trap '[ -n "${DNS_UP:-}" ] || stop_all' EXIT
  start_dns
  env_add DNS_IP "$CLUSTER_DNS_IP"
  DNS_UP=1
  log "cluster DNS up: CoreDNS on $CLUSTER_DNS_IP:53 for $CLUSTER_DOMAIN"
}

# up_kubeflow: the Kubeflow operators (scripts/lib/cluster-kubeflow.sh).
up_kubeflow() {
  trap '[ -n "${KUBEFLOW_UP:-}" ] || stop_all' EXIT
  start_kubeflow
  env_add KUBEFLOW 1
  KUBEFLOW_UP=1
  log "Kubeflow up: training operator (PyTorchJob), JobSet, Trainer v2"
}

# up_webhook: the webhook (scripts/lib/cluster-webhook.sh), then its URL in DIR/cluster.env.
up_webhook() {
  trap '[ -n "${WEBHOOK_UP:-}" ] || stop_all' EXIT
  start_webhook
  env_add WEBHOOK_URL "$WEBHOOK_URL"
  WEBHOOK_UP=1
  trap - EXIT
  log "webhook up: $WEBHOOK_URL"
}

# up_kueue: Kueue (scripts/lib/cluster-kueue.sh), then its webhook URL in DIR/cluster.env.
up_kueue() {
  trap '[ -n "${KUEUE_UP:-}" ] || stop_all' EXIT
  start_kueue
  env_add KUEUE_WEBHOOK_URL "$KUEUE_WEBHOOK_URL"
  env_add KUEUE_BIN_DIR "$KUEUE_BIN"
  KUEUE_UP=1
  trap - EXIT
  log "kueue up: webhooks on $KUEUE_WEBHOOK_URL"
}

# up_node NAME: the node (scripts/lib/cluster-node.sh), then its paths in DIR/cluster.env.
up_node() {
  local name="$1"
  NODE="$DIR/node"
  # Whatever fails from here on (a build, a missing tool, a component) stops what `up` started.
  trap '[ -n "${NODE_UP:-}" ] || stop_all' EXIT
  start_node "$name"
  env_add NODE_NAME "$name"
  env_add NODE_DIR "$NODE"
  env_add NODE_BIN_DIR "$NODE_BIN"
  env_add CONTAINERD_SOCKET "$NODE/containerd/containerd.sock"
  env_add CONTAINERD_CONFIG "$NODE/containerd/config.toml"
  env_add CTR "$NODE_BIN/ctr"
  env_add KUBELET_ROOT "$NODE/kubelet"
  env_add KUBELET_CONFIG "$NODE/kubelet-config.yaml"
  env_add GPUSLICE_CONFIG "$NODE_CONFIG"
  env_add GPUSLICE_BIN_DIR "$GBIN"
  env_add PAUSE_IMAGE "$PAUSE_IMAGE"
  NODE_UP=1
  log "node $name up: kubelet on $KUBELET_ADDRESS, containerd $NODE/containerd/containerd.sock"
}

# --- down -------------------------------------------------------------------------------------

# stop_all: the node first (scripts/lib/cluster-node.sh), then the control plane in reverse.
stop_all() {
  local i
  stop_kubeflow
  stop_nodes
  stop_node
  stop_kueue
  stop_dns
  stop_webhook
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_one "${COMPONENTS[$i]}"
  done
}

cmd_down() {
  [ $# -eq 1 ] || die "down needs exactly one directory: scripts/kube-cluster.sh down DIR"
  [ -d "$1" ] || return 0
  DIR="$(cd "$1" && pwd)"
  BIN="$(sed -n 's/^BIN_DIR=//p' "$DIR/cluster.env" 2>/dev/null || true)"
  # The slot `up` ran in names what `down` removes of the host (a cluster.env without one: 0).
  KUBE_SLOT="$(sed -n 's/^KUBE_SLOT=//p' "$DIR/cluster.env" 2>/dev/null || true)"
  KUBE_SLOT="${KUBE_SLOT:-0}"
  # The operators first: they would recreate the pods the drain deletes.
  stop_kubeflow
  [ -z "$BIN" ] || drain_node
  stop_all
  local created=""
  [ ! -e "$DIR/pids/created-dir" ] || created=1
  rm -rf "$DIR/pki" "$DIR/etcd" "$DIR/etcd.url" "$DIR/logs" "$DIR/pids" "$DIR/kubeconfigs" \
    "$DIR/kubeconfig" "$DIR/cluster.env"
  # A directory `up` made goes too, unless someone put something else in it.
  [ -z "$created" ] || rmdir "$DIR" 2>/dev/null || true
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  build) shift; [ $# -eq 0 ] || die "build takes no arguments"; build_binaries ;;
  build-node) shift; [ $# -eq 0 ] || die "build-node takes no arguments"; build_node_binaries ;;
  build-nerdctl) shift; [ $# -eq 0 ] || die "build-nerdctl takes no arguments"; build_nerdctl_binary ;;
  build-helm) shift; [ $# -eq 0 ] || die "build-helm takes no arguments"; build_helm_binary ;;
  build-kueue) shift; [ $# -eq 0 ] || die "build-kueue takes no arguments"; build_kueue_binary ;;
  build-dns) shift; [ $# -eq 0 ] || die "build-dns takes no arguments"; build_coredns ;;
  build-kubeflow) shift; [ $# -eq 0 ] || die "build-kubeflow takes no arguments"; build_kubeflow ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "kube-cluster: unknown command '$1' (accepted: up, down, restart, build, build-node, build-nerdctl, build-helm, build-kueue, build-dns, build-kubeflow, --help)" >&2; exit 2 ;;
esac
