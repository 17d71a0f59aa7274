#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit tests, integration tests that drive the
# binaries, and end-to-end tests with real runc, podman and containerd containers, a real
# Kubernetes control plane and kubelet, Prometheus and chromium on a simulated GPU node.
# Run as root on Debian 12; installs what it needs.
#
# Builds are cached outside the checkout (target/ -> /var/cache/gpuslice/cargo/<key>, see
# scripts/cargo-cache.sh; the Go builds in /var/cache/gpuslice/{kube,node,nerdctl,helm,kueue,runtime-tools}),
# so a fresh clone on a machine that ran the suite once rebuilds only the workspace's crates.
# Test binaries build with the `suite` profile (release without LTO, the workspace's crates at
# opt-level 1: Cargo.toml says why); the end-to-end tests
# drive the release binaries. At its end, also when a step fails, it prints a table of the
# wall-clock seconds of every phase.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test.sh: run as root: the end-to-end tests start real containers" >&2
  exit 1
fi

# --- the phase table -------------------------------------------------------------------
started=$SECONDS
phases=()
failed=()
# phase NAME COMMAND...: runs COMMAND, records its wall time and result under NAME; returns
# the command's status.
phase() { phase_or_skip "" "$@"; }
# phase_or_skip SKIP NAME COMMAND...: phase, but COMMAND's exit status SKIP (it cannot run on
# this machine and said why) is recorded as skipped, not failed; returns the status all the same.
phase_or_skip() {
  local skip=$1 name=$2 t0=$SECONDS rc=0
  shift 2
  echo "== $name"
  "$@" || rc=$?
  if [ -n "$skip" ] && [ "$rc" = "$skip" ]; then
    record "$name" $((SECONDS - t0)) skipped
  else
    record "$name" $((SECONDS - t0)) "$rc"
  fi
  return "$rc"
}
# record NAME SECONDS STATUS: one row of the table (a failed one also in $failed; STATUS
# `skipped` is neither).
record() {
  if [ "$3" = 0 ]; then
    phases+=("$(printf '%6s  %-8s %s' "$2" ok "$1")")
  elif [ "$3" = skipped ]; then
    phases+=("$(printf '%6s  %-8s %s' "$2" skipped "$1")")
  else
    phases+=("$(printf '%6s  %-8s %s' "$2" FAILED "$1 (exit $3)")")
    failed+=("$1")
  fi
}
# print_table STATUS: the table, and why the suite stopped when STATUS (its exit status) is
# not 0.
print_table() {
  local rc=$1
  echo
  echo "== phase table: wall-clock seconds (scripts/test.sh)"
  printf '%6s  %-8s %s\n' seconds result phase
  local p
  for p in "${phases[@]}"; do echo "$p"; done
  printf '%6d  %-8s %s\n' $((SECONDS - started)) "" "total"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
  elif [ "$rc" != 0 ]; then
    echo "stopped with exit status $rc"
  fi
}
# kill_tree PID: PID and every process below it (the background Go builds' go commands and
# compilers are its grandchildren, which killing it alone would leave running).
kill_tree() {
  local children c
  children="$(pgrep -P "$1" 2>/dev/null)" || true
  kill "$1" 2>/dev/null || true
  for c in $children; do kill_tree "$c"; done
}
go_pid=""
go_dir=""
# At any exit, an early one too: the background Go builds stopped, their temporary
# directory removed, then the table.
on_exit() {
  local rc=$?
  [ -z "$go_pid" ] || kill_tree "$go_pid"
  [ -z "$go_dir" ] || rm -rf "$go_dir"
  print_table "$rc"
}
trap on_exit EXIT

# --- set-up and builds (a failure stops the suite) --------------------------------------
phase "install-deps" ./scripts/install-deps.sh

# The test control plane's Kubernetes binaries, the test node's containerd 2.x and nerdctl
# (scripts/kube-cluster.sh), and runtime-tools' OCI validation programs
# (scripts/oci-conformance.sh): built from their Go modules once, then cached. They build in the
# background beside the Rust builds, which leave cores idle in their links (on a fresh 2-core
# machine the two together take about the time of the longer one); each one's time and
# status go to $go_dir, and the suite waits for them before the tests.
go_dir="$(mktemp -d)"
go_build_cmd() {
  if [ "$1" = oci ]; then ./scripts/oci-conformance.sh build; else ./scripts/kube-cluster.sh "$1"; fi
}
go_builds() {
  local what t0 rc
  for what in build build-node build-nerdctl build-helm build-kueue build-dns build-kubeflow oci; do
    t0=$SECONDS
    rc=0
    go_build_cmd "$what" >"$go_dir/$what.out" 2>"$go_dir/$what.log" || rc=$?
    echo "$((SECONDS - t0)) $rc" >"$go_dir/$what.time"
    [ "$rc" = 0 ] || return "$rc"
  done
}
go_builds &
go_pid=$!
phase "cargo cache (target/)" ./scripts/cargo-cache.sh
# The same three builds as scripts/build.sh (the demo's), timed one by one.
phase "build: release" cargo build --release --workspace --locked
phase "build: portable (zig, glibc floor)" ./scripts/build-portable.sh
static_rc=0
# Exit status 3: no musl target to be had here; the suite goes on with the glibc binaries.
phase_or_skip 3 "build: static (musl)" ./scripts/build-static.sh || static_rc=$?
[ "$static_rc" = 0 ] || [ "$static_rc" = 3 ] || exit "$static_rc"

phase "fmt" cargo fmt --all -- --check
# Every workspace member builds at opt-level 1 in the suite profile (Cargo.toml says why); one
# missing from that list would build at 3, its tests slower to compile and nothing else wrong.
suite_profile_names_every_member() {
  local missing
  missing="$(comm -23 \
    <(cargo metadata --no-deps --format-version 1 --locked | jq -r '.packages[].name' | sort) \
    <(sed -n 's/^\[profile\.suite\.package\.\([A-Za-z0-9_-]*\)\]$/\1/p' Cargo.toml | sort))"
  [ -z "$missing" ] && return 0
  echo "test.sh: Cargo.toml has no [profile.suite.package.NAME] with opt-level = 1 for the member(s): $(echo $missing)" >&2
  return 1
}
phase "Cargo.toml: the suite profile names every member" suite_profile_names_every_member
phase "clippy" cargo clippy --workspace --all-targets --release --locked -- -D warnings


# --- tests (every phase runs; the suite fails at the end if one did) --------------------
export GPUSLICE_TEST_BIN_DIR="$PWD/target/release"
export GPUSLICE_TEST_PORTABLE_DIR="$PWD/target/portable"
# The shim's and the probe's tests load the simulated driver and the shim of the release
# build too (they are cdylibs, which a test build does not make).
export GPUSLICE_SIM_LIB_DIR="$PWD/target/release"
# One package selection (--workspace) for every cargo call, so that features unify the same
# way and nothing is rebuilt between phases.
cargo_test=(cargo test --workspace --profile suite --locked)
phase "test build (profile suite)" "${cargo_test[@]}" --no-run
# The previous release's gpuslice and Helm chart for the upgrade tests (tests/tests/node_faults.rs,
# tests/tests/helm_chart.rs), built once from its pinned commit with this build's dependencies
# and cached by commit: here, in its own phase, so that its cold build neither holds a test's
# host locks nor hides in a test's time.
previous_build() {
  local d
  d="$(./scripts/previous-build.sh)" || return 1
  export GPUSLICE_PREVIOUS_BIN_DIR="$d"
}
phase "previous release: gpuslice at the pinned commit (scripts/previous-build.sh)" previous_build ||
  echo "test.sh: the previous release's build failed: node_faults:: and helm_chart:: (the upgrade tests) will fail" >&2

# The Go builds started after install-deps: wait for them here, after the Rust builds (on a
# fresh machine the last of them still runs beside the test build), then one row each in the
# table (their own wall time, beside the Rust builds). A failed build stops the suite here: the
# control-plane tests never skip.
go_wait_rc=0
phase "go: waiting for the background builds" wait "$go_pid" || go_wait_rc=$?
# Ended: its pid may be another process's by the time the suite exits.
go_pid=""
for what in build build-node build-nerdctl build-helm build-kueue build-dns build-kubeflow oci; do
  case $what in
    build) name="go: kubernetes (tests/kube)" ;;
    build-node) name="go: containerd (tests/node)" ;;
    build-nerdctl) name="go: nerdctl (tests/nerdctl)" ;;
    build-helm) name="go: helm (tests/helm)" ;;
    build-kueue) name="go: kueue (tests/kueue)" ;;
    build-dns) name="go: CoreDNS (tests/coredns)" ;;
    build-kubeflow) name="go: Kubeflow operators (tests/kubeflow)" ;;
    oci) name="go: runtime-tools (tests/runtime-tools)" ;;
  esac
  # No time: an earlier one failed and this one did not run.
  [ -f "$go_dir/$what.time" ] || continue
  read -r secs rc <"$go_dir/$what.time"
  record "$name (in the background)" "$secs" "$rc"
  if [ "$rc" != 0 ]; then
    echo "test.sh: the Go build '$what' failed; its log:" >&2
    tail -n 40 "$go_dir/$what.log" >&2
  fi
done
[ "$go_wait_rc" = 0 ] || exit "$go_wait_rc"
cat "$go_dir"/*.log >&2
GPUSLICE_KUBE_BIN_DIR="$(cat "$go_dir/build.out")"
GPUSLICE_NODE_BIN_DIR="$(cat "$go_dir/build-node.out")"
GPUSLICE_NERDCTL_BIN="$(cat "$go_dir/build-nerdctl.out")"
GPUSLICE_HELM_BIN="$(cat "$go_dir/build-helm.out")"
GPUSLICE_KUEUE_BIN_DIR="$(cat "$go_dir/build-kueue.out")"
GPUSLICE_RUNTIME_TOOLS_DIR="$(cat "$go_dir/oci.out")"
rm -rf "$go_dir"
go_dir=""
export GPUSLICE_KUBE_BIN_DIR GPUSLICE_NODE_BIN_DIR GPUSLICE_NERDCTL_BIN GPUSLICE_HELM_BIN GPUSLICE_KUEUE_BIN_DIR GPUSLICE_RUNTIME_TOOLS_DIR

npm_ci() {
  npm ci --prefix tests/browser --no-audit --no-fund || {
    echo "test.sh: npm ci --prefix tests/browser failed: the console's browser tests (tests/tests/console_web.rs) need it; npm comes from scripts/install-deps.sh" >&2
    return 1
  }
}
phase "npm: playwright-core (tests/browser; drives Debian's chromium)" npm_ci

tests_failed=0
run_tests() { phase "$@" || tests_failed=1; }
# OCI runtime conformance: runtime-tools' validation programs against runc and against the
# release build's gpuslice-runtime; fails when gpuslice-runtime fails what runc passes.
run_tests "oci conformance" env GPUSLICE_BIN_DIR="$PWD/target/release" ./scripts/oci-conformance.sh
run_tests "tests: unit (every crate's lib and bins)" "${cargo_test[@]}" --no-fail-fast --lib --bins -- --include-ignored
run_tests "tests: doc" "${cargo_test[@]}" --no-fail-fast --doc
# The integration-test binaries (one per crate, tests/main.rs), as cargo metadata lists them;
# the end-to-end one (tests/tests/main.rs) after them. No list (cargo metadata or jq failed,
# or it is empty) stops the suite: it would otherwise pass without running any of them.
integration_tests="$(cargo metadata --no-deps --format-version 1 --locked |
  jq -r '.packages[].targets[] | select(.kind == ["test"]) | .name' | grep -vx e2e)" || {
  echo "test.sh: no list of the integration-test targets (cargo metadata --no-deps | jq failed, or listed none but e2e)" >&2
  exit 1
}
for t in $integration_tests; do
  run_tests "tests: $t" "${cargo_test[@]}" --test "$t" -- --include-ignored
done
# The end-to-end tests in two runs of their binary: first those that hold only the locks of
# what they share on the host (tests/src/env.rs: lock()), three at a time, as they mostly
# wait on containers, kubelets and control planes (at most two of them on clusters with real
# nodes: the two slots of Resource::KubeNode); then those that need the machine alone
# (serial(): they measure time or compute shares, or start chromium and a whole cluster), one
# at a time. The locks keep either run correct on its own; the split keeps the alone ones from
# holding up the others.
alone=(enforce:: enforce_compute:: observability:: console_web:: context_memory::)
skip_alone=()
for m in "${alone[@]}"; do skip_alone+=(--skip "$m"); done
run_tests "tests: e2e, side by side" "${cargo_test[@]}" --test e2e -- --include-ignored \
  --test-threads 3 "${skip_alone[@]}"
run_tests "tests: e2e, the machine alone (${alone[*]})" "${cargo_test[@]}" --test e2e -- \
  --include-ignored --test-threads 1 "${alone[@]}"

if [ -x target/release/static/gpuslice-runtime ]; then
  # The static binaries run on the create path only: the tests that create containers
  # through runc, podman and containerd with them.
  run_tests "tests: e2e with the static create-path build (runc_slice, podman, containerd)" \
    env GPUSLICE_TEST_BIN_DIR="$PWD/target/release/static" "${cargo_test[@]}" --test e2e -- --include-ignored runc_slice:: podman:: containerd::
else
  echo "== no static build (scripts/build-static.sh could not add the musl target): skipped its end-to-end run"
fi

run_tests "package: dpkg -i, the demo with installed paths, dpkg -r restores the node" ./scripts/check-deb.sh
[ "$tests_failed" = 0 ]
