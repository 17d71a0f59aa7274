//! The web console's HTML, rendered on the server from the same model kubectl-gpuslice
//! prints: every text HTML-escaped, every figure cell with its exact integer in
//! `data-value` (absent, and the cell `—`, when the figure is not known), one banner per
//! missing source. Pure functions: what a page shows is tested without a server.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::edit::{Kind, Request};
use crate::model::{ContainerSlice, Figure, GpuView, Model, NodeView};
use crate::render::bytes;

use super::charts;
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
<header><nav><a href=\"/\">Nodes</a> <a href=\"/pods\">Pods</a> <a href=\"/workloads\">Workloads</a></nav>\
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

fn figure_cells(memory: &Figure, cores: &Figure) -> String {
    [
        bytes_cell("memory-capacity", Some(memory.capacity)),
        bytes_cell("memory-allocated", Some(memory.allocated)),
        bytes_cell("memory-free", Some(memory.free)),
        bytes_cell("memory-used", memory.used),
        num_cell("cores-capacity", Some(cores.capacity)),
        num_cell("cores-allocated", Some(cores.allocated)),
        num_cell("cores-used", cores.used),
    ]
    .concat()
}

/// Memory used over time per node (and [`TOTAL_ROW`]), from Prometheus.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub start: f64,
    pub end: f64,
    /// Node name (or GPU UUID) → points.
    pub series: BTreeMap<String, Vec<(f64, f64)>>,
}

/// `/`: the cluster row, then one row per node (`available`: only nodes with a GPU that has
/// free memory). `model` is `None` when the API server could not be read; `history` when
/// Prometheus could not.
pub fn nodes_page(
    chrome: &Chrome,
    model: Option<&Model>,
    available: bool,
    history: Option<&History>,
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
    body.push_str("<table id=\"nodes\"><thead><tr><th>Node</th><th>GPUs</th><th>Memory</th><th>Allocated</th><th>Free</th><th>Used</th><th>Cores</th><th>Cores allocated</th><th>Cores used</th></tr></thead><tbody>\n");
    if let Some(m) = model {
        let rows = std::iter::once((TOTAL_ROW, &m.total)).chain(
            m.nodes
                .iter()
                .filter(|n| !available || n.largest_free_memory > 0)
                .map(|n| (n.name.as_str(), n)),
        );
        for (name, n) in rows {
            body.push_str(&node_row(name, n, history));
        }
    }
    body.push_str("</tbody></table>\n");
    layout("Nodes", chrome, &body)
}

fn node_row(name: &str, n: &NodeView, history: Option<&History>) -> String {
    let label = if name == TOTAL_ROW {
        esc("cluster (total)")
    } else {
        format!("<a href=\"/nodes/{}\">{}</a>", esc(&seg(name)), esc(name))
    };
    let spark = history
        .map(|h| {
            let points = h.series.get(name).map(Vec::as_slice).unwrap_or(&[]);
            charts::sparkline(points, h.start, h.end, n.memory.capacity)
        })
        .unwrap_or_default();
    format!(
        "<tr data-node=\"{}\"><td data-col=\"name\">{label}</td><td data-col=\"gpus\" data-value=\"{}\">{} {spark}</td>{}</tr>\n",
        esc(name),
        n.gpus,
        n.gpus,
        figure_cells(&n.memory, &n.cores)
    )
}

/// `allocated / capacity` in whole percent (`None` without capacity).
fn share(allocated: u64, capacity: u64) -> Option<u64> {
    (capacity > 0).then(|| ((allocated as f64 / capacity as f64) * 100.0).round() as u64)
}

/// `/nodes/NAME`: one row per GPU of the node and a chart of each GPU's memory used.
pub fn node_page(chrome: &Chrome, model: &Model, node: &str, history: Option<&History>) -> String {
    let gpus: Vec<&GpuView> = model.gpus.iter().filter(|g| g.node == node).collect();
    let mut body = String::new();
    if let Some(n) = model.nodes.iter().find(|n| n.name == node) {
        let _ = writeln!(
            body,
            "<p id=\"node-summary\">{} GPU(s), {} memory of which {} allocated ({}%), {} free</p>",
            n.gpus,
            esc(&bytes(n.memory.capacity)),
            esc(&bytes(n.memory.allocated)),
            share(n.memory.allocated, n.memory.capacity).unwrap_or(0),
            esc(&bytes(n.memory.free)),
        );
    }
    body.push_str("<table id=\"gpus\"><thead><tr><th>Index</th><th>Model</th><th>Memory</th><th>Allocated</th><th>Share</th><th>Used</th><th>Cores allocated</th><th>Cores used</th><th>Claims</th></tr></thead><tbody>\n");
    for g in &gpus {
        let claims: Vec<String> = g
            .claims
            .iter()
            .map(|c| {
                let idle = if c.idle == Some(true) { " (idle)" } else { "" };
                format!("{}/{}{idle}", c.namespace, c.name)
            })
            .collect();
        let _ = writeln!(
            body,
            "<tr data-gpu=\"{}\">{}{}{}{}{}{}{}{}{}</tr>",
            esc(&g.uuid),
            num_cell("index", g.index.map(u64::from)),
            text_cell("model", &g.model),
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
    body.push_str("</tbody></table>\n<section id=\"charts\"><h2>Memory used</h2>\n");
    for g in &gpus {
        let (points, start, end): (&[(f64, f64)], f64, f64) = match history {
            Some(h) => (
                h.series.get(&g.uuid).map(Vec::as_slice).unwrap_or(&[]),
                h.start,
                h.end,
            ),
            None => (&[], 0.0, 3600.0),
        };
        let _ = writeln!(
            body,
            "<figure><figcaption>{} {}</figcaption>{}</figure>",
            esc(&g.device),
            esc(&g.uuid),
            charts::chart(&g.uuid, points, start, end, g.memory.capacity)
        );
    }
    body.push_str("</section>\n");
    layout(&format!("Node {node}"), chrome, &body)
}

/// CPU (millicores) and memory (bytes) of containers from cAdvisor's series, keyed by
/// (namespace, pod, container).
pub type ContainerUse = BTreeMap<(String, String, String), (Option<u64>, Option<u64>)>;

/// The `<p id="scope">` line of a page listed by namespace.
fn scope_line(namespace: Option<&str>) -> String {
    let scope = match namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".to_string(),
    };
    format!("<p id=\"scope\">{}</p>\n", esc(&scope))
}

/// `/pods`: one row per container holding a slice.
pub fn pods_page(
    chrome: &Chrome,
    model: Option<&Model>,
    namespace: Option<&str>,
    cadvisor: Option<&ContainerUse>,
) -> String {
    let mut body = scope_line(namespace);
    body.push_str("<table id=\"pods\"><thead><tr><th>Pod</th><th>Container</th><th>GPU</th><th>Memory limit</th><th>Used (slice)</th><th>Used (driver)</th><th>Cores share</th><th>Cores used</th><th>CPU</th><th>Memory</th></tr></thead><tbody>\n");
    for p in model.map(|m| m.pods.as_slice()).unwrap_or(&[]) {
        body.push_str(&pod_row(p, cadvisor));
    }
    body.push_str("</tbody></table>\n");
    layout("Pods", chrome, &body)
}

fn pod_row(p: &ContainerSlice, cadvisor: Option<&ContainerUse>) -> String {
    let key = (p.namespace.clone(), p.pod.clone(), p.container.clone());
    let (cpu, memory) = cadvisor
        .and_then(|c| c.get(&key).copied())
        .unwrap_or((None, None));
    let gpu = format!("{}/{} {}", p.node, p.device, p.uuid);
    format!(
        "<tr data-pod=\"{}/{}\" data-container=\"{}\"><td data-col=\"pod\">{}/{}</td><td data-col=\"container\">{}</td>{}{}{}{}{}{}{}{}</tr>\n",
        esc(&p.namespace),
        esc(&p.pod),
        esc(&p.container),
        esc(&p.namespace),
        esc(&p.pod),
        esc(&p.container),
        text_cell("gpu", &gpu),
        bytes_cell("memory-limit", Some(p.memory_limit)),
        bytes_cell("memory-used", p.memory_used),
        bytes_cell("memory-used-driver", p.memory_used_driver),
        num_cell("cores-share", Some(p.cores_share)),
        num_cell("cores-used", p.cores_used.map(|c| c.max(0.0).round() as u64)),
        cell("cpu", cpu, |m| format!("{m}m")),
        bytes_cell("memory", memory),
    )
}

/// A Deployment, StatefulSet or DaemonSet and its slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadRow {
    pub namespace: String,
    pub kind: Kind,
    pub name: String,
    /// Desired pods (a DaemonSet: the nodes it is scheduled on, when known).
    pub replicas: Option<u64>,
    /// The slice each pod gets; `None`: none.
    pub slice: Option<Slice>,
}

/// A workload's slice: its ResourceClaimTemplate and the request read back from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub template: String,
    /// `None` when the template is missing or not the console's shape.
    pub request: Option<Request>,
}

impl Slice {
    /// The slice as kubectl-gpuslice describes a request (`1 GPU × 20Gi memory, 30 cores`).
    pub fn describe(&self) -> String {
        match &self.request {
            Some(r) => r.describe(),
            None => format!("resourceclaimtemplate/{} (unreadable)", self.template),
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
pub fn workload_page(chrome: &Chrome, w: &WorkloadRow) -> String {
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
    if chrome.allow_edit {
        let request = w.slice.as_ref().and_then(|s| s.request);
        let gpus = request.map_or(1, |r| r.gpus);
        let memory = request.map_or(String::new(), |r| bytes(r.memory));
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
<label>GPUs per pod <input type=\"number\" name=\"gpus\" value=\"{gpus}\" min=\"1\" max=\"128\" required></label> \
<label>Memory per GPU <input type=\"text\" name=\"memory\" value=\"{memory}\" placeholder=\"8Gi\" required></label> \
<label>Cores per GPU, percent (optional) <input type=\"text\" name=\"cores\" value=\"{cores}\" placeholder=\"30\"></label> \
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
    } else {
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
        let needle = format!("<tr {attr}=\"{value}\"");
        let start = html
            .find(&needle)
            .unwrap_or_else(|| panic!("no {needle} in {html}"));
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
        let html = nodes_page(&chrome(vec![]), Some(&m), false, None);
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
            "<td data-col=\"memory-used\" class=\"unknown\">—</td>",
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
        assert_eq!(
            td(a, "memory-used"),
            format!(
                "<td data-col=\"memory-used\" data-value=\"{}\">12Gi</td>",
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
        let html = nodes_page(&chrome(vec![]), Some(&m), true, None);
        assert!(html.contains("data-node=\"node-a\"") && !html.contains("data-node=\"node-b\""));
        assert!(html.contains("<a id=\"filter-available\" href=\"/\">"));
        assert!(html.contains("<p id=\"mode\">read-only"));
        assert!(html.contains(
            "<p id=\"rights\">acts with the rights of kubeconfig context `kind` (user `admin`)</p>"
        ));
    }

    #[test]
    fn sparklines_come_from_the_history_of_each_row() {
        let m = model(Ok(usage()));
        let mut h = History {
            start: 0.0,
            end: 3600.0,
            ..History::default()
        };
        h.series
            .insert("node-a".into(), vec![(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)]);
        let html = nodes_page(&chrome(vec![]), Some(&m), false, Some(&h));
        assert!(row(&html, "data-node", "node-a")
            .contains("<svg class=\"sparkline\" data-points=\"3\""));
        assert!(row(&html, "data-node", "node-b")
            .contains("<svg class=\"sparkline\" data-points=\"0\""));
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
        let html = nodes_page(&chrome(banners), Some(&m), false, None);
        assert!(html.contains("<div class=\"source-missing\" data-source=\"prometheus\">Prometheus: not configured (start with --prometheus URL)</div>"));
        assert!(html.contains(
            "<div class=\"source-missing\" data-source=\"plugin:n2\">node n2: no gpuslice plugin"
        ));
        for n in ["(total)", "node-a", "node-b"] {
            let r = row(&html, "data-node", n);
            assert_eq!(
                td(r, "memory-used"),
                "<td data-col=\"memory-used\" class=\"unknown\">—</td>"
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
        let html = nodes_page(&chrome(api), None, false, None);
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
        let html = nodes_page(&c, Some(&m), false, None);
        assert!(
            !html.contains("<script>") && !html.contains("<b>"),
            "{html}"
        );
        assert!(html.contains("<tr data-node=\"&lt;script&gt;alert(1)&lt;/script&gt;\""));
        assert!(html.contains("href=\"/nodes/%3Cscript%3Ealert%281%29%3C%2Fscript%3E\""));
        let html = node_page(&c, &m, evil, None);
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
        let html = node_page(&chrome(vec![]), &m, "node-a", None);
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
            "<td data-col=\"claims\">ml/pair (idle), ml/train</td>"
        );
        assert_eq!(td(g0, "model"), "<td data-col=\"model\">NVIDIA H200</td>");
        assert_eq!(html.matches("<svg class=\"chart\"").count(), 2);
        assert!(html.contains("<svg class=\"chart\" data-gpu=\"GPU-NVIDIA-H200-1\""));
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
        let mut cad = ContainerUse::new();
        cad.insert(
            ("ml".into(), "train-0".into(), "main".into()),
            (Some(250), Some(3 * GIB)),
        );
        let html = pods_page(&chrome(vec![]), Some(&m), Some("ml"), Some(&cad));
        let r = row(&html, "data-pod", "ml/train-0");
        assert!(r.contains("data-container=\"main\""));
        assert_eq!(
            td(r, "memory-limit"),
            format!(
                "<td data-col=\"memory-limit\" data-value=\"{}\">20Gi</td>",
                20 * GIB
            )
        );
        assert_eq!(
            td(r, "memory-used"),
            format!(
                "<td data-col=\"memory-used\" data-value=\"{}\">8Gi</td>",
                8 * GIB
            )
        );
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
        assert_eq!(
            td(r, "cpu"),
            "<td data-col=\"cpu\" data-value=\"250\">250m</td>"
        );
        assert_eq!(
            td(r, "memory"),
            format!(
                "<td data-col=\"memory\" data-value=\"{}\">3Gi</td>",
                3 * GIB
            )
        );
        src.usage = Err("x".into());
        let m = build(&src, Some(&ml));
        let html = pods_page(&chrome(vec![]), Some(&m), Some("ml"), None);
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
            slice: None,
        };
        let mut c = chrome(vec![]);
        let html = workload_page(&c, &w);
        assert!(html.contains("<p id=\"current-slice\">none</p>"));
        assert!(!html.contains("<form"));
        assert!(html.contains("read-only: start gpuslice console with --allow-edit to allocate"));
        c.allow_edit = true;
        let html = workload_page(&c, &w);
        assert!(html.contains("<form id=\"allocate\" method=\"post\" action=\"/workloads/ml/deployment/train/allocate\">"));
        assert!(html.contains("<button id=\"allocate-submit\" type=\"submit\">Allocate</button>"));
        assert!(!html.contains("id=\"release\""));
        assert!(html.contains("<p id=\"mode\">edit allowed"));
        w.slice = Some(Slice {
            template: "t".into(),
            request: Some(Request::parse("20Gi", Some("30"), 1).unwrap()),
        });
        let html = workload_page(&c, &w);
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
            Err("--gpus 0: accepted 1 to 128 GPUs per pod"),
        );
        assert!(err.contains(
            "<div id=\"result\" class=\"error\">--gpus 0: accepted 1 to 128 GPUs per pod</div>"
        ));
    }
}
