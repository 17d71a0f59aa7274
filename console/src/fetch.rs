//! Reads what the model is made from: every gpuslice ResourceSlice and every ResourceClaim
//! of the cluster (nodes and GPUs are cluster-wide), the pods of the namespaces asked for,
//! and the use from Prometheus when a URL is given.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::Api;

use crate::model::Sources;
use crate::usage;

/// A list the API server refused.
#[derive(Debug, thiserror::Error)]
#[error("cannot list {what}: {source}")]
pub struct FetchError {
    pub what: &'static str,
    pub source: kube::Error,
}

/// Which pods to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodScope {
    None,
    Namespace(String),
    All,
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Vec<K>, FetchError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| FetchError { what, source })
}

/// Reads the sources; Prometheus problems do not fail it (the used figures say why).
pub async fn sources(
    client: &kube::Client,
    pods: &PodScope,
    prometheus: Option<&str>,
) -> Result<Sources, FetchError> {
    let slices = list(
        Api::<ResourceSlice>::all(client.clone()),
        "resourceslices.resource.k8s.io",
    );
    let claims = list(
        Api::<ResourceClaim>::all(client.clone()),
        "resourceclaims.resource.k8s.io",
    );
    let pods = async {
        match pods {
            PodScope::None => Ok(Vec::new()),
            PodScope::Namespace(ns) => {
                list(Api::<Pod>::namespaced(client.clone(), ns), "pods").await
            }
            PodScope::All => list(Api::<Pod>::all(client.clone()), "pods").await,
        }
    };
    let usage = async {
        match prometheus {
            None => Err(
                "no --prometheus URL given (use comes from a Prometheus scraping `gpuslice serve`)"
                    .to_string(),
            ),
            Some(url) => usage::fetch(url).await.map_err(|e| e.to_string()),
        }
    };
    let (slices, claims, pods, usage) = tokio::join!(slices, claims, pods, usage);
    Ok(Sources {
        slices: slices?,
        claims: claims?,
        pods: pods?,
        usage,
    })
}
