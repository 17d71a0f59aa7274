#!/usr/bin/env bash
# OCI runtime conformance of gpuslice-runtime: runs every validation program of
# opencontainers/runtime-tools (pinned in tests/runtime-tools/go.mod, built once into a keyed
# cache by scripts/lib/gomodule.sh) against plain runc and against gpuslice-runtime wrapping
# that runc, and fails when gpuslice-runtime fails what runc passes. A container without
# gpuslice annotations goes through the wrapper unchanged: that is what this checks.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/oci-conformance.sh [COMMAND]

  run           (the default) Build the validation programs if the cache has none, then run
                each one against runc and against gpuslice-runtime (which execs that runc),
                several at a time (the cgroup tests, which share fixed cgroup paths, one at a
                time), each under a timeout. Prints a table: test, runc's result,
                gpuslice-runtime's result, verdict. Exits 1 when gpuslice-runtime fails a
                test point that runc passes. A program whose two results differ runs once
                more with each runtime, alone, and those results decide (the timing-bound
                programs fail now and then on a loaded machine, with either runtime).
                Failures both runtimes share are the host's own (its runc, kernel, cgroup
                version, or the program's own): listed, not counted. Needs root.
  build         Build the validation programs and runtimetest if the cache has none for
                tests/runtime-tools, and print the cache entry (bin/ and the test rootfs
                rootfs-<arch>.tar.gz).
  --help        This text.

A test's result: "ok N/N" (every point passed or skipped), "skip" (the whole program skipped
itself), "FAIL 2,3 of 3" (the points that failed), "timeout", "error (exit N)" (it stopped
without completing its TAP plan).

Environment:
  GPUSLICE_BIN_DIR              gpuslice and gpuslice-runtime (default target/release)
  GPUSLICE_SIM_DIR              the simulated driver for the wrapper's simulated node
                                (default GPUSLICE_BIN_DIR)
  GPUSLICE_RUNTIME_TOOLS_DIR    use this entry (bin/ and rootfs-<arch>.tar.gz) instead of the cache
  GPUSLICE_RUNTIME_TOOLS_CACHE  cache root (default /var/cache/gpuslice/runtime-tools); entries
                                are <runtime-tools version>-<hash of tests/runtime-tools' go.mod,
                                go.sum and the recipe>
  GPUSLICE_OCI_TESTS            run only these tests (names separated by spaces)
  GPUSLICE_OCI_TIMEOUT          seconds each test program may run (default 60)
  GPUSLICE_OCI_JOBS             test programs at once (default 4, at least 2)
  GPUSLICE_OCI_KEEP             copy every program's TAP output and stderr into this directory
EOF
}

REPO="$(cd "$(dirname "$0")/.." && pwd)"
RT_SRC="$REPO/tests/runtime-tools"
RT_MODULE=github.com/opencontainers/runtime-tools
RT_CACHE_ROOT="${GPUSLICE_RUNTIME_TOOLS_CACHE:-/var/cache/gpuslice/runtime-tools}"
TIMEOUT="${GPUSLICE_OCI_TIMEOUT:-60}"
JOBS="${GPUSLICE_OCI_JOBS:-4}"

die() {
  echo "oci-conformance: $*" >&2
  exit 1
}

log() { echo "oci-conformance: $*" >&2; }

# shellcheck source=lib/gomodule.sh
. "$REPO/scripts/lib/gomodule.sh"

# --- build ------------------------------------------------------------------------------------

# The validation programs: the tools of tests/runtime-tools/go.mod under validation/.
validation_tests() {
  awk '/^tool \(/ { t = 1; next } t && /^\)/ { t = 0 } t { print $1 }' "$RT_SRC/go.mod" |
    sed -n "s#^$RT_MODULE/validation/##p"
}

# What the programs run inside their containers, besides them.
RT_EXTRA=(runtimetest)

# rt_rootfs ENTRY: puts the test rootfs the programs unpack into every bundle into ENTRY:
# the module's own rootfs-<arch>.tar.gz (busybox), else one made from Debian's busybox-static.
rt_rootfs() {
  local entry="$1" arch dir
  arch="$("$GO" env GOARCH)"
  dir="$(cd "$RT_SRC" && "$GO" list -mod=readonly -m -f '{{.Dir}}' "$RT_MODULE")" || return 1
  if [ -f "$dir/rootfs-$arch.tar.gz" ]; then
    cp "$dir/rootfs-$arch.tar.gz" "$entry/" && chmod 644 "$entry/rootfs-$arch.tar.gz"
    return
  fi
  [ -x /bin/busybox ] || { log "$dir has no rootfs-$arch.tar.gz and /bin/busybox is missing: run scripts/install-deps.sh (busybox-static)"; return 1; }
  local root a
  root="$(mktemp -d)"
  chmod 755 "$root"
  mkdir -p "$root/bin" "$root/dev" "$root/proc" "$root/sys" "$root/etc" "$root/tmp"
  cp /bin/busybox "$root/bin/"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"; done
  echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
  echo "root:x:0:" >"$root/etc/group"
  tar -czf "$entry/rootfs-$arch.tar.gz" --numeric-owner -C "$root" . || { rm -rf "$root"; return 1; }
  rm -rf "$root"
}

# Prints the entry holding bin/ (the programs, runtimetest) and rootfs-<arch>.tar.gz.
build_suite() {
  local t tests=()
  mapfile -t tests < <(validation_tests)
  [ ${#tests[@]} -gt 0 ] || die "$RT_SRC/go.mod names no $RT_MODULE/validation/... tool"
  if [ -n "${GPUSLICE_RUNTIME_TOOLS_DIR:-}" ]; then
    for t in "${tests[@]}" "${RT_EXTRA[@]}"; do
      [ -x "$GPUSLICE_RUNTIME_TOOLS_DIR/bin/$t" ] || die "GPUSLICE_RUNTIME_TOOLS_DIR=$GPUSLICE_RUNTIME_TOOLS_DIR has no bin/$t"
    done
    echo "$GPUSLICE_RUNTIME_TOOLS_DIR"
    return
  fi
  local release key bin bins=()
  GO="$(gomodule_go)"
  release="$(gomodule_release "$RT_SRC" "$RT_MODULE")"
  [ -n "$release" ] || die "$RT_SRC/go.mod requires no $RT_MODULE version"
  # The recipe lines: a change to the flags or to rt_rootfs (rootfs v1) rebuilds.
  key="$(gomodule_key "$GO" "$RT_SRC" go.mod go.sum -- "-s -w" "CGO_ENABLED=0" "rootfs v1 $("$GO" env GOARCH)")"
  for t in "${tests[@]}" "${RT_EXTRA[@]}"; do bins+=(--bin "$t"); done
  bin="$(gomodule_build --go "$GO" --cache "$RT_CACHE_ROOT" --cache-var GPUSLICE_RUNTIME_TOOLS_CACHE \
    --entry "$release-$key" "${bins[@]}" --src "$RT_SRC" --env CGO_ENABLED=0 \
    --what "runtime-tools $release (${#tests[@]} validation programs, runtimetest)" \
    --failed "the runtime-tools validation programs" --post rt_rootfs -- \
    -mod=readonly -trimpath -ldflags "-s -w" tool)"
  dirname "$bin"
}

# --- run --------------------------------------------------------------------------------------

# The cgroup tests use fixed cgroup paths (/cgrouptest, testdir/cgrouptest/container,
# pids/cgrouptest): run one at a time, in a lane of their own.
alone() {
  case "$1" in
    linux_cgroups_* | delete_resources | delete_only_create_resources) return 0 ;;
    *) return 1 ;;
  esac
}

# run_one TEST RUNTIME: TEST against RUNTIME (runc or gpuslice-runtime), its TAP output in
# OUT/RUNTIME/TEST.tap, stderr in .err, exit status in .rc, wall time in .ms.
run_one() {
  local t="$1" rt="$2" o="$OUT/$2/$1" rc=0 t0
  t0=$(date +%s%N)
  local env=(TMPDIR="$WORK/tmp" RUNTIME="$RUNC")
  [ "$rt" = runc ] || env=(TMPDIR="$WORK/tmp" RUNTIME="$GBIN/gpuslice-runtime" GPUSLICE_CONFIG="$WORK/gpuslice/config.toml")
  (cd "$WORK/run" && exec env "${env[@]}" timeout -k 5 "$TIMEOUT" "$SUITE/bin/$t") >"$o.tap" 2>"$o.err" </dev/null || rc=$?
  echo "$rc" >"$o.rc"
  echo $((($(date +%s%N) - t0) / 1000000)) >"$o.ms"
}

# result TEST RUNTIME: "<what failed, space-separated>|<result text>" of one run: the numbers
# of the points that failed, D for an error the program reported in a diagnostic outside any
# point (the hook programs do so), T for a timeout, E for a program that stopped short of its
# plan. Some programs print several TAP streams (their plans add up); one that expects the
# runtime to refuse a config prints nothing and exits 0 when it does.
result() {
  local o="$OUT/$2/$1"
  awk -v rc="$(cat "$o.rc")" '
    function add(set, w) { return set (set == "" ? "" : " ") w }
    /^TAP version/ { last = "header"; next }
    /^1\.\.[0-9]+/ { plan += substr($1, 4) + 0; planned = 1; last = "plan"; next }
    /^(not )?ok [0-9]+/ {
      n++
      last = "point"
      if ($1 == "ok") { if ($0 ~ /# [Ss][Kk][Ii][Pp]/) skip++; next }
      if ($0 ~ /# [Tt][Oo][Dd][Oo]/) next
      fails = add(fails, $3)
      nfail++
      next
    }
    # A block outside a point is a diagnostic; it reports a failure when it has an error.
    /^  ---$/ { loose = last != "point"; last = "yaml"; next }
    /^  \.\.\.$/ { loose = 0; last = "yaml end"; next }
    loose && /^    "error": / { orphan++; loose = 0; next }
    /^Bail out!/ { bail = 1 }
    END {
      set = fails
      if (orphan) set = add(set, "D")
      if (rc == 124 || rc == 137) { print add(set, "T") "|timeout"; exit }
      if (n == 0 && !planned && rc == 0) { print "|ok (no TAP, exit 0)"; exit }
      short = bail || rc != 0 || !planned || n < plan
      if (short) set = add(set, "E")
      diag = orphan ? " + diagnostic" : ""
      if (nfail > 0) {
        f = fails
        gsub(/ /, ",", f)
        text = nfail <= 4 ? "FAIL " f " of " plan : "FAIL " nfail " of " plan
        print set "|" text diag (short ? ", stopped" : ""); exit
      }
      if (short) { print set "|error (exit " rc ")" diag; exit }
      if (orphan) { print set "|FAIL: diagnostic, " (n == 0 ? "no points" : n " points ok"); exit }
      if (n == 0) { print "|ok (no points)"; exit }
      if (n == 1 && skip == 1) { print "|skip"; exit }
      print "|ok " n "/" plan
    }' "$o.tap"
}

# subset A B: every word of A is a word of B.
subset() {
  local w
  for w in $1; do
    [[ " $2 " == *" $w "* ]] || return 1
  done
}

cleanup() {
  # Containers a timed-out program left behind: those whose bundle is under WORK.
  if [ -n "${WORK:-}" ] && [ -d "$WORK" ]; then
    local id
    for id in $("$RUNC" list -f json 2>/dev/null | jq -r --arg w "$WORK/" '.[]? | select(.bundle | startswith($w)) | .id' 2>/dev/null); do
      "$RUNC" delete --force "$id" >/dev/null 2>&1 || true
    done
    # Whatever is still mounted under WORK (and WORK itself), deepest first; the removal
    # then stays on WORK's own file system.
    local m
    while read -r m; do
      umount -l "$m" 2>/dev/null || true
    done < <(awk -v d="$WORK" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    rm -rf --one-file-system "$WORK"
  fi
  # The relative-cgroup programs leave their cgroup's parents (testdir/cgrouptest, under the
  # cgroup they ran in) behind: removed once empty (rmdir only: a busy one stays).
  local d
  while read -r d; do
    rmdir "$d" 2>/dev/null && rmdir "$(dirname "$d")" 2>/dev/null || true
  done < <(find /sys/fs/cgroup -maxdepth 8 -type d -path '*/testdir/cgrouptest' 2>/dev/null)
}

cmd_run() {
  [ "$(id -u)" = 0 ] || die "run as root: the validation programs create containers with runc"
  [[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "GPUSLICE_OCI_TIMEOUT='$TIMEOUT' is not a whole number of seconds (1 or more)"
  [[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "GPUSLICE_OCI_JOBS='$JOBS' is not a whole number (2 or more)"
  [ "$JOBS" -ge 2 ] || JOBS=2
  local c
  for c in runc jq timeout flock tar mount umount; do
    command -v "$c" >/dev/null || die "$c is missing: run scripts/install-deps.sh"
  done
  RUNC="$(command -v runc)"
  GBIN="${GPUSLICE_BIN_DIR:-$REPO/target/release}"
  [ -x "$GBIN/gpuslice-runtime" ] && [ -x "$GBIN/gpuslice" ] ||
    die "$GBIN has no gpuslice and gpuslice-runtime: build them (cargo build --release) or set GPUSLICE_BIN_DIR"
  GBIN="$(cd "$GBIN" && pwd)"
  local t0=$SECONDS
  SUITE="$(build_suite)"
  local arch tests=() t
  arch="$(ls "$SUITE" | sed -n 's/^rootfs-\(.*\)\.tar\.gz$/\1/p' | head -n 1)"
  [ -n "$arch" ] || die "$SUITE has no rootfs-<arch>.tar.gz"
  if [ -n "${GPUSLICE_OCI_TESTS:-}" ]; then
    for t in $GPUSLICE_OCI_TESTS; do
      [ -x "$SUITE/bin/$t" ] || die "GPUSLICE_OCI_TESTS names '$t', which is no validation program (accepted: $(validation_tests | tr '\n' ' '))"
      tests+=("$t")
    done
  else
    mapfile -t tests < <(validation_tests)
  fi

  WORK="$(mktemp -d /tmp/gpuslice-oci.XXXXXX)"
  trap cleanup EXIT
  # The bundles live under WORK, made a private mount of its own: a program that asks for
  # rootfsPropagation "shared" (linux_rootfs_propagation) would otherwise propagate the
  # container's rootfs, /proc, /sys and /dev mounts into the host's mount namespace.
  mount --bind "$WORK" "$WORK" && mount --make-private "$WORK" || die "cannot make $WORK a private mount"
  OUT="$WORK/out"
  mkdir -p "$WORK/run" "$WORK/tmp" "$OUT/runc" "$OUT/gpuslice-runtime" "$WORK/gpuslice/state" "$WORK/gpuslice/cdi"
  # The programs unpack ./rootfs-<arch>.tar.gz and copy ./runtimetest into each bundle.
  cp "$SUITE/rootfs-$arch.tar.gz" "$SUITE/bin/runtimetest" "$WORK/run/"
  # gpuslice-runtime's node: a simulated GPU, its own state and CDI directories, and the
  # same runc underneath.
  local sim="${GPUSLICE_SIM_DIR:-$GBIN}"
  cat >"$WORK/gpuslice/config.toml" <<TOML
# Written by scripts/oci-conformance.sh: a simulated GPU node for gpuslice-runtime.
state_dir = "$WORK/gpuslice/state"
[shim]
library = "$sim/libgpuslice_shim.so"
[cdi]
spec_dir = "$WORK/gpuslice/cdi"
[inventory]
source = "simulated"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
[runtime]
path = "$RUNC"
TOML
  "$GBIN/gpuslice" --config "$WORK/gpuslice/config.toml" cdi generate --sim-driver "$sim" >"$WORK/cdi-generate.log" 2>&1 ||
    die "gpuslice cdi generate failed: $(cat "$WORK/cdi-generate.log")"

  log "${#tests[@]} validation programs against $RUNC and $GBIN/gpuslice-runtime, $JOBS at once, ${TIMEOUT} s each"
  # The alone lane runs in the background, one program at a time; the others share the
  # remaining slots.
  local lane=()
  for t in "${tests[@]}"; do
    if alone "$t"; then lane+=("$t"); fi
  done
  (for t in "${lane[@]}"; do run_one "$t" runc; run_one "$t" gpuslice-runtime; done) &
  for t in "${tests[@]}"; do
    alone "$t" && continue
    local rt
    for rt in runc gpuslice-runtime; do
      while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
      run_one "$t" "$rt" &
    done
  done
  wait

  # Verdicts. A test whose two results differ runs once more with each runtime, alone (a
  # loaded machine makes the timing-bound programs, killsig and kill among them, fail with
  # either runtime now and then; a runc failure must not hide one of gpuslice-runtime's),
  # and the second results decide.
  local verdicts=() regressions=() host=() once=() reruns=() r g rs gs v
  for t in "${tests[@]}"; do
    r="$(result "$t" runc)"
    g="$(result "$t" gpuslice-runtime)"
    rs="${r%%|*}"
    gs="${g%%|*}"
    v=""
    if [ "$rs" != "$gs" ]; then
      local first="first run: runc ${r#*|}, gpuslice-runtime ${g#*|}"
      reruns+=("$t ($first)")
      subset "$gs" "$rs" || once+=("$t")
      run_one "$t" runc
      run_one "$t" gpuslice-runtime
      r="$(result "$t" runc)"
      g="$(result "$t" gpuslice-runtime)"
      rs="${r%%|*}"
      gs="${g%%|*}"
      v="run again alone ($first); "
    fi
    if ! subset "$gs" "$rs"; then
      regressions+=("$t")
      v="${v}FAILED: gpuslice-runtime fails what runc passes"
    elif [ -n "$rs" ]; then
      host+=("$t")
      v="${v}the host's own (runc fails it too)"
    else
      v="${v%; }"
    fi
    verdicts+=("$t|${r#*|}|${g#*|}|$v")
  done

  if [ -n "${GPUSLICE_OCI_KEEP:-}" ]; then
    mkdir -p "$GPUSLICE_OCI_KEEP" && cp -r "$OUT/." "$GPUSLICE_OCI_KEEP/" ||
      log "could not copy the outputs to GPUSLICE_OCI_KEEP=$GPUSLICE_OCI_KEEP"
  fi

  echo
  echo "== OCI runtime conformance: runtime-tools $(basename "$SUITE"), $("$RUNC" --version | head -n 1), gpuslice-runtime of $GBIN"
  printf '%-32s %-30s %-30s %s\n' test runc gpuslice-runtime verdict
  local line
  for line in "${verdicts[@]}"; do
    IFS='|' read -r t r g v <<<"$line"
    printf '%-32s %-30s %-30s %s\n' "$t" "$r" "$g" "$v"
  done
  echo
  echo "${#tests[@]} programs in $((SECONDS - t0)) s: $((${#tests[@]} - ${#regressions[@]} - ${#host[@]})) pass with both runtimes," \
    "${#host[@]} fail with runc too (the host's own), ${#regressions[@]} fail with gpuslice-runtime only"
  [ ${#host[@]} -eq 0 ] || echo "the host's own failures: ${host[*]}"
  [ ${#reruns[@]} -eq 0 ] || printf 'run again, alone, as the two results differed: %s\n' "${reruns[@]}"
  local o
  for o in "${once[@]}"; do
    [[ " ${regressions[*]} " == *" $o "* ]] || echo "failed with gpuslice-runtime only once, not when run again: $o"
  done
  if [ ${#regressions[@]} -gt 0 ]; then
    echo "FAILED with gpuslice-runtime only: ${regressions[*]}"
    for t in "${regressions[@]}"; do
      echo "--- $t with gpuslice-runtime: the points that failed"
      awk '/^not ok [0-9]+/ { p = 1; c = 0 } /^ok [0-9]+|^1\.\./ { p = 0 } p && c++ < 12' "$OUT/gpuslice-runtime/$t.tap"
      tail -n 5 "$OUT/gpuslice-runtime/$t.err" | sed 's/^/  stderr | /'
    done
    return 1
  fi
}

case "${1:-run}" in
  run) shift || true; [ $# -eq 0 ] || die "run takes no arguments"; cmd_run ;;
  build) shift; [ $# -eq 0 ] || die "build takes no arguments"; build_suite ;;
  -h | --help | help) usage ;;
  *) echo "oci-conformance: unknown command '$1' (accepted: run, build, --help)" >&2; exit 2 ;;
esac
