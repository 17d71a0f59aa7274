#!/bin/sh
# Benchmarks of the simulated driver with gpuslice-probe (docs/benchmarks.md, "Simulated
# driver"): a throw-away simulated node with two 8 GiB GPUs in a temp dir, the release
# builds of the probe and the simulated libraries, then the per-call costs and the compute
# split of the time model. Usage: sim/scripts/bench-sim.sh [extra LD_PRELOAD library]
# (with a shim as argument, the same script gives the with-shim figures).
set -eu
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p gpuslice-probe -p gpuslice-sim-cuda -p gpuslice-sim-nvml
node=$(mktemp -d)
trap 'rm -rf "$node"' EXIT
mkdir -p "$node/state" "$node/dev" "$node/lib"
devices=""
for i in 0 1; do
  [ -n "$devices" ] && devices="$devices,"
  devices="$devices{\"index\":$i,\"uuid\":\"GPU-00000000-0000-4000-8000-00000000000$i\",\"model\":\"NVIDIA H200\",\"memory\":8589934592,\"minor\":$i,\"pci_bus_id\":\"00000000:1$i:00.0\",\"numa_node\":0,\"sm_count\":132,\"clock_khz\":1980000}"
  : > "$node/dev/nvidia$i"
done
printf '{"version":1,"devices":[%s]}\n' "$devices" > "$node/state/devices.json"
cp "$target/release/libgpuslice_sim_cuda.so" "$node/lib/libcuda.so.1"
cp "$target/release/libgpuslice_sim_nvml.so" "$node/lib/libnvidia-ml.so.1"
export GPUSLICE_SIM_STATE="$node/state" GPUSLICE_SIM_DEV="$node/dev" LD_LIBRARY_PATH="$node/lib"
if [ $# -gt 0 ]; then export LD_PRELOAD="$1"; fi
probe="$target/release/gpuslice-probe"
uptime
for run in 1 2 3; do
  "$probe" bench launch --iters 200000
  "$probe" bench alloc --iters 50000
done
"$probe" burn --seconds 5 --kernel-us 1000
"$probe" burn --seconds 5 --kernel-us 1000 & "$probe" burn --seconds 5 --kernel-us 1000; wait
"$probe" burn --seconds 5 --kernel-us 100 & "$probe" burn --seconds 5 --kernel-us 100; wait
