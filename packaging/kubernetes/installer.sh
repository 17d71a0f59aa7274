#!/bin/sh
# The gpuslice installer DaemonSet's entry point (see daemonset.yaml). Runs in a privileged
# pod with the host's root at $GPUSLICE_HOST_ROOT and hostPID, so host-side commands run in
# the host's mount namespace through `nsenter -t 1 -m`, with host paths throughout.
set -eu

HOST=${GPUSLICE_HOST_ROOT:-/host}
MODE=${GPUSLICE_MODE:-install}
PREFIX=/opt/gpuslice
SRC=/opt/gpuslice-image
GS="$PREFIX/bin/gpuslice"

host() { nsenter -t 1 -m -- "$@"; }
log() { echo "gpuslice-installer: $*"; }

restart_containerd() {
    if [ "${GPUSLICE_RESTART_CONTAINERD:-true}" != true ]; then
        log "containerd config changed; restart containerd yourself (GPUSLICE_RESTART_CONTAINERD=false)"
        return
    fi
    log "restarting containerd (running containers keep running)"
    host systemctl restart containerd
}

# Copies a file to the host atomically (a running containerd may exec the old one).
put() {
    mkdir -p "$(dirname "$HOST$2")"
    cp "$1" "$HOST$2.new"
    chmod "$3" "$HOST$2.new"
    mv -f "$HOST$2.new" "$HOST$2"
}

if [ "$MODE" = uninstall ]; then
    if [ -x "$HOST$GS" ]; then
        out=$(host "$GS" --config /dev/null configure containerd --remove)
        echo "$out"
        echo "$out" | grep -q "nothing to change" || restart_containerd
    fi
    rm -rf "$HOST$PREFIX" "$HOST/var/run/cdi/gpuslice.io-gpu.json"
    log "uninstalled; delete the DaemonSet now"
    touch /run/gpuslice-installer.ready
    exec sleep infinity
fi

put "$SRC/gpuslice" "$GS" 0755
put "$SRC/gpuslice-runtime" "$PREFIX/bin/gpuslice-runtime" 0755
# Where the static `gpuslice` hands its non-hook commands to (docs/architecture.md).
put "$SRC/gpuslice-full" "$PREFIX/lib/gpuslice/gpuslice-full" 0755
put "$SRC/libgpuslice_shim.so" "$PREFIX/lib/libgpuslice_shim.so" 0644
put /etc/gpuslice-configmap/config.toml /etc/gpuslice/config.toml 0644
log "installed to $PREFIX"

host "$GS" cdi generate
out=$(host "$GS" configure containerd)
echo "$out"
echo "$out" | grep -q "nothing to change" || restart_containerd

touch /run/gpuslice-installer.ready
# Regenerate the CDI spec and inventory when the driver changes (module reload, upgrade).
version() { cat "$HOST/proc/driver/nvidia/version" 2>/dev/null || true; }
last=$(version)
while sleep 60; do
    now=$(version)
    if [ "$now" != "$last" ]; then
        log "driver changed; regenerating the CDI spec"
        host "$GS" cdi generate || log "cdi generate failed; will retry"
        last=$now
    fi
done
