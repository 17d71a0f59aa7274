#!/usr/bin/env bash
# Registry benchmark (docs/benchmarks.md, "## Registry"): on a node of 8 GPUs with 100 live
# reservations (each bound to its own running process), the whole-process time of one
# reserve + release (hyperfine, against the same binary doing no registry work, in one run),
# then 16 concurrent processes doing reserve + release in a loop, with the registry checked
# for oversubscription throughout and at the end: once with requests that always fit, once
# with 16 workers contending for 9 slots (many refusals, each one a registry operation too). The state directory is on tmpfs, as /run
# is on a node. Usage: scripts/bench-registry.sh [seconds-of-throughput-run]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_RUN="${1:-10}"
TARGET="${CARGO_TARGET_DIR:-target}"
BIN="$TARGET/release/examples/registry_bench"
STATE="/dev/shm/gpuslice-bench-registry.$$"
EMPTY="/dev/shm/gpuslice-bench-registry-empty.$$"
OUT="$(mktemp -d)"

cargo build --release -p gpuslice-registry --example registry_bench

cleanup() {
  "$BIN" teardown "$STATE" 2>/dev/null || true
  rm -rf "$STATE" "$EMPTY" "$OUT"
}
trap cleanup EXIT

echo "== setup"
"$BIN" setup "$STATE" --gpus 8 --reservations 100
"$BIN" setup "$EMPTY" --gpus 8 --reservations 0
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

echo "== whole process: reserve + release vs. the same process doing nothing"
hyperfine -N --warmup 50 --runs 1000 --export-json "$OUT/once.json" \
  "$BIN once $STATE" "$BIN noop $STATE"
jq -r '.results | "median reserve+release process: \(.[0].median * 1000 | . * 1000 | round / 1000) ms, " +
  "empty process: \(.[1].median * 1000 | . * 1000 | round / 1000) ms, " +
  "ratio \(.[0].median / .[1].median | . * 100 | round / 100), " +
  "registry work: \((.[0].median - .[1].median) * 1000 | . * 1000 | round / 1000) ms"' "$OUT/once.json"

echo "== in one process (no process start): 2000 pairs"
"$BIN" loop "$STATE" --count 2000
"$BIN" loop "$EMPTY" --count 2000

echo "== throughput: 16 processes, 100 live reservations, requests that fit (every operation succeeds)"
"$BIN" throughput "$STATE" --procs 16 --seconds "$SECONDS_RUN" --request fit
echo "== throughput: 16 processes, 100 live reservations, 16 workers for 9 slots (refusals, oversubscription check)"
"$BIN" throughput "$STATE" --procs 16 --seconds "$SECONDS_RUN" --request contended
echo "== throughput: 16 processes, no other reservations, requests that fit"
"$BIN" throughput "$EMPTY" --procs 16 --seconds "$SECONDS_RUN" --request fit
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
