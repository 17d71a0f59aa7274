#!/usr/bin/env bash
# Builds every binary and library in release mode, then the portable (old-glibc) shim,
# simulated driver and probe that go into containers (target/portable/), then the static
# create-path binaries (target/release/static/; skipped with a message when
# the musl target cannot be had).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --locked
./scripts/build-portable.sh
./scripts/build-static.sh || [ $? = 3 ]
