#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for tests and demos (DESIGN §7): etcd (in-process
# embed), kube-apiserver, kube-scheduler and kube-controller-manager of the release pinned in
# tests/kube/go.mod, built from its Go modules and cached outside the checkout.
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
  up DIR --node NAME
                (not yet: a kubelet and containerd 2.x for the local machine come later)
  down DIR      Stop what `up DIR` started (only the pids it recorded) and remove what it
                wrote. Idempotent: a second call, or one for a DIR never used, does nothing.
  build         Build the binaries if the cache has none for the current sources, and print
                their directory (kube-apiserver, kube-scheduler, kube-controller-manager,
                kubectl, kubelet, etcd).
  --help        This text.

Environment:
  GPUSLICE_KUBE_BIN_DIR   use the binaries in this directory instead of the cache
  GPUSLICE_KUBE_CACHE     cache root (default /var/cache/gpuslice/kube); entries are
                          <release>-<hash of tests/kube's go.mod, go.sum and sources>/bin
  GPUSLICE_KUBE_TIMEOUT   seconds `up` waits for each component (default 240)
EOF
}

REPO="$(cd "$(dirname "$0")/.." && pwd)"
KUBE_SRC="$REPO/tests/kube"
CACHE_ROOT="${GPUSLICE_KUBE_CACHE:-/var/cache/gpuslice/kube}"
TIMEOUT="${GPUSLICE_KUBE_TIMEOUT:-240}"
# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd)

die() {
  echo "kube-cluster: $*" >&2
  exit 1
}

log() { echo "kube-cluster: $*" >&2; }

# --- build ------------------------------------------------------------------------------------

find_go() {
  local g
  for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
    if [ -n "$g" ] && [ -x "$g" ]; then
      echo "$g"
      return
    fi
  done
  die "no Go toolchain found (go on PATH or /usr/local/go/bin/go): run scripts/install-deps.sh"
}

k8s_release() {
  awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$KUBE_SRC/go.mod"
}

# How the binaries are built; part of the cache key, so a change here rebuilds.
build_ldflags() {
  local release="$1" v=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  local major minor
  major="${release#v}"
  major="${major%%.*}"
  minor="${release#v*.}"
  minor="${minor%%.*}"
  local x f
  x=""
  for f in "$v" "$c"; do
    x="$x -X $f.gitVersion=$release -X $f.gitMajor=$major -X $f.gitMinor=$minor -X $f.gitTreeState=clean"
  done
  echo "-s -w$x"
}

cache_key() {
  local go="$1" release="$2"
  {
    (cd "$KUBE_SRC" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum)
    build_ldflags "$release"
    printf '%s\n' "${BINARIES[@]}"
    "$go" version
  } | sha256sum | cut -c1-16
}

# Prints the cached bin directory, building it first when missing.
build_binaries() {
  if [ -n "${GPUSLICE_KUBE_BIN_DIR:-}" ]; then
    check_bin_dir "$GPUSLICE_KUBE_BIN_DIR"
    echo "$GPUSLICE_KUBE_BIN_DIR"
    return
  fi
  local go release key entry
  go="$(find_go)"
  release="$(k8s_release)"
  [ -n "$release" ] || die "$KUBE_SRC/go.mod requires no k8s.io/kubernetes version"
  key="$(cache_key "$go" "$release")"
  entry="$CACHE_ROOT/$release-$key"
  if [ -d "$entry/bin" ]; then
    echo "$entry/bin"
    return
  fi
  mkdir -p "$CACHE_ROOT" || die "cannot create the cache $CACHE_ROOT (set GPUSLICE_KUBE_CACHE to a writable directory)"
  # One build at a time per cache; a second caller waits and then finds the entry.
  exec 9>"$CACHE_ROOT/.lock"
  flock 9
  if [ ! -d "$entry/bin" ]; then
    local tmp start
    tmp="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
    chmod 755 "$tmp"
    start=$(date +%s)
    log "building Kubernetes $release control-plane binaries and kubelet into $entry (first run only)"
    if ! (cd "$KUBE_SRC" && "$go" build -mod=readonly -trimpath -ldflags "$(build_ldflags "$release")" -o "$tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
      k8s.io/kubernetes/cmd/kubelet ./cmd/etcd) >&2; then
      rm -rf "$tmp"
      die "building the Kubernetes binaries from $KUBE_SRC failed (see above)"
    fi
    mv "$tmp" "$entry"
    # Older entries are for sources no longer checked out here: drop them.
    find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d ! -path "$entry" -exec rm -rf {} +
    log "built in $(($(date +%s) - start)) s"
  fi
  flock -u 9
  exec 9>&-
  check_bin_dir "$entry/bin"
  echo "$entry/bin"
}

check_bin_dir() {
  local b
  for b in "${BINARIES[@]}"; do
    [ -x "$1/$b" ] || die "$1/$b is missing (GPUSLICE_KUBE_BIN_DIR or the cache holds an incomplete build)"
  done
}

# --- up ---------------------------------------------------------------------------------------

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ossl ARGS...: openssl, quiet unless it fails.
ossl() {
  local out
  out="$(openssl "$@" 2>&1)" || die "openssl $* failed: $out"
}

# gen_key FILE: an EC P-256 private key.
gen_key() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$1"
}

# sign NAME SUBJECT EXTENSIONS: DIR/pki/NAME.{key,crt} signed by the cluster CA.
sign() {
  local name="$1" subj="$2" ext="$3" pki="$DIR/pki"
  gen_key "$pki/$name.key"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  ossl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$pki/$name.ext" \
    -out "$pki/$name.crt"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

make_pki() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  gen_key "$pki/ca.key"
  ossl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpuslice-test-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt"
  local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  sign apiserver "/CN=kube-apiserver" "$server"
  sign admin "/O=system:masters/CN=kubernetes-admin" "$client"
  sign kube-scheduler "/CN=system:kube-scheduler" "$client"
  sign kube-controller-manager "/CN=system:kube-controller-manager" "$client"
  sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  gen_key "$pki/sa.key"
  ossl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
}

# kubeconfig FILE USER: a kubeconfig for the API server with DIR/pki/USER.{crt,key}.
kubeconfig() {
  local file="$1" user="$2" k=("$BIN/kubectl" --kubeconfig "$1")
  "${k[@]}" config set-cluster gpuslice-test --server "$API_URL" \
    --certificate-authority "$DIR/pki/ca.crt" --embed-certs >/dev/null
  "${k[@]}" config set-credentials "$user" --client-certificate "$DIR/pki/$user.crt" \
    --client-key "$DIR/pki/$user.key" --embed-certs >/dev/null
  "${k[@]}" config set-context gpuslice-test --cluster gpuslice-test --user "$user" >/dev/null
  "${k[@]}" config use-context gpuslice-test >/dev/null
  chmod 600 "$file"
}

# start NAME ARGS...: starts a component in its own session, stdin closed, output to its log.
start() {
  local name="$1"
  shift
  setsid "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

# running PID: the process exists and is not a zombie (a component that crashed while `up`,
# its parent, still runs stays a zombie until `up` exits).
running() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

alive() {
  local pid
  pid="$(cat "$DIR/pids/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid"
}

fail_component() {
  local name="$1" why="$2"
  {
    echo "kube-cluster: $name $why; last lines of $DIR/logs/$name.log:"
    tail -n 40 "$DIR/logs/$name.log" 2>/dev/null | sed 's/^/  | /'
  } >&2
  stop_all
  exit 1
}

# wait_for NAME WHAT COMMAND...: until COMMAND succeeds, NAME still runs, and TIMEOUT allows.
wait_for() {
  local name="$1" what="$2"
  shift 2
  local deadline=$(($(date +%s) + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || fail_component "$name" "exited before $what"
    [ "$(date +%s)" -lt "$deadline" ] || fail_component "$name" "did not get to $what within $TIMEOUT s"
    sleep 0.5
  done
}

healthz() {
  curl -fsk --max-time 5 "https://127.0.0.1:$1/healthz"
}

kubectl_admin() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout=5s "$@"
}

cmd_up() {
  [ $# -ge 1 ] || die "up needs a directory: scripts/kube-cluster.sh up DIR"
  DIR="$1"
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --node)
        die "up --node is not available yet: a kubelet and containerd 2.x for the local machine come with the node issue; 'up DIR' starts the control plane only" ;;
      *) die "unknown argument to up: '$1' (accepted: DIR, later --node NAME)" ;;
    esac
  done
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
  for c in pki etcd logs pids kubeconfigs kubeconfig cluster.env; do
    [ ! -e "$DIR/$c" ] || die "$DIR/$c exists from an earlier run: run 'scripts/kube-cluster.sh down $DIR' first, or give an empty directory"
  done
  for c in openssl curl python3 setsid flock; do
    command -v "$c" >/dev/null || die "$c is missing: run scripts/install-deps.sh"
  done
  BIN="$(build_binaries)"
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/kubeconfigs"
  [ -z "$created" ] || : >"$DIR/pids/created-dir"
  echo "BIN_DIR=$BIN" >"$DIR/cluster.env"

  make_pki

  start etcd "$BIN/etcd" --data-dir "$DIR/etcd" --url-file "$DIR/etcd.url"
  wait_for etcd "serving" test -s "$DIR/etcd.url"
  local etcd_url
  etcd_url="$(cat "$DIR/etcd.url")"
  echo "ETCD_URL=$etcd_url" >>"$DIR/cluster.env"

  local api_port
  api_port="$(free_port)"
  API_URL="https://127.0.0.1:$api_port"
  start kube-apiserver "$BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="$etcd_url" \
    --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --client-ca-file="$DIR/pki/ca.crt" \
    --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$DIR/pki/sa.pub" \
    --service-account-signing-key-file="$DIR/pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --profiling=false
  echo "API_URL=$API_URL" >>"$DIR/cluster.env"
  kubeconfig "$DIR/kubeconfig" admin
  wait_for kube-apiserver "answering /readyz on $API_URL" kubectl_admin get --raw /readyz

  local cm_port sched_port
  cm_port="$(free_port)"
  kubeconfig "$DIR/kubeconfigs/kube-controller-manager.kubeconfig" kube-controller-manager
  local kc="$DIR/kubeconfigs/kube-controller-manager.kubeconfig"
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$cm_port" --leader-elect=false \
    --root-ca-file="$DIR/pki/ca.crt" \
    --service-account-private-key-file="$DIR/pki/sa.key" \
    --cluster-signing-cert-file="$DIR/pki/ca.crt" --cluster-signing-key-file="$DIR/pki/ca.key" \
    --use-service-account-credentials=true \
    --profiling=false
  echo "CONTROLLER_MANAGER_URL=https://127.0.0.1:$cm_port" >>"$DIR/cluster.env"

  sched_port="$(free_port)"
  kubeconfig "$DIR/kubeconfigs/kube-scheduler.kubeconfig" kube-scheduler
  kc="$DIR/kubeconfigs/kube-scheduler.kubeconfig"
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false \
    --profiling=false
  echo "SCHEDULER_URL=https://127.0.0.1:$sched_port" >>"$DIR/cluster.env"

  wait_for kube-controller-manager "answering /healthz on port $cm_port" healthz "$cm_port"
  wait_for kube-scheduler "answering /healthz on port $sched_port" healthz "$sched_port"
  # Pods can be created once the service-account controller has made `default` and the
  # root CA publisher the namespace's kube-root-ca.crt.
  wait_for kube-controller-manager "creating the default service account" \
    kubectl_admin get serviceaccount default --namespace default
  wait_for kube-controller-manager "publishing kube-root-ca.crt" \
    kubectl_admin get configmap kube-root-ca.crt --namespace default
  log "control plane up: $API_URL, admin kubeconfig $DIR/kubeconfig"
}

# --- down -------------------------------------------------------------------------------------

# stop_one NAME: SIGTERM, then SIGKILL after 20 s, for the pid recorded in DIR/pids/NAME.pid,
# only while that pid is still the process `up` started (its command line names DIR).
stop_one() {
  local name="$1" file="$DIR/pids/$1.pid" pid i
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 40); do
      running "$pid" || break
      sleep 0.5
    done
    if running "$pid"; then
      log "$name (pid $pid) did not stop on SIGTERM within 20 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 20); do
        running "$pid" || break
        sleep 0.5
      done
    fi
    running "$pid" && die "$name (pid $pid) is still running after SIGKILL"
  fi
  rm -f "$file"
}

stop_all() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_one "${COMPONENTS[$i]}"
  done
}

cmd_down() {
  [ $# -eq 1 ] || die "down needs exactly one directory: scripts/kube-cluster.sh down DIR"
  [ -d "$1" ] || return 0
  DIR="$(cd "$1" && pwd)"
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
  build) shift; [ $# -eq 0 ] || die "build takes no arguments"; build_binaries ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "kube-cluster: unknown command '$1' (accepted: up, down, build, --help)" >&2; exit 2 ;;
esac
