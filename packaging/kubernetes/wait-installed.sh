#!/bin/sh
# Init container of the pods that use what the installer DaemonSet (daemonset.yaml,
# installer.sh) puts on their node: the kubelet plugin and the node agent read the host's
# /etc/gpuslice/config.toml when they start, and the agent runs the host's gpuslice. The
# DaemonSets roll independently, so on an upgrade such a pod can start before its node's
# installer pod wrote the new release; this waits until it has.
#
# Each argument is WANT=HAVE: a file this pod carries (the ConfigMap's config.toml, this
# image's binary) and the host's copy the installer writes from it. It returns once every HAVE
# is byte-identical to its WANT, saying what it waits for every 30 s. Without the installer's
# ConfigMap ($GPUSLICE_CONFIGMAP, mounted optional) the installer is not in use (gpuslice put
# on the host by its package) and nothing is waited for.
set -eu

interval=${GPUSLICE_WAIT_INTERVAL:-2}
configmap=${GPUSLICE_CONFIGMAP:-/etc/gpuslice-configmap/config.toml}
for pair in "$@"; do
    case $pair in
        ?*=?*) ;;
        *) echo "wait-installed: '$pair' is not WANT=HAVE (two file paths)" >&2; exit 2 ;;
    esac
done
if [ ! -e "$configmap" ]; then
    echo "wait-installed: no installer ConfigMap at $configmap: nothing to wait for"
    exit 0
fi
for pair in "$@"; do
    if [ ! -e "${pair%%=*}" ]; then
        echo "wait-installed: ${pair%%=*} is missing from this pod (a packaging bug)" >&2
        exit 2
    fi
done
waited=0
next_say=0
while :; do
    pending=""
    for pair in "$@"; do
        want=${pair%%=*}
        have=${pair#*=}
        cmp -s "$want" "$have" || pending="$pending $have"
    done
    if [ -z "$pending" ]; then
        [ "$waited" -eq 0 ] || echo "wait-installed: the node holds this release's files after ${waited}s"
        exit 0
    fi
    if [ "$waited" -ge "$next_say" ]; then
        echo "wait-installed: waiting for the installer DaemonSet's pod on this node to write${pending} (they differ from this release's; see its log)"
        next_say=$((next_say + 30))
    fi
    sleep "$interval"
    waited=$((waited + interval))
done
