#!/usr/bin/env bash
# Training run for the profile-guided build of the static create-path binaries
# (scripts/build-static.sh): drives instrumented `gpuslice` and `gpuslice-runtime` through
# what a container's life asks of them on a simulated 8-GPU node with 100 live reservations,
# so that the profile matches the benchmark in docs/benchmarks.md ("Create path"):
#   - `gpuslice hook precreate` and `hook create-runtime` (the 100 reservations);
#   - `gpuslice-runtime create` of an annotated bundle (the spec edit), of a plain one
#     (untouched), then `start` and `delete` (pass-through);
#   - `hook create-runtime` and `hook poststop` of each created container.
# No container runs: the configured runtime does not exist, so the wrapper stops with an
# error where it would execute runc (an exec would also discard the profile, which is written
# at exit). Needs root (the simulated node's device nodes).
#
#   scripts/lib/pgo-train.sh INSTRUMENTED_DIR FULL_GPUSLICE PORTABLE_DIR
set -euo pipefail
bin=$1 full=$2 portable=$3
work=$(mktemp -d /dev/shm/gpuslice-pgo-train.XXXXXX)
holder=
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

. "$(dirname "$0")/bench-node.sh"
{
  bench_node_config "$work" "$portable"
  echo "[runtime]"
  echo "path = \"$work/no-runtime\""
} > "$work/config.toml"
export GPUSLICE_CONFIG=$work/config.toml
"$full" cdi generate --sim-driver "$portable" >/dev/null

reservation_of() { grep -o '"gpuslice.io/reservation":"[0-9a-f]*"' "$1" | cut -d'"' -f4; }

sleep 600 & holder=$!
for i in $(seq 100); do
  echo '{"annotations":{"gpuslice.io/memory":"1Gi","gpuslice.io/cores":"5"}}' \
    | "$bin/gpuslice" hook precreate > "$work/pre.json"
  echo "{\"id\":\"holder-$i\",\"pid\":$holder}" \
    | "$bin/gpuslice" hook create-runtime --reservation "$(reservation_of "$work/pre.json")"
done

# A bundle's config.json as `runc spec` writes it, with and without a slice request.
mkdir -p "$work/bundle"
cat > "$work/plain.json" <<'JSON'
{"ociVersion":"1.0.2-dev","process":{"terminal":false,"user":{"uid":0,"gid":0},"args":["/bin/true"],"env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","TERM=xterm"],"cwd":"/","capabilities":{"bounding":["CAP_AUDIT_WRITE","CAP_KILL","CAP_NET_BIND_SERVICE"],"effective":["CAP_AUDIT_WRITE","CAP_KILL","CAP_NET_BIND_SERVICE"],"permitted":["CAP_AUDIT_WRITE","CAP_KILL","CAP_NET_BIND_SERVICE"],"ambient":["CAP_AUDIT_WRITE","CAP_KILL","CAP_NET_BIND_SERVICE"]},"rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}],"noNewPrivileges":true},"root":{"path":"rootfs","readonly":true},"hostname":"runc","mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","strictatime","mode=755","size=65536k"]},{"destination":"/dev/pts","type":"devpts","source":"devpts","options":["nosuid","noexec","newinstance","ptmxmode=0666","mode=0620","gid=5"]},{"destination":"/dev/shm","type":"tmpfs","source":"shm","options":["nosuid","noexec","nodev","mode=1777","size=65536k"]},{"destination":"/dev/mqueue","type":"mqueue","source":"mqueue","options":["nosuid","noexec","nodev"]},{"destination":"/sys","type":"sysfs","source":"sysfs","options":["nosuid","noexec","nodev","ro"]},{"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup","options":["nosuid","noexec","nodev","relatime","ro"]}],"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]},"namespaces":[{"type":"pid"},{"type":"network"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"cgroup"}],"maskedPaths":["/proc/acpi","/proc/asound","/proc/kcore","/proc/keys","/proc/latency_stats","/proc/timer_list","/proc/timer_stats","/proc/sched_debug","/sys/firmware","/proc/scsi"],"readonlyPaths":["/proc/bus","/proc/fs","/proc/irq","/proc/sys","/proc/sysrq-trigger"]}}
JSON
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
c = json.load(open(w + "/plain.json"))
c["annotations"] = {"gpuslice.io/memory": "1Gi", "gpuslice.io/cores": "5"}
json.dump(c, open(w + "/slice.json", "w"))
PY

# The wrapper ends with "cannot execute <no-runtime>" (status 1) after its work: expected.
wrapper() { "$bin/gpuslice-runtime" --root "$work/runc" "$@" </dev/null >/dev/null 2>&1 || true; }
for i in $(seq 40); do
  cp "$work/slice.json" "$work/bundle/config.json"
  wrapper create --bundle "$work/bundle" "c$i"
  id=$(reservation_of "$work/bundle/config.json")
  [ -n "$id" ] || { echo "pgo-train: the wrapper did not edit the spec" >&2; exit 1; }
  echo "{\"id\":\"c$i\",\"pid\":$holder}" | "$bin/gpuslice" hook create-runtime --reservation "$id"
  wrapper start "c$i"
  echo "{\"id\":\"c$i\",\"pid\":$holder,\"status\":\"stopped\"}" \
    | "$bin/gpuslice" hook poststop --reservation "$id"
  wrapper delete --force "c$i"
  cp "$work/plain.json" "$work/bundle/config.json"
  wrapper create --bundle "$work/bundle" "p$i"
done
