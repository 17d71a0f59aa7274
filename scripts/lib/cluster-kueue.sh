# The test cluster's Kueue (`up DIR … --kueue`, `build-kueue`): the manager of the release
# pinned in tests/kueue/go.mod, built from its Go module and cached with its CRDs and webhook
# manifests; run as a process on this machine against the cluster, its webhooks registered by
# URL with a serving certificate from the cluster's CA.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh after scripts/lib/gomodule.sh. Uses REPO, DIR, BIN, die
# and log of the sourcing script, sign (cluster-pki.sh), free_port/start/wait_for/stop_one/
# logged (cluster-process.sh) and kubectl_admin (cluster-control-plane.sh).

KUEUE_SRC="$REPO/tests/kueue"
KUEUE_CACHE_ROOT="${GPUSLICE_KUEUE_CACHE:-/var/cache/gpuslice/kueue}"

# --- the build ----------------------------------------------------------------------------------

kueue_release() {
  gomodule_release "$KUEUE_SRC" sigs.k8s.io/kueue
}

kueue_ldflags() {
  echo "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$1"
}

# kueue_entry_files TMP: beside bin/, the module's CRDs (crd/*.yaml, from
# config/components/crd/bases) and webhook registrations (webhook/manifests.yaml, from
# config/components/webhook), which `up --kueue` applies: the same release as the binary.
kueue_entry_files() {
  local tmp="$1" mod
  mod="$(cd "$KUEUE_SRC" && "$(gomodule_go)" list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/kueue)" || return 1
  [ -n "$mod" ] && [ -d "$mod/config/components/crd/bases" ] || {
    echo "kube-cluster: the module sigs.k8s.io/kueue has no config/components/crd/bases ($mod)" >&2
    return 1
  }
  mkdir -p "$tmp/crd" "$tmp/webhook" &&
    cp "$mod"/config/components/crd/bases/*.yaml "$tmp/crd/" &&
    cp "$mod/config/components/webhook/manifests.yaml" "$tmp/webhook/manifests.yaml" &&
    chmod -R a+rX "$tmp/crd" "$tmp/webhook"
}

# build_kueue_binary: prints the cached bin directory holding kueue (its CRDs in ../crd, its
# webhook manifests in ../webhook), building it first (a cold build takes minutes, a cached one
# the key's hashing: both are logged). GPUSLICE_KUEUE_BIN_DIR names another such directory.
build_kueue_binary() {
  if [ -n "${GPUSLICE_KUEUE_BIN_DIR:-}" ]; then
    check_bin_dir "$GPUSLICE_KUEUE_BIN_DIR" GPUSLICE_KUEUE_BIN_DIR kueue
    [ -d "$GPUSLICE_KUEUE_BIN_DIR/../crd" ] && [ -f "$GPUSLICE_KUEUE_BIN_DIR/../webhook/manifests.yaml" ] ||
      die "GPUSLICE_KUEUE_BIN_DIR=$GPUSLICE_KUEUE_BIN_DIR has no ../crd and ../webhook/manifests.yaml beside it"
    echo "$GPUSLICE_KUEUE_BIN_DIR"
    return
  fi
  local go release key ldflags start
  start=$(date +%s%N)
  go="$(gomodule_go)"
  release="$(kueue_release)"
  [ -n "$release" ] || die "$KUEUE_SRC/go.mod requires no sigs.k8s.io/kueue version"
  ldflags="$(kueue_ldflags "$release")"
  key="$(gomodule_key "$go" "$KUEUE_SRC" go.mod go.sum -- "$ldflags" "CGO_ENABLED=0" kueue crd webhook)"
  gomodule_build --go "$go" --cache "$KUEUE_CACHE_ROOT" --cache-var GPUSLICE_KUEUE_CACHE \
    --entry "kueue-$release-$key" --bin kueue --src "$KUEUE_SRC" --env CGO_ENABLED=0 \
    --what "Kueue $release" --failed Kueue --post kueue_entry_files \
    --timed "Kueue $release" --since "$start" -- \
    -mod=readonly -trimpath -ldflags "$ldflags" sigs.k8s.io/kueue/cmd/kueue
}

# --- `up DIR … --kueue` ---------------------------------------------------------------------------

# The namespace Kueue names as its own (config `namespace`); its webhooks skip it and kube-system.
KUEUE_NAMESPACE=kueue-system
# The CRDs whose versions Kueue converts (v1beta1 <-> v1beta2), as Kueue's own deployment
# registers them (config/components/crd/kustomization.yaml).
KUEUE_CONVERTED_CRDS=(localqueues clusterqueues cohorts workloads multikueueclusters)
# Where Kueue reads its metrics certificate when it does not manage certificates itself (a
# path compiled in); the manager runs in a mount namespace of its own that binds
# DIR/kueue/certs there, so the host only gets this empty mount point.
KUEUE_METRICS_CERTS=/etc/kueue/metrics/certs
# The values of Kueue's Helm chart that gpuslice ships; its part between the markers is the
# configuration `up --kueue` runs (docs/quotas.md).
KUEUE_VALUES="$REPO/packaging/helm/kueue-values.yaml"

# kueue_gpuslice_config: gpuslice's part of the shipped Kueue configuration (feature gates
# and resources), de-indented from the values file.
kueue_gpuslice_config() {
  awk '
    /^    # --- gpuslice: begin$/ { on = 1; next }
    /^    # --- gpuslice: end$/ { on = 0; found = 1; next }
    on { if ($0 == "") print ""; else if (substr($0, 1, 4) != "    ") exit 2; else print substr($0, 5) }
    END { if (!found) exit 3 }
  ' "$KUEUE_VALUES"
}

# kueue_configuration HEALTH_PORT WEBHOOK_PORT: Kueue's Configuration for the test cluster:
# this machine's ports, the cluster's certificate, no leader election, Jobs only; then
# gpuslice's part of the shipped configuration, with the on-demand visibility API off (an
# aggregated API server this control plane does not front).
kueue_configuration() {
  local part
  part="$(kueue_gpuslice_config)" || die "$KUEUE_VALUES has no '# --- gpuslice: begin/end' block indented by 4 spaces"
  cat <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $KUEUE_NAMESPACE
health:
  healthProbeBindAddress: 127.0.0.1:$1
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $2
  certDir: $DIR/kueue/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
integrations:
  frameworks: [batch/job]
YAML
  printf '%s\n' "$part" | sed '/^featureGates:$/a\  VisibilityOnDemand: false'
}

# kueue_webhooks URL CA_BUNDLE: Kueue's webhook registrations from the module
# (config/components/webhook/manifests.yaml) by URL instead of Service, named as Kueue's own
# deployment names them, each skipping kube-system and Kueue's namespace as there.
kueue_webhooks() {
  awk -v url="$1" -v ca="$2" -v ns="$KUEUE_NAMESPACE" '
    /^  name: (mutating|validating)-webhook-configuration$/ { print "  name: kueue-" substr($0, 9); next }
    /^    service:$/ { svc = 1; next }
    svc && /^      path: / { print "    url: " url substr($0, 13); print "    caBundle: " ca; svc = 0; next }
    svc && /^      / { next }
    /^  failurePolicy: / {
      print
      print "  namespaceSelector:"
      print "    matchExpressions:"
      print "    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, " ns "]}"
      next
    }
    { print }
  ' "$KUEUE_BIN/../webhook/manifests.yaml"
}

# kueue_conversion URL CA_BUNDLE: the merge patch that sends a CRD's version conversions to URL.
kueue_conversion() {
  printf '{"spec":{"conversion":{"strategy":"Webhook","webhook":{"conversionReviewVersions":["v1"],"clientConfig":{"url":"%s","caBundle":"%s"}}}}}' "$1" "$2"
}

# kueue_ready PORT: Kueue answers /readyz (its webhook server listens with its certificate).
kueue_ready() {
  curl -sf --max-time 2 "http://127.0.0.1:$1/readyz"
}

# start_kueue: the CRDs, the manager and its webhooks; KUEUE_WEBHOOK_URL.
start_kueue() {
  local health webhook ca crd
  KUEUE_BIN="$(build_kueue_binary)"
  mkdir -p "$DIR/kueue/certs"
  sign kueue-webhook "/CN=kueue-webhook" "$WEBHOOK_EXT"
  cp "$DIR/pki/kueue-webhook.crt" "$DIR/kueue/certs/tls.crt"
  cp "$DIR/pki/kueue-webhook.key" "$DIR/kueue/certs/tls.key"
  health="$(free_port)"
  webhook="$(free_port)"
  ca="$(base64 -w0 <"$DIR/pki/ca.crt")"
  KUEUE_WEBHOOK_URL="https://127.0.0.1:$webhook"
  kueue_configuration "$health" "$webhook" >"$DIR/kueue/config.yaml"
  kueue_webhooks "$KUEUE_WEBHOOK_URL" "$ca" >"$DIR/kueue/webhooks.yaml"

  # The CRDs (server-side: the Workload CRD is past client-side apply's annotation limit),
  # their conversions sent to the manager, the namespace. Each request may take a minute: the
  # CRDs are large (1.6 MB) and a loaded 2-core machine slows the API server's schema work.
  KUBECTL_TIMEOUT=60s logged kueue-crds "applying Kueue's CRDs" \
    kubectl_admin apply --server-side --force-conflicts -f "$KUEUE_BIN/../crd"
  for crd in "${KUEUE_CONVERTED_CRDS[@]}"; do
    KUBECTL_TIMEOUT=60s logged kueue-crds "sending $crd.kueue.x-k8s.io's conversions to Kueue" kubectl_admin patch crd \
      "$crd.kueue.x-k8s.io" --type merge -p "$(kueue_conversion "$KUEUE_WEBHOOK_URL/convert" "$ca")"
  done
  KUBECTL_TIMEOUT=60s logged kueue-crds "waiting for Kueue's CRDs to be established" \
    kubectl_admin wait --for condition=Established --timeout=50s -f "$KUEUE_BIN/../crd"
  KUBECTL_TIMEOUT=60s logged kueue-namespace "creating the namespace $KUEUE_NAMESPACE" kubectl_admin create namespace "$KUEUE_NAMESPACE"

  start_bound kueue "$DIR/kueue/certs" "$KUEUE_METRICS_CERTS" \
    "$KUEUE_BIN/kueue" --config "$DIR/kueue/config.yaml" --kubeconfig "$DIR/kubeconfig"
  wait_for kueue "answering /readyz on 127.0.0.1:$health" kueue_ready "$health"
  KUBECTL_TIMEOUT=60s logged kueue-webhooks "registering Kueue's webhooks" kubectl_admin apply -f "$DIR/kueue/webhooks.yaml"
}

# stop_kueue: the manager `up` started, if any (its objects go with the cluster).
stop_kueue() {
  stop_one kueue
  rm -rf "$DIR/kueue"
}
