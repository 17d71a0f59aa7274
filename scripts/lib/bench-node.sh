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

# bench_state_root: with BENCH_STATE=tmpfs, makes a directory on /dev/shm and exports it as
# GPUSLICE_NODE_STATE_ROOT: the cluster script's simulated nodes keep their gpuslice state and
# CDI specs there, in memory as /run/gpuslice and /var/run/cdi are on a node. Otherwise
# unsets it (the node state stays under the cluster's directory, on disk). The caller removes
# the directory.
bench_state_root() {
  unset GPUSLICE_NODE_STATE_ROOT
  [ "${BENCH_STATE:-}" = tmpfs ] || return 0
  GPUSLICE_NODE_STATE_ROOT=$(mktemp -d /dev/shm/gpuslice-bench-node.XXXXXX)
  export GPUSLICE_NODE_STATE_ROOT
}
