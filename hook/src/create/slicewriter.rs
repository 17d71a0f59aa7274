//! The one writer of a slice, for both front doors (the create path's spec edit and the DRA
//! kubelet plugin's prepare): the slice directory the registry names, with its limits file
//! and usage file, and the slice's own CDI spec in `cdi.spec_dir`, named after its
//! [`Holder`]. What it needs from the node is read and checked first, so that the create
//! path refuses before it reserves anything.

use std::path::{Path, PathBuf};

use gpuslice_cdi::{LazySpec, Spec, SpecFileError};
use gpuslice_registry::{Registry, RegistryError, Reservation};
use gpuslice_slice::{
    usage::create_usage_file, DeviceLimit, Limits, LimitsError, LIMITS_FILE, LIMITS_VERSION,
    USAGE_FILE,
};

use crate::create::slicespec::{preload_contents, slice_spec, SliceSpecError, PRELOAD_FILE};
use crate::node::{NodeContext, NodeError};
use crate::specfiles::{cached_node_spec_lazy, Holder, NODE_SPEC_CACHE};

/// A slice's files or spec could not be written; each prints as one line naming the path or id.
#[derive(Debug, thiserror::Error)]
pub enum SliceWriteError {
    #[error("no node CDI spec cached: {0}; run `gpuslice cdi generate` on this node first")]
    NodeSpec(SpecFileError),
    #[error("shim library {path} does not exist; install it or set shim.library in the config")]
    NoShim { path: PathBuf },
    #[error("{0}")]
    Node(#[from] NodeError),
    #[error("{0}")]
    SliceDir(Box<RegistryError>),
    #[error("{0}")]
    SliceSpec(#[from] SliceSpecError),
    #[error("{0}")]
    Limits(#[from] LimitsError),
    #[error("cannot create the usage file of slice {id}: {detail}")]
    Usage { id: String, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error("{0}")]
    SpecFile(SpecFileError),
}

/// Writes slices on this node: holds the cached node spec, the `gpuslice` binary its hooks
/// run, and has checked the shim library and the host's `ld.so.preload`.
#[derive(Debug)]
pub struct Writer<'a> {
    node: &'a NodeContext,
    binary: PathBuf,
    node_spec: LazySpec,
}

impl<'a> Writer<'a> {
    /// Reads the node spec cached by `cdi generate`, checks the shim library, finds the
    /// `gpuslice` binary and writes the host's `ld.so.preload` when it is missing or differs.
    pub fn new(node: &'a NodeContext) -> Result<Writer<'a>, SliceWriteError> {
        let config = node.config();
        let node_spec =
            cached_node_spec_lazy(&config.state_dir).map_err(SliceWriteError::NodeSpec)?;
        if !config.shim.library.is_file() {
            return Err(SliceWriteError::NoShim {
                path: config.shim.library.clone(),
            });
        }
        let binary = node.hook_binary()?;
        ensure_preload(node)?;
        Ok(Writer {
            node,
            binary,
            node_spec,
        })
    }

    /// Writes the slice of reservation `r`, held by `holder`: its directory in `registry`
    /// (limits file, usage file), then its CDI spec; returns that spec. A claim's usage file
    /// is kept when it exists (a claim prepared again while its containers run keeps their
    /// accounting); a container's slice starts a fresh one. Idempotent.
    pub fn write(
        &self,
        registry: &Registry,
        r: &Reservation,
        holder: Holder<'_>,
    ) -> Result<Spec, SliceWriteError> {
        let config = self.node.config();
        let slice_dir = registry
            .slice_dir(&r.id)
            .map_err(|e| SliceWriteError::SliceDir(Box::new(e)))?;
        let keep_usage = matches!(holder, Holder::Claim { .. });
        write_slice_files(&slice_dir, r, keep_usage)?;
        let booked: Vec<&str> = r.gpus.iter().map(|b| b.uuid.as_str()).collect();
        let node_spec = self.node_spec.with_devices(&booked).map_err(|source| {
            SliceWriteError::NodeSpec(SpecFileError::Decode {
                path: config.state_dir.join(NODE_SPEC_CACHE),
                source,
            })
        })?;
        let spec = slice_spec(self.node, &self.binary, &node_spec, r, &slice_dir, holder)?;
        gpuslice_cdi::write_transient_spec(&config.cdi.spec_dir, &spec, holder.device_name())
            .map_err(SliceWriteError::SpecFile)?;
        Ok(spec)
    }
}

/// Writes the host's `ld.so.preload` for slice containers when it is missing or differs.
fn ensure_preload(node: &NodeContext) -> Result<(), SliceWriteError> {
    let preload = node.config().state_dir.join(PRELOAD_FILE);
    if std::fs::read_to_string(&preload).ok().as_deref() != Some(preload_contents().as_str()) {
        gpuslice_fsutil::atomic_write(&preload, preload_contents().as_bytes(), 0o644).map_err(
            |source| SliceWriteError::Write {
                path: preload.clone(),
                source,
            },
        )?;
    }
    Ok(())
}

/// Writes the slice directory of `reservation`: its limits file, and a fresh usage file
/// (kept as it is when `keep_usage` and it exists).
pub fn write_slice_files(
    slice_dir: &Path,
    reservation: &Reservation,
    keep_usage: bool,
) -> Result<(), SliceWriteError> {
    let limits = Limits {
        version: LIMITS_VERSION,
        reservation: reservation.id.clone(),
        devices: reservation
            .gpus
            .iter()
            .map(|b| DeviceLimit {
                uuid: b.uuid.clone(),
                memory_limit: b.memory,
                cores: b.cores,
            })
            .collect(),
    };
    limits.write(&slice_dir.join(LIMITS_FILE))?;
    let usage = slice_dir.join(USAGE_FILE);
    if !(keep_usage && usage.is_file()) {
        create_usage_file(&usage).map_err(|e| SliceWriteError::Usage {
            id: reservation.id.clone(),
            detail: e.to_string(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::{Booking, Owner, ReservationState};

    /// A claim prepared again keeps its containers' accounting; a container's slice starts
    /// a fresh one.
    #[test]
    fn the_usage_file_is_kept_only_when_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = Reservation {
            id: "3f9a0c1d2e4b5a69".into(),
            state: ReservationState::Pending,
            owner: Owner::container(),
            whole_gpu: false,
            gpus: vec![Booking {
                index: 0,
                uuid: "GPU-0".into(),
                memory: 1 << 30,
                cores: 25,
                unknown: Default::default(),
            }],
            created_ms: 0,
            deadline_ms: None,
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        };
        let usage = dir.path().join(USAGE_FILE);
        let used = || std::fs::read(&usage).expect("read usage")[100];
        write_slice_files(dir.path(), &r, false).unwrap();
        let mut account = std::fs::read(&usage).expect("read usage");
        account[100] = 7;
        std::fs::write(&usage, &account).expect("write usage");
        write_slice_files(dir.path(), &r, true).unwrap();
        assert_eq!(used(), 7, "kept usage file replaced");
        write_slice_files(dir.path(), &r, false).unwrap();
        assert_eq!(used(), 0, "fresh usage file kept the old account");
        let limits = std::fs::read_to_string(dir.path().join(LIMITS_FILE)).expect("read limits");
        assert!(limits.contains("\"memory_limit\":1073741824"), "{limits}");
    }
}
