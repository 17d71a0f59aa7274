# The test cluster's DNS: CoreDNS (tests/coredns), its build and its start against the API server.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh after scripts/lib/gomodule.sh and cluster-process.sh.
# With several nodes (or --kubeflow) pods find Services by name, as Kubeflow's ranks find
# their master: CoreDNS runs on the host with its kubernetes plugin reading Services and
# EndpointSlices through the admin kubeconfig, and listens on port 53 of the cluster's DNS
# address (dns_ip: one per slot, KUBE_SLOT), an address of its own on the loopback link;
# every kubelet's clusterDNS names it, and the pods reach it through their bridge's gateway
# (the host routes). Uses REPO, DIR, KUBE_SLOT, die, log and the sourcing script's helpers.

COREDNS_SRC="$REPO/tests/coredns"
COREDNS_CACHE_ROOT="${GPUSLICE_COREDNS_CACHE:-/var/cache/gpuslice/coredns}"
CLUSTER_DOMAIN=cluster.local

# dns_ip: the cluster DNS address of slot KUBE_SLOT, 10.244.0.(10 + slot).
dns_ip() {
  echo "10.244.0.$((10 + ${KUBE_SLOT:-0}))"
}

# dns_label: the loopback link's label on that address (lo:gskdns; lo:gskdnsS in slot S > 0).
dns_label() {
  local slot="${KUBE_SLOT:-0}"
  [ "$slot" -eq 0 ] && echo lo:gskdns || echo "lo:gskdns$slot"
}

# module_version DIR MODULE: the version DIR/go.mod requires of MODULE, in a require block or
# on a `require MODULE VERSION` line of its own (go mod tidy writes a lone direct one so); a
# `tool` block naming MODULE is skipped.
module_version() {
  awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v[0-9]/ { print $2; exit }' "$1/go.mod"
}

# build_coredns: prints the cached bin directory holding coredns, building it first (cold:
# minutes; warm: the key's hashing).
build_coredns() {
  if [ -n "${GPUSLICE_COREDNS_BIN:-}" ]; then
    [ -x "$GPUSLICE_COREDNS_BIN" ] || die "GPUSLICE_COREDNS_BIN=$GPUSLICE_COREDNS_BIN is not an executable"
    echo "$GPUSLICE_COREDNS_BIN"
    return
  fi
  local go release key start bin
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(module_version "$COREDNS_SRC" github.com/coredns/coredns)"
  [ -n "$release" ] || die "$COREDNS_SRC/go.mod requires no github.com/coredns/coredns version"
  key="$(gomodule_key "$go" "$COREDNS_SRC" -- "-s -w" "CGO_ENABLED=0" coredns)"
  bin="$(gomodule_build --go "$go" --cache "$COREDNS_CACHE_ROOT" --cache-var GPUSLICE_COREDNS_CACHE \
    --entry "coredns-$release-$key" --bin coredns --src "$COREDNS_SRC" --env CGO_ENABLED=0 \
    --what "CoreDNS $release (kubernetes plugin)" --failed CoreDNS --timed "CoreDNS $release" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "-s -w" .)"
  echo "$bin/coredns"
}

# dns_ready PORT: CoreDNS's ready plugin answers 200 on PORT (its kubernetes plugin has synced
# with the API server).
dns_ready() {
  curl -fs --max-time 5 "http://127.0.0.1:$1/ready"
}

# start_dns: the slot's DNS address (dns_ip) on the loopback link (labelled dns_label), CoreDNS
# serving port 53 there for CLUSTER_DOMAIN from the API server (the admin kubeconfig); returns
# once it is ready; sets CLUSTER_DNS_IP for the kubelets. Pods reach that address through their
# bridge's gateway: it is an address of this host.
start_dns() {
  local coredns ready health addr
  addr="$(dns_ip)"
  coredns="$(build_coredns)"
  mkdir -p "$DIR/coredns"
  ready="$(free_port)"
  health="$(free_port)"
  cat >"$DIR/coredns/Corefile" <<COREFILE
# Written by scripts/kube-cluster.sh up: the test cluster's DNS (Services and their pods).
.:53 {
    bind $addr
    errors
    health 127.0.0.1:$health
    ready 127.0.0.1:$ready
    kubernetes $CLUSTER_DOMAIN in-addr.arpa {
        kubeconfig $DIR/kubeconfig
        ttl 5
    }
}
COREFILE
  # A leftover of a run that was killed before its `down` is replaced.
  ip addr del "$addr/32" dev lo >/dev/null 2>&1 || true
  ip addr add "$addr/32" dev lo label "$(dns_label)" ||
    fail_up "cannot add the cluster DNS address $addr to the loopback link"
  : >"$DIR/coredns/address-added"
  start coredns "$coredns" -conf "$DIR/coredns/Corefile"
  wait_for coredns "being ready on 127.0.0.1:$ready (its kubernetes plugin synced)" dns_ready "$ready"
  CLUSTER_DNS_IP="$addr"
}

# stop_dns: CoreDNS and its address (a no-op when `up` started none).
stop_dns() {
  [ -d "$DIR/coredns" ] || return 0
  stop_one coredns
  [ ! -e "$DIR/coredns/address-added" ] || ip addr del "$(dns_ip)/32" dev lo >/dev/null 2>&1 || true
  rm -rf "$DIR/coredns"
}
