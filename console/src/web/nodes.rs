//! The Nodes page (`/`, with a sparkline per node) and a node's page (`/nodes/NAME`, a
//! chart per GPU): the model plus each GPU's memory used over the last hour from
//! Prometheus.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::fetch::PodScope;
use crate::model::Model;
use crate::usage;

use super::pages::{self, History};
use super::respond::html;
use super::sources::{banner, model_of};
use super::state::{chrome, State};

/// The span of the charts.
const HISTORY: u64 = 3600;
/// One chart point per this many seconds.
const STEP: u64 = 60;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Memory used per GPU UUID over the last hour; `Err`: why not.
async fn gpu_history(state: &State) -> Result<History, String> {
    let Some(url) = &state.prometheus else {
        return Err("Prometheus: not configured (start with --prometheus URL)".into());
    };
    let end = now();
    let start = end.saturating_sub(HISTORY);
    let series = usage::query_range(url, "gpuslice_gpu_memory_used_bytes", start, end, STEP)
        .await
        .map_err(|e| e.to_string())?;
    let mut h = History {
        start: start as f64,
        end: end as f64,
        series: BTreeMap::new(),
    };
    for s in series {
        if let Some(uuid) = s.metric.get("uuid") {
            h.series.entry(uuid.clone()).or_default().extend(s.points);
        }
    }
    Ok(h)
}

/// Per node (and the total row): the sum of its GPUs' points at each time.
fn node_history(m: &Model, gpus: &History) -> History {
    let mut sums: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for g in &m.gpus {
        for (t, v) in gpus.series.get(&g.uuid).into_iter().flatten() {
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
        start: gpus.start,
        end: gpus.end,
        series: sums
            .into_iter()
            .map(|(k, pts)| (k, pts.into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect(),
    }
}

pub(super) async fn nodes(state: &State, available: bool) -> Response<Full<Bytes>> {
    let (m, mut banners) = model_of(state, PodScope::None, true).await;
    let history = match (&m, m.as_ref().and_then(|m| m.usage_unavailable.as_ref())) {
        (Some(m), None) => match gpu_history(state).await {
            Ok(h) => Some(node_history(m, &h)),
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
            history.as_ref(),
        ),
    )
}

pub(super) async fn node(state: &State, name: &str) -> Response<Full<Bytes>> {
    let (m, mut banners) = model_of(state, PodScope::None, true).await;
    let Some(m) = m else {
        return html(
            StatusCode::OK,
            pages::nodes_page(&chrome(state, banners), None, false, None),
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
        match gpu_history(state).await {
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
        pages::node_page(&chrome(state, banners), &m, name, history.as_ref()),
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
            start: 0.0,
            end: 120.0,
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
