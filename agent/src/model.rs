//! One scrape's figures as plain data: what the collector gathered and the encoder turns
//! into metric series. A figure that could not be had is `None` and its series is left
//! out.

use std::collections::BTreeMap;

/// Per GPU (inventory and measurement joined by UUID).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub memory_total: Option<u64>,
    /// Bytes booked by live reservations; `None` when the registry could not be read.
    pub memory_booked: Option<u64>,
    /// Compute share booked, 0–1 (whole-GPU bookings count as 1).
    pub cores_booked: Option<f64>,
    /// Live reservations with a booking on this GPU.
    pub slices: Option<u32>,
    /// Measured by NVML.
    pub memory_used: Option<u64>,
    /// Measured by NVML, 0–1.
    pub utilization: Option<f64>,
    /// Whether the health watch has it healthy (`health.json`); `None` when that record
    /// cannot be read.
    pub healthy: Option<bool>,
    /// The fatal XID that made it unhealthy.
    pub xid: Option<u32>,
}

/// Who holds a reservation, as series labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerLabels {
    pub container_id: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// One GPU booking of one live reservation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SliceSample {
    pub reservation: String,
    pub owner: OwnerLabels,
    pub uuid: String,
    pub index: u32,
    pub memory_limit: u64,
    /// Compute share limit, 0–1; `None` when the slice is not throttled.
    pub compute_limit: Option<f64>,
    /// From the slice's usage file.
    pub memory_used: Option<u64>,
    /// NVML's per-process memory summed over the container's processes on this GPU.
    pub nvml_memory_used: Option<u64>,
    /// NVML's per-process SM utilisation summed over the container's processes on this GPU,
    /// 0–1 of the GPU over the driver's last sample period; `None` when the driver gives no
    /// per-process figure.
    pub nvml_compute_used: Option<f64>,
    /// Cumulative measured kernel time (usage file; only counted under a compute limit).
    pub busy_seconds: Option<f64>,
    /// Achieved share over the last window, 0–1.
    pub compute_used: Option<f64>,
}

/// The registry's own health.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryHealth {
    pub pending: u64,
    pub bound: u64,
    /// Listed, but the owner is gone or the pending deadline passed: the next registry
    /// operation (or `gpuslice gc`) reaps them.
    pub stale: u64,
    pub reserved_total: u64,
    pub released_total: u64,
    pub reaped_total: u64,
    pub refused_total: BTreeMap<String, u64>,
}

/// Everything one scrape found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub node: String,
    pub gpus: Vec<GpuSample>,
    pub slices: Vec<SliceSample>,
    /// `None` when `registry.json` could not be read.
    pub registry: Option<RegistryHealth>,
    /// How long collecting took, seconds.
    pub collect_seconds: f64,
    /// The enforcer's totals and current throttles; `None` when it does not run.
    pub enforcer: Option<crate::enforce::events::Live>,
}
