//! `devices.json`, the simulated node's GPU list: the product's simulated inventory
//! (`gpuslice_driver::simulated`) writes it and defines its format; the simulated driver
//! reads it through these re-exports.

pub use gpuslice_driver::simulated::{
    devices_from_config, read_devices, simulated_pci_bus_id, write_devices, DevicesError,
    SimDevice, DEVICES_FILE, DEVICES_VERSION, MAX_DEVICES,
};
