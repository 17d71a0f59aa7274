#!/usr/bin/env bash
# Builds the installer image of daemonset.yaml (localhost/gpuslice-installer:<version>) with
# podman from this tree's build, the same binaries as the .deb (packaging/build-deb.sh): the
# static `gpuslice` and `gpuslice-runtime` of scripts/build-static.sh with the full glibc
# `gpuslice` as `gpuslice-full` (the glibc builds in both places when the musl target cannot
# be had), and the portable shim. Push it to your registry and
# set the DaemonSet's image to it, or load it on the nodes (`ctr -n k8s.io images import`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# Always built (a no-op when fresh): target/ may be shared between checkouts
# (scripts/cargo-cache.sh keys it by toolchain and Cargo.lock only), so binaries that are
# merely present may be another commit's.
cargo build --release --locked -p gpuslice >&2
./scripts/build-portable.sh >&2
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
if ./scripts/build-static.sh >&2; then
  cp "$target/release/static/gpuslice" "$target/release/static/gpuslice-runtime" "$ctx/"
else
  echo "build-image: the glibc binaries (no static build)" >&2
  cp "$target/release/gpuslice" "$target/release/gpuslice-runtime" "$ctx/"
fi
cp "$target/release/gpuslice" "$ctx/gpuslice-full"
cp "$target/portable/libgpuslice_shim.so" packaging/kubernetes/installer.sh packaging/kubernetes/wait-installed.sh \
   packaging/kubernetes/Containerfile "$ctx/"
podman build -t "localhost/gpuslice-installer:$version" -f "$ctx/Containerfile" "$ctx"
echo "built localhost/gpuslice-installer:$version"
