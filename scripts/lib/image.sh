# Shell helpers shared by the demo and the package check (sourced, not run).

# podman_image ROOTFS IMAGE [PROBE]: a small glibc image from this host's files, busybox for
# the shell and tools and glibc for dynamically linked programs (the probe at
# /usr/local/bin when PROBE is given), imported into podman as IMAGE unless it exists.
podman_image() {
  local rootfs=$1 image=$2 probe=${3:-}
  podman image exists "$image" && return 0
  mkdir -p "$rootfs"/{bin,usr/lib/x86_64-linux-gnu,usr/local/bin,lib64,etc,tmp,proc,sys,dev,run,root}
  ln -sfn usr/lib "$rootfs/lib"
  cp /bin/busybox "$rootfs/bin/"
  local a l
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$rootfs/bin/$a"; done
  for l in libc.so.6 libm.so.6 libgcc_s.so.1 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2; do
    cp "/lib/x86_64-linux-gnu/$l" "$rootfs/usr/lib/x86_64-linux-gnu/"
  done
  ln -sf /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$rootfs/lib64/ld-linux-x86-64.so.2"
  [ -z "$probe" ] || cp "$probe" "$rootfs/usr/local/bin/"
  tar -C "$rootfs" -c . | podman import -q - "$image" >/dev/null
}

# podman_conf FILE: a containers.conf with what this kind of host needs (runc, cgroupfs,
# explicit ulimits within the hard limit, no network): the harness's settings, not
# gpuslice's.
podman_conf() {
  local nofile
  nofile=$(ulimit -Hn); [ "$nofile" -gt 4096 ] && nofile=4096
  cat > "$1" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
}
