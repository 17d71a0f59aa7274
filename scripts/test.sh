#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit tests, integration tests that drive the
# binaries, and end-to-end tests with real runc, podman and containerd containers on a
# simulated GPU node. Run as root on Debian 12; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: run as root: the end-to-end tests start real containers" >&2
  exit 1
fi

./scripts/install-deps.sh
./scripts/build.sh

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release --locked -- -D warnings

echo "== test control plane: Kubernetes binaries of tests/kube (built once, then cached in /var/cache/gpuslice/kube)"
# A failed build stops the suite here: the control-plane tests never skip.
GPUSLICE_KUBE_BIN_DIR="$(./scripts/kube-cluster.sh build)"
export GPUSLICE_KUBE_BIN_DIR
echo "== test node: containerd 2.x of tests/node (built once, then cached in /var/cache/gpuslice/node)"
GPUSLICE_NODE_BIN_DIR="$(./scripts/kube-cluster.sh build-node)"
export GPUSLICE_NODE_BIN_DIR
echo "== nerdctl of tests/nerdctl (built once, then cached in /var/cache/gpuslice/nerdctl)"
GPUSLICE_NERDCTL_BIN="$(./scripts/kube-cluster.sh build-nerdctl)"
export GPUSLICE_NERDCTL_BIN

echo "== browser tests: playwright-core of tests/browser (drives Debian's /usr/bin/chromium; no browser download)"
if ! npm ci --prefix tests/browser --no-audit --no-fund; then
  echo "test.sh: npm ci --prefix tests/browser failed: the console's browser tests (tests/tests/console_web.rs) need it; npm comes from scripts/install-deps.sh" >&2
  exit 1
fi

echo "== unit, integration and end-to-end tests"
export GPUSLICE_TEST_BIN_DIR="$PWD/target/release"
export GPUSLICE_TEST_PORTABLE_DIR="$PWD/target/portable"
cargo test --workspace --release --locked --no-fail-fast -- --include-ignored

if [ -x target/release/static/gpuslice-runtime ]; then
  echo "== end-to-end tests again with the static create-path build (as the package installs it)"
  GPUSLICE_TEST_BIN_DIR="$PWD/target/release/static" cargo test --release --locked \
    -p gpuslice-e2e --test runc_slice --test podman --test containerd -- --include-ignored
else
  echo "== no static build (scripts/build-static.sh could not add the musl target): skipped its end-to-end run"
fi

echo "== package: dpkg -i, the demo with installed paths, dpkg -r restores the node"
./scripts/check-deb.sh
