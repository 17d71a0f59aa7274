//! The Budgets page (`/budgets[?namespace=NS]`): each namespace's ResourceQuotas naming
//! gpuslice's resources with bars of used against hard, and Kueue's ClusterQueues charging
//! `gpuslice.io/memory` where Kueue is installed, read from the API server per request
//! ([`crate::budgets::fetch`], what `kubectl gpuslice quota` prints).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::budgets::{self, Scope};

use super::pages;
use super::respond::html;
use super::sources::{api_banner, banner};
use super::state::{chrome, State};

pub(super) async fn budgets(state: &State, namespace: Option<&str>) -> Response<Full<Bytes>> {
    let scope = match namespace {
        Some(ns) => Scope::Namespace(ns.to_string()),
        None => Scope::All,
    };
    let (b, banners) = match budgets::fetch(&state.cluster.client, &scope, state.hami_compat).await
    {
        Ok(b) => {
            let banners = b
                .queues_unavailable
                .iter()
                .map(|why| banner("kueue", format!("Kueue: {why}")))
                .collect();
            (Some(b), banners)
        }
        Err(e) => (None, vec![api_banner(e)]),
    };
    html(
        StatusCode::OK,
        pages::budgets_page(&chrome(state, banners), b.as_ref(), namespace),
    )
}
