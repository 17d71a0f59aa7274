//! The Nodes page (`/`: per node CPU, memory and GPU memory used with share bars and
//! sparklines, a compact slice map) and a node's page (`/nodes/NAME`: a slice map and a
//! chart per GPU): the model plus, from Prometheus, each GPU's memory used and the kubelets'
//! cAdvisor CPU and memory over the last hour (one range query each: three per page).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::fetch::PodScope;
use crate::model::Model;
use crate::usage::{self, Series, Span};

use super::pages::{self, History, NodeUse};
use super::respond::html;
use super::sources::{banner, model_of, Loaded};
use super::state::{chrome, State};

/// The span of the charts.
pub(super) const HISTORY: u64 = 3600;

/// GPU memory used, per GPU (`uuid`).
pub(super) const GPU_MEMORY: &str = "gpuslice_gpu_memory_used_bytes";
/// The kubelets' cAdvisor: each node's CPU (cores) and memory working set, from its root
/// cgroup (`id="/"`), by the `node` label the scrape gives the kubelet's target.
pub(super) const NODE_CPU: &str =
    r#"sum by (node) (rate(container_cpu_usage_seconds_total{id="/"}[5m]))"#;
pub(super) const NODE_MEMORY: &str =
    r#"sum by (node) (container_memory_working_set_bytes{id="/"})"#;

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The charts' span now, ending [`usage::MIN_STEP`] ago: samples of the last scrape
/// interval may still be on their way, and a point drawn must not change once drawn.
pub(super) fn span() -> Span {
    Span::last(HISTORY, now().saturating_sub(usage::MIN_STEP))
}

/// The lists' sparklines' span: [`span`] with [`usage::SPARK_POINTS`] points.
pub(super) fn spark_span() -> Span {
    Span::last_points(
        HISTORY,
        now().saturating_sub(usage::MIN_STEP),
        usage::SPARK_POINTS,
    )
}

/// Points of `series` keyed by `label`'s value; series of one key are summed at each time.
pub(super) fn keyed(
    span: Span,
    series: Vec<Series>,
    key: impl Fn(&Series) -> Option<String>,
) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for s in &series {
        if let Some(k) = key(s) {
            let e = sums.entry(k).or_default();
            for (t, v) in &s.points {
                *e.entry(t.round() as u64).or_default() += v;
            }
        }
    }
    History {
        span,
        series: sums
            .into_iter()
            .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect(),
    }
}

/// One range query over `span`; `Err`: why not.
pub(super) async fn range(state: &State, promql: &str, span: Span) -> Result<Vec<Series>, String> {
    let Some(url) = &state.prometheus else {
        return Err("Prometheus: not configured (start with --prometheus URL)".into());
    };
    usage::query_range(url, promql, span)
        .await
        .map_err(|e| e.to_string())
}

/// Memory used per GPU UUID over the charts' span.
async fn gpu_history(state: &State, span: Span) -> Result<History, String> {
    let series = range(state, GPU_MEMORY, span).await?;
    Ok(keyed(span, series, |s| s.metric.get("uuid").cloned()))
}

/// A cAdvisor history by node, with the total row; `None` (and a banner) when Prometheus
/// holds no such series.
fn by_node(
    span: Span,
    series: Result<Vec<Series>, String>,
    banners: &mut Vec<pages::Banner>,
) -> Option<History> {
    match series {
        Ok(s) if !s.is_empty() => {
            let mut h = keyed(span, s.clone(), |s| s.metric.get("node").cloned());
            let total = keyed(span, s, |_| Some(pages::TOTAL_ROW.to_string()));
            h.series.extend(total.series);
            Some(h)
        }
        Ok(_) => {
            if !banners.iter().any(|b| b.source == "cadvisor") {
                banners.push(banner("cadvisor", "cAdvisor (nodes' CPU and memory): Prometheus has no container_cpu_usage_seconds_total or container_memory_working_set_bytes series with a node label (it scrapes no kubelet's /metrics/cadvisor; docs/console.md)"));
            }
            None
        }
        Err(e) => {
            if !banners.iter().any(|b| b.source == "cadvisor") {
                banners.push(banner("cadvisor", format!("cAdvisor: {e}")));
            }
            None
        }
    }
}

/// Per node (and the total row): the sum of its GPUs' points at each time.
fn node_history(m: &Model, gpus: &History) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for g in &m.gpus {
        for (t, v) in gpus.points(&g.uuid) {
            let key = t.round() as u64;
            for row in [g.node.as_str(), pages::TOTAL_ROW] {
                *sums
                    .entry(row.to_string())
                    .or_default()
                    .entry(key)
                    .or_default() += v;
            }
        }
    }
    History {
        span: gpus.span,
        series: sums
            .into_iter()
            .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect(),
    }
}

pub(super) async fn nodes(state: &State, available: bool) -> Response<Full<Bytes>> {
    // The range queries need nothing from the model: asked beside it.
    let span = spark_span();
    let (loaded, gpu, cpu, memory) = tokio::join!(
        model_of(state, PodScope::None, true),
        gpu_history(state, span),
        range(state, NODE_CPU, span),
        range(state, NODE_MEMORY, span)
    );
    let Loaded {
        model: m,
        usage,
        capacity,
        mut banners,
    } = loaded;
    let used = match (&m, m.as_ref().and_then(|m| m.usage_unavailable.as_ref())) {
        (Some(m), None) => match gpu {
            Ok(h) => Some(NodeUse {
                gpu_memory: node_history(m, &h),
                cpu: by_node(span, cpu, &mut banners),
                memory: by_node(span, memory, &mut banners),
                capacity,
            }),
            Err(e) => {
                banners.push(banner("prometheus", e));
                None
            }
        },
        _ => None,
    };
    html(
        StatusCode::OK,
        pages::nodes_page(
            &chrome(state, banners),
            m.as_ref(),
            available,
            used.as_ref(),
            usage.as_ref(),
        ),
    )
}

pub(super) async fn node(state: &State, name: &str) -> Response<Full<Bytes>> {
    let Loaded {
        model: m,
        usage,
        mut banners,
        ..
    } = model_of(state, PodScope::None, true).await;
    let Some(m) = m else {
        return html(
            StatusCode::OK,
            pages::nodes_page(&chrome(state, banners), None, false, None, None),
        );
    };
    let known = m.nodes.iter().any(|n| n.name == name);
    let plugin_missing = banners.iter().any(|b| b.source == format!("plugin:{name}"));
    banners.retain(|b| !b.source.starts_with("plugin:") || b.source == format!("plugin:{name}"));
    if !known && !plugin_missing {
        return html(
            StatusCode::NOT_FOUND,
            pages::not_found_page(&chrome(state, banners), &format!("node {name}")),
        );
    }
    let history = if m.usage_unavailable.is_none() {
        match gpu_history(state, span()).await {
            Ok(h) => Some(h),
            Err(e) => {
                banners.push(banner("prometheus", e));
                None
            }
        }
    } else {
        None
    };
    html(
        StatusCode::OK,
        pages::node_page(
            &chrome(state, banners),
            &m,
            usage.as_ref(),
            name,
            history.as_ref(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_rows_sum_their_gpus_at_each_time() {
        use crate::model;
        use crate::model::tests::{claims, slices};
        let m = model::build(
            &model::Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage: Err("x".into()),
            },
            None,
        );
        let mut h = History {
            span: Span {
                start: 0,
                end: 120,
                step: 60,
            },
            series: BTreeMap::new(),
        };
        h.series
            .insert("GPU-NVIDIA-H200-0".into(), vec![(0.0, 1.0), (60.0, 2.0)]);
        h.series
            .insert("GPU-NVIDIA-H200-1".into(), vec![(0.0, 10.0), (60.0, 20.0)]);
        h.series
            .insert("GPU-NVIDIA-L4-0".into(), vec![(60.0, 100.0)]);
        h.series
            .insert("GPU-elsewhere".into(), vec![(60.0, 1000.0)]);
        let n = node_history(&m, &h);
        assert_eq!(n.series["node-a"], [(0.0, 11.0), (60.0, 22.0)]);
        assert_eq!(n.series["node-b"], [(60.0, 100.0)]);
        assert_eq!(n.series[pages::TOTAL_ROW], [(0.0, 11.0), (60.0, 122.0)]);
    }
}
