#!/usr/bin/env bash
# Builds every binary and library in release mode, then the portable (old-glibc) shim,
# simulated driver and probe that go into containers (target/portable/), then the static
# create-path binaries (target/release/static/; skipped with a message when
# the musl target cannot be had). target/ is the shared Cargo cache of scripts/cargo-cache.sh
# unless the checkout has a target/ directory of its own. scripts/test.sh runs the same
# three builds, each timed in its phase table. The outputs the last two copy are installed
# atomically (scripts/lib/install.sh): a probe or wrapper running from there, or a shim
# loaded, keeps its file and does not fail the build ("Text file busy").
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/cargo-cache.sh >/dev/null
cargo build --release --workspace --locked
./scripts/build-portable.sh
./scripts/build-static.sh || [ $? = 3 ]
