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

/// Memory figures of one device, node-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFigures {
    pub total: u64,
    pub used: u64,
    pub free: u64,
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

    /// Node-wide memory of device `index` (a host index), after reclaiming dead processes'.
    pub fn memory(&self, index: usize) -> Result<MemoryFigures, StateError> {
        let total = self.devices.get(index).map(|d| d.memory).unwrap_or(0);
        self.state.reap_dead()?;
        let used = self.state.used(index).min(total);
        Ok(MemoryFigures {
            total,
            used,
            free: total - used,
        })
    }
}
