# The control plane: etcd, API server, controller manager, scheduler: their flags, start and wait.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh, whose `up` calls these in order and records each
# endpoint in DIR/cluster.env. Every component listens on a free port of 127.0.0.1 and uses
# the credentials of scripts/lib/cluster-pki.sh. Uses DIR and BIN (the Kubernetes binaries)
# of the sourcing script and scripts/lib/cluster-process.sh, and its FEATURE_GATES and
# EMULATED_VERSION (`up … --feature-gates LIST --emulated-version X.Y`), passed to each
# component when set.

# version_flags: VERSION_FLAGS, the --feature-gates and --emulated-version flags `up` was given.
version_flags() {
  VERSION_FLAGS=()
  [ -z "${FEATURE_GATES:-}" ] || VERSION_FLAGS+=("--feature-gates=$FEATURE_GATES")
  [ -z "${EMULATED_VERSION:-}" ] || VERSION_FLAGS+=("--emulated-version=$EMULATED_VERSION")
}

# kubectl_admin ARGS...: kubectl as the cluster's admin (DIR/kubeconfig); each request gives up
# after KUBECTL_TIMEOUT (default 5s).
kubectl_admin() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout="${KUBECTL_TIMEOUT:-5s}" "$@"
}

# healthz PORT: the component on PORT of 127.0.0.1 answers https /healthz.
healthz() {
  curl -fsk --max-time 5 "https://127.0.0.1:$1/healthz"
}

# wait_healthz NAME PORT: until NAME answers /healthz on PORT (wait_for).
wait_healthz() {
  wait_for "$1" "answering /healthz on port $2" healthz "$2"
}

# start_etcd: etcd (in-process embed, tests/kube/cmd/etcd) with its data in DIR/etcd, on a
# port it picks and writes to DIR/etcd.url; returns once it serves, its URL in ETCD_URL.
start_etcd() {
  start etcd "$BIN/etcd" --data-dir "$DIR/etcd" --url-file "$DIR/etcd.url"
  wait_for etcd "serving" test -s "$DIR/etcd.url"
  ETCD_URL="$(cat "$DIR/etcd.url")"
}

# start_apiserver: kube-apiserver on a free port, its URL in API_URL (not waited for:
# wait_apiserver, once the admin kubeconfig names it).
start_apiserver() {
  local port
  port="$(free_port)"
  API_URL="https://127.0.0.1:$port"
  version_flags
  start kube-apiserver "$BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
    --etcd-servers="$ETCD_URL" \
    --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --client-ca-file="$DIR/pki/ca.crt" \
    --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$DIR/pki/sa.pub" \
    --service-account-signing-key-file="$DIR/pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    "${VERSION_FLAGS[@]}" \
    --profiling=false
}

# wait_apiserver: until the API server answers /readyz to the admin.
wait_apiserver() {
  wait_for kube-apiserver "answering /readyz on $API_URL" kubectl_admin get --raw /readyz
}

# start_controller NAME PORT ARGS...: NAME (kube-controller-manager or kube-scheduler) on PORT,
# reaching the API server, and delegating authentication and authorization to it, with its
# own kubeconfig DIR/kubeconfigs/NAME.kubeconfig (user NAME); ARGS are NAME's own flags.
start_controller() {
  local name="$1" port="$2" kc="$DIR/kubeconfigs/$1.kubeconfig"
  shift 2
  kubeconfig "$kc" "$name"
  version_flags
  start "$name" "$BIN/$name" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$port" --leader-elect=false \
    "$@" \
    "${VERSION_FLAGS[@]}" \
    --profiling=false
}

# start_controller_manager: kube-controller-manager on a free port (CONTROLLER_MANAGER_PORT),
# signing with the cluster CA and the service-account key.
start_controller_manager() {
  CONTROLLER_MANAGER_PORT="$(free_port)"
  start_controller kube-controller-manager "$CONTROLLER_MANAGER_PORT" \
    --root-ca-file="$DIR/pki/ca.crt" \
    --service-account-private-key-file="$DIR/pki/sa.key" \
    --cluster-signing-cert-file="$DIR/pki/ca.crt" --cluster-signing-key-file="$DIR/pki/ca.key" \
    --use-service-account-credentials=true
}

# start_scheduler: kube-scheduler on a free port (SCHEDULER_PORT).
start_scheduler() {
  SCHEDULER_PORT="$(free_port)"
  start_controller kube-scheduler "$SCHEDULER_PORT"
}

# wait_controllers: until the controller manager and the scheduler answer /healthz and pods
# can be created: the service-account controller has made `default` and the root CA
# publisher the namespace's kube-root-ca.crt.
wait_controllers() {
  wait_healthz kube-controller-manager "$CONTROLLER_MANAGER_PORT"
  wait_healthz kube-scheduler "$SCHEDULER_PORT"
  wait_for kube-controller-manager "creating the default service account" \
    kubectl_admin get serviceaccount default --namespace default
  wait_for kube-controller-manager "publishing kube-root-ca.crt" \
    kubectl_admin get configmap kube-root-ca.crt --namespace default
}
