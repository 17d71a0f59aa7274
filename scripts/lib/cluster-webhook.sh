# The test cluster's admission webhook (`up DIR … --webhook`): `gpuslice webhook --hami-compat`
# on a free port of 127.0.0.1 with a serving certificate from the cluster's CA, registered with
# a MutatingWebhookConfiguration by URL, and the ValidatingAdmissionPolicy the chart installs
# with it (packaging/kubernetes/annotations-policy.yaml: a pod's slice-request annotations
# fixed at its creation).
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh. Uses DIR, REPO, BIN, sign and
# free_port/start/wait_for/stop_one (cluster-pki.sh, cluster-process.sh), gpuslice_bin_dir
# (cluster-node.sh), kubectl_admin and fail_up of the sourcing script.

# The webhook's serving certificate: the name the API server dials.
WEBHOOK_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"

# webhook_configuration URL CA_BUNDLE: the registration, the same webhook the Helm chart
# registers (packaging/helm/gpuslice/templates/webhook.yaml) but by URL: only pods whose
# containers name gpuslice.io/* or nvidia.com/gpu* resources or that name a claim template,
# pods carrying gpuslice.io/* annotations (refused where a budget holds; a rank of a job kept
# one per node), pods of a job (its labels) that name a claim (kept one rank per node), and
# ResourceClaims that ask gpuslice's device classes, except those the resource claim
# controller makes for a pod (its template was charged when the pod was admitted), are sent
# (matchConditions), and for those the API server refuses the object while the webhook cannot
# be reached (failurePolicy: Fail), so a GPU pod is never admitted unchanged nor a claim
# uncharged against its namespace's budget (docs/webhook.md, docs/quotas.md).
webhook_configuration() {
  # One entry's settings shared by both: who is called and what a failure to call means.
  webhook_common() {
    cat <<YAML
  admissionReviewVersions: [v1]
  sideEffects: NoneOnDryRun
  failurePolicy: Fail
  timeoutSeconds: 10
  reinvocationPolicy: Never
  clientConfig:
    url: $1
    caBundle: $2
YAML
  }
  cat <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: gpuslice-webhook
  labels: {app.kubernetes.io/managed-by: kube-cluster.sh}
webhooks:
- name: pods.gpuslice.io
$(webhook_common "$1" "$2")
  rules:
  - operations: [CREATE]
    apiGroups: [""]
    apiVersions: [v1]
    resources: [pods]
    scope: Namespaced
  namespaceSelector:
    matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}
  matchConditions:
  - name: names-gpu-resources
    expression: >-
      (object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))
      .exists(c, has(c.resources) && (
        (has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('gpuslice.io/') || k.startsWith('nvidia.com/gpu') || k in ['deviceclass.resource.kubernetes.io/gpuslice.io', 'deviceclass.resource.kubernetes.io/slots.gpuslice.io'])) ||
        (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('gpuslice.io/') || k.startsWith('nvidia.com/gpu') || k in ['deviceclass.resource.kubernetes.io/gpuslice.io', 'deviceclass.resource.kubernetes.io/slots.gpuslice.io'])))) ||
      (has(object.spec.resourceClaims) && object.spec.resourceClaims.exists(e, has(e.resourceClaimTemplateName))) ||
      (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('gpuslice.io/') &&
        (k in ['gpuslice.io/gpus', 'gpuslice.io/memory', 'gpuslice.io/cores', 'gpuslice.io/gpu', 'gpuslice.io/gpu-type', 'gpuslice.io/policy'] ||
        ['gpuslice.io/gpus.', 'gpuslice.io/memory.', 'gpuslice.io/cores.', 'gpuslice.io/gpu.', 'gpuslice.io/gpu-type.', 'gpuslice.io/policy.'].exists(p, k.startsWith(p))))) ||
      (has(object.metadata.labels) &&
        ['gpuslice.io/job', 'training.kubeflow.org/job-name', 'jobset.sigs.k8s.io/jobset-name'].exists(l, l in object.metadata.labels) &&
        has(object.spec.resourceClaims) && object.spec.resourceClaims.exists(e, has(e.resourceClaimName)))
- name: claims.gpuslice.io
$(webhook_common "$1" "$2")
  rules:
  - operations: [CREATE]
    apiGroups: [resource.k8s.io]
    apiVersions: [v1]
    resources: [resourceclaims]
    scope: Namespaced
  namespaceSelector:
    matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}
  matchConditions:
  - name: asks-gpuslice-devices
    expression: >-
      has(object.spec.devices) && has(object.spec.devices.requests) &&
      object.spec.devices.requests.exists(r,
        (has(r.exactly) && r.exactly.deviceClassName in ['gpuslice.io', 'slots.gpuslice.io']) ||
        (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in ['gpuslice.io', 'slots.gpuslice.io'])))
  - name: not-a-pods-claim-from-the-claim-controller
    expression: >-
      !(request.userInfo.username in ['system:serviceaccount:kube-system:resource-claim-controller', 'system:kube-controller-manager'] &&
        has(object.metadata.ownerReferences) &&
        object.metadata.ownerReferences.exists(o, o.apiVersion == 'v1' && o.kind == 'Pod' && has(o.controller) && o.controller))
YAML
}

# start_webhook: the certificate, the webhook, its health, its registration, the annotation
# policy; WEBHOOK_URL.
start_webhook() {
  local gbin port
  gbin="$(gpuslice_bin_dir)"
  sign webhook "/CN=gpuslice-webhook" "$WEBHOOK_EXT"
  port="$(free_port)"
  start gpuslice-webhook "$gbin/gpuslice" webhook --listen "127.0.0.1:$port" \
    --tls-cert "$DIR/pki/webhook.crt" --tls-key "$DIR/pki/webhook.key" \
    --kubeconfig "$DIR/kubeconfig" --hami-compat --budget-recount 2
  wait_for gpuslice-webhook "serving https://127.0.0.1:$port/healthz" \
    curl -sf --max-time 2 --cacert "$DIR/pki/ca.crt" "https://127.0.0.1:$port/healthz"
  WEBHOOK_URL="https://127.0.0.1:$port/mutate"
  webhook_configuration "$WEBHOOK_URL" "$(base64 -w0 <"$DIR/pki/ca.crt")" >"$DIR/webhook.yaml"
  logged webhook-registration "registering the webhook" kubectl_admin apply -f "$DIR/webhook.yaml"
  logged webhook-annotations-policy "applying the policy that fixes slice-request annotations at creation" \
    kubectl_admin apply -f "$REPO/packaging/kubernetes/annotations-policy.yaml"
}

# stop_webhook: the webhook `up` started, if any (its registration goes with the cluster).
stop_webhook() {
  stop_one gpuslice-webhook
  rm -f "$DIR/webhook.yaml"
}
