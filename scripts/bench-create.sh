#!/usr/bin/env bash
# Benchmark: what gpuslice adds to a container's life (issue 4: the wrapper and hooks add at
# most 5 ms median). `runc create + start + delete` of one bundle, three ways in one run, on
# a simulated node of 8 GPUs that already holds 100 live reservations (bound to a running
# process):
#   runc               the plain spec;
#   runc+slice-spec    plain runc given a spec gpuslice already edited, hooks stripped: what
#                      the container itself costs runc with its GPU (device nodes, cgroup
#                      rules, driver-library, shim and slice-file mounts);
#   gpuslice-runtime   the wrapper with a slice annotation: spec edit, reservation, slice
#                      files, CDI spec, then runc with the createRuntime and poststop hooks.
# The wrapper and hooks add (gpuslice-runtime - runc+slice-spec); the whole difference to
# plain runc is reported too. Medians, added milliseconds and ratios.
#
#   scripts/bench-create.sh [RUNS]              (root)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-40}
bin=${GPUSLICE_BIN_DIR:-$PWD/target/release}
portable=${GPUSLICE_PORTABLE_DIR:-$PWD/target/portable}
work=$(mktemp -d /dev/shm/gpuslice-bench-create.XXXXXX)
holder_pid=
cleanup() {
  runc --root "$work/runc" delete -f bench-plain >/dev/null 2>&1 || true
  runc --root "$work/runc" delete -f bench-slice >/dev/null 2>&1 || true
  [ -n "$holder_pid" ] && kill "$holder_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

{
  echo "state_dir = \"$work/state\""
  echo "[inventory]"
  echo "source = \"simulated\""
  for _ in $(seq 8); do printf '[[inventory.simulated]]\nmemory = "141Gi"\n'; done
  echo "[cdi]"
  echo "spec_dir = \"$work/cdi\""
  echo "[shim]"
  echo "library = \"$portable/libgpuslice_shim.so\""
  echo "[registry]"
  echo "pending_timeout = \"1h\""   # the pre-edited spec's reservation stays pending
} > "$work/config.toml"
export GPUSLICE_CONFIG=$work/config.toml
"$bin/gpuslice" cdi generate --sim-driver "$portable" >/dev/null

# 100 live reservations, bound to a process that outlives the benchmark.
sleep 3600 & holder_pid=$!
for i in $(seq 100); do
  id=$(echo '{"annotations":{"gpuslice.io/memory":"1Gi","gpuslice.io/cores":"5"}}' \
    | "$bin/gpuslice" hook precreate | python3 -c 'import json,sys; print(json.load(sys.stdin)["annotations"]["gpuslice.io/reservation"])')
  echo "{\"id\":\"holder-$i\",\"pid\":$holder_pid}" | "$bin/gpuslice" hook create-runtime --reservation "$id"
done
echo "live reservations: $("$bin/gpuslice" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reservations"]))')" >&2

# One bundle: a minimal static rootfs (busybox) running `true`.
mkdir -p "$work/bundle/rootfs/bin"
cp /bin/busybox "$work/bundle/rootfs/bin/"
ln -s busybox "$work/bundle/rootfs/bin/true"
(cd "$work/bundle" && runc spec)
python3 - "$work/bundle/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["process"]["terminal"] = False
c["process"]["args"] = ["/bin/true"]
json.dump(c, open(p + ".plain", "w"))
c["annotations"] = {"gpuslice.io/memory": "1Gi", "gpuslice.io/cores": "5"}
json.dump(c, open(p + ".slice", "w"))
PY
# The spec gpuslice makes of it, without the hooks, for plain runc.
"$bin/gpuslice" hook precreate < "$work/bundle/config.json.slice" | python3 -c '
import json, sys
c = json.load(sys.stdin)
c.pop("hooks", None)
json.dump(c, open(sys.argv[1], "w"))' "$work/bundle/config.json.edited"
cat > "$work/life.sh" <<SH
#!/bin/sh
# \$1: runtime, \$2: plain|slice. A fresh config.json each time (the wrapper edits it).
cp "$work/bundle/config.json.\$2" "$work/bundle/config.json"
"\$1" --root "$work/runc" create -b "$work/bundle" "bench-\$2" </dev/null >/dev/null 2>&1
"\$1" --root "$work/runc" start "bench-\$2"
"\$1" --root "$work/runc" delete -f "bench-\$2"
SH
chmod +x "$work/life.sh"

hyperfine --style basic --warmup 3 --runs "$runs" --export-json "$work/result.json" \
  -n runc "$work/life.sh $(command -v runc) plain" \
  -n runc+slice-spec "$work/life.sh $(command -v runc) edited" \
  -n gpuslice-runtime "$work/life.sh $bin/gpuslice-runtime slice" >&2
left=$("$bin/gpuslice" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reservations"]))')
python3 - "$work/result.json" "$left" <<'PY'
import json, sys
res = {r["command"]: r["median"] * 1000 for r in json.load(open(sys.argv[1]))["results"]}
base, spec, ours = res["runc"], res["runc+slice-spec"], res["gpuslice-runtime"]
print(f"median create+start+delete: runc {base:.2f} ms; runc with the edited spec {spec:.2f} ms; "
      f"gpuslice-runtime {ours:.2f} ms")
print(f"wrapper and hooks add {ours - spec:.2f} ms (ratio {ours / spec:.2f}); the container's GPU "
      f"edits cost runc {spec - base:.2f} ms; all together {ours - base:.2f} ms (ratio {ours / base:.2f}); "
      f"reservations afterwards: {sys.argv[2]} (the 100 held ones and the pre-edited spec's)")
PY
