# Shell helper shared by the benchmarks (create path, cdi generate) (sourced, not run).

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
