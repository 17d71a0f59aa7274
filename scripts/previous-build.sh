#!/usr/bin/env bash
# The previous release's `gpuslice` and `gpuslice-runtime`, for the upgrade test
# (tests/tests/node_faults.rs: pods booked by the previous plugin, the plugin rolled to this
# build), and its Helm chart, for the chart's upgrade test (tests/tests/helm_chart.rs). Built
# once from commit PREVIOUS of this repository's history (the `suite` profile, dependencies
# taken from this workspace's target/suite when it has them) and cached under
# /var/cache/gpuslice/previous/<commit>/bin, keyed by the commit, the chart beside it in
# <commit>/chart; prints the bin directory.
#
#   scripts/previous-build.sh            # PREVIOUS below
#   GPUSLICE_PREVIOUS_COMMIT=<hash> scripts/previous-build.sh
#
# Move PREVIOUS to the last release's commit when one is cut, so that the test reads what the
# release before this one wrote (docs/troubleshooting.md, "Restarts and upgrades").
set -euo pipefail
cd "$(dirname "$0")/.."

PREVIOUS="${GPUSLICE_PREVIOUS_COMMIT:-f204b072929c74f0542525fd12a9eaee8b0279fa}"
CACHE=/var/cache/gpuslice/previous

die() {
  echo "previous-build.sh: $*" >&2
  exit 1
}

[[ "$PREVIOUS" =~ ^[0-9a-f]{40}$ ]] || die "GPUSLICE_PREVIOUS_COMMIT must be a full commit hash, not '$PREVIOUS'"
out="$CACHE/$PREVIOUS"
CHART=packaging/helm/gpuslice
have_bins() { [ -x "$out/bin/gpuslice" ] && [ -x "$out/bin/gpuslice-runtime" ]; }
built() { have_bins && [ -f "$out/chart/Chart.yaml" ]; }
if built; then
  echo "$out/bin"
  exit 0
fi
mkdir -p "$CACHE" /run/lock
exec 9>"/run/lock/gpuslice-previous-build.lock"
flock 9
if built; then
  echo "$out/bin"
  exit 0
fi
git cat-file -e "$PREVIOUS^{commit}" 2>/dev/null ||
  die "commit $PREVIOUS is not in this clone's history (a shallow clone? 'git fetch --unshallow')"
# Binaries cached before the chart was kept beside them: add the chart alone.
if have_bins; then
  rm -rf "$out/chart.tmp" "$out/chart"
  mkdir -p "$out/chart.tmp"
  git archive "$PREVIOUS" "$CHART" | tar -x -C "$out/chart.tmp" --strip-components=3
  mv "$out/chart.tmp" "$out/chart"
  echo "$out/bin"
  exit 0
fi

work="$out.tmp"
rm -rf "$work"
mkdir -p "$work/src" "$work/target" "$work/bin"
git archive "$PREVIOUS" | tar -x -C "$work/src"
# Dependencies compiled for this workspace's suite profile are the same crates at the same
# versions (those the old Cargo.lock pins otherwise are built); only gpuslice's crates build.
if [ -d target/suite/deps ]; then
  echo "previous-build.sh: copying target/suite's dependencies" >&2
  cp -a target/suite "$work/target/suite"
fi
# Its own crates at opt-level 1, as this workspace's suite profile builds its own (Cargo.toml
# says why), whatever the old Cargo.toml said: a test fixture, compiled once.
members=()
for m in $(cd "$work/src" && cargo metadata --no-deps --format-version 1 --locked | jq -r '.packages[].name'); do
  members+=(--config "profile.suite.package.$m.opt-level=1")
done
echo "previous-build.sh: building gpuslice at $PREVIOUS (profile suite)" >&2
(cd "$work/src" && CARGO_TARGET_DIR="$work/target" cargo build --profile suite --locked "${members[@]}" \
  -p gpuslice --bin gpuslice --bin gpuslice-runtime >&2)
cp "$work/target/suite/gpuslice" "$work/target/suite/gpuslice-runtime" "$work/bin/"
cp -a "$work/src/$CHART" "$work/chart"
rm -rf "$work/target" "$work/src"
rm -rf "$out"
mv "$work" "$out"
echo "$out/bin"
