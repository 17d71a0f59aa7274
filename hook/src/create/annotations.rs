//! The user interface: `gpuslice.io/*` annotations (docs/annotations.md) turned into a registry
//! request. Defined in `gpuslice_registry::annotations`, which the admission webhook reads
//! too, so that the node and the webhook agree on which annotations ask for a slice.

pub use gpuslice_registry::annotations::*;
