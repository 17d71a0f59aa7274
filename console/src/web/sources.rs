//! The cluster model behind the Nodes, node and Pods pages, read per request, with one
//! banner per source it could not read (the API server, Prometheus, a node's plugin).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::Api;

use crate::fetch::{self, PodScope};
use crate::model::{self, Model};

use super::pages::Banner;
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

/// The model and the banners of its missing sources (`None`: the API server could not be
/// read). `plugins`: also name the cluster's nodes that publish no gpuslice ResourceSlice.
pub(super) async fn model_of(
    state: &State,
    scope: PodScope,
    plugins: bool,
) -> (Option<Model>, Vec<Banner>) {
    let client = &state.cluster.client;
    let src = match fetch::sources(client, &scope, state.prometheus.as_deref()).await {
        Ok(s) => s,
        Err(e) => return (None, vec![api_banner(e)]),
    };
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
        // Listing nodes may be forbidden to the kubeconfig's user: then no such banners.
        if let Ok(list) = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            for n in list.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
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
    }
    (Some(m), banners)
}
