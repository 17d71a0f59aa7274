//! The exported entry points, with the real driver's names and C ABI, grouped by API area.

pub mod array;
pub mod context;
pub mod device;
pub mod event;
pub mod graph;
pub mod init;
pub mod memory;
pub mod module;
pub mod pool;
pub mod stream;
pub mod vmm;
