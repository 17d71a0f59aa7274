//! What gpuslice needs to know about a node's NVIDIA driver: its device nodes, its
//! user-space libraries (found like the dynamic loader finds them), its utility programs
//! (`nvidia-smi`) and the GPU inventory
//! from NVML or from the simulated list of the config (booking NVML's total less the memory
//! the driver reserves, `memory`), with the simulated node's device list
//! that the simulated driver reads (`simulated`), its injected faults (`simfault`), the GPUs
//! the driver reported unhealthy (`health`) and the simulated node's driver root: its
//! layout and set-up (`simnode`).

pub mod binaries;
pub mod devices;
pub mod health;
pub mod inventory;
pub mod ldcache;
pub mod libraries;
pub mod memory;
pub mod simfault;
pub mod simnode;
pub mod simulated;

pub use binaries::{discover_binaries, DriverBinary, UTILITY_BINARIES};
pub use devices::{
    discover_device_nodes, DeviceNode, DeviceNodes, DevicesError, NodeInspector, NodeKind,
    RealInspector,
};
pub use inventory::{
    inventory, nvml_inventory, simulated_inventory, Gpu, InventoryError, NodeInventory,
    UnreadableGpu,
};
pub use libraries::{discover_libraries, DriverLibrary, LibrariesError, COMPUTE_LIBRARIES};
pub use memory::{bookable_memory, device_memory, DeviceMemory};
