#!/usr/bin/env bash
# Shim overhead on the simulated driver, with and without LD_PRELOAD in one run:
#   - intercepted cuLaunchKernel with no compute limit (median ns per call)
#   - cuMemAlloc_v2 + cuMemFree_v2 pair (median ns per pair)
#   - loading the shim into a non-CUDA process (/bin/true, hyperfine)
# Uses the release artifacts of scripts/build-portable.sh (built if missing).
#
#   CARGO_TARGET_DIR=target scripts/bench-shim.sh [ITERS]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
bin=${BENCH_DIR:-$target_dir/portable}
iters=${1:-200000}
[ -x "$bin/gpuslice-probe" ] || CARGO_TARGET_DIR=$target_dir "$root/scripts/build-portable.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/state" "$work/dev" "$work/lib" "$work/slice"
cp "$bin/libcuda.so.1" "$bin/libnvidia-ml.so.1" "$work/lib/"
uuid=GPU-0b5e7c1a-0000-4000-8000-000000000001
cat > "$work/state/devices.json" <<JSON
{"version":1,"devices":[{"index":0,"uuid":"$uuid","model":"NVIDIA H200","memory":151397597184,"minor":0,"pci_bus_id":"00000000:01:00.0","numa_node":0,"sm_count":132,"clock_khz":1980000}]}
JSON
: > "$work/dev/nvidia0"
echo "{\"version\":1,\"reservation\":\"bench\",\"devices\":[{\"uuid\":\"$uuid\",\"memory_limit\":107374182400}]}" > "$work/slice/limits.json"
# The usage file as gpuslice_slice::usage::create_usage_file makes it (header of layout 1).
python3 - "$work/slice/usage" <<'PY'
import struct, sys
b = bytearray(4096 + 1024 * 256)
b[0:24] = b"GPUSLUSG" + struct.pack("<IIII", 1, 16, 1024, 256)
open(sys.argv[1], "wb").write(b)
PY

export GPUSLICE_SIM_STATE=$work/state GPUSLICE_SIM_DEV=$work/dev LD_LIBRARY_PATH=$work/lib GPUSLICE_DIR=$work/slice
probe=$bin/gpuslice-probe
shim=$bin/libgpuslice_shim.so
median() { "$@" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["median_ns"])'; }

echo "| measure | without shim | with shim | added |"
echo "|---|---|---|---|"
for what in launch alloc; do
    # Alternate runs so drift hits both sides alike; report the median of three each.
    a=(); b=()
    for _ in 1 2 3; do
        a+=("$(median "$probe" --json bench "$what" --iters "$iters")")
        b+=("$(median env LD_PRELOAD="$shim" "$probe" --json bench "$what" --iters "$iters")")
    done
    ma=$(printf '%s\n' "${a[@]}" | sort -n | sed -n 2p)
    mb=$(printf '%s\n' "${b[@]}" | sort -n | sed -n 2p)
    echo "| bench $what (median ns per call) | $ma | $mb | $((mb - ma)) |"
done

if command -v hyperfine >/dev/null; then
    hyperfine -N --warmup 100 --runs 1000 --export-json "$work/hf.json" \
        "env /bin/true" "env LD_PRELOAD=$shim /bin/true" >/dev/null 2>&1
    python3 - "$work/hf.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
a, b = (x["median"] * 1e6 for x in r)
print(f"| /bin/true start (median µs, hyperfine) | {a:.0f} | {b:.0f} | {b - a:.0f} |")
PY
fi
