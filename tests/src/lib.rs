//! End-to-end test harness: real runc, podman and containerd on a simulated node (being built).
