#!/usr/bin/env bash
# Peak resident memory of `gpuslice webhook` while it reads 8 reviews of just under its 3 MiB
# body limit at once, for three pods: realistic containers, and padding of the densest JSON
# (a value every two bytes) where the webhook does not read and inside a container's GPU
# resources, where it does (refused: more than the webhook keeps). Per pod, a fresh webhook:
# its idle RSS, its peak RSS (VmHWM) and the growth; docs/benchmarks.md records the figures.
#
#   kube/webhook/tests/review-rss.sh [GPUSLICE_BIN]    (default: target/release/gpuslice)
#
# No API server is needed: the webhook's kubeconfig names one that does not exist, so the
# inventory stays empty (the reviews are dry runs; reading them is what is measured).
set -euo pipefail

bin=${1:-target/release/gpuslice}
[ -x "$bin" ] || { echo "review-rss.sh: no executable $bin (cargo build --release)" >&2; exit 2; }
dir=$(mktemp -d)
pid=""
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=localhost -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
cat >"$dir/kubeconfig" <<'EOF'
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
EOF
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
limit = 3 << 20
room = limit - 4096

def review(pod):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "namespace": "default", "operation": "CREATE",
                        "dryRun": True, "object": pod}}

def container(i, env):
    return {"name": f"c{i}", "image": "registry.example/app:1",
            "env": [{"name": f"E{j}", "value": "v" * 20} for j in range(env)],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}

# Realistic: containers of 40 environment variables each, the first asking a GPU slice.
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
while len(json.dumps(review(pod))) < room - 2000:
    pod["spec"]["containers"].append(container(len(pod["spec"]["containers"]), 40))
pod["spec"]["containers"][0]["resources"]["limits"]["gpuslice.io/memory"] = "1Gi"
shapes = {"1-realistic": json.dumps(review(pod))}

def padded(where):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "x", "args": [],
                                    "resources": {"limits": {"gpuslice.io/gpus": "1"}, "pad": []}}]}}
    text = json.dumps(review(pod), separators=(",", ":"))
    mark = '"args":[]' if where == "args" else '"pad":[]'
    zeros = ",".join("0" for _ in range((room - len(text)) // 2))
    return text.replace(mark, mark[:-1] + zeros + "]", 1)

shapes["2-dense-unread"] = padded("args")
shapes["3-dense-in-gpu-resources"] = padded("pad")
for name, text in shapes.items():
    assert len(text) < limit, (name, len(text))
    with open(f"{d}/{name}.json", "w") as f:
        f.write(text)
EOF

start() {
  "$bin" webhook --listen "127.0.0.1:$port" --tls-cert "$dir/tls.crt" --tls-key "$dir/tls.key" \
    --kubeconfig "$dir/kubeconfig" 2>"$dir/webhook.log" &
  pid=$!
  for _ in $(seq 100); do
    curl -sk "https://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  cat "$dir/webhook.log" >&2
  exit 1
}
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$pid/status"; }

echo "binary: $bin"
printf '%-36s %9s %9s %11s  %s\n' "pod (8 reviews at once, fresh process)" "idle MiB" "peak MiB" "growth MiB" "answers"
for f in "$dir"/*.json; do
  name=$(basename "$f" .json)
  start
  idle=$(kib VmRSS)
  codes=$(
    for _ in 1 2 3 4 5 6 7 8; do
      curl -sk -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' -H 'Expect:' \
        --data-binary "@$f" "https://127.0.0.1:$port/mutate" &
    done
    wait
  )
  peak=$(kib VmHWM)
  stop
  printf '%-36s %9d %9d %11d  %s\n' "$name ($(($(stat -c %s "$f") / 1024)) KiB)" \
    $((idle / 1024)) $((peak / 1024)) $(((peak - idle) / 1024)) "$(echo $codes)"
done
