//! What `gpuslice status` and `gpuslice gc` print: the aligned table, the JSON
//! (docs/observability.md; with the measured figures next to the booked ones), and the reports of reaping and
//! rebuilding. Pure functions of registry data and of the measurements `measured` takes.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use gpuslice_config::{format_bytes_rounded, PlacementConfig};

use gpuslice_registry::{
    gpu_loads, missing_gpus, printable, violations, GcReport, Inventory, Owner, Reaped,
    RebuildReport, RegistryFile, Reservation, UnreadableRecord,
};

use super::table::{Align, Table};

/// What is wrong with the registry's contents (more booked than a GPU holds, an id listed
/// twice, …), one line each; empty for a sound registry. `status` shows them.
pub fn problems(file: &RegistryFile, placement: &PlacementConfig) -> Vec<String> {
    violations(file, placement)
}

fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        0
    } else {
        ((u128::from(part) * 100 + u128::from(whole) / 2) / u128::from(whole)) as u64
    }
}

/// The owner in a table cell: `ns/pod/container`, a container id shortened to 12
/// characters, `claim ns/name`, or `-` while unknown.
fn owner_cell(owner: &Owner) -> String {
    match owner {
        Owner::Container {
            kubernetes: None,
            container_id: Some(id),
            ..
        } => id.chars().take(12).collect(),
        other => other.to_string(),
    }
}

/// What was measured on one GPU (NVML); `None` where it could not be measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuMeasured {
    /// Bytes in use.
    pub memory_used: Option<u64>,
    /// Percent of the last sample period a kernel ran.
    pub utilization: Option<u32>,
}

/// Measured figures shown beside the booked ones; empty when nothing was measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// By GPU UUID.
    pub gpus: HashMap<String, GpuMeasured>,
    /// By reservation id, then GPU UUID: bytes its processes hold (from the usage file).
    pub memory_used: HashMap<String, BTreeMap<String, u64>>,
    /// Why the GPUs could not be measured (NVML unavailable), one line.
    pub gpu_error: Option<String>,
}

impl Measured {
    fn reservation_used(&self, id: &str, uuid: &str) -> Option<u64> {
        self.memory_used.get(id)?.get(uuid).copied()
    }
}

/// A measured figure in a table cell, `-` when there is none.
fn bytes_or_dash(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".to_string(), format_bytes_rounded)
}

fn gpu_label(uuid: &str, inventory: &Inventory) -> String {
    match inventory.gpu(uuid) {
        Some(g) => g.index.to_string(),
        None => format!("{uuid} (missing)"),
    }
}

/// Memory in use per booking (`0: 1.5Gi, 1: -`); `-` when nothing was measured.
fn used_cell(r: &Reservation, inventory: &Inventory, measured: &Measured) -> String {
    if !measured.memory_used.contains_key(&r.id) {
        return "-".to_string();
    }
    r.gpus
        .iter()
        .map(|b| {
            format!(
                "{}: {}",
                gpu_label(&b.uuid, inventory),
                bytes_or_dash(measured.reservation_used(&r.id, &b.uuid))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn bookings_cell(r: &Reservation, inventory: &Inventory) -> String {
    r.gpus
        .iter()
        .map(|b| {
            let gpu = gpu_label(&b.uuid, inventory);
            if r.whole_gpu {
                format!("{gpu}: whole GPU")
            } else if b.cores > 0 {
                format!(
                    "{gpu}: {} {}% cores",
                    format_bytes_rounded(b.memory),
                    b.cores
                )
            } else {
                format!("{gpu}: {}", format_bytes_rounded(b.memory))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The status table without measurements (measured columns show `-`), checked against the
/// default placement rules.
pub fn render_table(file: &RegistryFile) -> String {
    render_table_measured(
        file,
        &Measured::default(),
        &gpuslice_config::Config::default().placement,
    )
}

/// The status table: per GPU (index, model, memory total / allocated / free, memory
/// used as measured, cores allocated, utilisation as measured, share of the GPU's memory
/// booked, slice count), a `warning:` line for each [`problems`] under `placement`, then the
/// reservations with the memory each uses per GPU. Control characters in names are escaped.
pub fn render_table_measured(
    file: &RegistryFile,
    measured: &Measured,
    placement: &PlacementConfig,
) -> String {
    let loads = gpu_loads(&file.reservations);
    let mut gpus = Table::new(&[
        ("GPU", Align::Right),
        ("MODEL", Align::Left),
        ("MEMORY", Align::Right),
        ("ALLOCATED", Align::Right),
        ("FREE", Align::Right),
        ("USED", Align::Right),
        ("CORES", Align::Right),
        ("UTIL", Align::Right),
        ("BOOKED", Align::Right),
        ("SLICES", Align::Right),
    ]);
    for g in &file.inventory.gpus {
        let l = loads.get(g.uuid.as_str()).copied().unwrap_or_default();
        let m = measured.gpus.get(&g.uuid).copied().unwrap_or_default();
        gpus.row(vec![
            g.index.to_string(),
            g.model.clone(),
            format_bytes_rounded(g.memory_total),
            format_bytes_rounded(l.memory),
            format_bytes_rounded(g.memory_total.saturating_sub(l.memory)),
            bytes_or_dash(m.memory_used),
            format!("{}%", l.cores),
            m.utilization
                .map_or_else(|| "-".to_string(), |u| format!("{u}%")),
            format!("{}%", percent(l.memory, g.memory_total)),
            if l.whole {
                "whole".into()
            } else {
                l.slices.to_string()
            },
        ]);
    }
    let mut out = if file.inventory.gpus.is_empty() {
        "no GPU inventory: run `gpuslice cdi generate`\n".to_string()
    } else {
        gpus.render()
    };
    if let Some(e) = &measured.gpu_error {
        out.push_str(&format!("not measured: {}\n", printable(e)));
    }
    let mut missing: Vec<&str> = missing_gpus(&file.inventory, &file.reservations)
        .into_iter()
        .map(|(_, u)| u)
        .collect();
    missing.sort_unstable();
    missing.dedup();
    for uuid in missing {
        out.push_str(&format!(
            "GPU {} is booked but no longer in the inventory\n",
            printable(uuid)
        ));
    }
    for p in problems(file, placement) {
        out.push_str(&format!("warning: {}\n", printable(&p)));
    }
    out.push('\n');
    if file.reservations.is_empty() {
        out.push_str("no reservations\n");
        return out;
    }
    let mut rs = Table::new(&[
        ("RESERVATION", Align::Left),
        ("STATE", Align::Left),
        ("OWNER", Align::Left),
        ("GPUS", Align::Left),
        ("USED", Align::Left),
    ]);
    for r in &file.reservations {
        rs.row(vec![
            r.id.clone(),
            r.state.to_string(),
            owner_cell(&r.owner),
            bookings_cell(r, &file.inventory),
            used_cell(r, &file.inventory, measured),
        ]);
    }
    out.push_str(&rs.render());
    out
}

/// `status --json` without measurements (the measured fields are `null`), checked against
/// the default placement rules.
pub fn status_json(file: &RegistryFile) -> Value {
    status_json_measured(
        file,
        &Measured::default(),
        &gpuslice_config::Config::default().placement,
    )
}

/// `status --json` (docs/observability.md): `gpus` (index, uuid, model, memory_total,
/// memory_allocated, cores_allocated; plus memory_free, slices, whole_gpu, and measured
/// memory_used and utilization in percent) and `reservations` (id, state, container_id,
/// gpus[uuid, memory, cores]; plus owner, whole_gpu, created_ms, deadline_ms, bound_ms, and
/// each GPU's index and measured memory_used). Bytes are integers; what was not measured is
/// `null`, and `measure_error` says why the GPUs were not; `problems` lists the
/// [`problems`] under `placement`. Strings keep their characters (JSON escapes control ones).
pub fn status_json_measured(
    file: &RegistryFile,
    measured: &Measured,
    placement: &PlacementConfig,
) -> Value {
    let loads = gpu_loads(&file.reservations);
    let gpus: Vec<Value> = file
        .inventory
        .gpus
        .iter()
        .map(|g| {
            let l = loads.get(g.uuid.as_str()).copied().unwrap_or_default();
            let m = measured.gpus.get(&g.uuid).copied().unwrap_or_default();
            json!({
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_total": g.memory_total,
                "memory_allocated": l.memory,
                "cores_allocated": l.cores,
                "memory_free": g.memory_total.saturating_sub(l.memory),
                "slices": l.slices,
                "whole_gpu": l.whole,
                "memory_used": m.memory_used,
                "utilization": m.utilization,
            })
        })
        .collect();
    let reservations: Vec<Value> = file
        .reservations
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "state": r.state.as_str(),
                "container_id": r.owner.container_id(),
                "gpus": r.gpus.iter().map(|b| json!({
                    "uuid": b.uuid,
                    "memory": b.memory,
                    "cores": b.cores,
                    "index": file.inventory.gpu(&b.uuid).map(|g| g.index),
                    "memory_used": measured.reservation_used(&r.id, &b.uuid),
                })).collect::<Vec<_>>(),
                "owner": r.owner,
                "whole_gpu": r.whole_gpu,
                "created_ms": r.created_ms,
                "deadline_ms": r.deadline_ms,
                "bound_ms": r.bound_ms,
            })
        })
        .collect();
    json!({
        "gpus": gpus,
        "reservations": reservations,
        "counters": file.counters,
        "measure_error": measured.gpu_error,
        "problems": problems(file, placement),
    })
}

/// What `gpuslice gc` prints: one line per reaped reservation with its reason.
pub fn render_reaped(reaped: &[Reaped]) -> String {
    if reaped.is_empty() {
        return "nothing to reap\n".to_string();
    }
    let mut out = format!("reaped {}:\n", reaped.len());
    for r in reaped {
        out.push_str(&format!("  {}\n", printable(&r.to_string())));
    }
    out
}

/// What `gpuslice gc` prints: what went, then the slice directories left in place.
pub fn render_gc(report: &GcReport) -> String {
    render_reaped(&report.reaped) + &render_unreadable(&report.unreadable)
}

/// One line per slice directory whose record could not be read, saying what became of it.
fn render_unreadable(unreadable: &[UnreadableRecord]) -> String {
    unreadable
        .iter()
        .map(|u| format!("unreadable record: {}\n", printable(&u.to_string())))
        .collect()
}

/// What `gpuslice gc --rebuild` prints.
pub fn render_rebuild(report: &RebuildReport) -> String {
    let mut out = String::new();
    if let Some(p) = &report.moved_aside {
        out.push_str(&format!("unusable registry kept as {}\n", p.display()));
    }
    out.push_str(&format!(
        "restored {} reservations\n",
        report.restored.len()
    ));
    for r in &report.restored {
        out.push_str(&format!(
            "  {} ({}, {})\n",
            r.id,
            r.state,
            printable(&r.owner.to_string())
        ));
    }
    if !report.dropped.is_empty() {
        out.push_str(&format!("dropped {}:\n", report.dropped.len()));
        for d in &report.dropped {
            out.push_str(&format!("  {}\n", printable(&d.to_string())));
        }
    }
    out.push_str(&render_unreadable(&report.unreadable));
    for (id, uuid) in &report.missing {
        out.push_str(&format!(
            "reservation {id} books GPU {}, which the inventory lacks\n",
            printable(uuid)
        ));
    }
    for v in &report.violations {
        out.push_str(&format!("over capacity: {v}\n"));
    }
    out
}
