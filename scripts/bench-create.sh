#!/usr/bin/env bash
# Benchmark: what gpuslice adds to a container's life (the
# wrapper and hooks add at most 5 ms median). `runc create + start + delete` of one bundle, several ways in one run, on
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
# Then, with perf, the time of each gpuslice process in a life (BENCH_SPLIT_LIVES, default 100).
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
  echo "{\"id\":\"holder-$i\",\"pid\":$holder_pid,\"annotations\":{\"gpuslice.io/reservation\":\"$id\"}}" | "$bin/gpuslice" hook create-runtime --reservation "$id"
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
          f"median of per-round differences {paired:.2f} ms; "
          f"ratio over plain runc {med[w] / med['runc']:.3f}")
print(f"the container's GPU edits cost runc {spec - med['runc']:.2f} ms "
      f"(ratio {spec / med['runc']:.2f})")
PY
# Where the added time goes, per gpuslice process, from the kernel's sched tracepoints over
# interleaved lives of each build: a hook from exec to exit; the wrapper's start and delete
# from exec to their exec of the runtime; its create from exec to the spawn of the runtime
# (the edit), and from the runtime's exit to its own (the hand-back of the exit status).
# Needs perf (Debian: linux-perf) and a kernel that lets root trace; skipped otherwise or
# with BENCH_SPLIT_LIVES=0.
split=${BENCH_SPLIT_LIVES:-100}
if [ "$split" -gt 0 ] && command -v perf >/dev/null \
  && perf record -q -e sched:sched_process_exec -o "$work/probe.data" -- true >/dev/null 2>&1; then
  lives=""
  for d in "$bin" "$glibc"; do lives="$lives $work/life.sh $d/gpuslice-runtime slice;"; done
  perf record -q -e sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit -a \
    -o "$work/sched.data" -- sh -c "for i in \$(seq $split); do $lives done" >/dev/null 2>&1
  perf script -i "$work/sched.data" 2>/dev/null | python3 -c '
import collections, re, statistics, sys
builds = list(dict.fromkeys(sys.argv[1:]))
cur, res, calls = {}, collections.defaultdict(list), collections.Counter()
spawned, runc_end = {}, {}
for line in sys.stdin:
    m = re.search(r"\s(\d+\.\d+): sched:(\w+): (.*)$", line)
    if not m:
        continue
    t, kind, rest = float(m.group(1)) * 1000, m.group(2), m.group(3)
    pid = int(re.search(r" pid=(\d+)", rest).group(1))
    if kind == "sched_process_fork":
        # The wrapper spawns the runtime on create: its own part ends there.
        if pid in cur and cur[pid][1] == "wrapper create" and pid not in spawned.values():
            b, what, t0 = cur[pid]
            res[(b, "wrapper create")].append(t - t0)
            spawned[int(re.search(r"child_pid=(\d+)", rest).group(1))] = pid
        continue
    if kind == "sched_process_exec":
        exe = re.search(r"filename=(\S+)", rest).group(1)
        if pid in cur:  # the wrapper execs the runtime
            b, what, t0 = cur.pop(pid)
            res[(b, what)].append(t - t0)
            continue
        for b in builds:
            if exe == b + "/gpuslice-runtime":
                cur[pid] = (b, "wrapper " + ["create", "start", "delete"][calls[b] % 3], t)
                calls[b] += 1
            elif exe == b + "/gpuslice":
                cur[pid] = (b, "hook", t)
    elif kind == "sched_process_exit":
        if pid in spawned:
            runc_end[spawned.pop(pid)] = t
        elif pid in cur:
            b, what, t0 = cur.pop(pid)
            if pid in runc_end:
                res[(b, "after runc")].append(t - runc_end.pop(pid))
            elif what != "wrapper create":
                res[(b, what)].append(t - t0)
parts = ["wrapper create", "after runc", "wrapper start", "wrapper delete", "hook"]
print("per process, median (ms): wrapper create: exec to spawn of the runtime, and the runtime'"'"'s exit")
print("to its own; start, delete: exec to exec of the runtime; a hook: exec to exit")
print("  " + "build".ljust(34) + "".join(p.rjust(16) for p in parts) + "   life (2 hooks)")
for b in builds:
    med = [statistics.median(res[(b, p)]) if res[(b, p)] else float("nan") for p in parts]
    print("  " + b[-34:].ljust(34) + "".join(f"{m:16.3f}" for m in med)
          + f"   {sum(med[:4]) + 2 * med[4]:8.3f}")
' "$bin" "$glibc"
fi
left=$("$bin/gpuslice" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reservations"]))')
echo "reservations afterwards: $left (the 100 held ones and the pre-edited spec's)"
