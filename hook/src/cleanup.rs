//! Opening the registry with the cleanup every release and reap needs: removing the slice's
//! own CDI spec from `cdi.spec_dir`.

use gpuslice_registry::{Registry, Reservation};

use crate::error::Error;
use crate::node::Node;

/// Kind of the per-slice CDI specs.
pub const SLICE_KIND: &str = "gpuslice.io/slice";

/// Path of the CDI spec of slice `id` in `dir`.
pub fn slice_spec_path(dir: &std::path::Path, id: &str) -> Option<std::path::PathBuf> {
    gpuslice_cdi::transient_spec_file_name(SLICE_KIND, id)
        .ok()
        .map(|n| dir.join(n))
}

/// Opens the node's registry; released and reaped slices lose their CDI spec file.
pub fn open_registry(node: &Node) -> Result<Registry, Error> {
    let spec_dir = node.config().cdi.spec_dir.clone();
    let cleanup = Box::new(move |r: &Reservation| {
        if let Some(path) = slice_spec_path(&spec_dir, &r.id) {
            let _ = gpuslice_cdi::remove_spec(&path);
        }
    });
    Ok(Registry::open_config(node.config(), cleanup)?)
}
