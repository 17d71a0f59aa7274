#!/usr/bin/env bash
# Installs what building, the demo and the tests need on a fresh Debian 12 machine (as root).
# Idempotent: packages already present are not fetched again.
set -euo pipefail

PACKAGES=(
  runc podman containerd        # container engines driven by the end-to-end tests and the demo
  debootstrap                   # Debian bullseye rootfs for the shim's old-glibc test
  prometheus                    # promtool checks the exporter's output
  hyperfine                     # whole-process benchmarks
  jq busybox-static             # test images and JSON checks
  gcc libc6-dev binutils        # linking, fixture libraries, objdump
  python3 python3-venv          # ziglang (for the portable shim build) comes from PyPI
  iproute2 procps util-linux kmod
  ca-certificates
)

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
