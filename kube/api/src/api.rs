//! The API server client: from a kubeconfig file, or the pod's in-cluster credentials.

use std::path::Path;
use std::time::Duration;

/// No client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot read kubeconfig {path}: {detail}")]
    Kubeconfig { path: String, detail: String },
    #[error("no in-cluster credentials ({detail}); run it in a pod with a service account, or pass --kubeconfig PATH")]
    InCluster { detail: String },
    #[error("cannot make an API server client: {0}")]
    Client(String),
}

/// A client for the cluster `kubeconfig` names, or the in-cluster one when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ApiError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|e| ApiError::Kubeconfig {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ApiError::Kubeconfig {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?
        }
        None => kube::Config::incluster().map_err(|e| ApiError::InCluster {
            detail: e.to_string(),
        })?,
    };
    // A prepare waits on the API server: an unreachable one must fail the call, not hang it.
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(20));
    config.write_timeout = Some(Duration::from_secs(20));
    kube::Client::try_from(config).map_err(|e| ApiError::Client(e.to_string()))
}
