#!/usr/bin/env bash
# The main job: builds gpuslice, sets up a simulated 2-GPU node (no GPU needed), and shows
# whole GPUs and slices with real podman containers: what each container sees, the shim
# holding each to its own memory limit and compute share, `gpuslice status`, and a request
# that does not fit being refused. Run as root on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root: it creates device nodes and starts containers" >&2
  exit 1
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

say "Installing what the demo needs and building gpuslice"
./scripts/install-deps.sh
./scripts/build.sh

BIN=${GPUSLICE_BIN_DIR:-$root/target/release}
PORTABLE=${GPUSLICE_PORTABLE_DIR:-$root/target/portable}
DEMO=${GPUSLICE_DEMO_DIR:-/run/gpuslice-demo}
IMAGE=localhost/gpuslice-demo:1
export PATH="$BIN:$PATH"

# Leave nothing behind from an earlier run.
cleanup() {
  for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep '^gpuslice-demo-' || true); do
    CONTAINERS_CONF=$DEMO/containers.conf podman rm -f -t 0 "$c" >/dev/null 2>&1 || true
  done
  rm -f /var/run/cdi/gpuslice.io-gpu.json /var/run/cdi/gpuslice.io-slice_*.json
}
cleanup
# A demo that fails (a step's error, or a check below) takes its containers and its node CDI
# spec, which names the demo's simulated devices for every engine on the host, with it; the
# simulated node in $DEMO stays for a look, as after a run that succeeds.
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] && return
  echo "demo.sh: failed (exit $rc): removing its containers and CDI specs; $DEMO stays" >&2
  cleanup
}
trap on_exit EXIT
rm -rf "$DEMO"
mkdir -p "$DEMO"

say "A simulated node: 2 x NVIDIA H200 (141 GiB each)"
cat > "$DEMO/config.toml" <<TOML
state_dir = "$DEMO/state"
[inventory]
source = "simulated"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
[shim]
library = "$PORTABLE/libgpuslice_shim.so"
[cdi]
spec_dir = "/var/run/cdi"
TOML
export GPUSLICE_CONFIG=$DEMO/config.toml
cat "$GPUSLICE_CONFIG"
show gpuslice cdi generate --sim-driver "$PORTABLE"
show ls -l "$DEMO/state/sim/dev"

# podman on this kind of host needs runc, cgroupfs and explicit ulimits: the demo's own
# containers.conf, not gpuslice's business. The image: busybox, glibc and the probe.
# shellcheck source=lib/image.sh
. "$root/scripts/lib/image.sh"
podman_conf "$DEMO/containers.conf"
export CONTAINERS_CONF=$DEMO/containers.conf
podman rmi -f "$IMAGE" >/dev/null 2>&1 || true   # the probe may have been rebuilt
podman_image "$DEMO/rootfs" "$IMAGE" "$PORTABLE/gpuslice-probe"

say "Whole GPUs through CDI: --device gpuslice.io/gpu=0 sees /dev/nvidia0 and the control nodes, not /dev/nvidia1"
show gpuslice cdi list
show podman run --rm --device gpuslice.io/gpu=0 "$IMAGE" sh -c 'ls /dev | grep nvidia'

say "Slices through podman's precreate hook"
show gpuslice configure podman --hooks-dir "$DEMO/hooks.d"
HOOKS=(--hooks-dir "$DEMO/hooks.d")

run_slice() { # name, annotations...
  local name=$1; shift
  local ann=()
  for a in "$@"; do ann+=(--annotation "gpuslice.io/$a"); done
  podman "${HOOKS[@]}" run -d --name "gpuslice-demo-$name" "${ann[@]}" "$IMAGE" sh -c '
    echo "devices: $(ls /dev | grep nvidia | tr "\n" " ")"
    echo "limits:  $(cat /run/gpuslice/limits.json)"
    gpuslice-probe info
    gpuslice-probe alloc --chunk 4Gi
    gpuslice-probe burn --seconds 4
    # DONE once the held allocation is reported: the probe prints its line, then holds.
    gpuslice-probe alloc --chunk 2Gi --max 8Gi --hold 600 >/tmp/held 2>&1 &
    until grep -q "^alloc " /tmp/held; do
      kill -0 $! 2>/dev/null || { cat /tmp/held; echo "HOLD FAILED"; exit 1; }
      sleep 0.1
    done
    cat /tmp/held; echo DONE; wait' >/dev/null
  echo "started gpuslice-demo-$name with ${*}"
}
run_slice infer-a memory=40Gi cores=30
run_slice infer-b memory=24Gi cores=60
run_slice train-c memory=100Gi

for name in infer-a infer-b train-c; do
  held=no
  for _ in $(seq 1 200); do
    log=$(podman logs "gpuslice-demo-$name" 2>/dev/null || true)
    if grep -qx DONE <<<"$log"; then held=yes; break; fi
    grep -qx "HOLD FAILED" <<<"$log" && break
    sleep 0.1
  done
  if [ "$held" != yes ]; then
    echo "demo.sh: gpuslice-demo-$name did not report its held allocation (within 20 s); its log:" >&2
    podman logs "gpuslice-demo-$name" >&2 2>&1 || true
    exit 1
  fi
  say "What gpuslice-demo-$name sees (the probe drives the simulated CUDA driver through the shim)"
  podman logs "gpuslice-demo-$name" 2>&1 | grep -v '^DONE$'
done

say "gpuslice status: capacity, what is booked, who holds it, and what each slice really uses (each probe now holds 8 GiB)"
show gpuslice status

say "A request that does not fit is refused at create time, with the free capacity per GPU"
if podman "${HOOKS[@]}" run --rm --annotation gpuslice.io/memory=120Gi "$IMAGE" true; then
  echo "unexpected: the request fitted" >&2
  exit 1
fi

say "Stopping the containers gives their slices back"
for name in infer-a infer-b train-c; do podman rm -f -t 0 "gpuslice-demo-$name" >/dev/null; done
show gpuslice status
cleanup
say "Done. The simulated node stays in $DEMO; \`GPUSLICE_CONFIG=$DEMO/config.toml gpuslice status\` reads it."
