# The test cluster's several nodes (`up DIR --node A[=CONFIG] --node B[=CONFIG]`) on this machine.
# shellcheck shell=bash
# Sourced by scripts/kube-cluster.sh after scripts/lib/cluster-node.sh, which starts and
# stops one node: this file runs it once per node, each chosen with select_node (its own
# directory, component names, bridge and subnet, kubelet cgroup root and gpuslice config).
# The first node is what `up --node NAME` makes, its paths in DIR/cluster.env as for one
# node; every node's paths are in its directory's node.env (the same keys) and
# DIR/cluster.env lists them all in NODES and NODE_DIRS. Pods of all nodes share the host's
# routing: each bridge is the gateway of its subnet, so a pod reaches another node's pod
# through the host. Uses DIR, env_add, up_node and fail_up of the sourcing script.

# write_node_env NAME: the node's paths, in NODE/node.env.
write_node_env() {
  cat >"$NODE/node.env" <<ENV
NODE_NAME=$1
NODE_DIR=$NODE
NODE_BIN_DIR=$NODE_BIN
CONTAINERD_SOCKET=$NODE/containerd/containerd.sock
CONTAINERD_CONFIG=$NODE/containerd/config.toml
CTR=$NODE_BIN/ctr
KUBELET_ROOT=$NODE/kubelet
KUBELET_CONFIG=$NODE/kubelet-config.yaml
GPUSLICE_CONFIG=$NODE_CONFIG
CNI_BRIDGE=$CNI_BRIDGE
CNI_SUBNET=$CNI_SUBNET
CONTAINERD_COMPONENT=$C_CONTAINERD
KUBELET_COMPONENT=$C_KUBELET
PLUGIN_COMPONENT=$C_PLUGIN
ENV
}

# up_nodes SPEC...: each SPEC NAME or NAME=CONFIG a node, in order; the first as `up --node`.
up_nodes() {
  local i=0 spec name names="" dirs=""
  SEVERAL_NODES=1
  # Each node's pods reach the others' through the host (the bridge plugin turns forwarding
  # on for its gateway; a host whose FORWARD policy drops would need a rule).
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 1 ] || fail_up "IPv4 forwarding is off on this host: pods of two nodes cannot reach each other"
  for spec in "$@"; do
    name="${spec%%=*}"
    NODE_CONFIG_GIVEN=""
    [ "$spec" = "$name" ] || NODE_CONFIG_GIVEN="${spec#*=}"
    select_node "$i" "$name"
    mkdir -p "$NODE"
    # What `down` needs to stop this node even when `up` fails halfway.
    echo "$i $name" >"$NODE/index"
    if [ "$i" -eq 0 ]; then
      up_node "$name"
    else
      NODE_UP=""
      start_node "$name"
      NODE_UP=1
      log "node $name up: kubelet on $KUBELET_ADDRESS, containerd $NODE/containerd/containerd.sock"
    fi
    write_node_env "$name"
    names="${names:+$names,}$name"
    dirs="${dirs:+$dirs,}$NODE"
    i=$((i + 1))
  done
  env_add NODES "$names"
  env_add NODE_DIRS "$dirs"
}

# stop_nodes: the nodes after the first (stop_node stops that one), each as select_node
# chose it at `up`.
stop_nodes() {
  local f i name
  for f in "$DIR"/node-*/index; do
    [ -e "$f" ] || continue
    read -r i name <"$f"
    select_node "$i" "$name"
    stop_node
  done
  NODE_SELECTED=""
}
