#!/usr/bin/env bash
# The shim against a real NVIDIA driver, with and without it, in one short run: probe info,
# alloc on every API (4 GiB limit), burn at a 30 % compute share. Prints a markdown table
# for docs/benchmarks.md. Builds nothing: it needs the portable artifacts
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
w=$(bare burn --seconds 5); s=$(shimmed burn --seconds 5)
share='"%.1f %% / %.1f %%" % (v["nominal_share"] * 100, v["event_share"] * 100)'
echo "| burn 5 s, share (nominal / events) | $(echo "$w" | field "$share") | $(echo "$s" | field "$share") (target $cores %) |"
for what in launch alloc; do
    w=$(bare bench "$what" --iters 20000); s=$(shimmed bench "$what" --iters 20000)
    echo "| bench $what, median ns (paced at $cores %) | $(echo "$w" | field 'v["median_ns"]') | $(echo "$s" | field 'v["median_ns"]') |"
done
