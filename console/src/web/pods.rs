//! The Pods page (`/pods[?namespace=NS][&node=NODE]`): per container holding a slice, grouped
//! under its workload, cAdvisor's CPU and memory of its pod and the slice's GPU memory used, each with
//! its share bar and the sparkline of its last hour from Prometheus (one range query each:
//! three per page), beside the model's figures; and the Idle page (`/idle`), the rows of
//! `kubectl gpuslice pods --idle`.

use std::collections::BTreeSet;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::fetch::PodScope;
use crate::idle::{self, IdleOptions};

use super::nodes::{keyed, range, spark_span};
use super::pages::{self, pod_key, slice_key, IdleSort, PodUse};
use super::respond::html;
use super::sources::{banner, model_of, Loaded};
use super::state::{chrome, State};

/// cAdvisor's CPU (cores, over 5 minutes) and working set per pod: its pod cgroup's series
/// (`container=""`), which the kubelet labels with the pod whatever the runtime (a
/// container's own series carry its name only where cAdvisor knows the runtime).
pub(super) const POD_CPU: &str = r#"sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{pod!="",container=""}[5m]))"#;
pub(super) const POD_MEMORY: &str =
    r#"sum by (namespace, pod) (container_memory_working_set_bytes{pod!="",container=""})"#;
/// Each slice's memory used (the shim's account).
pub(super) const SLICE_MEMORY: &str = "gpuslice_slice_memory_used_bytes";

pub(super) async fn pods(
    state: &State,
    namespace: Option<&str>,
    node: Option<&str>,
) -> Response<Full<Bytes>> {
    let scope = match namespace {
        Some(ns) => PodScope::Namespace(ns.to_string()),
        None => PodScope::All,
    };
    // The range queries need nothing from the model: asked beside it.
    let span = spark_span();
    let (loaded, slices, cpu, memory) = tokio::join!(
        model_of(state, scope, false),
        range(state, SLICE_MEMORY, span),
        range(state, POD_CPU, span),
        range(state, POD_MEMORY, span)
    );
    let Loaded {
        model: m,
        usage,
        capacity,
        mut banners,
    } = loaded;
    let used = if state.prometheus.is_some() {
        let container = |s: &crate::usage::Series| {
            let l = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
            Some(pod_key(&l("namespace"), &l("pod")))
        };
        let (cpu, memory) = match (cpu, memory) {
            (Ok(c), Ok(m)) if !(c.is_empty() && m.is_empty()) => (
                Some(keyed(span, c, container)),
                Some(keyed(span, m, container)),
            ),
            (Err(e), _) | (_, Err(e)) => {
                banners.push(banner("cadvisor", format!("cAdvisor: {e}")));
                (None, None)
            }
            _ => {
                banners.push(banner("cadvisor", format!("cAdvisor: Prometheus at {} has no container_cpu_usage_seconds_total or container_memory_working_set_bytes series (it scrapes no kubelet's cAdvisor)", state.prometheus.as_deref().unwrap_or_default())));
                (None, None)
            }
        };
        Some(PodUse {
            slices: keyed(span, slices.unwrap_or_default(), |s| {
                let l = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
                Some(slice_key(&l("node"), &l("reservation"), &l("uuid")))
            }),
            cpu,
            memory,
            capacity,
        })
    } else {
        banners.push(banner(
            "cadvisor",
            "cAdvisor (containers' CPU and memory): Prometheus not configured (start with --prometheus URL)",
        ));
        None
    };
    html(
        StatusCode::OK,
        pages::pods_page(
            &chrome(state, banners),
            m.as_ref(),
            namespace,
            node,
            used.as_ref(),
            usage.as_ref(),
        ),
    )
}

pub(super) async fn idle_page(
    state: &State,
    namespace: Option<&str>,
    opts: IdleOptions,
    sort: IdleSort,
) -> Response<Full<Bytes>> {
    let only = namespace.map(|n| BTreeSet::from([n.to_string()]));
    let rows = idle::fetch_rows(
        &state.cluster.client,
        state.prometheus.as_deref(),
        only.as_ref(),
        &opts,
    )
    .await;
    let (rows, banners) = match rows {
        Ok(r) => (Some(r), Vec::new()),
        Err(e @ idle::IdleError::Fetch(_)) => (None, vec![super::sources::api_banner(e)]),
        Err(e) => (None, vec![banner("prometheus", e.to_string())]),
    };
    html(
        StatusCode::OK,
        pages::idle_page(
            &chrome(state, banners),
            rows.as_deref(),
            &opts,
            namespace,
            sort,
        ),
    )
}
