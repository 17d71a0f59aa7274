#!/usr/bin/env bash
# Benchmark: what gpuslice adds to a container's life (issue 4: at most 5 ms median).
# `runc create + start + delete` of one bundle, plain runc against gpuslice-runtime with a
# slice annotation (spec edit, reservation, slice files, CDI spec, createRuntime and
# poststop hooks), on a simulated node of 8 GPUs that already holds 100 live reservations
# (bound to a running process). Both in the same run; reports the medians, the added
# milliseconds and the ratio.
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
  -n gpuslice-runtime "$work/life.sh $bin/gpuslice-runtime slice" >&2
left=$("$bin/gpuslice" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reservations"]))')
python3 - "$work/result.json" "$left" <<'PY'
import json, sys
res = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
base, ours = res["runc"]["median"] * 1000, res["gpuslice-runtime"]["median"] * 1000
print(f"runc create+start+delete: median {base:.2f} ms; through gpuslice-runtime with a slice: "
      f"median {ours:.2f} ms; added {ours - base:.2f} ms (ratio {ours / base:.2f}); "
      f"reservations afterwards: {sys.argv[2]} (the 100 held ones)")
PY
