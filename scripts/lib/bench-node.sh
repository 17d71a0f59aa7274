# Shell helpers shared by the benchmarks (create path, cdi generate, pod and job start) (sourced,
# not run).

# bench_node_config WORK PORTABLE: prints the config of the simulated node both measure (8
# H200-sized GPUs, state and CDI specs under WORK, the shim from PORTABLE); callers append
# their own tables.
bench_node_config() {
  local work=$1 portable=$2
  echo "state_dir = \"$work/state\""
  echo "[inventory]"
  echo "source = \"simulated\""
  for _ in $(seq 8); do printf '[[inventory.simulated]]\nmemory = "141Gi"\n'; done
  echo "[cdi]"
  echo "spec_dir = \"$work/cdi\""
  echo "[shim]"
  echo "library = \"$portable/libgpuslice_shim.so\""
}

# bench_tmpfs_node_config PORTABLE BIN: makes a directory on /dev/shm holding the config the
# cluster script writes for its simulated node (one NVIDIA H200, the shim from PORTABLE), with
# the node's gpuslice state and CDI specs in that directory, on tmpfs as /run/gpuslice and
# /var/run/cdi are on a node (the cluster script's own config puts them under its DIR, on
# disk); runs BIN/gpuslice's `cdi generate` for it and prints the config's path. The caller
# removes the directory (the config's dirname).
bench_tmpfs_node_config() {
  local portable=$1 bin=$2 dir
  dir=$(mktemp -d /dev/shm/gpuslice-bench-node.XXXXXX)
  mkdir -p "$dir/state" "$dir/cdi"
  printf 'state_dir = "%s"\n[shim]\nlibrary = "%s"\n[cdi]\nspec_dir = "%s"\n[inventory]\nsource = "simulated"\n[[inventory.simulated]]\nmodel = "NVIDIA H200"\nmemory = "141Gi"\n' \
    "$dir/state" "$portable/libgpuslice_shim.so" "$dir/cdi" >"$dir/config.toml"
  "$bin/gpuslice" --config "$dir/config.toml" cdi generate --sim-driver "$portable" >/dev/null
  echo "$dir/config.toml"
}
