#!/usr/bin/env bash
# Builds the shim, the simulated driver libraries and the probe against an old glibc floor
# with cargo-zigbuild, so they load in any glibc-based image a node may run (a preload
# library linked on a recent host needs that host's glibc symbol versions, and every
# process of an older image would then fail to start). Copies them to target/portable/.
#
#   scripts/build-portable.sh            # floor glibc 2.17 (default)
#   GLIBC_FLOOR=2.28 scripts/build-portable.sh
#
# Installs what it needs when missing: ziglang and cargo-zigbuild (pip, prebuilt).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/lib/install.sh
floor=${GLIBC_FLOOR:-2.17}
arch=${PORTABLE_ARCH:-x86_64}
target="${arch}-unknown-linux-gnu"
target_dir=${CARGO_TARGET_DIR:-$root/target}
out="$target_dir/portable"

# zig and cargo-zigbuild come from PyPI (ziglang, and cargo-zigbuild's prebuilt wheel: a
# `cargo install` compiles it and its hundred crates, minutes on a fresh 2-core machine). A
# Debian system python refuses `pip install` outside a virtual environment (PEP 668), so they
# go into one under the target dir; whichever is on PATH already is used as it is.
venv="$target_dir/tools/zig-venv"
want=()
if ! command -v zig >/dev/null && ! python3 -m ziglang version >/dev/null 2>&1; then
    want+=(ziglang)
fi
if ! command -v cargo-zigbuild >/dev/null; then
    want+=(cargo-zigbuild)
fi
if [ ${#want[@]} -gt 0 ]; then
    missing=()
    for p in "${want[@]}"; do
        if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -m pip show --quiet "$p" >/dev/null 2>&1; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "build-portable: installing ${missing[*]} (pip, into $venv)" >&2
        [ -x "$venv/bin/python3" ] || python3 -m venv "$venv"
        "$venv/bin/python3" -m pip install --quiet "${missing[@]}"
    fi
    export PATH="$venv/bin:$PATH"
fi

echo "build-portable: building for $target.$floor" >&2
cargo zigbuild --release --target "$target.$floor" --target-dir "$target_dir" \
    -p gpuslice-shim -p gpuslice-sim-cuda -p gpuslice-sim-nvml -p gpuslice-probe

built="$target_dir/$target/release"
mkdir -p "$out"
# Atomic installs: a probe still running from here, or a shim loaded, keeps its file.
install_atomic "$built/libgpuslice_shim.so" "$out/libgpuslice_shim.so"
install_atomic "$built/libgpuslice_sim_cuda.so" "$out/libcuda.so.1"
install_atomic "$built/libgpuslice_sim_nvml.so" "$out/libnvidia-ml.so.1"
install_atomic "$built/gpuslice-probe" "$out/gpuslice-probe"
echo "$floor" > "$out/GLIBC_FLOOR"

# Check the floor: no GLIBC_x.y symbol version above it in any artifact.
bad=0
for f in "$out"/libgpuslice_shim.so "$out"/libcuda.so.1 "$out"/libnvidia-ml.so.1 "$out"/gpuslice-probe; do
    max=$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
    if [ -n "$max" ] && [ "$(printf '%s\n%s\n' "$max" "$floor" | sort -V | tail -1)" != "$floor" ]; then
        echo "build-portable: $f needs GLIBC_$max, above the floor $floor" >&2
        bad=1
    fi
done
[ "$bad" = 0 ] || exit 1
echo "build-portable: $out (glibc floor $floor)" >&2
ls -l "$out" >&2
