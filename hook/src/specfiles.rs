//! Where gpuslice's CDI spec files live, below everything that reads or writes them: the
//! node spec's cache in the state dir (the create path reads it instead of NVML), each
//! slice's transient spec in `cdi.spec_dir` (named after who holds the slice), and the
//! environment every gpuslice container gets from either.

use std::path::{Path, PathBuf};

use gpuslice_cdi::{Spec, SpecFileError};
use gpuslice_registry::{claim_uid, Reservation};

/// The copy of the node spec the create path reads (in `state_dir`).
pub const NODE_SPEC_CACHE: &str = "cdi-node.json";
/// Environment of every gpuslice container: a second GPU runtime on the node injects nothing.
pub const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";
/// Kind of a slice's own CDI spec (one device, named by the reservation id).
pub const SLICE_KIND: &str = "gpuslice.io/slice";
/// Kind of a DRA claim's CDI spec (one device, named by the claim's UID).
pub const CLAIM_KIND: &str = "gpuslice.io/claim";

/// Who holds a slice, which names its CDI spec: a container that asked by annotations
/// (kind [`SLICE_KIND`], the device named by the reservation id), or a DRA claim from
/// prepare to unprepare (kind [`CLAIM_KIND`], the device named by the claim's UID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    Container { reservation: &'a str },
    Claim { uid: &'a str },
}

impl<'a> Holder<'a> {
    /// The holder of reservation `r`, from its owner.
    pub fn of(r: &'a Reservation) -> Holder<'a> {
        match claim_uid(r) {
            Some(uid) => Holder::Claim { uid },
            None => Holder::Container { reservation: &r.id },
        }
    }

    /// The kind of the slice's CDI spec.
    pub fn kind(self) -> &'static str {
        match self {
            Holder::Container { .. } => SLICE_KIND,
            Holder::Claim { .. } => CLAIM_KIND,
        }
    }

    /// The name of the spec's one device.
    pub fn device_name(self) -> &'a str {
        match self {
            Holder::Container { reservation } => reservation,
            Holder::Claim { uid } => uid,
        }
    }

    /// The qualified CDI device id (`kind=name`) an engine or the kubelet is handed.
    pub fn device_id(self) -> String {
        format!("{}={}", self.kind(), self.device_name())
    }

    /// Path of the slice's CDI spec in `dir`; `None` when the device name cannot name a
    /// spec file.
    pub fn spec_path(self, dir: &Path) -> Option<PathBuf> {
        gpuslice_cdi::transient_spec_file_name(self.kind(), self.device_name())
            .ok()
            .map(|n| dir.join(n))
    }
}

/// Path of the CDI spec of slice `id` in `dir`; `None` when `id` cannot name a spec file.
pub fn slice_spec_path(dir: &Path, id: &str) -> Option<PathBuf> {
    Holder::Container { reservation: id }.spec_path(dir)
}

/// Path of the CDI spec of the claim with UID `uid` in `dir`; `None` when `uid` cannot name
/// a spec file.
pub fn claim_spec_path(dir: &Path, uid: &str) -> Option<PathBuf> {
    Holder::Claim { uid }.spec_path(dir)
}

/// The qualified CDI device id of the claim with UID `uid`.
pub fn claim_device_id(uid: &str) -> String {
    Holder::Claim { uid }.device_id()
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::{Owner, ReservationState};

    fn reservation(owner: Owner) -> Reservation {
        Reservation {
            id: "3f9a0c1d2e4b5a69".into(),
            state: ReservationState::Pending,
            owner,
            whole_gpu: false,
            gpus: Vec::new(),
            created_ms: 0,
            deadline_ms: None,
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        }
    }

    /// The spec a release removes is the one the writer named: a container's by reservation
    /// id, a claim's by its UID.
    #[test]
    fn a_reservation_names_its_holders_spec() {
        let dir = Path::new("/cdi");
        let r = reservation(Owner::container());
        let holder = Holder::of(&r);
        assert_eq!(holder, Holder::Container { reservation: &r.id });
        assert_eq!(holder.device_id(), "gpuslice.io/slice=3f9a0c1d2e4b5a69");
        assert_eq!(holder.spec_path(dir), slice_spec_path(dir, &r.id));

        let uid = "0b4a6c1e-3d2f-4e5a-9b8c-7d6e5f4a3b2c";
        let r = reservation(Owner::DraClaim {
            claim_uid: uid.into(),
            namespace: "ns".into(),
            members: Vec::new(),
            name: "c".into(),
            gone: None,
        });
        let holder = Holder::of(&r);
        assert_eq!(holder, Holder::Claim { uid });
        assert_eq!(holder.device_id(), claim_device_id(uid));
        assert_eq!(holder.device_id(), format!("gpuslice.io/claim={uid}"));
        assert_eq!(holder.spec_path(dir), claim_spec_path(dir, uid));
        assert_ne!(holder.spec_path(dir), slice_spec_path(dir, &r.id));
        assert_eq!(claim_spec_path(dir, "../x"), None);
    }
}
