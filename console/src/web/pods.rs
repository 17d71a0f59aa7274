//! The Pods page (`/pods[?namespace=NS]`): per container holding a slice, the model's
//! figures beside cAdvisor's CPU and memory from Prometheus.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::fetch::PodScope;
use crate::usage;

use super::pages::{self, ContainerUse};
use super::respond::html;
use super::sources::{banner, model_of};
use super::state::{chrome, State};

/// cAdvisor's CPU (millicores, over 5 minutes) and working set per container.
async fn container_use(state: &State) -> Result<ContainerUse, String> {
    let Some(url) = &state.prometheus else {
        return Err("cAdvisor (containers' CPU and memory): Prometheus not configured (start with --prometheus URL)".into());
    };
    const CPU: &str = r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD"}[5m]))"#;
    const MEM: &str = r#"sum by (namespace, pod, container) (container_memory_working_set_bytes{container!="",container!="POD"})"#;
    let (cpu, mem) = tokio::join!(usage::query(url, CPU), usage::query(url, MEM));
    let (cpu, mem) = (
        cpu.map_err(|e| e.to_string())?,
        mem.map_err(|e| e.to_string())?,
    );
    if cpu.is_empty() && mem.is_empty() {
        return Err(format!("cAdvisor: Prometheus at {url} has no container_cpu_usage_seconds_total or container_memory_working_set_bytes series (it scrapes no kubelet's cAdvisor)"));
    }
    let mut out = ContainerUse::new();
    for (samples, is_cpu) in [(cpu, true), (mem, false)] {
        for s in samples {
            let label = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
            let Some(v) = s.value.1.parse::<f64>().ok().filter(|v| v.is_finite()) else {
                continue;
            };
            let e = out
                .entry((label("namespace"), label("pod"), label("container")))
                .or_default();
            if is_cpu {
                e.0 = Some((v.max(0.0) * 1000.0).round() as u64);
            } else {
                e.1 = Some(v.max(0.0).round() as u64);
            }
        }
    }
    Ok(out)
}

pub(super) async fn pods(state: &State, namespace: Option<&str>) -> Response<Full<Bytes>> {
    let scope = match namespace {
        Some(ns) => PodScope::Namespace(ns.to_string()),
        None => PodScope::All,
    };
    let (m, mut banners) = model_of(state, scope, false).await;
    let cadvisor = match container_use(state).await {
        Ok(c) => Some(c),
        Err(e) => {
            banners.push(banner("cadvisor", e));
            None
        }
    };
    html(
        StatusCode::OK,
        pages::pods_page(
            &chrome(state, banners),
            m.as_ref(),
            namespace,
            cadvisor.as_ref(),
        ),
    )
}
