#!/usr/bin/env bash
# Benchmark: what gpuslice adds to a container's life (issue 4: the wrapper and hooks add at
# most 5 ms median). `runc create + start + delete` of one bundle, several ways in one run, on
# a simulated node of 8 GPUs that already holds 100 live reservations (bound to a running
# process):
#   runc               the plain spec;
#   runc+slice-spec    plain runc given a spec gpuslice already edited, hooks stripped: what
#                      the container itself costs runc with its GPU (device nodes, cgroup
#                      rules, driver-library, shim and slice-file mounts);
#   gpuslice-runtime   the wrapper with a slice annotation: spec edit, reservation, slice
#                      files, CDI spec, then runc with the createRuntime and poststop hooks;
#                      the static (musl) build that scripts/build-static.sh stages, as
#                      installed by the package;
#   glibc-build        the same with the dynamically linked glibc binaries of target/release
#                      (what `cargo build --release` alone gives).
# The wrapper and hooks add (gpuslice-runtime - runc+slice-spec). The ways run interleaved,
# one of each per round in a shuffled order, so that the machine's drift (these hosts are
# shared) falls on all of them alike; reported: medians per way, the added milliseconds and
# ratios, and the median of the per-round differences.
#
#   scripts/bench-create.sh [ROUNDS]              (root; default 100)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh   # runc, busybox-static
rounds=${1:-100}
glibc=${GPUSLICE_GLIBC_BIN_DIR:-$PWD/target/release}
bin=${GPUSLICE_BIN_DIR:-$PWD/target/release/static}
if [ ! -x "$bin/gpuslice-runtime" ]; then
  echo "bench-create: no static build in $bin (scripts/build-static.sh); measuring the glibc build only" >&2
  bin=$glibc
fi
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

. scripts/lib/bench-node.sh
{
  bench_node_config "$work" "$portable"
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

python3 - "$work" "$(command -v runc)" "$bin" "$glibc" "$rounds" <<'PY'
import os, random, statistics, subprocess, sys, time
work, runc, static, glibc, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
ways = {
    "runc": (runc, "plain"),
    "runc+slice-spec": (runc, "edited"),
    "gpuslice-runtime": (static + "/gpuslice-runtime", "slice"),
}
if os.path.realpath(static) != os.path.realpath(glibc):
    ways["glibc-build"] = (glibc + "/gpuslice-runtime", "slice")
times = {w: [] for w in ways}
def life(way):
    exe, kind = ways[way]
    t0 = time.perf_counter()
    subprocess.run([work + "/life.sh", exe, kind], check=True)
    return (time.perf_counter() - t0) * 1000
for w in ways:  # warm-up
    for _ in range(3):
        life(w)
for _ in range(rounds):
    order = list(ways)
    random.shuffle(order)
    for w in order:
        times[w].append(life(w))
med = {w: statistics.median(v) for w, v in times.items()}
print(f"{rounds} rounds; median create+start+delete:")
for w, m in med.items():
    q = statistics.quantiles(times[w], n=4)
    print(f"  {w:17s} {m:7.2f} ms   (quartiles {q[0]:.2f} .. {q[2]:.2f})")
spec = med["runc+slice-spec"]
for w in [w for w in ways if w not in ("runc", "runc+slice-spec")]:
    paired = statistics.median(a - b for a, b in zip(times[w], times["runc+slice-spec"]))
    print(f"{w}: wrapper and hooks add {med[w] - spec:.2f} ms (ratio {med[w] / spec:.2f}); "
          f"median of per-round differences {paired:.2f} ms")
print(f"the container's GPU edits cost runc {spec - med['runc']:.2f} ms "
      f"(ratio {spec / med['runc']:.2f})")
PY
left=$("$bin/gpuslice" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reservations"]))')
echo "reservations afterwards: $left (the 100 held ones and the pre-edited spec's)"
