//! The web console's HTML, rendered on the server from the same model kubectl-gpuslice
//! prints: every text HTML-escaped, every figure cell with its exact integer in
//! `data-value` (absent, and the cell `—`, when the figure is not known), one banner per
//! missing source. Pure functions: what a page shows is tested without a server.

use std::collections::BTreeMap;
use std::fmt::Write;

use k8s_openapi::api::core::v1::Pod;

use crate::budgets::{self, show, show_value, Ask, Budgets, NamespaceBudget, Rollout};
use crate::edit::{Kind, Request};
use crate::idle::{IdleOptions, IdleSlice};
use crate::model::{claim_series, gpu_label, ContainerSlice, GpuView, Model, NodeView};
use crate::render::bytes;
use crate::usage::{format_window, Span, Usage};
use gpuslice_config::quantity::format_kube_quantity;
use gpuslice_dra::quota::{Charge, Resource};
use gpuslice_registry::MAX_GPUS;

use super::charts::{self, Plot, Unit};
pub use super::escape::{esc, seg};

/// A figure that is not known.
pub const UNKNOWN: &str = "—";
/// The name of the cluster row of the Nodes table.
pub const TOTAL_ROW: &str = "(total)";

/// One source a page could not read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    /// `prometheus`, `plugin:<node>`, `api` or `cadvisor`.
    pub source: String,
    pub text: String,
}

/// What every page shows around its content.
#[derive(Debug, Clone)]
pub struct Chrome {
    /// Whose rights the console acts with (the kubeconfig context and user).
    pub rights: String,
    pub allow_edit: bool,
    pub banners: Vec<Banner>,
}

fn layout(title: &str, chrome: &Chrome, body: &str) -> String {
    let mut banners = String::new();
    for b in &chrome.banners {
        let _ = writeln!(
            banners,
            "<div class=\"source-missing\" data-source=\"{}\">{}</div>",
            esc(&b.source),
            esc(&b.text)
        );
    }
    let mode = if chrome.allow_edit {
        "edit allowed: the Allocate, Edit and Release buttons change workloads"
    } else {
        "read-only: start gpuslice console with --allow-edit to allocate"
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title} · gpuslice console</title>\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><link rel=\"stylesheet\" href=\"/static/console.css\"></head>\n<body>\
<header><nav><a href=\"/\">Nodes</a> <a href=\"/pods\">Pods</a> <a href=\"/idle\">Idle slices</a> <a href=\"/workloads\">Workloads</a> <a href=\"/budgets\">Budgets</a></nav>\
<p id=\"rights\">{rights}</p><p id=\"mode\">{mode}</p></header>\n<main><h1>{title}</h1>\n{banners}{body}</main></body></html>\n",
        title = esc(title),
        rights = esc(&chrome.rights),
    )
}

/// A `<td>` of a figure: `text` shown, `value` in `data-value`; `—` without it when unknown.
fn cell(col: &str, value: Option<u64>, text: impl Fn(u64) -> String) -> String {
    match value {
        Some(v) => format!(
            "<td data-col=\"{col}\" data-value=\"{v}\">{}</td>",
            esc(&text(v))
        ),
        None => format!("<td data-col=\"{col}\" class=\"unknown\">{UNKNOWN}</td>"),
    }
}

fn bytes_cell(col: &str, v: Option<u64>) -> String {
    cell(col, v, bytes)
}

fn num_cell(col: &str, v: Option<u64>) -> String {
    cell(col, v, |v| v.to_string())
}

fn text_cell(col: &str, text: &str) -> String {
    format!("<td data-col=\"{col}\">{}</td>", esc(text))
}

/// Use over time from Prometheus: per key (a node, [`TOTAL_ROW`], a GPU UUID, a slice or a
/// container) the points of one range query over `span`.
#[derive(Debug, Clone)]
pub struct History {
    pub span: Span,
    pub series: BTreeMap<String, Vec<(f64, f64)>>,
}

impl History {
    pub fn points(&self, key: &str) -> &[(f64, f64)] {
        self.series.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The last point's value of `key`.
    pub fn now(&self, key: &str) -> Option<f64> {
        self.points(key).last().map(|p| p.1)
    }
}

/// A node's (CPU cores, memory bytes) of its `status.capacity`, each when known.
pub type Capacity = (Option<f64>, Option<f64>);

/// What the Nodes list shows beside the model: GPU memory used over time per node (`None`:
/// not known), and the kubelets' cAdvisor CPU and memory (`None`: not scraped) with the Node
/// objects' capacity.
#[derive(Debug, Clone)]
pub struct NodeUse {
    pub gpu_memory: Option<History>,
    pub cpu: Option<History>,
    pub memory: Option<History>,
    /// Node name → its capacity.
    pub capacity: BTreeMap<String, Capacity>,
}

/// A value cell in the lists' pattern: the value (right-aligned, with its unit), a small bar
/// of its share of `capacity`, and a sparkline of its history.
fn use_cell(
    col: &str,
    value: Option<f64>,
    unit: Unit,
    capacity: Option<f64>,
    spark: Option<(&str, &History, &str)>,
) -> String {
    let shown = match (value, unit) {
        (Some(v), Unit::Cores) => Some(((v.max(0.0) * 1000.0).round() as u64, unit.show(v))),
        (Some(v), Unit::Bytes) => Some((v.max(0.0).round() as u64, unit.show(v))),
        (None, _) => None,
    };
    let spark = spark
        .map(|(what, h, key)| {
            charts::sparkline(
                what,
                what,
                &Plot {
                    span: h.span,
                    points: h.points(key),
                    top: capacity,
                    unit,
                },
            )
        })
        .unwrap_or_default();
    match shown {
        Some((v, text)) => format!(
            "<td data-col=\"{col}\" data-value=\"{v}\" class=\"use\"><span class=\"v\">{}</span>{}{spark}</td>",
            esc(&text),
            charts::share_bar(value, capacity)
        ),
        None => format!(
            "<td data-col=\"{col}\" class=\"use unknown\"><span class=\"v\">{UNKNOWN}</span>{spark}</td>"
        ),
    }
}

/// The bookings of a GPU's memory or cores as slice-map segments.
fn segments(g: &GpuView, usage: Option<&Usage>, cores: bool) -> Vec<charts::Segment> {
    g.claims
        .iter()
        .map(|c| {
            let series = usage.and_then(|u| claim_series(u, &g.uuid, c, &g.claims));
            charts::Segment {
                name: format!("{}/{}", c.namespace, c.name),
                namespace: c.namespace.clone(),
                pod: c.pods.first().cloned(),
                booked: if cores { c.cores } else { c.memory },
                used: if cores {
                    series
                        .and_then(|s| s.compute_used)
                        .map(|r| (r * 100.0).round() as u64)
                } else {
                    series.and_then(|s| s.memory_used)
                },
            }
        })
        .collect()
}

/// A GPU as a person names it, with its UUID on hover.
fn gpu_name(g: &GpuView) -> String {
    format!(
        "<span class=\"gpu-name\" title=\"{}\">{}</span>",
        esc(&g.uuid),
        esc(&gpu_label(&g.node, &g.device, &g.model))
    )
}

/// `/`: the cluster row, then one row per node (`available`: only nodes with a GPU that has
/// free memory). `model` is `None` when the API server could not be read; `used` when
/// Prometheus could not.
pub fn nodes_page(
    chrome: &Chrome,
    model: Option<&Model>,
    available: bool,
    used: Option<&NodeUse>,
    usage: Option<&Usage>,
) -> String {
    let mut body = String::new();
    let (href, label) = if available {
        ("/", "Show all nodes")
    } else {
        ("/?available=1", "Only nodes with free GPU memory")
    };
    let _ = writeln!(
        body,
        "<p><a id=\"filter-available\" href=\"{href}\">{label}</a></p>"
    );
    body.push_str("<div class=\"scroll\"><table id=\"nodes\"><thead><tr><th>Node</th><th>GPUs</th><th>Slice map (memory per GPU)</th><th>CPU</th><th>Memory</th><th>GPU memory used</th><th>GPU memory</th><th>Allocated</th><th>Free</th><th>Cores</th><th>Cores allocated</th><th>Cores used</th></tr></thead><tbody>\n");
    if let Some(m) = model {
        let rows = std::iter::once((TOTAL_ROW, &m.total)).chain(
            m.nodes
                .iter()
                .filter(|n| !available || n.largest_free_memory > 0)
                .map(|n| (n.name.as_str(), n)),
        );
        for (name, n) in rows {
            body.push_str(&node_row(m, name, n, used, usage));
        }
    }
    body.push_str("</tbody></table></div>\n");
    layout("Nodes", chrome, &body)
}

fn node_row(
    m: &Model,
    name: &str,
    n: &NodeView,
    used: Option<&NodeUse>,
    usage: Option<&Usage>,
) -> String {
    let label = if name == TOTAL_ROW {
        esc("cluster (total)")
    } else {
        format!("<a href=\"/nodes/{}\">{}</a>", esc(&seg(name)), esc(name))
    };
    let capacity = |pick: fn(&Capacity) -> Option<f64>| {
        let u = used?;
        if name == TOTAL_ROW {
            m.nodes
                .iter()
                .map(|n| u.capacity.get(&n.name).and_then(pick))
                .sum::<Option<f64>>()
        } else {
            u.capacity.get(name).and_then(pick)
        }
    };
    let cpu_cap = capacity(|c| c.0);
    let mem_cap = capacity(|c| c.1);
    let cpu = use_cell(
        "cpu",
        used.and_then(|u| u.cpu.as_ref()?.now(name)),
        Unit::Cores,
        cpu_cap,
        used.and_then(|u| Some(("cpu", u.cpu.as_ref()?, name))),
    );
    let memory = use_cell(
        "memory",
        used.and_then(|u| u.memory.as_ref()?.now(name)),
        Unit::Bytes,
        mem_cap,
        used.and_then(|u| Some(("memory", u.memory.as_ref()?, name))),
    );
    let gpu_used = use_cell(
        "memory-used",
        n.memory.used.map(|v| v as f64),
        Unit::Bytes,
        Some(n.memory.capacity as f64),
        used.and_then(|u| Some(("gpu-memory", u.gpu_memory.as_ref()?, name))),
    );
    let map = if name == TOTAL_ROW {
        String::new()
    } else {
        m.gpus
            .iter()
            .filter(|g| g.node == name)
            .map(|g| {
                format!(
                    "<span class=\"mini\" title=\"{}\">{}</span>",
                    esc(&gpu_label(&g.node, &g.device, &g.model)),
                    charts::slice_map(
                        "memory",
                        g.memory.capacity,
                        &segments(g, usage, false),
                        bytes,
                        true
                    )
                )
            })
            .collect()
    };
    format!(
        "<tr data-node=\"{}\"><td data-col=\"name\">{label}</td>{}<td data-col=\"slice-map\" class=\"maps\">{map}</td>{cpu}{memory}{gpu_used}{}{}{}{}{}{}</tr>\n",
        esc(name),
        num_cell("gpus", Some(n.gpus)),
        bytes_cell("memory-capacity", Some(n.memory.capacity)),
        bytes_cell("memory-allocated", Some(n.memory.allocated)),
        bytes_cell("memory-free", Some(n.memory.free)),
        num_cell("cores-capacity", Some(n.cores.capacity)),
        num_cell("cores-allocated", Some(n.cores.allocated)),
        num_cell("cores-used", n.cores.used),
    )
}

/// `allocated / capacity` in whole percent (`None` without capacity).
fn share(allocated: u64, capacity: u64) -> Option<u64> {
    (capacity > 0).then(|| ((allocated as f64 / capacity as f64) * 100.0).round() as u64)
}

/// `/nodes/NAME`: one row per GPU of the node, a slice map per GPU (memory and cores) and a
/// chart of each GPU's memory used.
pub fn node_page(
    chrome: &Chrome,
    model: &Model,
    usage: Option<&Usage>,
    node: &str,
    history: Option<&History>,
) -> String {
    let gpus: Vec<&GpuView> = model.gpus.iter().filter(|g| g.node == node).collect();
    let mut body = String::new();
    if let Some(n) = model.nodes.iter().find(|n| n.name == node) {
        let _ = writeln!(
            body,
            "<p id=\"node-summary\">{} GPU(s), {} memory of which {} allocated ({}%), {} free</p>\n<p id=\"node-mode\">publication mode: {}</p>",
            n.gpus,
            esc(&bytes(n.memory.capacity)),
            esc(&bytes(n.memory.allocated)),
            share(n.memory.allocated, n.memory.capacity).unwrap_or(0),
            esc(&bytes(n.memory.free)),
            esc(&n.mode),
        );
    }
    body.push_str("<div class=\"scroll\"><table id=\"gpus\"><thead><tr><th>GPU</th><th>Index</th><th>Model</th><th>Memory</th><th>Allocated</th><th>Share</th><th>Used</th><th>Cores allocated</th><th>Cores used</th><th>Claims</th></tr></thead><tbody>\n");
    for g in &gpus {
        let claims: Vec<String> = g
            .claims
            .iter()
            .map(|c| {
                // Idle now (the last sample); over a window: the Idle slices page.
                let idle = if c.idle == Some(true) {
                    " (idle now)"
                } else {
                    ""
                };
                format!("{}/{}{idle}", c.namespace, c.name)
            })
            .collect();
        let _ = writeln!(
            body,
            "<tr data-gpu=\"{}\"><td data-col=\"gpu\">{}</td>{}{}{}{}{}{}{}{}{}</tr>",
            esc(&g.uuid),
            gpu_name(g),
            num_cell("index", g.index.map(u64::from)),
            text_cell(
                "model",
                &match &g.unhealthy {
                    Some(why) => format!("{} (unhealthy: {why})", g.model),
                    None => g.model.clone(),
                }
            ),
            bytes_cell("memory-capacity", Some(g.memory.capacity)),
            bytes_cell("memory-allocated", Some(g.memory.allocated)),
            cell(
                "memory-share",
                share(g.memory.allocated, g.memory.capacity),
                |v| format!("{v}%")
            ),
            bytes_cell("memory-used", g.memory.used),
            num_cell("cores-allocated", Some(g.cores.allocated)),
            num_cell("cores-used", g.cores.used),
            text_cell("claims", &claims.join(", ")),
        );
    }
    body.push_str("</tbody></table></div>\n<section id=\"slice-maps\"><h2>Who holds each GPU</h2>\n<p class=\"legend\">Each bar is one GPU: a segment per claim's booking (linked to its pod), its measured use darker inside, then the free part.</p>\n");
    for g in &gpus {
        let _ = writeln!(
            body,
            "<div class=\"gpu-map\" data-gpu=\"{}\"><h3>{}</h3><p>memory, {} <span class=\"uuid\">{}</span></p>{}<p>cores (percent of the GPU)</p>{}</div>",
            esc(&g.uuid),
            gpu_name(g),
            esc(&bytes(g.memory.capacity)),
            esc(&g.uuid),
            charts::slice_map("memory", g.memory.capacity, &segments(g, usage, false), bytes, false),
            charts::slice_map("cores", g.cores.capacity, &segments(g, usage, true), |v| format!("{v}%"), false),
        );
    }
    body.push_str("</section>\n<section id=\"charts\"><h2>GPU memory used</h2>\n");
    for g in &gpus {
        let span = history.map_or(Span::last(3600, 3600), |h| h.span);
        let points = history.map_or(&[][..], |h| h.points(&g.uuid));
        let _ = writeln!(
            body,
            "<figure><figcaption>{}</figcaption>{}</figure>",
            gpu_name(g),
            charts::chart(
                ("data-gpu", &g.uuid),
                "GPU memory used",
                &Plot {
                    span,
                    points,
                    top: Some(g.memory.capacity as f64),
                    unit: Unit::Bytes
                }
            )
        );
    }
    body.push_str("</section>\n");
    layout(&format!("Node {node}"), chrome, &body)
}

/// What the Pods list shows beside the model, over time: per slice its memory used (key
/// [`slice_key`]), per pod cAdvisor's CPU and memory (key [`pod_key`]; `None`: not
/// scraped), and the nodes' capacity (CPU cores, memory bytes) for the share bars.
#[derive(Debug, Clone)]
pub struct PodUse {
    pub slices: History,
    pub cpu: Option<History>,
    pub memory: Option<History>,
    pub capacity: BTreeMap<String, Capacity>,
}

/// The history key of a slice series.
pub fn slice_key(node: &str, reservation: &str, uuid: &str) -> String {
    format!("{node} {reservation} {uuid}")
}

/// The history key of a pod.
pub fn pod_key(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{pod}")
}

/// The `<p id="scope">` line of a page listed by namespace.
fn scope_line(namespace: Option<&str>) -> String {
    let scope = match namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".to_string(),
    };
    format!("<p id=\"scope\">{}</p>\n", esc(&scope))
}

/// The filter links of the Pods page: every namespace and node holding a slice.
fn pod_filters(pods: &[ContainerSlice], namespace: Option<&str>, node: Option<&str>) -> String {
    let namespaces: std::collections::BTreeSet<&str> =
        pods.iter().map(|p| p.namespace.as_str()).collect();
    let nodes: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
    let mut out = String::from("<p id=\"filters\">namespace: <a href=\"/pods\">all</a>");
    for ns in namespaces {
        let _ = write!(
            out,
            " <a href=\"/pods?namespace={}\"{}>{}</a>",
            esc(&seg(ns)),
            if namespace == Some(ns) {
                " class=\"on\""
            } else {
                ""
            },
            esc(ns)
        );
    }
    out.push_str(" · node:");
    for n in nodes {
        let _ = write!(
            out,
            " <a href=\"/pods?node={}{}\"{}>{}</a>",
            esc(&seg(n)),
            namespace.map_or(String::new(), |ns| format!(
                "&amp;namespace={}",
                esc(&seg(ns))
            )),
            if node == Some(n) { " class=\"on\"" } else { "" },
            esc(n)
        );
    }
    out.push_str("</p>\n");
    out
}

/// `/pods`: one row per container holding a slice, grouped under its workload with a count
/// of its pods; `node`: only slices on that node.
pub fn pods_page(
    chrome: &Chrome,
    model: Option<&Model>,
    namespace: Option<&str>,
    node: Option<&str>,
    used: Option<&PodUse>,
    usage: Option<&Usage>,
) -> String {
    let mut body = scope_line(namespace);
    let all = model.map(|m| m.pods.as_slice()).unwrap_or(&[]);
    body.push_str(&pod_filters(all, namespace, node));
    body.push_str("<div class=\"scroll\"><table id=\"pods\"><thead><tr><th>Pod</th><th>Container</th><th>GPU</th><th>Pod CPU</th><th>Pod memory</th><th>GPU memory used</th><th>Memory limit</th><th>Used (driver)</th><th>Cores share</th><th>Cores used</th></tr></thead><tbody>\n");
    let mut groups: BTreeMap<(&str, &str), Vec<&ContainerSlice>> = BTreeMap::new();
    for p in all.iter().filter(|p| node.is_none_or(|n| p.node == n)) {
        groups
            .entry((p.namespace.as_str(), p.workload.as_str()))
            .or_default()
            .push(p);
    }
    for ((ns, workload), rows) in groups {
        let pods: std::collections::BTreeSet<&str> = rows.iter().map(|p| p.pod.as_str()).collect();
        let _ = writeln!(
            body,
            "<tr class=\"group\" data-group=\"{}/{}\" data-count=\"{}\"><th colspan=\"10\">{}/{} · {} pod{}</th></tr>",
            esc(ns),
            esc(workload),
            pods.len(),
            esc(ns),
            esc(workload),
            pods.len(),
            if pods.len() == 1 { "" } else { "s" }
        );
        for p in rows {
            body.push_str(&pod_row(model, p, used, usage));
        }
    }
    body.push_str("</tbody></table></div>\n");
    layout("Pods", chrome, &body)
}

fn pod_row(
    model: Option<&Model>,
    p: &ContainerSlice,
    used: Option<&PodUse>,
    usage: Option<&Usage>,
) -> String {
    let ckey = pod_key(&p.namespace, &p.pod);
    let cap = used.and_then(|u| u.capacity.get(&p.node)).copied();
    let cpu = use_cell(
        "cpu",
        used.and_then(|u| u.cpu.as_ref()?.now(&ckey)),
        Unit::Cores,
        cap.and_then(|c| c.0),
        used.and_then(|u| Some(("cpu", u.cpu.as_ref()?, ckey.as_str()))),
    );
    let memory = use_cell(
        "memory",
        used.and_then(|u| u.memory.as_ref()?.now(&ckey)),
        Unit::Bytes,
        cap.and_then(|c| c.1),
        used.and_then(|u| Some(("memory", u.memory.as_ref()?, ckey.as_str()))),
    );
    // The slice's own series: a claim's as the model matches it, an annotation slice's by
    // its pod and container.
    let series = usage.and_then(|u| match &p.claim {
        Some(name) => {
            let g = model?.gpus.iter().find(|g| g.uuid == p.uuid)?;
            let c = g
                .claims
                .iter()
                .find(|c| c.namespace == p.namespace && &c.name == name)?;
            claim_series(u, &g.uuid, c, &g.claims)
        }
        None => u.slices.iter().find(|s| {
            s.uuid == p.uuid
                && s.namespace == p.namespace
                && s.pod == p.pod
                && s.container == p.container
        }),
    });
    let skey = series.map(|s| slice_key(&s.node, &s.reservation, &s.uuid));
    let gpu_used = use_cell(
        "memory-used",
        p.memory_used.map(|v| v as f64),
        Unit::Bytes,
        Some(p.memory_limit as f64),
        used.zip(skey.as_deref())
            .map(|(u, k)| ("gpu-memory", &u.slices, k)),
    );
    let gpu = model
        .and_then(|m| m.gpus.iter().find(|g| g.uuid == p.uuid))
        .map_or_else(
            || {
                format!(
                    "<span class=\"gpu-name\" title=\"{}\">{}/{}</span>",
                    esc(&p.uuid),
                    esc(&p.node),
                    esc(&p.device)
                )
            },
            gpu_name,
        );
    format!(
        "<tr id=\"pod-{}-{}\" data-pod=\"{}/{}\" data-container=\"{}\" data-workload=\"{}\"><td data-col=\"pod\">{}/{}</td><td data-col=\"container\">{}</td><td data-col=\"gpu\">{gpu}</td>{cpu}{memory}{gpu_used}{}{}{}{}</tr>\n",
        esc(&p.namespace),
        esc(&p.pod),
        esc(&p.namespace),
        esc(&p.pod),
        esc(&p.container),
        esc(&p.workload),
        esc(&p.namespace),
        esc(&p.pod),
        esc(&p.container),
        bytes_cell("memory-limit", Some(p.memory_limit)),
        bytes_cell("memory-used-driver", p.memory_used_driver),
        num_cell("cores-share", Some(p.cores_share)),
        num_cell("cores-used", p.cores_used.map(|c| c.max(0.0).round() as u64)),
    )
}

/// How the Idle page sorts its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleSort {
    /// The largest holding first (the default).
    Memory,
    /// By namespace and workload.
    Workload,
}

/// `/idle`: the slices whose use stayed under the threshold for the window
/// ([`crate::idle::idle_slices`], the rows `kubectl gpuslice pods --idle` prints).
pub fn idle_page(
    chrome: &Chrome,
    rows: Option<&[IdleSlice]>,
    opts: &IdleOptions,
    namespace: Option<&str>,
    sort: IdleSort,
) -> String {
    let mut body = scope_line(namespace);
    let window = format_window(opts.window);
    let _ = writeln!(
        body,
        "<p id=\"idle-rule\">Slices whose measured memory and compute stayed under {}% of their limit for the last {} (change with ?threshold=PERCENT&amp;window=30m|1h|6h|1d).</p>",
        opts.threshold_percent,
        esc(&window)
    );
    let total: u64 = rows.unwrap_or(&[]).iter().map(|r| r.memory_held).sum();
    let _ = writeln!(
        body,
        "<p id=\"idle-total\" data-value=\"{total}\">{} slice(s) hold {} idle</p>",
        rows.map_or(0, <[IdleSlice]>::len),
        esc(&bytes(total))
    );
    let q = |s: &str| {
        format!(
            "/idle?sort={s}&amp;threshold={}&amp;window={}{}",
            opts.threshold_percent,
            esc(&window),
            namespace.map_or(String::new(), |n| format!(
                "&amp;namespace={}",
                esc(&seg(n))
            ))
        )
    };
    let _ = writeln!(
        body,
        "<div class=\"scroll\"><table id=\"idle\"><thead><tr><th><a id=\"sort-workload\" href=\"{}\">Workload</a></th><th>Pods</th><th>Claim</th><th>GPU</th><th><a id=\"sort-memory\" href=\"{}\">Memory held</a></th><th>Max used</th><th>Cores share</th><th>Max cores used</th></tr></thead><tbody>",
        q("workload"),
        q("memory")
    );
    let mut sorted: Vec<&IdleSlice> = rows.unwrap_or(&[]).iter().collect();
    if sort == IdleSort::Workload {
        sorted.sort_by(|a, b| {
            (&a.namespace, &a.workload, &a.uuid).cmp(&(&b.namespace, &b.workload, &b.uuid))
        });
    }
    for r in sorted {
        let what = r.claim.clone().unwrap_or_else(|| r.pods.join(","));
        let pods: Vec<String> = r
            .pods
            .iter()
            .map(|p| {
                format!(
                    "<a href=\"/pods?namespace={}#pod-{}-{}\">{}</a>",
                    esc(&seg(&r.namespace)),
                    esc(&r.namespace),
                    esc(p),
                    esc(p)
                )
            })
            .collect();
        let _ = writeln!(
            body,
            "<tr data-idle=\"{}/{} {}\"><td data-col=\"workload\">{}/{}</td><td data-col=\"pods\">{}</td>{}<td data-col=\"gpu\"><span class=\"gpu-name\" title=\"{}\">{}</span></td>{}{}{}{}</tr>",
            esc(&r.namespace),
            esc(&what),
            esc(&r.uuid),
            esc(&r.namespace),
            esc(&r.workload),
            pods.join(", "),
            text_cell("claim", r.claim.as_deref().unwrap_or("(annotation)")),
            esc(&r.uuid),
            esc(&gpu_label(&r.node, &r.device, &r.model)),
            bytes_cell("memory-held", Some(r.memory_held)),
            bytes_cell("memory-used-max", Some(r.memory_used_max)),
            num_cell("cores-share", Some(r.cores_share)),
            num_cell("cores-used-max", Some(r.cores_used_max.max(0.0).round() as u64)),
        );
    }
    body.push_str("</tbody></table></div>\n");
    layout("Idle slices", chrome, &body)
}

/// A Deployment, StatefulSet or DaemonSet and its slice.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRow {
    pub namespace: String,
    pub kind: Kind,
    pub name: String,
    /// Desired pods (a DaemonSet: the nodes it is scheduled on, when known).
    pub replicas: Option<u64>,
    /// The pods the namespace's budget is checked for, as the allocation counts them
    /// ([`crate::workload::budget_pods`]; a DaemonSet: one per node with gpuslice GPUs).
    pub pods: u64,
    /// How its controller replaces those pods once the template changes
    /// ([`crate::workload::Workload::rollout`]), which the budget's room per pod follows.
    pub rollout: Rollout,
    /// The slice each pod gets; `None`: none.
    pub slice: Option<Slice>,
    /// One of its pods as admitted, which decides the budgets that count them (their scopes:
    /// [`budgets::admitted_pod`]).
    pub pod: Pod,
}

/// Where a workload's slice is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceSource {
    /// The claim form: the ResourceClaimTemplate the pod's claim `gpuslice` names.
    Claim(String),
    /// The limits form: `gpuslice.io/*` limits, made a claim of each pod by the webhook.
    Limits,
    /// HAMi's `nvidia.com/gpu…` limits, as `container: name=value, …` (shown, not edited).
    Hami(String),
}

/// A workload's slice: where it is written and the request read back from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub source: SliceSource,
    /// `None` when the template is missing or not the claim shape, and for HAMi's limits.
    pub request: Option<Request>,
    /// What one pod is charged, as the webhook charges it at admission (the budget's
    /// `used` holds it); `None` when it cannot be computed, and for HAMi's limits.
    pub charge: Option<Charge>,
}

impl Slice {
    /// The slice as kubectl-gpuslice describes a request (`1 GPU × 20Gi memory, 30 cores`).
    pub fn describe(&self) -> String {
        match (&self.request, &self.source) {
            (Some(r), _) => r.describe(),
            (None, SliceSource::Claim(t)) => format!("resourceclaimtemplate/{t} (unreadable)"),
            (None, SliceSource::Limits) => "gpuslice.io/* limits (unreadable)".to_string(),
            (None, SliceSource::Hami(l)) => format!("HAMi limits ({l})"),
        }
    }

    /// Which form the slice has, for the GPU tab.
    pub fn form(&self) -> String {
        match &self.source {
            SliceSource::Claim(t) => format!("claim form: resourceclaimtemplate/{t}"),
            SliceSource::Limits => "limits form: gpuslice.io/* limits in the containers, which the webhook turns into a claim of each pod".to_string(),
            SliceSource::Hami(_) => "HAMi's limits: the console shows them and does not edit them (remove them by hand to allocate here)".to_string(),
        }
    }
}

fn slice_text(s: Option<&Slice>) -> String {
    s.map_or_else(|| "none".to_string(), Slice::describe)
}

fn workload_href(w: &WorkloadRow) -> String {
    format!(
        "/workloads/{}/{}/{}",
        seg(&w.namespace),
        w.kind.as_str(),
        seg(&w.name)
    )
}

/// `/workloads`: one row per workload.
pub fn workloads_page(
    chrome: &Chrome,
    rows: Option<&[WorkloadRow]>,
    namespace: Option<&str>,
) -> String {
    let mut body = scope_line(namespace);
    body.push_str("<table id=\"workloads\"><thead><tr><th>Workload</th><th>Replicas</th><th>GPU</th></tr></thead><tbody>\n");
    for w in rows.unwrap_or(&[]) {
        let id = format!("{}/{}/{}", w.namespace, w.kind.as_str(), w.name);
        let _ = writeln!(
            body,
            "<tr data-workload=\"{}\"><td data-col=\"name\"><a href=\"{}\">{}</a></td>{}{}</tr>",
            esc(&id),
            esc(&workload_href(w)),
            esc(&id),
            num_cell("replicas", w.replicas),
            text_cell("gpu", &slice_text(w.slice.as_ref())),
        );
    }
    body.push_str("</tbody></table>\n");
    layout("Workloads", chrome, &body)
}

/// `/workloads/NS/KIND/NAME`: the GPU tab, with the Allocate (or Edit) and Release forms
/// when editing is allowed.
/// `budgets`: the namespace's budgets, or why they cannot be read.
pub fn workload_page(
    chrome: &Chrome,
    w: &WorkloadRow,
    budgets: Result<&[NamespaceBudget], &str>,
) -> String {
    let href = workload_href(w);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<p id=\"replicas\">replicas: {}</p>",
        w.replicas.map_or(UNKNOWN.to_string(), |r| r.to_string())
    );
    body.push_str("<section id=\"gpu-tab\"><h2>GPU</h2>\n");
    let _ = writeln!(
        body,
        "<p id=\"current-slice\">{}</p>",
        esc(&slice_text(w.slice.as_ref()))
    );
    if let Some(s) = &w.slice {
        let _ = writeln!(body, "<p id=\"slice-form\">{}</p>", esc(&s.form()));
    }
    body.push_str(&budget_part(w, budgets));
    // HAMi's limits are shown, not edited (allocate and release refuse them): no forms and
    // no read-only note, only the slice-form sentence above.
    let hami = matches!(
        w.slice.as_ref().map(|s| &s.source),
        Some(SliceSource::Hami(_))
    );
    if chrome.allow_edit && !hami {
        // At most MAX_GPUS per pod, and no more than the namespace's GPU budget leaves.
        let most = u64::from(MAX_GPUS);
        let max = budgets
            .ok()
            .and_then(|b| gpus_max(w, b))
            .map_or(most, |m| m.min(most));
        let request = w.slice.as_ref().and_then(|s| s.request);
        let gpus = request.map_or(1, |r| r.gpus);
        // The exact quantity, as the template and limits are written: the rounded display
        // figure would shrink the slice, or be refused, when sent back as pre-filled.
        let memory = request.map_or(String::new(), |r| format_kube_quantity(r.memory));
        let cores = request
            .and_then(|r| r.cores)
            .map_or(String::new(), |c| c.to_string());
        let submit = if w.slice.is_some() {
            "Edit"
        } else {
            "Allocate"
        };
        let _ = writeln!(
            body,
            "<form id=\"allocate\" method=\"post\" action=\"{href}/allocate\">\
<label>GPUs per pod <input type=\"number\" name=\"gpus\" value=\"{gpus}\" min=\"1\" max=\"{max}\" required></label> \
<label>Memory per GPU <input type=\"text\" name=\"memory\" value=\"{memory}\" placeholder=\"8Gi\" required></label> \
<label>Cores per GPU, percent (optional) <input type=\"text\" name=\"cores\" value=\"{cores}\" placeholder=\"30\"></label> \
<label>Form <select name=\"form\"><option value=\"\">as the workload has it; new: limits if the webhook is installed, else claim</option><option value=\"limits\">limits (the webhook makes the claim)</option><option value=\"claim\">claim</option></select></label> \
<label><input type=\"checkbox\" name=\"dry_run\" value=\"1\"> dry run (show the diff, change nothing)</label> \
<button id=\"allocate-submit\" type=\"submit\">{submit}</button></form>",
            href = esc(&href),
            memory = esc(&memory),
            cores = esc(&cores),
        );
        if w.slice.is_some() {
            let _ = writeln!(
                body,
                "<form id=\"release\" method=\"post\" action=\"{}/release\">\
<label><input type=\"checkbox\" name=\"dry_run\" value=\"1\"> dry run</label> \
<button id=\"release-submit\" type=\"submit\">Release</button></form>",
                esc(&href)
            );
        }
    } else if !hami {
        body.push_str(
            "<p class=\"read-only\">read-only: start gpuslice console with --allow-edit to allocate</p>\n",
        );
    }
    body.push_str("</section>\n");
    let title = format!("Workload {}/{}/{}", w.namespace, w.kind.as_str(), w.name);
    layout(&title, chrome, &body)
}

/// What an allocate or release answered: kubectl-gpuslice's summary line, or its diff on a
/// dry run, or the one line of its refusal.
pub fn result_page(
    chrome: &Chrome,
    workload: &str,
    back: &str,
    outcome: Result<&str, &str>,
) -> String {
    let mut body = String::new();
    match outcome {
        Ok(out) if out.contains("(dry run: nothing changed)") => {
            let _ = writeln!(
                body,
                "<div id=\"result\" class=\"ok\">dry run: nothing changed</div>\n<pre id=\"diff\">{}</pre>",
                esc(out)
            );
        }
        Ok(out) => {
            let _ = writeln!(
                body,
                "<div id=\"result\" class=\"ok\">{}</div>",
                esc(out.trim_end())
            );
        }
        Err(line) => {
            let _ = writeln!(
                body,
                "<div id=\"result\" class=\"error\">{}</div>",
                esc(line)
            );
        }
    }
    let _ = writeln!(
        body,
        "<p><a id=\"back\" href=\"{}\">Back to {}</a></p>",
        esc(back),
        esc(workload)
    );
    layout(&format!("Result {workload}"), chrome, &body)
}

/// A budget's bar: `used` of `whole` as a bar 120 px wide, marked `over` past it.
fn budget_bar(used: u64, whole: u64, what: &str) -> String {
    if whole == 0 {
        return String::new();
    }
    let pct = used as f64 / whole as f64 * 100.0;
    let class = if used > whole {
        "budget-bar over"
    } else {
        "budget-bar"
    };
    format!(
        "<span class=\"{class}\" data-share=\"{pct:.1}\" title=\"{pct:.0}% of {}\"><i style=\"width:{:.1}%\"></i></span>",
        esc(what),
        pct.clamp(0.0, 100.0)
    )
}

/// The hard and used cells of one resource of a budget: `—`-less `-` where the quota names
/// no hard value (no limit, not an unknown figure).
fn budget_cells(b: &NamespaceBudget, what: Resource) -> String {
    let col = match what {
        Resource::Memory => "memory",
        Resource::Cores => "cores",
        Resource::Gpus => "gpus",
    };
    let l = b.limit(what);
    match l.hard {
        None => format!(
            "<td data-col=\"{col}-hard\" class=\"none\">-</td><td data-col=\"{col}-used\" class=\"none\">-</td>"
        ),
        Some(hard) => format!(
            "<td data-col=\"{col}-hard\" data-value=\"{hard}\">{}</td><td data-col=\"{col}-used\" data-value=\"{}\" class=\"use\"><span class=\"v\">{}</span>{}</td>",
            esc(&show(what, hard)),
            l.used,
            esc(&show(what, l.used)),
            budget_bar(l.used, hard, &show(what, hard)),
        ),
    }
}

/// `/budgets`: one row per ResourceQuota and name set with a bar of used against hard for
/// GPU memory, cores and GPUs; then, where Kueue is installed, one row per ClusterQueue
/// charging `gpuslice.io/memory` with a bar of used against its nominal quota.
pub fn budgets_page(chrome: &Chrome, budgets: Option<&Budgets>, namespace: Option<&str>) -> String {
    let mut body = scope_line(namespace);
    body.push_str("<p class=\"legend\">Used is the admission ledger of each quota (its status.used): what admitted pods and claims take of it. A bar fills as used nears hard.</p>\n");
    body.push_str("<div class=\"scroll\"><table id=\"budgets\"><thead><tr><th>Namespace</th><th>Quota</th><th>Names</th><th>GPU memory</th><th>Used</th><th>Cores</th><th>Used</th><th>GPUs</th><th>Used</th></tr></thead><tbody>\n");
    for b in budgets.map(|b| b.namespaces.as_slice()).unwrap_or(&[]) {
        let _ = writeln!(
            body,
            "<tr data-budget=\"{}/{}\"><td data-col=\"namespace\"><a href=\"/budgets?namespace={}\">{}</a></td>{}{}{}{}{}</tr>",
            esc(&b.namespace),
            esc(&b.quota),
            esc(&seg(&b.namespace)),
            esc(&b.namespace),
            text_cell("quota", &b.quota),
            text_cell("names", &b.name_sets()),
            budget_cells(b, Resource::Memory),
            budget_cells(b, Resource::Cores),
            budget_cells(b, Resource::Gpus),
        );
    }
    body.push_str("</tbody></table></div>\n");
    if let Some(b) = budgets {
        if b.namespaces.is_empty() {
            body.push_str("<p id=\"budgets-none\">No ResourceQuota here names gpuslice's resources (limits.gpuslice.io/memory, cores, gpus; HAMi's limits.nvidia.com/* in HAMi-compat namespaces).</p>\n");
        }
        if !b.warnings.is_empty() {
            body.push_str("<ul id=\"budget-warnings\">");
            for w in &b.warnings {
                let _ = write!(body, "<li>{}</li>", esc(w));
            }
            body.push_str("</ul>\n");
        }
        body.push_str(
            "<section id=\"queues-section\"><h2>Kueue ClusterQueues (gpuslice.io/memory)</h2>\n",
        );
        match &b.queues {
            None if b.queues_unavailable.is_none() => body.push_str(
                "<p id=\"queues-none\">Kueue is not installed (no ClusterQueue kind is served): no queues.</p>\n",
            ),
            None => {}
            Some(queues) => {
                body.push_str("<div class=\"scroll\"><table id=\"queues\"><thead><tr><th>ClusterQueue</th><th>Cohort</th><th>Nominal</th><th>Borrowing limit</th><th>Used</th><th>Borrowed</th><th>Reserved</th></tr></thead><tbody>\n");
                for q in queues {
                    let limit = match (&q.cohort, q.borrowing_limit) {
                        (None, _) => "<td data-col=\"borrowing-limit\" class=\"none\">-</td>".to_string(),
                        (Some(_), None) => "<td data-col=\"borrowing-limit\">unlimited</td>".to_string(),
                        (Some(_), Some(l)) => bytes_cell("borrowing-limit", Some(l)),
                    };
                    let _ = writeln!(
                        body,
                        "<tr data-queue=\"{}\"><td data-col=\"name\">{}</td>{}{}{limit}<td data-col=\"memory-used\" data-value=\"{}\" class=\"use\"><span class=\"v\">{}</span>{}</td>{}{}</tr>",
                        esc(&q.name),
                        esc(&q.name),
                        text_cell("cohort", q.cohort.as_deref().unwrap_or("-")),
                        bytes_cell("memory-nominal", Some(q.nominal)),
                        q.used,
                        esc(&bytes(q.used)),
                        budget_bar(q.used, q.nominal, &format!("the nominal {}", bytes(q.nominal))),
                        bytes_cell("memory-borrowed", Some(q.borrowed)),
                        bytes_cell("memory-reserved", Some(q.reserved)),
                    );
                }
                body.push_str("</tbody></table></div>\n");
            }
        }
        body.push_str("</section>\n");
    }
    layout("Budgets", chrome, &body)
}

/// The GPU tab's budget part: per budget of the namespace and resource, what an allocation
/// of this workload may still ask, per pod at the worst point of its rollout (its current
/// slices freed only as the rollout removes them); the console checks the allocation against
/// the same figures before it writes anything.
fn budget_part(w: &WorkloadRow, budgets: Result<&[NamespaceBudget], &str>) -> String {
    let budgets = match budgets {
        Err(why) => {
            return format!(
                "<p id=\"budget\" class=\"unknown\">The budget of namespace {} cannot be read ({}): the allocation is not checked against it here (admission still is).</p>\n",
                esc(&w.namespace),
                esc(why)
            )
        }
        Ok([]) => {
            return format!(
                "<p id=\"budget\">Namespace {} has no budget: no ResourceQuota names limits.gpuslice.io/memory, cores or gpus.</p>\n",
                esc(&w.namespace)
            )
        }
        Ok(b) => b,
    };
    if !budgets.iter().any(|b| b.counts(&w.pod)) {
        let quotas: Vec<&str> = budgets.iter().map(|b| b.quota.as_str()).collect();
        return format!(
            "<p id=\"budget\">No budget of namespace {} counts this workload's pods: the scopes of its ResourceQuotas ({}) hold for none of them.</p>\n",
            esc(&w.namespace),
            esc(&quotas.join(", "))
        );
    }
    let pods = w.pods;
    let held = w.slice.as_ref().and_then(|s| s.charge).map(|per_pod| Ask {
        pods,
        per_pod,
        what: String::new(),
    });
    let mut out = format!(
        "<div id=\"budget\"><p>Budget of namespace {} for this workload's {pods} pod(s){}, per pod at the worst point of its rollout ({}); an allocation asking more is refused before anything is written:</p><ul>",
        esc(&w.namespace),
        if held.is_some() {
            " (its current slices freed as the rollout removes them)"
        } else {
            ""
        },
        esc(&w.rollout.strategy)
    );
    for room in budgets::headroom(budgets, &w.pod, held.as_ref(), &w.rollout) {
        let (name, b) = (room.line.name, room.budget);
        let per_pod = room.per_pod;
        let _ = write!(
            out,
            "<li data-budget=\"{}/{}\" data-resource=\"{}\" data-left=\"{}\">quota {}: {} {} of {} used; left for it: {} ({} per pod)</li>",
            esc(&b.namespace),
            esc(&b.quota),
            name.name,
            room.left,
            esc(&b.quota),
            name.name,
            esc(&show_value(name, room.line.used)),
            esc(&show_value(name, room.line.hard)),
            esc(&show_value(name, room.left)),
            esc(&show_value(name, per_pod)),
        );
    }
    out.push_str("</ul></div>\n");
    out
}

/// The most GPUs per pod the namespace's GPU budgets leave this workload (the form's
/// `max`, so the browser refuses more before sending); `None`: no GPU budget.
fn gpus_max(w: &WorkloadRow, budgets: &[NamespaceBudget]) -> Option<u64> {
    let pods = w.pods.max(1);
    let held = w.slice.as_ref().and_then(|s| s.charge).map(|per_pod| Ask {
        pods,
        per_pod,
        what: String::new(),
    });
    budgets::headroom(budgets, &w.pod, held.as_ref(), &w.rollout)
        .into_iter()
        .filter(|r| r.line.name.resource == Resource::Gpus)
        .map(|r| r.per_pod)
        .min()
}

/// A page saying what was not found (an unknown node or workload).
pub fn not_found_page(chrome: &Chrome, what: &str) -> String {
    let body = format!("<p id=\"not-found\">{} not found</p>\n", esc(what));
    layout("Not found", chrome, &body)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::tests::{claims, slices, usage, GIB};
    use crate::model::{build, Sources};

    /// A claim-form slice of `req`, charged as one claim per pod.
    fn claim_slice(req: Request) -> Slice {
        Slice {
            source: SliceSource::Claim("t".into()),
            request: Some(req),
            charge: Some(Ask::of_request(1, &req).unwrap().per_pod),
        }
    }

    fn chrome(banners: Vec<Banner>) -> Chrome {
        Chrome {
            rights: "acts with the rights of kubeconfig context `kind` (user `admin`)".into(),
            allow_edit: false,
            banners,
        }
    }

    fn model(usage: Result<crate::usage::Usage, String>) -> Model {
        build(
            &Sources {
                slices: slices(),
                claims: claims(),
                pods: Vec::new(),
                usage,
            },
            None,
        )
    }

    /// The `<tr …>` line whose attribute `attr` is `value`.
    fn row<'a>(html: &'a str, attr: &str, value: &str) -> &'a str {
        let needle = format!(" {attr}=\"{value}\"");
        let at = html
            .find(&needle)
            .unwrap_or_else(|| panic!("no {needle} in {html}"));
        let start = html[..at].rfind("<tr").unwrap();
        let end = html[start..].find("</tr>").unwrap() + start;
        &html[start..end]
    }

    fn td<'a>(row: &'a str, col: &str) -> &'a str {
        let needle = format!("<td data-col=\"{col}\"");
        let start = row
            .find(&needle)
            .unwrap_or_else(|| panic!("no {col} in {row}"));
        let end = row[start..].find("</td>").unwrap() + start;
        &row[start..end + 5]
    }

    #[test]
    fn nodes_show_the_models_figures_with_exact_values() {
        let m = model(Ok(usage()));
        let html = nodes_page(&chrome(vec![]), Some(&m), false, None, None);
        let total = row(&html, "data-node", "(total)");
        assert_eq!(
            td(total, "memory-capacity"),
            format!(
                "<td data-col=\"memory-capacity\" data-value=\"{}\">265Gi</td>",
                265 * GIB
            )
        );
        assert_eq!(
            td(total, "memory-used"),
            "<td data-col=\"memory-used\" class=\"use unknown\"><span class=\"v\">—</span></td>",
            "the L4 is not measured: the total is unknown, not 0"
        );
        let a = row(&html, "data-node", "node-a");
        assert!(a.contains("<a href=\"/nodes/node-a\">node-a</a>"), "{a}");
        assert_eq!(
            td(a, "memory-allocated"),
            format!(
                "<td data-col=\"memory-allocated\" data-value=\"{}\">40Gi</td>",
                40 * GIB
            )
        );
        // 12Gi of node-a's 241Gi: a 5 % bar.
        assert_eq!(
            td(a, "memory-used"),
            format!(
                "<td data-col=\"memory-used\" data-value=\"{}\" class=\"use\"><span class=\"v\">12Gi</span><span class=\"share\" data-share=\"5.0\" title=\"5% of capacity\"><i style=\"width:5.0%\"></i></span></td>",
                12 * GIB
            )
        );
        assert_eq!(
            td(a, "cores-capacity"),
            "<td data-col=\"cores-capacity\" data-value=\"175\">175</td>"
        );
        assert_eq!(
            td(a, "cores-used"),
            "<td data-col=\"cores-used\" data-value=\"42\">42</td>"
        );
        assert!(td(a, "gpus").starts_with("<td data-col=\"gpus\" data-value=\"2\">2"));
        assert!(!a.contains("sparkline"), "no history given, no sparkline");
        // The filter: node-b's L4 is fully allocated.
        let html = nodes_page(&chrome(vec![]), Some(&m), true, None, None);
        assert!(html.contains("data-node=\"node-a\"") && !html.contains("data-node=\"node-b\""));
        assert!(html.contains("<a id=\"filter-available\" href=\"/\">"));
        assert!(html.contains("<p id=\"mode\">read-only"));
        assert!(html.contains(
            "<p id=\"rights\">acts with the rights of kubeconfig context `kind` (user `admin`)</p>"
        ));
    }

    fn span() -> Span {
        Span {
            start: 0,
            end: 3600,
            step: 60,
        }
    }

    #[test]
    fn each_row_shows_cpu_memory_and_gpu_memory_as_value_bar_and_sparkline() {
        let m = model(Ok(usage()));
        let mut gpu = History {
            span: span(),
            series: BTreeMap::new(),
        };
        gpu.series
            .insert("node-a".into(), vec![(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)]);
        let mut cpu = gpu.clone();
        cpu.series.clear();
        cpu.series
            .insert("node-a".into(), vec![(0.0, 0.5), (60.0, 0.25)]);
        let mut mem = gpu.clone();
        mem.series.clear();
        mem.series
            .insert("node-a".into(), vec![(60.0, (4 * GIB) as f64)]);
        let used = NodeUse {
            gpu_memory: Some(gpu),
            cpu: Some(cpu),
            memory: Some(mem),
            capacity: [("node-a".to_string(), (Some(2.0), Some((16 * GIB) as f64)))].into(),
        };
        let html = nodes_page(
            &chrome(vec![]),
            Some(&m),
            false,
            Some(&used),
            Some(&usage()),
        );
        let a = row(&html, "data-node", "node-a");
        assert!(a.contains("<svg class=\"sparkline\" data-chart=\"gpu-memory\" data-start=\"0\" data-end=\"3600\" data-step=\"60\" data-points=\"3\""), "{a}");
        let c = td(a, "cpu");
        assert!(c.starts_with("<td data-col=\"cpu\" data-value=\"250\" class=\"use\"><span class=\"v\">250m</span><span class=\"share\" data-share=\"12.5\""), "{c}");
        assert!(c.contains("data-values=\"0:0.5 60:0.25\""), "{c}");
        let mm = td(a, "memory");
        assert!(
            mm.contains(&format!("data-value=\"{}\"", 4 * GIB))
                && mm.contains("data-share=\"25.0\""),
            "{mm}"
        );
        // node-b: no history, so no data yet; cAdvisor knows nothing of it: unknown.
        let b = row(&html, "data-node", "node-b");
        assert!(b.contains("<span class=\"sparkline no-data\" data-chart=\"gpu-memory\" data-points=\"0\">no data yet</span>"), "{b}");
        assert!(
            td(b, "cpu").contains("class=\"use unknown\"><span class=\"v\">—</span>"),
            "{b}"
        );
        // The compact slice map: node-a's two GPUs, each split into its bookings.
        assert_eq!(
            td(a, "slice-map")
                .matches("class=\"slice-map compact\"")
                .count(),
            2
        );
    }

    #[test]
    fn unknown_figures_are_a_dash_and_missing_sources_a_banner() {
        let m = model(Err("no --prometheus URL given".into()));
        let banners = vec![
            Banner {
                source: "prometheus".into(),
                text: "Prometheus: not configured (start with --prometheus URL)".into(),
            },
            Banner {
                source: "plugin:n2".into(),
                text: "node n2: no gpuslice plugin (no ResourceSlice of driver gpuslice.io)".into(),
            },
        ];
        let html = nodes_page(&chrome(banners), Some(&m), false, None, None);
        assert!(html.contains("<div class=\"source-missing\" data-source=\"prometheus\">Prometheus: not configured (start with --prometheus URL)</div>"));
        assert!(html.contains(
            "<div class=\"source-missing\" data-source=\"plugin:n2\">node n2: no gpuslice plugin"
        ));
        for n in ["(total)", "node-a", "node-b"] {
            let r = row(&html, "data-node", n);
            assert_eq!(
                td(r, "memory-used"),
                "<td data-col=\"memory-used\" class=\"use unknown\"><span class=\"v\">—</span></td>"
            );
            assert_eq!(
                td(r, "cores-used"),
                "<td data-col=\"cores-used\" class=\"unknown\">—</td>"
            );
            assert!(!td(r, "memory-used").contains(">0<"));
        }
        // No model (the API server unreadable): the table is empty, not zeros.
        let api = vec![Banner {
            source: "api".into(),
            text: "API server: cannot list".into(),
        }];
        let html = nodes_page(&chrome(api), None, false, None, None);
        assert!(html.contains("data-source=\"api\""));
        assert!(!html.contains("<tr data-node"));
    }

    #[test]
    fn hostile_names_are_escaped_everywhere() {
        let mut m = model(Ok(usage()));
        let evil = "<script>alert(1)</script>";
        m.nodes[0].name = evil.into();
        m.gpus[0].node = evil.into();
        m.gpus[0].model = "\"><img src=x onerror=alert(1)>".into();
        m.gpus[0].claims[0].name = evil.into();
        let c = chrome(vec![Banner {
            source: "plugin:<b>".into(),
            text: evil.into(),
        }]);
        let html = nodes_page(&c, Some(&m), false, None, None);
        assert!(
            !html.contains("<script>") && !html.contains("<b>"),
            "{html}"
        );
        assert!(html.contains("<tr data-node=\"&lt;script&gt;alert(1)&lt;/script&gt;\""));
        assert!(html.contains("href=\"/nodes/%3Cscript%3Ealert%281%29%3C%2Fscript%3E\""));
        let html = node_page(&c, &m, None, evil, None);
        assert!(
            !html.contains("<script>") && !html.contains("<img"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"));
    }

    #[test]
    fn the_node_page_has_a_row_and_a_chart_per_gpu_with_the_share() {
        let m = model(Ok(usage()));
        let html = node_page(&chrome(vec![]), &m, Some(&usage()), "node-a", None);
        let g0 = row(&html, "data-gpu", "GPU-NVIDIA-H200-0");
        // 30Gi of 141Gi: 21%.
        assert_eq!(
            td(g0, "memory-share"),
            "<td data-col=\"memory-share\" data-value=\"21\">21%</td>"
        );
        assert_eq!(
            td(g0, "index"),
            "<td data-col=\"index\" data-value=\"0\">0</td>"
        );
        assert_eq!(
            td(g0, "claims"),
            "<td data-col=\"claims\">ml/pair (idle now), ml/train</td>"
        );
        assert_eq!(td(g0, "model"), "<td data-col=\"model\">NVIDIA H200</td>");
        // No history: each GPU's chart says so instead of drawing an empty frame.
        assert_eq!(html.matches("<div class=\"chart no-data\"").count(), 2);
        assert!(html.contains("<div class=\"chart no-data\" data-gpu=\"GPU-NVIDIA-H200-1\""));
        assert!(
            td(g0, "gpu").contains("title=\"GPU-NVIDIA-H200-0\">node-a/gpu-0 (H200)</span>"),
            "{g0}"
        );
        // The slice map of gpu-0: pair (10Gi, idle: 0 used) and train (20Gi, 8Gi used),
        // 111Gi free, in proportion to the 141Gi.
        let map = &html[html
            .find("<div class=\"gpu-map\" data-gpu=\"GPU-NVIDIA-H200-0\"")
            .unwrap()..];
        let map = &map[..map.find("</div></div>").unwrap()];
        assert!(map.contains(&format!("data-claim=\"ml/pair\" data-pod=\"pair-0\" data-booked=\"{}\" href=\"/pods?namespace=ml#pod-ml-pair-0\" style=\"width:7.0922%\"", 10 * GIB)), "{map}");
        assert!(
            map.contains(&format!(
                "<i class=\"used\" data-used=\"{}\" style=\"width:40.00%\">",
                8 * GIB
            )),
            "{map}"
        );
        assert!(
            map.contains(&format!("data-free=\"{}\"", 111 * GIB)),
            "{map}"
        );
        assert!(
            map.contains("data-resource=\"cores\" data-capacity=\"100\""),
            "{map}"
        );
        assert!(
            !html.contains("GPU-NVIDIA-L4-0"),
            "node-b's GPU is not on node-a's page"
        );
    }

    #[test]
    fn pods_show_both_memory_figures_and_cadvisor_when_known() {
        let mut src = Sources {
            slices: slices(),
            claims: claims(),
            pods: vec![crate::model::tests::pod(
                "ml",
                "train-0",
                "gpu",
                "train",
                &[("main", true)],
            )],
            usage: Ok(usage()),
        };
        let ml = BTreeSet::from(["ml".to_string()]);
        let m = build(&src, Some(&ml));
        let h = |k: &str, v: f64| History {
            span: span(),
            series: [(k.to_string(), vec![(60.0, v)])].into(),
        };
        let key = pod_key("ml", "train-0");
        let used = PodUse {
            slices: History {
                span: span(),
                series: BTreeMap::new(),
            },
            cpu: Some(h(&key, 0.25)),
            memory: Some(h(&key, (3 * GIB) as f64)),
            capacity: BTreeMap::new(),
        };
        let u = usage();
        let html = pods_page(
            &chrome(vec![]),
            Some(&m),
            Some("ml"),
            None,
            Some(&used),
            Some(&u),
        );
        assert!(html.contains("<tr class=\"group\" data-group=\"ml/pod/train-0\" data-count=\"1\"><th colspan=\"10\">ml/pod/train-0 · 1 pod</th></tr>"), "{html}");
        let r = row(&html, "data-pod", "ml/train-0");
        assert!(r.contains("data-container=\"main\""));
        assert_eq!(
            td(r, "memory-limit"),
            format!(
                "<td data-col=\"memory-limit\" data-value=\"{}\">20Gi</td>",
                20 * GIB
            )
        );
        assert!(td(r, "memory-used").starts_with(&format!(
            "<td data-col=\"memory-used\" data-value=\"{}\" class=\"use\"><span class=\"v\">8Gi</span><span class=\"share\" data-share=\"40.0\"",
            8 * GIB
        )));
        assert_eq!(
            td(r, "memory-used-driver"),
            format!(
                "<td data-col=\"memory-used-driver\" data-value=\"{}\">9Gi</td>",
                9 * GIB
            )
        );
        assert_eq!(
            td(r, "cores-share"),
            "<td data-col=\"cores-share\" data-value=\"30\">30</td>"
        );
        assert_eq!(
            td(r, "cores-used"),
            "<td data-col=\"cores-used\" data-value=\"28\">28</td>"
        );
        assert!(td(r, "cpu").starts_with(
            "<td data-col=\"cpu\" data-value=\"250\" class=\"use\"><span class=\"v\">250m</span>"
        ));
        assert!(td(r, "memory").starts_with(&format!(
            "<td data-col=\"memory\" data-value=\"{}\" class=\"use\"><span class=\"v\">3Gi</span>",
            3 * GIB
        )));
        src.usage = Err("x".into());
        let m = build(&src, Some(&ml));
        let html = pods_page(&chrome(vec![]), Some(&m), Some("ml"), None, None, None);
        let r = row(&html, "data-pod", "ml/train-0");
        for col in [
            "memory-used",
            "memory-used-driver",
            "cores-used",
            "cpu",
            "memory",
        ] {
            assert!(
                td(r, col).contains(">—<") && !td(r, col).contains("data-value"),
                "{col}: {r}"
            );
        }
    }

    #[test]
    fn the_gpu_tab_offers_forms_only_when_editing_is_allowed() {
        let mut w = WorkloadRow {
            namespace: "ml".into(),
            kind: Kind::Deployment,
            name: "train".into(),
            replicas: Some(2),
            pods: 2,
            rollout: Rollout::remove_first(2, "Recreate"),
            slice: None,
            pod: crate::budgets::tests::pod(),
        };
        let mut c = chrome(vec![]);
        let html = workload_page(&c, &w, Ok(&[]));
        assert!(html.contains("<p id=\"current-slice\">none</p>"));
        assert!(!html.contains("<form"));
        assert!(html.contains("read-only: start gpuslice console with --allow-edit to allocate"));
        c.allow_edit = true;
        let html = workload_page(&c, &w, Ok(&[]));
        assert!(html.contains("<form id=\"allocate\" method=\"post\" action=\"/workloads/ml/deployment/train/allocate\">"));
        assert!(html.contains("<button id=\"allocate-submit\" type=\"submit\">Allocate</button>"));
        assert!(!html.contains("id=\"release\""));
        assert!(html.contains("<p id=\"mode\">edit allowed"));
        w.slice = Some(claim_slice(Request::parse("20Gi", Some("30"), 1).unwrap()));
        let html = workload_page(&c, &w, Ok(&[]));
        assert!(html.contains("<p id=\"current-slice\">1 GPU × 20Gi memory, 30 cores</p>"));
        assert!(html.contains(">Edit</button>") && html.contains("<button id=\"release-submit\""));
        assert!(
            html.contains("name=\"memory\" value=\"20Gi\"")
                && html.contains("name=\"cores\" value=\"30\"")
        );
        let rows = [w.clone()];
        let html = workloads_page(&c, Some(&rows), None);
        let r = row(&html, "data-workload", "ml/deployment/train");
        assert_eq!(
            td(r, "replicas"),
            "<td data-col=\"replicas\" data-value=\"2\">2</td>"
        );
        assert_eq!(
            td(r, "gpu"),
            "<td data-col=\"gpu\">1 GPU × 20Gi memory, 30 cores</td>"
        );
        assert!(r.contains("href=\"/workloads/ml/deployment/train\""));
    }

    #[test]
    fn the_gpu_tab_offers_no_form_for_hamis_limits() {
        let w = WorkloadRow {
            namespace: "ml".into(),
            kind: Kind::Deployment,
            name: "legacy".into(),
            replicas: Some(1),
            pods: 1,
            rollout: Rollout::remove_first(1, "Recreate"),
            slice: Some(Slice {
                source: SliceSource::Hami("main: nvidia.com/gpu=1".into()),
                request: None,
                charge: None,
            }),
            pod: crate::budgets::tests::pod(),
        };
        for allow_edit in [true, false] {
            let mut c = chrome(vec![]);
            c.allow_edit = allow_edit;
            let html = workload_page(&c, &w, Ok(&[]));
            assert!(!html.contains("<form"), "{allow_edit}: {html}");
            assert!(!html.contains("id=\"allocate\"") && !html.contains("id=\"release\""));
            assert!(
                !html.contains("class=\"read-only\""),
                "{allow_edit}: {html}"
            );
            assert!(html.contains("<p id=\"slice-form\">HAMi&#39;s limits: the console shows them and does not edit them"), "{html}");
        }
    }

    #[test]
    fn the_edit_form_pre_fills_the_exact_memory_of_the_slice() {
        let mut c = chrome(vec![]);
        c.allow_edit = true;
        // 20000Mi shows as 19.5Gi in tables; 10000Mi as 9.8Gi, not a whole number of bytes.
        for (asked, mib) in [
            ("20000Mi", 20000u64),
            ("10000Mi", 10000),
            ("20Gi", 20 << 10),
        ] {
            let w = WorkloadRow {
                namespace: "ml".into(),
                kind: Kind::Deployment,
                name: "train".into(),
                replicas: Some(1),
                pods: 1,
                rollout: Rollout::remove_first(1, "Recreate"),
                slice: Some(claim_slice(Request::parse(asked, None, 1).unwrap())),
                pod: crate::budgets::tests::pod(),
            };
            let html = workload_page(&c, &w, Ok(&[]));
            let (_, rest) = html.split_once("name=\"memory\" value=\"").unwrap();
            let (value, _) = rest.split_once('"').unwrap();
            let parsed = gpuslice_config::quantity::parse_kube_quantity(value);
            assert_eq!(
                parsed.ok(),
                Some(mib << 20),
                "{asked} pre-filled as {value}"
            );
            let sent = Request::parse(value, None, 1).unwrap();
            assert_eq!(sent.memory, mib << 20, "{asked} sent back as {value}");
        }
    }

    #[test]
    fn results_show_the_summary_the_diff_or_the_refusal() {
        let c = chrome(vec![]);
        let ok = result_page(&c, "deployment/x", "/", Ok("deployment/x released\n"));
        assert!(ok.contains("<div id=\"result\" class=\"ok\">deployment/x released</div>"));
        let dry = result_page(
            &c,
            "deployment/x",
            "/",
            Ok("--- a\n+++ b\n+  <x>\n(dry run: nothing changed)\n"),
        );
        assert!(dry.contains(
            "<pre id=\"diff\">--- a\n+++ b\n+  &lt;x&gt;\n(dry run: nothing changed)\n</pre>"
        ));
        let err = result_page(
            &c,
            "deployment/x",
            "/",
            Err("--gpus 0: accepted 1 to 16 GPUs per pod"),
        );
        assert!(err.contains(
            "<div id=\"result\" class=\"error\">--gpus 0: accepted 1 to 16 GPUs per pod</div>"
        ));
    }

    #[test]
    fn the_budgets_page_draws_used_against_hard_per_quota_and_queue() {
        use crate::budgets::tests::budget;
        use crate::budgets::QueueBudget;
        let mut b = Budgets {
            namespaces: vec![
                budget("team-a", "10Gi", "6Gi", "4", "1"),
                budget("team-b", "4Gi", "5Gi", "2", "0"),
            ],
            queues: None,
            queues_unavailable: None,
            warnings: vec!["ResourceQuota x/y: <bad>".into()],
        };
        let html = budgets_page(&chrome(vec![]), Some(&b), None);
        assert!(
            html.contains("<a href=\"/budgets\">Budgets</a>"),
            "the nav links it"
        );
        let a = row(&html, "data-budget", "team-a/gpu");
        assert_eq!(
            td(a, "memory-hard"),
            format!(
                "<td data-col=\"memory-hard\" data-value=\"{}\">10Gi</td>",
                10 * GIB
            )
        );
        assert_eq!(
            td(a, "memory-used"),
            format!("<td data-col=\"memory-used\" data-value=\"{}\" class=\"use\"><span class=\"v\">6Gi</span><span class=\"budget-bar\" data-share=\"60.0\" title=\"60% of 10Gi\"><i style=\"width:60.0%\"></i></span></td>", 6 * GIB)
        );
        assert_eq!(
            td(a, "cores-hard"),
            "<td data-col=\"cores-hard\" class=\"none\">-</td>",
            "no hard value: no limit, not an unknown figure"
        );
        assert!(
            td(a, "gpus-used").contains("data-value=\"1\"")
                && td(a, "gpus-used").contains("data-share=\"25.0\"")
        );
        assert_eq!(td(a, "names"), "<td data-col=\"names\">gpuslice.io</td>");
        // Over its hard value (lowered after admissions): the bar full and marked.
        let over = td(row(&html, "data-budget", "team-b/gpu"), "memory-used");
        assert!(
            over.contains("class=\"budget-bar over\" data-share=\"125.0\"")
                && over.contains("width:100.0%"),
            "{over}"
        );
        assert!(
            html.contains("<p id=\"queues-none\">Kueue is not installed"),
            "{html}"
        );
        assert!(!html.contains("<table id=\"queues\""));
        assert!(html
            .contains("<ul id=\"budget-warnings\"><li>ResourceQuota x/y: &lt;bad&gt;</li></ul>"));
        b.queues = Some(vec![QueueBudget {
            name: "team-a".into(),
            cohort: Some("pool".into()),
            nominal: 8 * GIB,
            borrowing_limit: Some(8 * GIB),
            used: 12 * GIB,
            borrowed: 4 * GIB,
            reserved: 12 * GIB,
        }]);
        let html = budgets_page(&chrome(vec![]), Some(&b), Some("team-a"));
        let q = row(&html, "data-queue", "team-a");
        assert!(
            td(q, "memory-used").contains("class=\"budget-bar over\" data-share=\"150.0\""),
            "{q}"
        );
        assert_eq!(td(q, "cohort"), "<td data-col=\"cohort\">pool</td>");
        assert_eq!(
            td(q, "borrowing-limit"),
            format!(
                "<td data-col=\"borrowing-limit\" data-value=\"{}\">8Gi</td>",
                8 * GIB
            )
        );
        assert!(!html.contains("queues-none"));
        assert!(html.contains("<p id=\"scope\">namespace team-a</p>"));
        // The API server unreadable: no rows, no claim that nothing is budgeted.
        let html = budgets_page(&chrome(vec![]), None, None);
        assert!(
            !html.contains("<tr data-budget")
                && !html.contains("budgets-none")
                && !html.contains("queues-none")
        );
    }

    #[test]
    fn the_gpu_tab_says_what_the_budget_leaves_before_the_form_is_sent() {
        use crate::budgets::tests::budget;
        let mut w = WorkloadRow {
            namespace: "team-a".into(),
            kind: Kind::Deployment,
            name: "train".into(),
            replicas: Some(2),
            pods: 2,
            rollout: Rollout::remove_first(2, "Recreate"),
            slice: None,
            pod: crate::budgets::tests::pod(),
        };
        let mut c = chrome(vec![]);
        c.allow_edit = true;
        let b = [budget("team-a", "10Gi", "6Gi", "5", "1")];
        let html = workload_page(&c, &w, Ok(&b));
        assert!(html.contains(&format!("<li data-budget=\"team-a/gpu\" data-resource=\"limits.gpuslice.io/memory\" data-left=\"{}\">quota gpu: limits.gpuslice.io/memory 6Gi of 10Gi used; left for it: 4Gi (2Gi per pod)</li>", 4 * GIB)), "{html}");
        assert!(html.contains("data-resource=\"limits.gpuslice.io/gpus\" data-left=\"4\">quota gpu: limits.gpuslice.io/gpus 1 of 5 used; left for it: 4 (2 per pod)</li>"), "{html}");
        // The browser refuses more GPUs per pod than the GPU budget leaves, before sending.
        assert!(
            html.contains("name=\"gpus\" value=\"1\" min=\"1\" max=\"2\""),
            "{html}"
        );
        // The workload's own slices are counted as freed by an edit.
        w.slice = Some(claim_slice(Request::parse("1Gi", None, 1).unwrap()));
        let html = workload_page(&c, &w, Ok(&b));
        assert!(
            html.contains(&format!("data-left=\"{}\"", 6 * GIB))
                && html.contains("(its current slices freed as the rollout removes them), per pod at the worst point of its rollout (Recreate)")
                && html.contains("left for it: 6Gi (3Gi per pod)"),
            "{html}"
        );
        // 2 GPUs held of the 1 used: all 5 left, 2 per pod.
        assert!(html.contains("max=\"2\""), "{html}");
        // A rolling update (maxSurge 1, maxUnavailable 0) keeps an old pod of 1Gi beside two
        // new ones at its worst point: (6Gi - 1Gi) / 2 per new pod.
        w.rollout = Rollout {
            surge: 1,
            unavailable: 0,
            strategy: "RollingUpdate, maxSurge 1, maxUnavailable 0".into(),
            ..Rollout::remove_first(2, "")
        };
        let html = workload_page(&c, &w, Ok(&b));
        assert!(
            html.contains("per pod at the worst point of its rollout (RollingUpdate, maxSurge 1, maxUnavailable 0)")
                && html.contains("left for it: 6Gi (2.5Gi per pod)"),
            "{html}"
        );
        let html = workload_page(&c, &w, Ok(&[]));
        assert!(
            html.contains("<p id=\"budget\">Namespace team-a has no budget"),
            "{html}"
        );
        // A quota whose scopes hold for none of its pods leaves it no room to show, and the
        // browser no GPU limit but the usual one.
        let high = [crate::budgets::tests::scoped_to_class(
            "team-a", "high", "10Gi", "0",
        )];
        let html = workload_page(&c, &w, Ok(&high));
        assert!(
            html.contains("<p id=\"budget\">No budget of namespace team-a counts this workload's pods: the scopes of its ResourceQuotas (gpu-high) hold for none of them.</p>"),
            "{html}"
        );
        assert!(html.contains("max=\"16\""), "{html}");
        w.pod = crate::budgets::tests::pod_of_class("high");
        let html = workload_page(&c, &w, Ok(&high));
        assert!(html.contains("data-budget=\"team-a/gpu-high\""), "{html}");
        assert!(html.contains("max=\"16\""), "{html}");
        let html = workload_page(&c, &w, Err("cannot list resourcequotas: forbidden"));
        assert!(html.contains("<p id=\"budget\" class=\"unknown\">The budget of namespace team-a cannot be read (cannot list resourcequotas: forbidden)"), "{html}");
    }
}
