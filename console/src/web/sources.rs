//! The cluster model behind the Nodes, node and Pods pages, read per request, with one
//! banner per source it could not read (the API server, Prometheus, a node's plugin), with
//! the Node objects' CPU and memory capacity for the lists' share bars.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::quantity::parse_kube_quantity;

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::Api;

use crate::fetch::{self, PodScope};
use crate::model::{self, Model};
use crate::usage::Usage;

use super::pages::{Banner, Capacity};
use super::state::State;

pub(super) fn banner(source: &str, text: impl Into<String>) -> Banner {
    Banner {
        source: source.to_string(),
        text: text.into(),
    }
}

pub(super) fn api_banner(detail: impl std::fmt::Display) -> Banner {
    banner("api", format!("API server: {detail}"))
}

/// What a page is made from: the model (`None`: the API server could not be read), the
/// use Prometheus answered, the Node objects' capacity and the banners of missing sources.
pub(super) struct Loaded {
    pub(super) model: Option<Model>,
    pub(super) usage: Option<Usage>,
    /// Node name → its capacity.
    pub(super) capacity: BTreeMap<String, Capacity>,
    pub(super) banners: Vec<Banner>,
}

/// CPU cores of a Node's capacity (`2`, `1500m`).
fn cores(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse::<u64>().ok().map(|m| m as f64 / 1000.0),
        None => parse_kube_quantity(q).ok().map(|c| c as f64),
    }
}

/// The model and the banners of its missing sources. `plugins`: also name the cluster's
/// nodes that publish no gpuslice ResourceSlice.
pub(super) async fn model_of(state: &State, scope: PodScope, plugins: bool) -> Loaded {
    let client = &state.cluster.client;
    let node_api = Api::<Node>::all(client.clone());
    let list_params = ListParams::default();
    let (src, nodes) = tokio::join!(
        fetch::sources(client, &scope, state.prometheus.as_deref()),
        // Listing nodes may be forbidden to the kubeconfig's user: then no such banners.
        node_api.list(&list_params)
    );
    let src = match src {
        Ok(s) => s,
        Err(e) => {
            return Loaded {
                model: None,
                usage: None,
                capacity: BTreeMap::new(),
                banners: vec![api_banner(e)],
            }
        }
    };
    let nodes = nodes.map(|l| l.items).unwrap_or_default();
    let capacity = nodes
        .iter()
        .filter_map(|n| {
            let cap = n.status.as_ref()?.capacity.as_ref();
            let get = |k: &str| cap.and_then(|c| c.get(k)).map(|q| q.0.clone());
            Some((
                n.metadata.name.clone()?,
                (
                    get("cpu").and_then(|q| cores(&q)),
                    get("memory")
                        .and_then(|q| parse_kube_quantity(&q).ok())
                        .map(|b| b as f64),
                ),
            ))
        })
        .collect();
    let only = match &scope {
        PodScope::Namespace(ns) => Some(BTreeSet::from([ns.clone()])),
        _ => None,
    };
    let m = model::build(&src, only.as_ref());
    let mut banners = Vec::new();
    if let Some(why) = &m.usage_unavailable {
        banners.push(match &state.prometheus {
            None => banner(
                "prometheus",
                "Prometheus: not configured (start with --prometheus URL)",
            ),
            Some(_) => banner("prometheus", why.clone()),
        });
    }
    if plugins {
        for n in nodes.iter().filter_map(|n| n.metadata.name.as_deref()) {
            if !m.nodes.iter().any(|v| v.name == n) {
                banners.push(banner(
                    &format!("plugin:{n}"),
                    format!(
                        "node {n}: no gpuslice plugin (no ResourceSlice of driver gpuslice.io)"
                    ),
                ));
            }
        }
    }
    Loaded {
        model: Some(m),
        usage: src.usage.ok(),
        capacity,
        banners,
    }
}
