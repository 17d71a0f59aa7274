#!/usr/bin/env bash
# Acceptance check of the Debian package, as root on Debian 12:
#   1. snapshot everything the package or its commands may touch;
#   2. `dpkg -i` the package (built by packaging/build-deb.sh unless given as $1);
#   3. the demo (scripts/demo.sh, docs/operator-guide.md) with the installed paths: a
#      simulated two-GPU node from the installed simulated driver, the CDI spec, a whole GPU
#      through CDI, a sliced podman container that sees its limits through the installed
#      shim, a request that does not fit refused, the slices released; then
#      `gpuslice configure` for containerd (checked with containerd's own `config dump`),
#      docker and CRI-O at their standard paths;
#   4. `dpkg -r`, then the snapshot again: the node must be exactly as before.
# Exits non-zero with the difference when anything is left behind or a check fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() { echo "check-deb: FAIL: $*" >&2; exit 1; }
step() { echo "== check-deb: $*"; }

[ "$(id -u)" = 0 ] || fail "run as root"
if dpkg-query -W -f='${Status}' gpuslice 2>/dev/null | grep -q "install ok installed"; then
    fail "gpuslice is already installed; this check needs a node without it"
fi

# The e2e tests share /var/run/cdi and the engines: take their host-wide lock.
mkdir -p /run/lock
exec 9>/run/lock/gpuslice-e2e.lock
flock 9

deb=${1:-}
if [ -z "$deb" ]; then
    step "building the package"
    deb=$(packaging/build-deb.sh | tail -1)
fi
[ -f "$deb" ] || fail "no package at $deb"

WATCHED=(
    /usr/bin/gpuslice /usr/bin/gpuslice-runtime /usr/bin/kubectl-gpuslice /usr/lib/gpuslice /usr/share/gpuslice
    /usr/share/doc/gpuslice /lib/systemd/system/gpuslice-cdi.service
    /lib/systemd/system/gpuslice-cdi.path /lib/systemd/system/gpuslice-serve.service
    /etc/systemd/system
    /var/lib/systemd/deb-systemd-helper-enabled /var/lib/systemd/deb-systemd-helper-masked
    /etc/gpuslice /etc/containerd /etc/containers/oci /usr/share/containers/oci /etc/docker
    /etc/crio /etc/cdi /var/run/cdi /run/gpuslice
)

# Every path under WATCHED: type, mode, and content digest or link target.
snapshot() {
    local p
    for p in "${WATCHED[@]}"; do
        [ -e "$p" ] || [ -L "$p" ] || continue
        find "$p" -xdev | sort | while IFS= read -r f; do
            if [ -L "$f" ]; then
                echo "link $f -> $(readlink "$f")"
            elif [ -d "$f" ]; then
                echo "dir  $(stat -c %a "$f") $f"
            else
                echo "file $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-16) $f"
            fi
        done
    done
}

# /var/run/cdi is the tmpfs directory every CDI user shares (podman reads only it and
# /etc/cdi): the package writes a file there, and its removal deletes that file only.
mkdir -p /var/run/cdi
T=$(mktemp -d /tmp/gpuslice-check-deb.XXXXXX)
IMAGE=localhost/gpuslice-check-deb:1
had_image=no
podman image exists "$IMAGE" 2>/dev/null && had_image=yes
cleanup() {
    dpkg -r gpuslice >/dev/null 2>&1 || true
    [ "$had_image" = yes ] || podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
    rm -rf "$T"
}
trap cleanup EXIT

snapshot > "$T/before"

step "dpkg -i $deb"
dpkg -i "$deb"
for f in /usr/bin/gpuslice /usr/bin/gpuslice-runtime /usr/bin/kubectl-gpuslice \
    /usr/lib/gpuslice/libgpuslice_shim.so \
    /usr/lib/gpuslice/sim/libcuda.so.1 /usr/lib/gpuslice/sim/libnvidia-ml.so.1 \
    /usr/lib/gpuslice/sim/gpuslice-probe /lib/systemd/system/gpuslice-cdi.service \
    /lib/systemd/system/gpuslice-cdi.path /lib/systemd/system/gpuslice-serve.service \
    /usr/share/containers/oci/hooks.d/gpuslice.json \
    /usr/share/gpuslice/kubernetes/runtimeclass.yaml /usr/share/doc/gpuslice/operator-guide.md; do
    [ -e "$f" ] || fail "the package did not install $f"
done
# Every Kubernetes manifest of the tree, the DRA ones and their examples too, as shipped.
for f in packaging/kubernetes/*.yaml packaging/kubernetes/dra/*.yaml \
    packaging/kubernetes/dra/examples/*.yaml; do
    installed=/usr/share/gpuslice/kubernetes/${f#packaging/kubernetes/}
    cmp -s "$f" "$installed" || fail "the package did not install $f as $installed"
done
# The units postinst enables, by the links `systemctl enable` would make.
enabled_links=(
    /etc/systemd/system/paths.target.wants/gpuslice-cdi.path
    /etc/systemd/system/multi-user.target.wants/gpuslice-cdi.service
    /etc/systemd/system/multi-user.target.wants/gpuslice-serve.service
)
for l in "${enabled_links[@]}"; do
    [ -L "$l" ] || fail "postinst did not enable $(basename "$l") ($l is missing)"
done
# The node agent's unit runs the installed gpuslice's exporter and enforcer, always.
grep -qx 'ExecStart=/usr/bin/gpuslice serve' /lib/systemd/system/gpuslice-serve.service \
    || fail "gpuslice-serve.service does not run /usr/bin/gpuslice serve"
grep -qx 'Restart=always' /lib/systemd/system/gpuslice-serve.service \
    || fail "gpuslice-serve.service is not restarted when it stops"
# A unit the admin disabled stays disabled across an upgrade (here: the same package again),
# as dh_installsystemd's postinst does; the others stay enabled.
step "an admin's disable survives an upgrade"
# deb-systemd-helper runs only under dpkg: tell it the package it acts for.
dsh() { DPKG_MAINTSCRIPT_PACKAGE=gpuslice deb-systemd-helper "$@"; }
dsh disable gpuslice-cdi.path gpuslice-serve.service
dpkg -i "$deb"
for u in gpuslice-cdi.path gpuslice-serve.service; do
    ! dsh --quiet is-enabled "$u" \
        || fail "reinstalling the package enabled $u again, which the admin had disabled"
done
[ -L /etc/systemd/system/multi-user.target.wants/gpuslice-cdi.service ] \
    || fail "reinstalling the package disabled gpuslice-cdi.service"
gpuslice --version
# The kubectl plugin runs, and the installed gpuslice (the static one hands over to the full
# build) has the web console.
kubectl-gpuslice --help | grep -q 'allocate' || fail "/usr/bin/kubectl-gpuslice --help does not list allocate"
gpuslice console --help | grep -q -- '--allow-edit' || fail "gpuslice console --help does not list --allow-edit"
# With a static build (scripts/build-static.sh), the create path's binaries are static and
# the full build they hand other commands to is installed beside the shim.
if [ -x "$root/target/release/static/gpuslice-runtime" ]; then
    for f in /usr/bin/gpuslice /usr/bin/gpuslice-runtime; do
        ! readelf -l "$f" | grep -q INTERP || fail "$f is not the static build"
    done
    readelf -l /usr/lib/gpuslice/gpuslice-full | grep -q INTERP \
        || fail "/usr/lib/gpuslice/gpuslice-full is not the full (glibc) build"
fi
# postinst configures no engine unless asked (GPUSLICE_CONFIGURE).
snapshot | grep -E ' /etc/(containerd|docker|crio)' > "$T/engines-after-install" || true
grep -E ' /etc/(containerd|docker|crio)' "$T/before" > "$T/engines-before" || true
diff -u "$T/engines-before" "$T/engines-after-install" \
    || fail "postinst changed engine configs without being asked"

step "demo: a simulated two-GPU node with the installed shim and driver"
cat > "$T/config.toml" <<EOF
state_dir = "$T/state"
[inventory]
source = "simulated"
[[inventory.simulated]]
memory = "16Gi"
[[inventory.simulated]]
memory = "16Gi"
EOF
GS=(gpuslice --config "$T/config.toml")
"${GS[@]}" cdi generate
"${GS[@]}" cdi list | grep -qx 'gpuslice.io/gpu=all' || fail "cdi list lacks gpuslice.io/gpu=all"
"${GS[@]}" status

# A small glibc image (busybox for the shell) and podman with this host's needs.
# shellcheck source=lib/image.sh
. "$root/scripts/lib/image.sh"
[ "$had_image" = yes ] || podman_image "$T/rootfs" "$IMAGE"
podman_conf "$T/containers.conf"
export CONTAINERS_CONF="$T/containers.conf"
out=$(podman run --rm --device gpuslice.io/gpu=0 "$IMAGE" sh -c 'ls /dev | grep nvidia')
echo "$out"
echo "$out" | grep -qx nvidia0 || fail "a whole GPU through CDI: /dev/nvidia0 missing"
! echo "$out" | grep -qx nvidia1 || fail "a whole GPU through CDI: /dev/nvidia1 visible"
"${GS[@]}" configure podman --hooks-dir "$T/hooks.d"
# Written by the full build, the hook still names the installed /usr/bin/gpuslice.
grep -q '"path": "/usr/bin/gpuslice"' "$T/hooks.d/gpuslice.json" \
    || fail "the podman hook does not run /usr/bin/gpuslice: $(cat "$T/hooks.d/gpuslice.json")"
out=$(podman --hooks-dir "$T/hooks.d" run --rm \
    --annotation gpuslice.io/memory=4Gi --annotation gpuslice.io/cores=30 \
    -v /usr/lib/gpuslice/sim/gpuslice-probe:/usr/local/bin/gpuslice-probe:ro \
    "$IMAGE" sh -c 'cat /etc/ld.so.preload; cat /run/gpuslice/limits.json; echo; ls /dev; /usr/local/bin/gpuslice-probe info --json')
echo "$out"
echo "$out" | grep -qx /usr/lib/gpuslice/libgpuslice_shim.so || fail "the container does not preload the installed shim"
echo "$out" | grep -q '"memory_limit":4294967296' || fail "the container's limits.json lacks the 4 GiB limit"
echo "$out" | grep -q 4294967296 || fail "the probe does not see the 4 GiB slice"
if podman --hooks-dir "$T/hooks.d" run --rm --annotation gpuslice.io/memory=20Gi "$IMAGE" true; then
    fail "a 20 GiB slice was created on 16 GiB GPUs"
fi
"${GS[@]}" status --json | grep -q '"reservations": \[\]' || fail "the slices were not released"

step "demo: register with every engine at the standard paths"
gpuslice configure containerd
if command -v containerd >/dev/null; then
    containerd config dump | grep -q 'BinaryName = "/usr/bin/gpuslice-runtime"' \
        || fail "containerd's effective config lacks the gpuslice runtime"
fi
gpuslice configure docker
grep -q '"path": "/usr/bin/gpuslice-runtime"' /etc/docker/daemon.json || fail "daemon.json lacks the runtime"
gpuslice configure crio
grep -q 'runtime_path = "/usr/bin/gpuslice-runtime"' /etc/crio/crio.conf.d/99-gpuslice.conf \
    || fail "the CRI-O drop-in lacks the runtime"
gpuslice configure containerd | grep -q "nothing to change" || fail "configure containerd is not idempotent"

step "dpkg -r gpuslice"
rm -rf "$T/state"
dpkg -r gpuslice
snapshot > "$T/after"
if ! diff -u "$T/before" "$T/after"; then
    fail "dpkg -r left the node different from before (diff above)"
fi
dpkg -P gpuslice >/dev/null 2>&1 || true
echo "check-deb: OK: installed, demo passed, removal restored the node"
