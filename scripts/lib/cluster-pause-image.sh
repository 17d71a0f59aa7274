# The test node's pause image, built here from busybox-static: no registry is reachable.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh; scripts/lib/cluster-node.sh imports the archive into
# the node's containerd. Uses NODE (DIR/node), PAUSE_IMAGE (the image's name) and die of the
# sourcing script.

# blob DIR FILE: moves FILE into the layout's blobs; prints "sha256:<hex> <size>".
blob() {
  local blobs="$1/blobs/sha256" hex size
  mkdir -p "$blobs"
  hex="$(sha256sum "$2" | cut -d' ' -f1)"
  size="$(stat -c %s "$2")"
  mv "$2" "$blobs/$hex"
  echo "sha256:$hex $size"
}

# pause_image FILE: an OCI image layout archive of the pause image (busybox-static, whose sh
# waits until SIGTERM), for `ctr images import`.
pause_image() {
  local out="$1" work="$NODE/images/pause" layer config manifest
  # grep reads the whole list (no -q): an early exit would kill busybox with SIGPIPE
  # mid-list, and pipefail would take that for a missing shell.
  { command -v busybox >/dev/null && busybox --list 2>/dev/null | grep -x sh >/dev/null; } ||
    die "busybox (package busybox-static) is missing: run scripts/install-deps.sh"
  local busybox
  busybox="$(command -v busybox)"
  ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static: install busybox-static"
  rm -rf "$work"
  mkdir -p "$work/rootfs/bin" "$work/layout"
  cp "$busybox" "$work/rootfs/bin/busybox"
  ln -s busybox "$work/rootfs/bin/sh"
  tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/layer.tar" .
  read -r layer layer_size < <(blob "$work/layout" "$work/layer.tar")
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/bin/sh","-c","trap \\"exit 0\\" TERM INT; while :; do sleep 3600 & wait; done"]},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
    "$layer" >"$work/config.json"
  read -r config config_size < <(blob "$work/layout" "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
  read -r manifest manifest_size < <(blob "$work/layout" "$work/manifest.json")
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$PAUSE_IMAGE" >"$work/layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
  tar -C "$work/layout" -cf "$out" oci-layout index.json blobs
  rm -rf "$work"
}
