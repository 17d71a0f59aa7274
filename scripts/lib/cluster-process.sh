# How the test cluster runs its components: start one, tell whether it runs, wait for it, stop it.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh. Every component, of the control plane and of the node,
# is one process started here in its own session, its pid in DIR/pids/NAME.pid and its output
# in DIR/logs/NAME.log; `down` stops only those pids. Uses DIR, TIMEOUT, die, log and
# stop_all (stop what `up` started) of the sourcing script.

# free_port: a port of 127.0.0.1 that nothing listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME ARGS...: starts a component in its own session, stdin closed, output to its log.
start() {
  local name="$1"
  shift
  setsid "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

# start_bound NAME SOURCE TARGET ARGS...: `start`, in a mount namespace of its own in which
# SOURCE is bound on TARGET (an empty directory of the host, made here and left as a mount
# point): for a component that reads a path compiled into it, so that two clusters' copies,
# each in its own namespace, each read their own files. Needs root.
start_bound() {
  local name="$1" source="$2" target="$3"
  shift 3
  command -v unshare >/dev/null || die "unshare is missing: run scripts/install-deps.sh"
  mkdir -p "$target" 2>/dev/null || die "cannot create $target (the mount point of $name's files): run as root"
  start "$name" unshare --mount --propagation private -- \
    sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' "$source" "$target" "$@"
}

# running PID: the process exists and is not a zombie (a component that crashed while `up`,
# its parent, still runs stays a zombie until `up` exits).
running() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

# alive NAME: the component `up` recorded as NAME runs.
alive() {
  local pid
  pid="$(cat "$DIR/pids/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid"
}

# fail_up MESSAGE: a step of `up` failed: print MESSAGE, stop what `up` started, exit 1.
fail_up() {
  echo "kube-cluster: $*" >&2
  stop_all
  exit 1
}

# fail_component NAME WHY: fail_up, naming NAME and showing the tail of its log.
fail_component() {
  local name="$1" why="$2" log="$DIR/logs/$1.log" tail
  tail="$(tail -n 40 "$log" 2>/dev/null | sed 's/^/  | /')" || true
  fail_up "$name $why; last lines of $log:${tail:+$'\n'$tail}"
}

# logged NAME WHAT COMMAND...: runs a one-off step of `up`, its output to DIR/logs/NAME.log;
# when it fails, fail_up "WHAT failed: <that output>".
logged() {
  local name="$1" what="$2"
  shift 2
  "$@" >"$DIR/logs/$name.log" 2>&1 || fail_up "$what failed: $(cat "$DIR/logs/$name.log")"
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

# gone PID TRIES: PID has ended, waiting up to TRIES half-seconds for it.
gone() {
  local _
  for _ in $(seq 1 "$2"); do
    running "$1" || return 0
    sleep 0.5
  done
  ! running "$1"
}

# stop_one NAME: SIGTERM, then SIGKILL after 20 s, for the pid recorded in DIR/pids/NAME.pid,
# only while that pid is still the process `up` started (its command line names DIR).
stop_one() {
  local name="$1" file="$DIR/pids/$1.pid" pid
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/"; then
    kill -TERM "$pid" 2>/dev/null || true
    if ! gone "$pid" 40; then
      log "$name (pid $pid) did not stop on SIGTERM within 20 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      gone "$pid" 20 || die "$name (pid $pid) is still running after SIGKILL"
    fi
  fi
  rm -f "$file"
}
