#!/usr/bin/env bash
# Exporter benchmark (docs/benchmarks.md, "## Exporter"): a simulated node of 8 GPUs with 100
# live reservations, each bound to its own running process that holds GPU memory through the
# shim (so every scrape reads 100 usage files, checks 100 owners and attributes 100 NVML
# processes through /proc). Measures the latency of GET /metrics against GET /healthz (the
# same server doing no collection) over one keep-alive connection, in one run, and the
# exporter's resident memory. State lives on tmpfs, as /run does on a node. Needs root
# (device nodes of the simulated node). A second exporter on the same state, configured for a
# real driver that this machine lacks, runs without NVML: the with/without-NVML ratio from the
# same run.
#
#   scripts/bench-exporter.sh [scrapes]      # default 500
set -euo pipefail
cd "$(dirname "$0")/.."

SCRAPES="${1:-500}"
# Absolute: the config refuses a relative shim path.
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac
REL="$TARGET/release"
NODE="/dev/shm/gpuslice-bench-exporter.$$"
PIDS=()

cargo build --release -p gpuslice -p gpuslice-sim-cuda -p gpuslice-sim-nvml -p gpuslice-probe \
  -p gpuslice-shim

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$NODE"
}
trap cleanup EXIT

mkdir -p "$NODE"
CONFIG="$NODE/config.toml"
{
  echo "state_dir = \"$NODE/state\""
  echo "[cdi]"
  echo "spec_dir = \"$NODE/cdi\""
  echo "[registry]"
  echo "pending_timeout = \"1h\""
  echo "[shim]"
  echo "library = \"$REL/libgpuslice_shim.so\""
  echo "[inventory]"
  echo "source = \"simulated\""
  for _ in 1 2 3 4 5 6 7 8; do
    printf '[[inventory.simulated]]\nmemory = "141Gi"\n'
  done
} > "$CONFIG"
GS=("$REL/gpuslice" --config "$CONFIG")
"${GS[@]}" cdi generate --sim-driver "$REL" >/dev/null

SIM="$NODE/state/sim"
export GPUSLICE_SIM_STATE="$SIM/state" GPUSLICE_SIM_DEV="$SIM/dev"
LIBCUDA="$SIM/usr/lib/x86_64-linux-gnu/libcuda.so.1"
SPEC='{"ociVersion":"1.0.2","process":{"args":["true"],"env":[]},"root":{"path":"rootfs"},"linux":{},"annotations":{"gpuslice.io/memory":"8Gi","gpuslice.io/cores":"5"}}'

echo "== setup: 8 GPUs, 100 reservations, each held by a probe process with 256 MiB"
for i in $(seq 1 100); do
  id=$(echo "$SPEC" | "${GS[@]}" hook precreate | jq -r '.annotations["gpuslice.io/reservation"]')
  index=$("${GS[@]}" status --json | jq -r --arg id "$id" \
    '.reservations[] | select(.id == $id) | .gpus[0].index')
  GPUSLICE_DIR="$NODE/state/slices/$id" LD_PRELOAD="$REL/libgpuslice_shim.so" \
    "$REL/gpuslice-probe" --lib "$LIBCUDA" --device "$index" --json \
    alloc --chunk 64Mi --max 256Mi --hold 3600 > "$NODE/probe-$i.out" 2>/dev/null &
  PIDS+=("$!")
  echo "{\"id\":\"bench-$i\",\"pid\":$!,\"annotations\":{\"gpuslice.io/reservation\":\"$id\"}}" | "${GS[@]}" hook create-runtime --reservation "$id"
done
for i in $(seq 1 100); do
  until grep -q '"cmd":"alloc"' "$NODE/probe-$i.out" 2>/dev/null; do sleep 0.05; done
done

"${GS[@]}" serve --listen 127.0.0.1:0 2> "$NODE/serve.log" &
SERVE=$!
PIDS+=("$SERVE")
sed -e 's/^source = "simulated"/source = "nvml"/' "$CONFIG" > "$NODE/no-nvml.toml"
"$REL/gpuslice" --config "$NODE/no-nvml.toml" serve --listen 127.0.0.1:0 2> "$NODE/serve-no-nvml.log" &
PIDS+=("$!")
until grep -q listening "$NODE/serve.log" && grep -q listening "$NODE/serve-no-nvml.log"; do
  sleep 0.05
done
URL=$(sed -n 's|.*listening on \(http://[^/]*\)/metrics|\1|p' "$NODE/serve.log")
URL_NO_NVML=$(sed -n 's|.*listening on \(http://[^/]*\)/metrics|\1|p' "$NODE/serve-no-nvml.log")
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

echo "== one scrape, checked"
curl -sf "$URL/metrics" > "$NODE/metrics.txt"
promtool check metrics < "$NODE/metrics.txt"
echo "series: $(grep -vc '^#' "$NODE/metrics.txt"), bytes: $(wc -c < "$NODE/metrics.txt")"
echo "bound reservations: $(sed -n 's/^gpuslice_reservations{.*state="bound"} //p' "$NODE/metrics.txt")," \
  "slices with measured memory: $(grep -c '^gpuslice_slice_memory_used_bytes' "$NODE/metrics.txt")," \
  "with NVML cross-check: $(grep -c '^gpuslice_slice_nvml_memory_used_bytes' "$NODE/metrics.txt")," \
  "errors: $(grep '^gpuslice_exporter_errors_total' "$NODE/metrics.txt" | awk '{s+=$2} END {print s}')"

echo "== $SCRAPES scrapes each of /metrics, /healthz and /metrics without NVML, interleaved, keep-alive"
python3 - "$URL" "$SCRAPES" "$URL_NO_NVML" <<'PY'
import http.client, re, statistics, sys, time, urllib.parse
url, n = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2])
bare = urllib.parse.urlparse(sys.argv[3])
conn = http.client.HTTPConnection(url.hostname, url.port)
bare_conn = http.client.HTTPConnection(bare.hostname, bare.port)
collect = re.compile(rb"^gpuslice_exporter_collect_duration_seconds\{[^}]*\} (\S+)$", re.M)
def get(path, c=conn):
    t = time.perf_counter()
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, r.status
    return time.perf_counter() - t, body
for _ in range(20):
    get("/metrics"); get("/healthz")
m, h, c, b, bc = [], [], [], [], []
for _ in range(n):
    t, body = get("/metrics")
    m.append(t)
    c.append(float(collect.search(body).group(1)))
    h.append(get("/healthz")[0])
    t, body = get("/metrics", bare_conn)
    assert b"gpuslice_gpu_memory_used_bytes{" not in body
    b.append(t)
    bc.append(float(collect.search(body).group(1)))
ms = lambda v: f"{v * 1000:.2f} ms"
q = lambda v, p: sorted(v)[int(len(v) * p)]
med = statistics.median
print(f"/metrics median {ms(med(m))} (p90 {ms(q(m, .9))}), /healthz median {ms(med(h))}, "
      f"ratio {med(m) / med(h):.1f}, collection + encoding {ms(med(m) - med(h))}")
print(f"in-process collection (gpuslice_exporter_collect_duration_seconds): median {ms(med(c))} "
      f"(p90 {ms(q(c, .9))})")
print(f"without NVML: /metrics median {ms(med(b))}, collection median {ms(med(bc))}; "
      f"ratio with/without NVML: scrape {med(m) / med(b):.2f}, collection {med(c) / med(bc):.2f}")
PY
echo "exporter memory (with NVML): $(grep -E 'VmRSS|VmHWM' /proc/$SERVE/status | tr -s ' \t' ' ' | tr '\n' ' ')"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
