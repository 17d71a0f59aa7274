//! The simulated node as one process sees it: its paths, the GPUs of `devices.json`, the
//! subset visible through device nodes, the shared state, and the faults injected into it.

use crate::devices::{read_devices, DevicesError, SimDevice};
use crate::faults::{Effect, Faults, SimFault};
use crate::paths::{PathsError, SimPaths};
use crate::state::{SharedState, StateError};

/// The simulated node could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    Devices(#[from] DevicesError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Memory figures of one device, node-wide, in NVML v2's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFigures {
    /// All the physical memory (NVML's total).
    pub total: u64,
    /// Set aside by the driver: never allocated, never free.
    pub reserved: u64,
    /// Allocated by processes.
    pub used: u64,
    /// `total - reserved - used`.
    pub free: u64,
}

impl MemoryFigures {
    /// The figures of `device` with `allocated` bytes charged on it (clamped to what can be
    /// allocated).
    pub fn of(device: &SimDevice, allocated: u64) -> MemoryFigures {
        let allocatable = device.allocatable();
        let used = allocated.min(allocatable);
        MemoryFigures {
            total: device.memory,
            reserved: device.memory - allocatable,
            used,
            free: allocatable - used,
        }
    }

    /// The total CUDA reports (`cuMemGetInfo`, `cuDeviceTotalMem`): the reserved memory
    /// left out.
    pub fn cuda_total(&self) -> u64 {
        self.total - self.reserved
    }

    /// NVML v1's `used`: the reserved memory and the allocations.
    pub fn nvml_v1_used(&self) -> u64 {
        self.reserved + self.used
    }
}

/// An opened simulated node.
#[derive(Debug)]
pub struct SimNode {
    paths: SimPaths,
    devices: Vec<SimDevice>,
    state: SharedState,
    faults: Faults,
}

impl SimNode {
    /// Opens the node at `paths`: reads `devices.json`, maps the shared state.
    pub fn open(paths: SimPaths) -> Result<SimNode, NodeError> {
        let devices = read_devices(&paths.state_dir)?;
        let state = SharedState::open(&paths.state_file())?;
        let faults = Faults::new(&paths.state_dir);
        Ok(SimNode {
            paths,
            devices,
            state,
            faults,
        })
    }

    /// Opens the node found from the environment (see [`SimPaths::from_env`]).
    pub fn open_from_env() -> Result<SimNode, NodeError> {
        SimNode::open(SimPaths::from_env()?)
    }

    pub fn paths(&self) -> &SimPaths {
        &self.paths
    }

    /// All GPUs of the node, in index order.
    pub fn devices(&self) -> &[SimDevice] {
        &self.devices
    }

    /// The GPUs this process may use (device node present), in index order: ordinal `i` of
    /// the driver API is element `i`.
    pub fn visible(&self) -> Vec<&SimDevice> {
        self.devices
            .iter()
            .filter(|d| self.paths.is_visible(d.minor))
            .collect()
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// The worst effect of the XIDs in effect on GPU `index` (a host index), if any.
    pub fn effect(&self, index: usize) -> Option<Effect> {
        self.faults.effect(&self.devices.get(index)?.uuid)
    }

    /// The XIDs in effect on GPU `index` (a host index), in injection order.
    pub fn faults_in_effect(&self, index: usize) -> Vec<SimFault> {
        self.devices
            .get(index)
            .map(|d| self.faults.in_effect(&d.uuid))
            .unwrap_or_default()
    }

    /// How many XIDs were ever injected into GPU `index` (a host index), cleared or not
    /// ([`Faults::count`]).
    pub fn xid_count(&self, index: usize) -> usize {
        self.devices
            .get(index)
            .map_or(0, |d| self.faults.count(&d.uuid))
    }

    /// The worst effect of the XIDs injected into GPU `index` (a host index) after the first
    /// `seen` of its history, cleared or not ([`Faults::worst_since`]).
    pub fn worst_since(&self, index: usize, seen: usize) -> Option<Effect> {
        self.faults
            .worst_since(&self.devices.get(index)?.uuid, seen)
    }

    /// The node's XID log: every injected XID, in injection order.
    pub fn faults(&self) -> Vec<SimFault> {
        self.faults.all()
    }

    /// Node-wide memory of device `index` (a host index), after reclaiming dead processes';
    /// all zero for an index the node does not have.
    pub fn memory(&self, index: usize) -> Result<MemoryFigures, StateError> {
        self.state.reap_dead()?;
        Ok(match self.devices.get(index) {
            Some(d) => MemoryFigures::of(d, self.state.used(index)),
            None => MemoryFigures {
                total: 0,
                reserved: 0,
                used: 0,
                free: 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(memory: u64, reserved_memory: u64) -> SimDevice {
        SimDevice {
            index: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            memory,
            minor: 0,
            pci_bus_id: "00000000:18:00.0".into(),
            numa_node: 0,
            sm_count: 132,
            clock_khz: 1_980_000,
            context_memory: 0,
            reserved_memory,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn reserved_memory_is_never_used_nor_free_and_cuda_leaves_it_out() {
        // An H100 80GB: NVML's total 81559 MiB, CUDA's 81089 MiB.
        let d = device(81559 * MIB, 470 * MIB);
        let idle = MemoryFigures::of(&d, 0);
        assert_eq!(
            idle,
            MemoryFigures {
                total: 81559 * MIB,
                reserved: 470 * MIB,
                used: 0,
                free: 81089 * MIB,
            }
        );
        assert_eq!(idle.cuda_total(), 81089 * MIB);
        assert_eq!(
            idle.nvml_v1_used(),
            470 * MIB,
            "v1 counts the reserved part as used"
        );
        let busy = MemoryFigures::of(&d, 1000 * MIB);
        assert_eq!((busy.used, busy.free), (1000 * MIB, 80089 * MIB));
        assert_eq!(busy.nvml_v1_used(), 1470 * MIB);
        assert_eq!(busy.total, busy.reserved + busy.used + busy.free);
        // Charges past what can be allocated (never admitted) read as full, not negative.
        let full = MemoryFigures::of(&d, u64::MAX);
        assert_eq!((full.used, full.free), (81089 * MIB, 0));
    }

    #[test]
    fn without_reserved_memory_the_figures_are_the_whole_gpu() {
        let f = MemoryFigures::of(&device(8 << 30, 0), 1 << 30);
        assert_eq!(
            (f.total, f.reserved, f.used, f.free),
            (8 << 30, 0, 1 << 30, 7 << 30)
        );
        assert_eq!(f.cuda_total(), 8 << 30);
        assert_eq!(f.nvml_v1_used(), 1 << 30);
    }
}
