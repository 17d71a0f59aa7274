//! What is booked on each GPU, summed from the reservations: the one computation placement,
//! status and the oversubscription check all share.

use gpuslice_config::PlacementConfig;

use crate::model::{Inventory, RegistryFile, Reservation};

/// Bookings summed over one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuLoad {
    /// Bytes booked.
    pub memory: u64,
    /// Percent of compute booked (may exceed 100 only in a damaged registry).
    pub cores: u32,
    /// Reservations with a booking on this GPU.
    pub slices: u32,
    /// A whole-GPU booking holds it.
    pub whole: bool,
}

/// Loads keyed by GPU UUID, over every reservation (also those on GPUs the inventory lost).
pub fn gpu_loads(reservations: &[Reservation]) -> GpuLoads<'_> {
    let mut loads = GpuLoads(Vec::new());
    for r in reservations {
        for b in &r.gpus {
            let l = loads.entry(&b.uuid);
            l.memory = l.memory.saturating_add(b.memory);
            l.cores += u32::from(b.cores);
            l.slices += 1;
            l.whole |= r.whole_gpu;
        }
    }
    loads
}

/// The loads of [`gpu_loads`] by GPU UUID. A node has a handful of GPUs, so a list searched
/// beats hashing a 40-byte UUID per booking, which every
/// placement does for every reservation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuLoads<'a>(Vec<(&'a str, GpuLoad)>);

impl<'a> GpuLoads<'a> {
    /// The load of the GPU with this UUID, if anything is booked on it.
    pub fn get(&self, uuid: &str) -> Option<&GpuLoad> {
        self.0.iter().find(|(u, _)| *u == uuid).map(|(_, l)| l)
    }

    fn entry(&mut self, uuid: &'a str) -> &mut GpuLoad {
        let at = match self.0.iter().position(|(u, _)| *u == uuid) {
            Some(i) => i,
            None => {
                self.0.push((uuid, GpuLoad::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }
}

/// Bytes that may be booked on a GPU of `total` bytes under `overcommit` (≥ 1.0).
pub fn memory_capacity(total: u64, overcommit: f64) -> u64 {
    if overcommit <= 1.0 || !overcommit.is_finite() {
        return total;
    }
    let cap = (total as f64 * overcommit).floor();
    if cap >= u64::MAX as f64 {
        u64::MAX
    } else {
        (cap as u64).max(total)
    }
}

/// Every way the file breaks the placement rules, one line each; empty when it is sound.
/// Checks memory (× overcommit), cores ≤ 100, whole-GPU exclusivity, the slice cap, distinct
/// GPUs per reservation and unique ids.
pub fn violations(file: &RegistryFile, placement: &PlacementConfig) -> Vec<String> {
    let mut out = Vec::new();
    let loads = gpu_loads(&file.reservations);
    for gpu in &file.inventory.gpus {
        let Some(l) = loads.get(gpu.uuid.as_str()) else {
            continue;
        };
        let cap = memory_capacity(gpu.memory_total, placement.memory_overcommit);
        if l.memory > cap {
            out.push(format!(
                "GPU {}: {} bytes booked, more than it holds ({cap} bytes)",
                gpu.index, l.memory
            ));
        }
        if l.cores > 100 {
            out.push(format!("GPU {}: {}% cores booked", gpu.index, l.cores));
        }
        if l.whole && l.slices > 1 {
            out.push(format!(
                "GPU {}: whole-GPU booking shared by {} reservations",
                gpu.index, l.slices
            ));
        }
        if let Some(max) = placement.max_slices_per_gpu {
            if l.slices > max {
                out.push(format!(
                    "GPU {}: {} slices, at most {max} allowed",
                    gpu.index, l.slices
                ));
            }
        }
    }
    let mut ids = std::collections::HashSet::new();
    for r in &file.reservations {
        if !ids.insert(r.id.as_str()) {
            out.push(format!("reservation id {} appears twice", r.id));
        }
        let mut uuids = std::collections::HashSet::new();
        if !r.gpus.iter().all(|b| uuids.insert(b.uuid.as_str())) {
            out.push(format!("reservation {} books one GPU twice", r.id));
        }
    }
    out
}

/// UUIDs that reservations book but the inventory no longer lists, with the reservation ids.
pub fn missing_gpus<'a>(
    inventory: &Inventory,
    reservations: &'a [Reservation],
) -> Vec<(&'a str, &'a str)> {
    reservations
        .iter()
        .flat_map(|r| r.gpus.iter().map(move |b| (r.id.as_str(), b.uuid.as_str())))
        .filter(|(_, uuid)| inventory.gpu(uuid).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_scales_and_saturates() {
        assert_eq!(memory_capacity(10, 1.0), 10);
        assert_eq!(memory_capacity(10, 1.5), 15);
        assert_eq!(memory_capacity(10, 0.5), 10);
        assert_eq!(memory_capacity(u64::MAX, 16.0), u64::MAX);
    }
}
