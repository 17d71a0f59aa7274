# `restart DIR [--feature-gates LIST]`: what a cluster upgrade or a feature-gate flip does to
# the test cluster, in an upgrade's order: the control plane first, then the node's kubelet,
# then the gpuslice kubelet plugin (a DaemonSet rolled last); the node's two are stopped while
# the API server restarts.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh. Each component is stopped by its recorded pid and started
# again with the command line it ran (so its ports, certificates and files stay), only its
# --feature-gates replaced; its log is appended to. etcd, containerd and the containers the
# node runs are not touched: the cluster's objects and the running pods stay. Uses DIR, BIN,
# TIMEOUT, die and log of the sourcing script, scripts/lib/cluster-process.sh (start's pid
# files, alive, stop_one, wait_for), cluster-control-plane.sh (kubectl_admin, wait_apiserver,
# wait_healthz) and cluster-node.sh (node_ready, node_slice).

# env_get KEY: KEY's value in DIR/cluster.env (empty when absent).
env_get() {
  sed -n "s/^$1=//p" "$DIR/cluster.env" | tail -n 1
}

# env_set KEY VALUE: KEY=VALUE in DIR/cluster.env in place of any earlier KEY (none when VALUE is
# empty), the file replaced whole (tests read it).
env_set() {
  local tmp="$DIR/.cluster.env.tmp"
  grep -v "^$1=" "$DIR/cluster.env" >"$tmp" || true
  [ -z "$2" ] || echo "$1=$2" >>"$tmp"
  mv -f "$tmp" "$DIR/cluster.env"
}

# url_port URL: the port of https://127.0.0.1:PORT.
url_port() {
  echo "${1##*:}"
}

# stop_keeping NAME GATES: stops NAME (stop_one), keeping the command line it ran in
# DIR/pids/NAME.argv (NUL-separated), its --feature-gates now GATES (dropped when GATES is
# empty: the release's defaults).
stop_keeping() {
  local name="$1" gates="$2" pid arg
  pid="$(cat "$DIR/pids/$name.pid" 2>/dev/null)" || die "$name was not started by 'up $DIR' (no $DIR/pids/$name.pid)"
  alive "$name" || die "$name (pid $pid) is not running: 'scripts/kube-cluster.sh down $DIR' and 'up' again"
  local -a argv=()
  mapfile -d '' argv <"/proc/$pid/cmdline"
  {
    for arg in "${argv[@]}"; do
      case "$arg" in
        --feature-gates=*) ;;
        *) printf '%s\0' "$arg" ;;
      esac
    done
    [ -z "$gates" ] || printf '%s\0' "--feature-gates=$gates"
  } >"$DIR/pids/$name.argv"
  stop_one "$name"
}

# start_again NAME: starts NAME with the command line stop_keeping kept, in its own session,
# output appended to DIR/logs/NAME.log, its new pid where `down` finds it.
start_again() {
  local name="$1"
  local -a argv=()
  mapfile -d '' argv <"$DIR/pids/$name.argv"
  rm -f "$DIR/pids/$name.argv"
  setsid "${argv[@]}" </dev/null >>"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

# restart_component NAME GATES: stop_keeping, then start_again.
restart_component() {
  stop_keeping "$1" "$2"
  start_again "$1"
}

# kubelet_healthz: the restarted kubelet answers on its healthz port (DIR/node/kubelet-config.yaml).
kubelet_healthz() {
  local port
  port="$(sed -n 's/^healthzPort: //p' "$DIR/node/kubelet-config.yaml")"
  curl -fs --max-time 5 "http://127.0.0.1:$port/healthz"
}

# log_since NAME LINES PATTERN: a line after the first LINES of DIR/logs/NAME.log matches PATTERN.
log_since() {
  tail -n +"$(($2 + 1))" "$DIR/logs/$1.log" | grep -q "$3"
}

cmd_restart() {
  [ $# -ge 1 ] || die "restart needs a directory: scripts/kube-cluster.sh restart DIR [--feature-gates LIST]"
  DIR="$1"
  shift
  local gates=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --feature-gates)
        [[ $# -ge 2 && "$2" =~ ^[A-Za-z0-9]+=(true|false)(,[A-Za-z0-9]+=(true|false))*$ ]] ||
          die "--feature-gates needs a list Name=true|false,… (e.g. DRAConsumableCapacity=true), not '${2:-}'"
        gates="$2"
        shift 2 ;;
      *) die "unknown argument to restart: '$1' (accepted: DIR, --feature-gates LIST)" ;;
    esac
  done
  [ -f "$DIR/cluster.env" ] || die "$DIR has no cluster.env: start it with 'scripts/kube-cluster.sh up $DIR' first"
  ! grep -q '^NODES=' "$DIR/cluster.env" || die "restart handles a cluster of one node; $DIR has several (NODES in its cluster.env)"
  DIR="$(cd "$DIR" && pwd)"
  # shellcheck disable=SC2034 # BIN: the Kubernetes binaries kubectl_admin runs
  BIN="$(env_get BIN_DIR)"
  API_URL="$(env_get API_URL)"
  # A failed step says so and leaves the cluster for `down` (fail_up stops nothing here).
  # shellcheck disable=SC2317 # called by fail_up (scripts/lib/cluster-process.sh)
  stop_all() { :; }
  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    alive "$c" || die "$c is not running in $DIR: 'scripts/kube-cluster.sh down $DIR' and 'up' again"
  done
  env_set FEATURE_GATES "$gates"

  local name
  name="$(env_get NODE_NAME)"
  # Everything that talks to the API server stops first: none acts with the old gates against
  # the new API server, and an API server with clients still attached waits for them at
  # shutdown (20 s here). The controllers start once it serves (they exit when it cannot be
  # reached at start), then the kubelet, then the plugin (a DaemonSet rolled last).
  if [ -n "$name" ]; then
    stop_keeping gpuslice-kubelet-plugin ""
    stop_keeping kubelet "$gates"
  fi
  stop_keeping kube-scheduler "$gates"
  stop_keeping kube-controller-manager "$gates"
  restart_component kube-apiserver "$gates"
  wait_apiserver
  start_again kube-controller-manager
  start_again kube-scheduler
  wait_healthz kube-controller-manager "$(url_port "$(env_get CONTROLLER_MANAGER_URL)")"
  wait_healthz kube-scheduler "$(url_port "$(env_get SCHEDULER_URL)")"
  log "control plane restarted${gates:+ with --feature-gates=$gates}: $API_URL"
  [ -n "$name" ] || return 0

  start_again kubelet
  wait_for kubelet "answering /healthz" kubelet_healthz
  wait_for kubelet "making Node $name Ready" node_ready "$name"
  # The plugin's new process, registered by the kubelet and publishing in the mode it finds.
  local lines
  lines="$(wc -l <"$DIR/logs/gpuslice-kubelet-plugin.log")"
  start_again gpuslice-kubelet-plugin
  wait_for gpuslice-kubelet-plugin "being registered by the kubelet" \
    log_since gpuslice-kubelet-plugin "$lines" "registered with the kubelet"
  wait_for gpuslice-kubelet-plugin "publishing the ResourceSlice of $name" node_slice "$name"
  log "node $name restarted: kubelet${gates:+ with --feature-gates=$gates}, gpuslice kubelet-plugin"
}
