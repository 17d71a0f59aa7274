//! Turns one [`Scrape`] and the error counts into metric families with prometheus-client,
//! in the format the scraper asked for: OpenMetrics when its `Accept` header names it (as
//! Prometheus's does), else the Prometheus text format 0.0.4 (curl, `promtool check
//! metrics`). A fresh registry per scrape: series of things that went away simply vanish.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::errors::ErrorLog;
use crate::model::{Scrape, SliceSample};

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition formats served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` lists `application/openmetrics-text`, else text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let wants_om = accept.is_some_and(|a| {
            a.split(',').any(|part| {
                let mut fields = part.split(';');
                let media = fields.next().unwrap_or("").trim();
                let refused = fields.any(|f| {
                    f.trim()
                        .strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f64>().ok())
                        == Some(0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if wants_om {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    index: String,
    uuid: String,
    model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SliceLabels {
    node: String,
    reservation: String,
    container_id: String,
    namespace: String,
    pod: String,
    container: String,
    uuid: String,
    index: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    node: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    node: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    node: String,
    source: String,
}

type Bytes<L> = Family<L, Gauge>;
type Ratio<L> = Family<L, Gauge<f64, AtomicU64>>;
type Total<L> = Family<L, Counter>;

fn bytes(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn ratio() -> Unit {
    Unit::Other("ratio".into())
}

fn slice_labels(node: &str, s: &SliceSample) -> SliceLabels {
    SliceLabels {
        node: node.to_string(),
        reservation: s.reservation.clone(),
        container_id: s.owner.container_id.clone(),
        namespace: s.owner.namespace.clone(),
        pod: s.owner.pod.clone(),
        container: s.owner.container.clone(),
        uuid: s.uuid.clone(),
        index: s.index.to_string(),
    }
}

fn gpu_metrics(reg: &mut Registry, scrape: &Scrape) {
    let total = Bytes::<GpuLabels>::default();
    let booked = Bytes::<GpuLabels>::default();
    let cores = Ratio::<GpuLabels>::default();
    let slices = Family::<GpuLabels, Gauge>::default();
    let used = Bytes::<GpuLabels>::default();
    let util = Ratio::<GpuLabels>::default();
    let healthy = Family::<GpuLabels, Gauge>::default();
    let xid = Family::<GpuLabels, Gauge>::default();
    for g in &scrape.gpus {
        let l = GpuLabels {
            node: scrape.node.clone(),
            index: g.index.to_string(),
            uuid: g.uuid.clone(),
            model: g.model.clone(),
        };
        if let Some(v) = g.memory_total {
            total.get_or_create(&l).set(bytes(v));
        }
        if let Some(v) = g.memory_booked {
            booked.get_or_create(&l).set(bytes(v));
        }
        if let Some(v) = g.cores_booked {
            cores.get_or_create(&l).set(v);
        }
        if let Some(v) = g.slices {
            slices.get_or_create(&l).set(i64::from(v));
        }
        if let Some(v) = g.memory_used {
            used.get_or_create(&l).set(bytes(v));
        }
        if let Some(v) = g.utilization {
            util.get_or_create(&l).set(v);
        }
        if let Some(v) = g.healthy {
            healthy.get_or_create(&l).set(i64::from(v));
        }
        if let Some(v) = g.xid {
            xid.get_or_create(&l).set(i64::from(v));
        }
    }
    reg.register_with_unit(
        "gpuslice_gpu_memory_total",
        "Memory of the GPU",
        Unit::Bytes,
        total,
    );
    reg.register_with_unit(
        "gpuslice_gpu_memory_booked",
        "GPU memory booked by live reservations",
        Unit::Bytes,
        booked,
    );
    reg.register_with_unit(
        "gpuslice_gpu_cores_booked",
        "Share of the GPU's compute booked by live reservations (a whole-GPU booking counts as 1)",
        ratio(),
        cores,
    );
    reg.register(
        "gpuslice_gpu_slices",
        "Live reservations with a booking on the GPU",
        slices,
    );
    reg.register_with_unit(
        "gpuslice_gpu_memory_used",
        "GPU memory in use as measured by NVML",
        Unit::Bytes,
        used,
    );
    reg.register_with_unit(
        "gpuslice_gpu_utilization",
        "Share of the last sample period a kernel ran on the GPU, as measured by NVML",
        ratio(),
        util,
    );
    reg.register(
        "gpuslice_gpu_healthy",
        "1 while the GPU is healthy, 0 from a fatal XID until the driver reports it recovered",
        healthy,
    );
    reg.register(
        "gpuslice_gpu_xid",
        "The fatal XID that made the GPU unhealthy (only while it is)",
        xid,
    );
}

fn slice_metrics(reg: &mut Registry, scrape: &Scrape) {
    let limit = Bytes::<SliceLabels>::default();
    let used = Bytes::<SliceLabels>::default();
    let nvml_used = Bytes::<SliceLabels>::default();
    let nvml_share = Ratio::<SliceLabels>::default();
    let cores = Ratio::<SliceLabels>::default();
    let share = Ratio::<SliceLabels>::default();
    let busy = Family::<SliceLabels, Counter<f64, AtomicU64>>::default();
    for s in &scrape.slices {
        let l = slice_labels(&scrape.node, s);
        limit.get_or_create(&l).set(bytes(s.memory_limit));
        if let Some(v) = s.memory_used {
            used.get_or_create(&l).set(bytes(v));
        }
        if let Some(v) = s.nvml_memory_used {
            nvml_used.get_or_create(&l).set(bytes(v));
        }
        if let Some(v) = s.nvml_compute_used {
            nvml_share.get_or_create(&l).set(v);
        }
        if let Some(v) = s.compute_limit {
            cores.get_or_create(&l).set(v);
        }
        if let Some(v) = s.compute_used {
            share.get_or_create(&l).set(v);
        }
        if let Some(v) = s.busy_seconds {
            busy.get_or_create(&l).inc_by(v);
        }
    }
    reg.register_with_unit(
        "gpuslice_slice_memory_limit",
        "GPU memory the reservation may use on this GPU",
        Unit::Bytes,
        limit,
    );
    reg.register_with_unit(
        "gpuslice_slice_memory_used",
        "GPU memory the slice's processes hold on this GPU, from the slice's usage file",
        Unit::Bytes,
        used,
    );
    reg.register_with_unit(
        "gpuslice_slice_nvml_memory_used",
        "GPU memory NVML reports for the container's processes on this GPU (cross-check of the usage file; includes driver context overhead)",
        Unit::Bytes,
        nvml_used,
    );
    reg.register_with_unit(
        "gpuslice_slice_nvml_compute_used",
        "Compute share of this GPU NVML reports for the container's processes over its last sample period (per-process SM utilisation, summed)",
        ratio(),
        nvml_share,
    );
    reg.register_with_unit(
        "gpuslice_slice_compute_limit",
        "Compute share the slice is throttled to on this GPU (1 for a whole GPU; absent when not throttled)",
        ratio(),
        cores,
    );
    reg.register_with_unit(
        "gpuslice_slice_compute_used",
        "Compute share the slice achieved on this GPU between the last two samples at least a second apart",
        ratio(),
        share,
    );
    reg.register_with_unit(
        "gpuslice_slice_compute_busy",
        "Measured kernel time of the slice on this GPU (only counted under a compute limit)",
        Unit::Seconds,
        busy,
    );
}

fn registry_metrics(reg: &mut Registry, scrape: &Scrape) {
    let Some(h) = &scrape.registry else {
        return;
    };
    let node = NodeLabels {
        node: scrape.node.clone(),
    };
    let states = Family::<StateLabels, Gauge>::default();
    for (state, n) in [
        ("pending", h.pending),
        ("bound", h.bound),
        ("stale", h.stale),
    ] {
        let l = StateLabels {
            node: scrape.node.clone(),
            state: state.into(),
        };
        states.get_or_create(&l).set(bytes(n));
    }
    reg.register(
        "gpuslice_reservations",
        "Reservations in the registry by state (stale: owner gone or deadline passed, reaped by the next registry operation)",
        states,
    );
    for (name, help, v) in [
        ("gpuslice_reserved", "Reservations made", h.reserved_total),
        (
            "gpuslice_released",
            "Reservations released",
            h.released_total,
        ),
        (
            "gpuslice_reaped",
            "Reservations reaped because their owner went away or never bound",
            h.reaped_total,
        ),
    ] {
        let f = Total::<NodeLabels>::default();
        f.get_or_create(&node).inc_by(v);
        reg.register(name, help, f);
    }
    let refused = Total::<ReasonLabels>::default();
    for (reason, n) in &h.refused_total {
        let l = ReasonLabels {
            node: scrape.node.clone(),
            reason: reason.clone(),
        };
        refused.get_or_create(&l).inc_by(*n);
    }
    reg.register(
        "gpuslice_refused",
        "Requests the registry refused, by reason",
        refused,
    );
}

fn exporter_metrics(reg: &mut Registry, scrape: &Scrape, errors: &ErrorLog) {
    let f = Total::<SourceLabels>::default();
    for (source, n) in errors.counts() {
        let l = SourceLabels {
            node: scrape.node.clone(),
            source: source.as_str().into(),
        };
        f.get_or_create(&l).inc_by(n);
    }
    reg.register(
        "gpuslice_exporter_errors",
        "Things a scrape could not read, by source; their series were left out",
        f,
    );
    let d = Family::<NodeLabels, Gauge<f64, AtomicU64>>::default();
    d.get_or_create(&NodeLabels {
        node: scrape.node.clone(),
    })
    .set(scrape.collect_seconds);
    reg.register_with_unit(
        "gpuslice_exporter_collect_duration",
        "Time this scrape spent collecting",
        Unit::Seconds,
        d,
    );
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    node: String,
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThrottleLabels {
    node: String,
    reservation: String,
    uuid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UuidLabels {
    node: String,
    uuid: String,
}

/// The enforcer's families, when it runs.
fn enforcer_metrics(reg: &mut Registry, scrape: &Scrape) {
    use crate::enforce::events::EventKind;
    let Some(live) = &scrape.enforcer else {
        return;
    };
    let node = || NodeLabels {
        node: scrape.node.clone(),
    };
    let kills = Total::<NodeLabels>::default();
    kills.get_or_create(&node()).inc_by(live.record.kills_total);
    reg.register(
        "gpuslice_enforcer_kills",
        "Processes the enforcer killed for taking their slice over its memory limit past grace",
        kills,
    );
    let events = Total::<KindLabels>::default();
    for kind in EventKind::ALL {
        events
            .get_or_create(&KindLabels {
                node: scrape.node.clone(),
                kind: kind.as_str().into(),
            })
            .inc_by(live.record.count(kind));
    }
    reg.register(
        "gpuslice_enforcer_events",
        "Enforcer events by kind: memory_kill, memory_report, memory_escalation, compute_report, compute_throttle, unowned",
        events,
    );
    let cycles = Total::<NodeLabels>::default();
    cycles
        .get_or_create(&node())
        .inc_by(live.record.cycles_total);
    reg.register(
        "gpuslice_enforcer_cycles",
        "Readings of the driver's per-process figures the enforcer acted on",
        cycles,
    );
    let run = Ratio::<ThrottleLabels>::default();
    for (reservation, uuid, fraction) in &live.throttled {
        run.get_or_create(&ThrottleLabels {
            node: scrape.node.clone(),
            reservation: reservation.clone(),
            uuid: uuid.clone(),
        })
        .set(*fraction);
    }
    reg.register_with_unit(
        "gpuslice_enforcer_run",
        "Fraction of each freezer period a throttled slice may run",
        ratio(),
        run,
    );
    let unowned = Bytes::<UuidLabels>::default();
    for (uuid, n) in &live.unowned {
        unowned
            .get_or_create(&UuidLabels {
                node: scrape.node.clone(),
                uuid: uuid.clone(),
            })
            .set(bytes(*n));
    }
    reg.register(
        "gpuslice_enforcer_unowned_processes",
        "Processes on a GPU that belong to no reservation of that GPU",
        unowned,
    );
    let d = Family::<NodeLabels, Gauge<f64, AtomicU64>>::default();
    d.get_or_create(&node()).set(live.cycle_seconds);
    reg.register_with_unit(
        "gpuslice_enforcer_cycle_duration",
        "Time the enforcer's last cycle took",
        Unit::Seconds,
        d,
    );
}

/// The metric families of one scrape.
pub fn registry(scrape: &Scrape, errors: &ErrorLog) -> Registry {
    let mut reg = Registry::default();
    gpu_metrics(&mut reg, scrape);
    slice_metrics(&mut reg, scrape);
    registry_metrics(&mut reg, scrape);
    exporter_metrics(&mut reg, scrape, errors);
    enforcer_metrics(&mut reg, scrape);
    reg
}

/// The exposition text of one scrape.
pub fn encode(scrape: &Scrape, errors: &ErrorLog, format: Format) -> String {
    let reg = registry(scrape, errors);
    let mut out = String::with_capacity(64 * 1024);
    let result = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &reg),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &reg),
    };
    // Writing into a String cannot fail; an encoder error would be a bug in a label value.
    if result.is_err() {
        out.clear();
    }
    out
}
