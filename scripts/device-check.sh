#!/usr/bin/env bash
# The shim against a real NVIDIA driver, with and without it, in one short run: probe info,
# alloc on every API (4 GiB limit), burn at a 30 % compute share; then a CUDA context's own
# device memory as the driver counts it, and a slice filled by what cuMemGetInfo reports free
# (two processes, several contexts): the driver's count for the slice must stay at or under
# the limit (the host enforcer would kill otherwise) and CUDA, NVML and NVML's process lists
# must agree with it. Prints a markdown table for docs/benchmarks.md. On a machine without
# an NVIDIA GPU it says so and exits 0. Builds nothing: it needs the portable artifacts
# (scripts/build-portable.sh on the build host; carry target/portable to the GPU machine).
#
#   scripts/device-check.sh [PORTABLE_DIR]     # default target/portable
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-${CARGO_TARGET_DIR:-$root/target}/portable}
probe=$bin/gpuslice-probe
shim=$bin/libgpuslice_shim.so
for f in "$probe" "$shim"; do
    [ -e "$f" ] || { echo "device-check: missing $f (run scripts/build-portable.sh)" >&2; exit 2; }
done
# The real driver, never the simulated one shipped beside the probe.
unset LD_LIBRARY_PATH GPUSLICE_SIM_STATE GPUSLICE_SIM_DEV
if [ ! -e /dev/nvidiactl ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    echo "device-check: no NVIDIA GPU on this machine (no /dev/nvidia*); nothing to check"
    exit 0
fi
limit=$((4 << 30)); cores=30

info=$("$probe" --json info 2>&1 | tail -1)
uuid=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["uuid"])') || {
    echo "device-check: probe info failed without the shim: $info" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "{\"version\":1,\"reservation\":\"device-check\",\"devices\":[{\"uuid\":\"$uuid\",\"memory_limit\":$limit,\"cores\":$cores}]}" > "$work/limits.json"
python3 - "$work/usage" <<'PY'
import struct, sys
b = bytearray(4096 + 1024 * 256)
b[0:24] = b"GPUSLUSG" + struct.pack("<IIII", 1, 16, 1024, 256)
open(sys.argv[1], "wb").write(b)
PY

field() { python3 -c "import json,sys; v=json.loads(sys.stdin.read().splitlines()[-1]); print(eval(sys.argv[1], {}, {'v': v}))" "$1" 2>/dev/null || echo "n/a"; }
bare() { "$probe" --json "$@" 2>"$work/err"; }
shimmed() { GPUSLICE_DIR=$work LD_PRELOAD=$shim "$probe" --json "$@" 2>"$work/err"; }
gib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.2f} GiB')" "$1" 2>/dev/null || echo "$1"; }

echo "GPU: $(printf '%s' "$info" | field 'v["name"]') $uuid, driver $(printf '%s' "$info" | field 'v["driver_version"]'); limit 4 GiB, cores $cores"
echo
echo "| check | without shim | with shim |"
echo "|---|---|---|"
wi=$(bare info); si=$(shimmed info)
echo "| cuMemGetInfo total | $(gib "$(echo "$wi" | field 'v["mem_total"]')") | $(gib "$(echo "$si" | field 'v["mem_total"]')") |"
echo "| cuMemGetInfo free | $(gib "$(echo "$wi" | field 'v["mem_free"]')") | $(gib "$(echo "$si" | field 'v["mem_free"]')") |"
echo "| cuDeviceTotalMem | $(gib "$(echo "$wi" | field 'v["total_mem"]')") | $(gib "$(echo "$si" | field 'v["total_mem"]')") |"
echo "| NVML total | $(gib "$(echo "$wi" | field 'v["nvml"]["total"]')") | $(gib "$(echo "$si" | field 'v["nvml"]["total"]')") |"
for api in alloc pitch managed async pool vmm array graph; do
    w=$(bare alloc --chunk 512Mi --max 6Gi --api "$api")
    s=$(shimmed alloc --chunk 512Mi --max 6Gi --api "$api")
    echo "| alloc --api $api | $(gib "$(echo "$w" | field 'v["total"]')") $(echo "$w" | field 'v["error"] or ""') | $(gib "$(echo "$s" | field 'v["total"]')") $(echo "$s" | field 'v["error"] or ""') |"
done
# A destroyed graph's 3 GiB stays in the driver's graph pool (docs/shim.md, "The graph memory
# pool"): free after the destroy / after the step, the pool's reserved bytes, the step's error.
for then in alloc graph trim; do
    w=$(bare graph-cache --chunk 3Gi --then "$then")
    s=$(shimmed graph-cache --chunk 3Gi --then "$then")
    row='"%.2f / %.2f GiB, pool %.2f GiB %s" % (v["free_destroyed"] / 2**30, v["free_after"] / 2**30, v["graph_reserved"] / 2**30, v["error"] or "")'
    echo "| graph-cache --chunk 3Gi --then $then | $(echo "$w" | field "$row") | $(echo "$s" | field "$row") |"
done
w=$(bare burn --seconds 5); s=$(shimmed burn --seconds 5)
share='"%.1f %% / %.1f %%" % (v["nominal_share"] * 100, v["event_share"] * 100)'
echo "| burn 5 s, share (nominal / events) | $(echo "$w" | field "$share") | $(echo "$s" | field "$share") (target $cores %) |"
# The deprecated launch entry points, and the cooperative multi-device one, are paced alike
# (docs/shim.md).
for api in grid-async grid legacy multi-device; do
    w=$(bare burn --seconds 2 --launch "$api"); s=$(shimmed burn --seconds 2 --launch "$api")
    echo "| burn 2 s --launch $api, share (nominal / events) | $(echo "$w" | field "$share") | $(echo "$s" | field "$share") (target $cores %) |"
done
for what in launch alloc; do
    w=$(bare bench "$what" --iters 20000); s=$(shimmed bench "$what" --iters 20000)
    echo "| bench $what, median ns (paced at $cores %) | $(echo "$w" | field 'v["median_ns"]') | $(echo "$s" | field 'v["median_ns"]') |"
done

# --- context memory: what a context costs, and a slice filled by what CUDA reports free ---
fails=0
# Waits up to 60 s for a JSON line with "cmd":"fill" in $1.
await_fill() {
    local i
    for i in $(seq 600); do
        grep -q '"cmd":"fill"' "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "device-check: no fill report in $1: $(cat "$1" "$work/err" 2>/dev/null)" >&2
    return 1
}
# The driver's per-process figure (bytes) of pid $1 on GPU $uuid, from NVML without the shim.
driver_bytes() {
    "$probe" --json smi 2>/dev/null | python3 -c '
import json, sys
pid, uuid = int(sys.argv[1]), sys.argv[2]
for l in sys.stdin:
    d = json.loads(l)["device"]
    if d["uuid"].lower() != uuid.lower():
        continue
    for n in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"):
        if n in d["processes"]:
            print(sum(u for p, u in d["processes"][n]["entries"] if p == pid)); sys.exit(0)
print(0)' "$1" "$uuid"
}

echo
echo "| context memory | measured |"
echo "|---|---|"
"$probe" --json fill --fraction 0 --hold 5 >"$work/ctx1" 2>"$work/err" &
p1=$!
if await_fill "$work/ctx1"; then
    one=$(driver_bytes "$(field 'v["pid"]' <"$work/ctx1")")
    echo "| one context, nothing allocated (driver, per process) | $(gib "$one") |"
fi
wait "$p1" 2>/dev/null
"$probe" --json fill --fraction 0 --contexts 2 --hold 5 >"$work/ctx3" 2>"$work/err" &
p3=$!
if await_fill "$work/ctx3"; then
    three=$(driver_bytes "$(field 'v["pid"]' <"$work/ctx3")")
    echo "| three contexts, nothing allocated (driver, per process) | $(gib "$three") |"
fi
wait "$p3" 2>/dev/null

# A fresh slice: process A fills half of what it is told is free (three contexts), B all the
# rest (two contexts); both hold while the driver's figures are read.
python3 - "$work/usage" <<'PY'
import struct, sys
b = bytearray(4096 + 1024 * 256)
b[0:24] = b"GPUSLUSG" + struct.pack("<IIII", 1, 16, 1024, 256)
open(sys.argv[1], "wb").write(b)
PY
shimmed fill --fraction 0.5 --contexts 2 --hold 15 >"$work/fa" &
pa=$!
await_fill "$work/fa" || fails=1
shimmed fill --contexts 1 --hold 10 >"$work/fb" &
pb=$!
if await_fill "$work/fb"; then
    a_pid=$(field 'v["pid"]' <"$work/fa"); b_pid=$(field 'v["pid"]' <"$work/fb")
    driver=$(( $(driver_bytes "$a_pid") + $(driver_bytes "$b_pid") ))
    fb=$(cat "$work/fb")
    cuda_used=$(echo "$fb" | field 'v["mem_used"]')
    echo "| slice of $(gib $limit): B allocated what cuMemGetInfo said was free | $(gib "$(echo "$fb" | field 'v["allocated"]')"), free left $(gib "$(echo "$fb" | field 'v["mem_free"]')") |"
    echo "| slice used: cuMemGetInfo / NVML v1 / NVML v2 | $(gib "$cuda_used") / $(gib "$(echo "$fb" | field 'v["nvml"]["v1"]["used"]')") / $(gib "$(echo "$fb" | field 'v["nvml"]["v2"]["used"]')") |"
    echo "| slice used: NVML process lists v1 / v2 / v3 (in the slice) | $(gib "$(echo "$fb" | field 'v["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses"]["used"]')") / $(gib "$(echo "$fb" | field 'v["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v2"]["used"]')") / $(gib "$(echo "$fb" | field 'v["nvml"]["processes"]["nvmlDeviceGetComputeRunningProcesses_v3"]["used"]')") |"
    echo "| the driver's count for the slice's two processes (what the enforcer and the exporter's nvml series read) | $(gib "$driver") |"
    if [ "$driver" -gt "$limit" ]; then
        echo "device-check: FAIL: the driver counts $driver bytes for a slice of $limit: the enforcer would kill a process that only took what it was told was free" >&2
        fails=1
    fi
    diff=$(( driver > cuda_used ? driver - cuda_used : cuda_used - driver ))
    echo "| driver's count − slice's used | $(gib "$diff") |"
    if [ "$diff" -gt $((1 << 20)) ]; then
        echo "device-check: FAIL: the driver's count and the slice's used memory differ by $diff bytes (more than 1 MiB)" >&2
        fails=1
    fi
else
    fails=1
fi
wait "$pa" "$pb" 2>/dev/null
exit "$fails"
