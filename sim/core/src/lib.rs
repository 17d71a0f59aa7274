//! The simulated GPU node shared by the simulated `libcuda.so.1` and `libnvidia-ml.so.1`:
//! where the node lives (`devices.json` and device nodes), node-wide device memory
//! accounting across processes, the kernel timeline of each device, and per-process slots
//! whose memory comes back when the process dies, and the faults injected into its GPUs.
//! It lets every gpuslice path run end to end
//! on a machine without a GPU.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod devices;
pub mod faults;
pub mod memory;
pub mod node;
pub mod paths;
pub mod procs;
pub mod slots;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod timeline;

pub use devices::{
    devices_from_config, read_devices, write_devices, DevicesError, SimDevice, MAX_DEVICES,
};
pub use faults::{effect, Effect, SimFault};
pub use memory::OutOfMemory;
pub use node::{MemoryFigures, NodeError, SimNode};
pub use paths::{SimPaths, CONTAINER_STATE_DIR, DEV_ENV, STATE_ENV};
pub use slots::{Slot, SlotUsage};
pub use state::{SharedState, StateError, MAX_SLOTS};
pub use timeline::{now_ns, sleep_until, Scheduled};
