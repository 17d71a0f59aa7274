#!/usr/bin/env bash
# Benchmark: `gpuslice cdi generate` for 8 simulated GPUs, as a whole process (the
# median must stay at or below 20 ms). State and output on tmpfs, as on a real node.
#
#   scripts/bench-cdi-generate.sh [RUNS]        (root: the simulated node has device nodes)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
bin=${GPUSLICE_BIN_DIR:-$PWD/target/release}
portable=${GPUSLICE_PORTABLE_DIR:-$PWD/target/portable}
work=$(mktemp -d /dev/shm/gpuslice-bench-cdi.XXXXXX)
trap 'rm -rf "$work"' EXIT

. scripts/lib/bench-node.sh
bench_node_config "$work" "$portable" > "$work/config.toml"

cmd="$bin/gpuslice --config $work/config.toml cdi generate --sim-driver $portable"
$cmd >/dev/null   # creates the simulated node once; later runs find it in place
hyperfine --style basic --warmup 5 --runs "$runs" --export-json "$work/result.json" "$cmd" >&2
python3 - "$work/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"cdi generate, 8 simulated GPUs: median {r['median']*1000:.2f} ms "
      f"(mean {r['mean']*1000:.2f} ms, min {r['min']*1000:.2f} ms, {len(r['times'])} runs)")
PY
