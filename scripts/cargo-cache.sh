#!/usr/bin/env bash
# Points the checkout's target/ at a Cargo build cache outside the checkout, so a fresh clone
# on a machine that built once reuses every compiled dependency (the workspace's own crates
# rebuild, as their sources are new). Like the Go builds of scripts/kube-cluster.sh, entries
# live under /var/cache/gpuslice, keyed by the Rust toolchain (`rustc -vV`) and Cargo.lock:
# a new toolchain or lock file starts a new entry, seeded with a copy of the newest earlier
# one (Cargo's fingerprints rebuild whatever the new lock changed; a lock that adds a
# workspace crate would otherwise rebuild every dependency), and only the two newest are kept.
#
#   scripts/cargo-cache.sh          # link target/ -> $GPUSLICE_CARGO_CACHE/<key>, print it
#
# A target/ that is a real directory (a developer's own builds) is left as it is.
# GPUSLICE_CARGO_CACHE: cache root (default /var/cache/gpuslice/cargo). One suite at a time
# per entry: cargo locks the build directory, but the tests run the binaries it holds.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${GPUSLICE_CARGO_CACHE:-/var/cache/gpuslice/cargo}"

if [ -d target ] && [ ! -L target ]; then
  echo "cargo-cache: target/ is a directory of this checkout: building there, no shared cache" >&2
  echo "$PWD/target"
  exit 0
fi
key="$( { rustc -vV; cat Cargo.lock; } | sha256sum | cut -c1-16)"
entry="$root/$key"
mkdir -p "$entry" || { echo "cargo-cache: cannot create $entry (set GPUSLICE_CARGO_CACHE to a writable directory)" >&2; exit 1; }
touch "$entry"
if [ "$(readlink target 2>/dev/null || true)" != "$entry" ]; then
  ln -sfn "$entry" target.tmp && mv -T target.tmp target
fi
# A new entry starts as a copy of the newest earlier one, when there is one.
seeded=""
if [ -z "$(ls -A "$entry")" ]; then
  prev="$(ls -1dt "$root"/*/ 2>/dev/null | grep -v -x -F "$entry/" | head -n 1 || true)"
  if [ -n "$prev" ] && [ -n "$(ls -A "$prev")" ]; then
    if cp -a --reflink=auto "$prev/." "$entry.seed.$$" 2>/dev/null && rmdir "$entry" && mv -T "$entry.seed.$$" "$entry"; then
      seeded=" seeded from ${prev%/}"
    else
      rm -rf "$entry.seed.$$"
      mkdir -p "$entry"
    fi
  fi
fi
# Keep the two newest entries.
ls -1dt "$root"/*/ 2>/dev/null | tail -n +3 | while read -r old; do
  echo "cargo-cache: removing the old entry $old" >&2
  rm -rf "$old"
done
[ -n "$(ls -A "$entry")" ] && state=warm || state=cold
echo "cargo-cache: target -> $entry ($state$seeded)" >&2
echo "$entry"
