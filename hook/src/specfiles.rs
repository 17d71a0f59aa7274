//! Where gpuslice's CDI spec files live, below everything that reads or writes them: the
//! node spec's cache in the state dir (the create path reads it instead of NVML), each
//! slice's transient spec in `cdi.spec_dir`, and the environment every gpuslice container
//! gets from either.

use std::path::{Path, PathBuf};

use gpuslice_cdi::{Spec, SpecFileError};

/// The copy of the node spec the create path reads (in `state_dir`).
pub const NODE_SPEC_CACHE: &str = "cdi-node.json";
/// Environment of every gpuslice container: a second GPU runtime on the node injects nothing.
pub const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";
/// Kind of a slice's own CDI spec (one device, named by the reservation id).
pub const SLICE_KIND: &str = "gpuslice.io/slice";

/// Path of the CDI spec of slice `id` in `dir`; `None` when `id` cannot name a spec file.
pub fn slice_spec_path(dir: &Path, id: &str) -> Option<PathBuf> {
    gpuslice_cdi::transient_spec_file_name(SLICE_KIND, id)
        .ok()
        .map(|n| dir.join(n))
}

/// Reads the node spec cached in `state_dir` by the last `cdi generate`.
pub fn cached_node_spec(state_dir: &Path) -> Result<Spec, SpecFileError> {
    gpuslice_cdi::read_spec(&state_dir.join(NODE_SPEC_CACHE))
}

/// The node spec cache for the create path: parsed strictly, not validated again (it was when
/// `cdi generate` wrote it; what a slice takes from it is validated when the slice's own spec
/// is written), and devices parsed only when asked for.
pub fn cached_node_spec_lazy(state_dir: &Path) -> Result<gpuslice_cdi::LazySpec, SpecFileError> {
    gpuslice_cdi::read_own_spec(&state_dir.join(NODE_SPEC_CACHE))
}
