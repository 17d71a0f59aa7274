#!/usr/bin/env bash
# Builds the static (musl) `gpuslice` and `gpuslice-runtime` that a container's create path
# runs (Cargo profile `static`), and stages them in target/release/static/ with the full
# (glibc) `gpuslice` beside them as `gpuslice-full`, which the static `gpuslice` hands every
# non-hook command to (it cannot load NVML). On VMs where `cpuid` traps, a static process
# starts in ~0.3 ms against ~1 ms for glibc (docs/benchmarks.md, "Create path").
#
#   scripts/build-static.sh        # after `cargo build --release` and scripts/build-portable.sh
#                                  # (scripts/build.sh); GPUSLICE_NO_PGO=1: no profile
#
# Adds the Rust target x86_64-unknown-linux-musl with rustup when it is missing. Exits 3
# (and stages nothing) when the target cannot be had; callers then use the glibc build.
set -euo pipefail
cd "$(dirname "$0")/.."
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
[ -x target/release/gpuslice ] || cargo build --release --locked -p gpuslice --bins

# Profile-guided: an instrumented build, a training run of the create path on a simulated
# node (scripts/lib/pgo-train.sh), then the build that uses the profile. These processes
# live a millisecond and run mostly cold code, so the profile's code layout and inlining cut
# their time by about a quarter. Without llvm-profdata (rustup component llvm-tools), root
# or the portable simulated driver (scripts/build-portable.sh), the build goes on without it.
profdata=
pgo_dir=$PWD/target/pgo
if [ "${GPUSLICE_NO_PGO:-}" = 1 ]; then
  echo "build-static: GPUSLICE_NO_PGO=1: building without a profile" >&2
elif [ "$(id -u)" != 0 ] || [ ! -e target/portable/libgpuslice_shim.so ]; then
  echo "build-static: no profile-guided build (needs root and scripts/build-portable.sh first)" >&2
else
  sysroot=$(rustc --print sysroot)
  llvm_profdata=$sysroot/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata
  [ -x "$llvm_profdata" ] || rustup component add llvm-tools >&2 || true
  if [ ! -x "$llvm_profdata" ]; then
    echo "build-static: llvm-profdata not available (rustup component llvm-tools); building without a profile" >&2
  else
    rm -rf "$pgo_dir/raw"
    RUSTFLAGS="-Cprofile-generate=$pgo_dir/raw" CARGO_TARGET_DIR=$pgo_dir/target \
      cargo build --profile static --locked --target "$target" -p gpuslice --bins
    scripts/lib/pgo-train.sh "$pgo_dir/target/$target/static" "$PWD/target/release/gpuslice" \
      "$PWD/target/portable"
    "$llvm_profdata" merge -o "$pgo_dir/create-path.profdata" "$pgo_dir"/raw/*.profraw
    profdata=$pgo_dir/create-path.profdata
  fi
fi
if [ -n "$profdata" ]; then
  RUSTFLAGS="-Cprofile-use=$profdata" cargo build --profile static --locked --target "$target" -p gpuslice --bins
else
  cargo build --profile static --locked --target "$target" -p gpuslice --bins
fi
rm -rf "$out"
mkdir -p "$out"
cp "target/$target/static/gpuslice" "target/$target/static/gpuslice-runtime" "$out/"
cp target/release/gpuslice "$out/gpuslice-full"
echo "build-static: staged $out/{gpuslice,gpuslice-runtime} (static${profdata:+, profile-guided}) and $out/gpuslice-full" >&2
