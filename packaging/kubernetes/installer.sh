#!/bin/sh
# The gpuslice installer DaemonSet's entry point (see daemonset.yaml). Runs in a privileged
# pod with the host's root at $GPUSLICE_HOST_ROOT and hostPID, so host-side commands run in
# the host's mount namespace through `nsenter -t 1 -m`, with host paths throughout.
set -eu

HOST=${GPUSLICE_HOST_ROOT:-/host}
MODE=${GPUSLICE_MODE:-install}
PREFIX=/opt/gpuslice
# This image's files and the ConfigMap's config, in the pod (settable for the tests only).
SRC=${GPUSLICE_IMAGE_DIR:-/opt/gpuslice-image}
CONFIGMAP=${GPUSLICE_CONFIGMAP:-/etc/gpuslice-configmap/config.toml}
GS="$PREFIX/bin/gpuslice"
# On the host while a containerd restart is owed: written before `configure containerd` runs
# and removed only once containerd restarted, so a restart that failed or never ran (the pod
# evicted, OOM-killed or drained in between) is made up on the pod's next start, when
# `configure` finds nothing to change. Outside $PREFIX: it outlives an uninstall's removal.
PENDING=/var/lib/gpuslice/containerd-restart-pending

host() { nsenter -t 1 -m -- "$@"; }
log() { echo "gpuslice-installer: $*"; }

restart_containerd() {
    if [ "${GPUSLICE_RESTART_CONTAINERD:-true}" != true ]; then
        # The operator restarts it: said once, not on every later start.
        log "containerd config changed; restart containerd yourself (GPUSLICE_RESTART_CONTAINERD=false)"
    else
        log "restarting containerd (running containers keep running)"
        host systemctl restart containerd
    fi
    rm -f "$HOST$PENDING"
}

# Runs the host's `gpuslice ARGS` (a `configure containerd`) and restarts containerd when that
# changed its config or when an earlier run's restart is still owed ($PENDING).
configure_containerd() {
    owed=false
    if [ -e "$HOST$PENDING" ]; then owed=true; fi
    mkdir -p "$(dirname "$HOST$PENDING")"
    echo "gpuslice installer: containerd must restart to load its config" >"$HOST$PENDING.new"
    mv -f "$HOST$PENDING.new" "$HOST$PENDING"
    out=$(host "$GS" "$@")
    echo "$out"
    if [ "$owed" = true ]; then
        log "an earlier run's containerd restart did not happen; making it up"
        restart_containerd
    elif echo "$out" | grep -q "nothing to change"; then
        rm -f "$HOST$PENDING"
    else
        restart_containerd
    fi
}

# Copies a file to the host atomically (a running containerd may exec the old one).
put() {
    mkdir -p "$(dirname "$HOST$2")"
    cp "$1" "$HOST$2.new"
    chmod "$3" "$HOST$2.new"
    mv -f "$HOST$2.new" "$HOST$2"
}

if [ "$MODE" = uninstall ]; then
    # containerd restarts (and drops the runtime) before the binaries it points at go
    # (with GPUSLICE_RESTART_CONTAINERD=false that restart is the operator's).
    if [ -x "$HOST$GS" ]; then
        configure_containerd --config /dev/null configure containerd --remove
    elif [ -e "$HOST$PENDING" ]; then
        restart_containerd
    fi
    rm -rf "$HOST$PREFIX" "$HOST/var/run/cdi/gpuslice.io-gpu.json"
    rmdir "$(dirname "$HOST$PENDING")" 2>/dev/null || true
    log "uninstalled; delete the DaemonSet now"
    touch /run/gpuslice-installer.ready
    exec sleep infinity
fi

put "$SRC/gpuslice" "$GS" 0755
put "$SRC/gpuslice-runtime" "$PREFIX/bin/gpuslice-runtime" 0755
# Where the static `gpuslice` hands its non-hook commands to (docs/architecture.md).
put "$SRC/gpuslice-full" "$PREFIX/lib/gpuslice/gpuslice-full" 0755
put "$SRC/libgpuslice_shim.so" "$PREFIX/lib/libgpuslice_shim.so" 0644
put "$CONFIGMAP" /etc/gpuslice/config.toml 0644
log "installed to $PREFIX"

host "$GS" cdi generate
configure_containerd configure containerd

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
