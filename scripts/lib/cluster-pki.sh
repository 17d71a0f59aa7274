# The test cluster's credentials: CA, certificates, service-account keys (DIR/pki), kubeconfigs.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh. openssl makes EC P-256 keys; every certificate is signed
# by the cluster's own CA, DIR/pki/ca.{crt,key}. Uses DIR, BIN (kubectl), API_URL and die of
# the sourcing script.

# The extensions of a server certificate for the API server, under each name it is reached by.
SERVER_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
# The extensions of a client certificate (the subject's O and CN are its groups and user).
CLIENT_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

# ossl ARGS...: openssl, quiet unless it fails.
ossl() {
  local out
  out="$(openssl "$@" 2>&1)" || die "openssl $* failed: $out"
}

# gen_key FILE: an EC P-256 private key.
gen_key() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$1"
}

# sign NAME SUBJECT EXTENSIONS: DIR/pki/NAME.{key,crt} signed by the cluster CA.
sign() {
  local name="$1" subj="$2" ext="$3" pki="$DIR/pki"
  gen_key "$pki/$name.key"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  ossl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$pki/$name.ext" \
    -out "$pki/$name.crt"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

# sign_client NAME SUBJECT: DIR/pki/NAME.{key,crt}, a client certificate for SUBJECT.
sign_client() {
  sign "$1" "$2" "$CLIENT_EXT"
}

# make_pki: the CA, the API server's serving certificate, the client certificates of the
# admin, the scheduler, the controller manager and the API server's kubelet client, and the
# service-account key pair.
make_pki() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  gen_key "$pki/ca.key"
  ossl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpuslice-test-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt"
  sign apiserver "/CN=kube-apiserver" "$SERVER_EXT"
  sign_client admin "/O=system:masters/CN=kubernetes-admin"
  sign_client kube-scheduler "/CN=system:kube-scheduler"
  sign_client kube-controller-manager "/CN=system:kube-controller-manager"
  sign_client apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  gen_key "$pki/sa.key"
  ossl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
}

# kubeconfig FILE USER: a kubeconfig for the API server with DIR/pki/USER.{crt,key}.
kubeconfig() {
  local file="$1" user="$2" k=("$BIN/kubectl" --kubeconfig "$1")
  "${k[@]}" config set-cluster gpuslice-test --server "$API_URL" \
    --certificate-authority "$DIR/pki/ca.crt" --embed-certs >/dev/null
  "${k[@]}" config set-credentials "$user" --client-certificate "$DIR/pki/$user.crt" \
    --client-key "$DIR/pki/$user.key" --embed-certs >/dev/null
  "${k[@]}" config set-context gpuslice-test --cluster gpuslice-test --user "$user" >/dev/null
  "${k[@]}" config use-context gpuslice-test >/dev/null
  chmod 600 "$file"
}
