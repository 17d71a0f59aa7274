//! The generated gRPC code of the kubelet's plugin-registration and DRA v1 services
//! (`proto/`, compiled by `build.rs`).

/// `pluginregistration`: the kubelet's plugin watcher calls it.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: NodePrepareResources and NodeUnprepareResources.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}
