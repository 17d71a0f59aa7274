#!/usr/bin/env bash
# Builds every binary and library in release mode, then the portable (old-glibc) shim,
# simulated driver and probe that go into containers (target/portable/).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --locked
./scripts/build-portable.sh
