#!/usr/bin/env bash
# Builds the Debian package target/debian/gpuslice_<version>-1_<arch>.deb with cargo-deb:
# the release binaries (`gpuslice` and `gpuslice-runtime` static from
# scripts/build-static.sh, with the full glibc `gpuslice` as /usr/lib/gpuslice/gpuslice-full,
# and the kubectl plugin /usr/bin/kubectl-gpuslice;
# the glibc builds in both places when the musl target cannot be had), the portable (old-glibc) shim, simulated driver and probe from
# scripts/build-portable.sh, the systemd units, podman's hooks.d file, the Kubernetes
# manifests (packaging/kubernetes/*.yaml in /usr/share/gpuslice/kubernetes/, the DRA ones of
# packaging/kubernetes/dra/ and their examples/ in its dra/ folder) and the docs, with the
# maintainer scripts of packaging/deb/. The asset list is [package.metadata.deb] of
# cli/Cargo.toml; scripts/check-deb.sh checks every manifest is installed as in the tree.
# Installs cargo-deb when it is missing. Prints the package's path on its last line.
#
#   packaging/build-deb.sh                       # everything from this tree
#   GPUSLICE_PORTABLE_DIR=dir packaging/build-deb.sh   # take the portable files from dir
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}

if ! command -v cargo-deb >/dev/null 2>&1; then
    echo "build-deb: installing cargo-deb" >&2
    cargo install --locked cargo-deb
fi
# Always built (a no-op when fresh): target/ may be shared between checkouts
# (scripts/cargo-cache.sh keys it by toolchain and Cargo.lock only), so binaries that are
# merely present may be another commit's.
cargo build --release --locked -p gpuslice -p gpuslice-console >&2
bins="$target/release/deb-bin"
rm -rf "$bins"
mkdir -p "$bins"
if ./scripts/build-static.sh >&2; then
    cp "$target/release/static/gpuslice" "$target/release/static/gpuslice-runtime" "$bins/"
else
    echo "build-deb: packaging the glibc binaries (no static build)" >&2
    cp "$target/release/gpuslice" "$target/release/gpuslice-runtime" "$bins/"
fi
cp "$target/release/gpuslice" "$bins/gpuslice-full"
# The kubectl plugin (`kubectl gpuslice`, docs/console.md): glibc, it is not on the create path.
cp "$target/release/kubectl-gpuslice" "$bins/"

# The portable files: the caller's (GPUSLICE_PORTABLE_DIR), else this tree's, built every
# time for the reason above.
if [ -n "${GPUSLICE_PORTABLE_DIR:-}" ]; then
    portable=$GPUSLICE_PORTABLE_DIR
else
    ./scripts/build-portable.sh >&2
    portable=$target/portable
fi
# cargo-deb resolves asset paths under target/release/ to the real target directory.
stage="$target/release/deb-portable"
rm -rf "$stage"
mkdir -p "$stage"
for f in libgpuslice_shim.so libcuda.so.1 libnvidia-ml.so.1 gpuslice-probe; do
    cp "$portable/$f" "$stage/$f"
done

cargo deb --no-build --locked -p gpuslice --output "$target/debian/" >&2
ls -t "$target"/debian/gpuslice_*.deb | head -1
