//! The API server client, chosen the way kubectl chooses it: `--kubeconfig` (else
//! `$KUBECONFIG`, else `~/.kube/config`, else in-cluster credentials) and `--context`.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// No client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read kubeconfig {path}: {detail}")]
    Kubeconfig { path: String, detail: String },
    #[error("no usable kubeconfig ({detail}); pass --kubeconfig PATH or set $KUBECONFIG")]
    Infer { detail: String },
    #[error("cannot make an API server client: {0}")]
    Client(String),
}

/// A client and the namespace its context names (kubectl's default for `-n`).
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    pub default_namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("default_namespace", &self.default_namespace)
            .finish_non_exhaustive()
    }
}

/// Connects as kubectl would with `--kubeconfig kubeconfig --context context`.
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<Cluster, ClientError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let err = |detail: String| ClientError::Kubeconfig {
                path: path.display().to_string(),
                detail,
            };
            let kc = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None if context.is_some() => {
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| ClientError::Infer {
                    detail: e.to_string(),
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Infer {
                detail: e.to_string(),
            })?,
    };
    // A command line tool: an unreachable API server must fail the command, not hang it.
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    config.write_timeout = Some(Duration::from_secs(30));
    let default_namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))?;
    Ok(Cluster {
        client,
        default_namespace,
    })
}
