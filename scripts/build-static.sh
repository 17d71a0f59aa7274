#!/usr/bin/env bash
# Builds the static (musl) `gpuslice` and `gpuslice-runtime` that a container's create path
# runs (Cargo profile `static`), and stages them in target/release/static/ with the full
# (glibc) `gpuslice` beside them as `gpuslice-full`, which the static `gpuslice` hands every
# non-hook command to (it cannot load NVML). On VMs where `cpuid` traps, a static process
# starts in ~0.3 ms against ~1 ms for glibc (docs/benchmarks.md, "Create path").
#
#   scripts/build-static.sh        # after `cargo build --release` (scripts/build.sh)
#
# Adds the Rust target x86_64-unknown-linux-musl with rustup when it is missing. Exits 3
# (and stages nothing) when the target cannot be had; callers then use the glibc build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/install.sh
target=x86_64-unknown-linux-musl
out=target/release/static

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "build-static: adding the Rust target $target" >&2
  if ! rustup target add "$target" >&2; then
    echo "build-static: the Rust target $target is not available; no static build (the create path uses the glibc binaries)" >&2
    rm -rf "$out"
    exit 3
  fi
fi
# The full build staged beside the static ones: always built (a no-op when fresh), as
# target/ may hold another checkout's (scripts/cargo-cache.sh).
cargo build --release --locked -p gpuslice --bins >&2

# `--no-default-features`: the create path alone (gpuslice-hook); the node agent, engine
# registration, the kubelet plugin and the console never enter the static build, which runs
# only the hooks and the wrapper and hands any other command line to gpuslice-full.
cargo build --profile static --locked --target "$target" -p gpuslice --bins --no-default-features
# Atomic installs, not a fresh directory: an engine configured with these binaries keeps
# running them while they are replaced, and never finds them missing or half-written.
mkdir -p "$out"
install_atomic "target/$target/static/gpuslice" "$out/gpuslice"
install_atomic "target/$target/static/gpuslice-runtime" "$out/gpuslice-runtime"
install_atomic target/release/gpuslice "$out/gpuslice-full"
echo "build-static: staged $out/{gpuslice,gpuslice-runtime} (static) and $out/gpuslice-full" >&2
