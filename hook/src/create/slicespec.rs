//! The slice's own CDI spec, one device named after its holder (`gpuslice.io/slice=<reservation
//! id>` for a container's annotations, `gpuslice.io/claim=<claim UID>` for a DRA claim): the
//! booked GPUs' nodes, the driver's control nodes and libraries, the shim through
//! `/etc/ld.so.preload`, the slice's files, the environment (docs/annotations.md, "In the container") and the holder's
//! hooks.

use std::path::{Path, PathBuf};

use gpuslice_cdi::{ContainerEdits, Device, Mount, Spec};
use gpuslice_registry::Reservation;
use gpuslice_slice::{CONTAINER_DIR, CONTAINER_LIMITS, CONTAINER_USAGE, LIMITS_FILE, USAGE_FILE};

use crate::create::driveredits::{RO_BIND, RW_BIND};
use crate::node::NodeContext;
use crate::specfiles::{Holder, VISIBLE_DEVICES_VOID};

/// Where the shim is mounted in slice containers.
pub const SHIM_CONTAINER_PATH: &str = "/usr/lib/gpuslice/libgpuslice_shim.so";
/// The host file mounted read-only at `/etc/ld.so.preload` (in `state_dir`).
pub const PRELOAD_FILE: &str = "ld.so.preload";

/// The slice spec could not be built from the node spec.
#[derive(Debug, thiserror::Error)]
pub enum SliceSpecError {
    #[error("the cached node spec has no device {uuid}: run `gpuslice cdi generate` after driver or inventory changes")]
    UnknownGpu { uuid: String },
}

/// The contents of the host's `ld.so.preload` file for slice containers.
pub fn preload_contents() -> String {
    format!("{SHIM_CONTAINER_PATH}\n")
}

/// The environment of a slice's container (docs/annotations.md, "In the container"). `CUDA_DEVICE_*` are for HAMi-core's `libvgpu.so` when an
/// operator uses it as the shim; gpuslice's shim ignores all of these.
pub fn slice_env(r: &Reservation) -> Vec<String> {
    let mut env = vec![
        format!("GPUSLICE_RESERVATION={}", r.id),
        format!("GPUSLICE_DIR={CONTAINER_DIR}"),
        VISIBLE_DEVICES_VOID.to_string(),
    ];
    // Containers number their GPUs 0.. in host index order, as the driver enumerates them.
    let mut gpus: Vec<_> = r.gpus.iter().collect();
    gpus.sort_by_key(|b| b.index);
    for (i, b) in gpus.iter().enumerate() {
        env.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={}m", b.memory >> 20));
    }
    if let Some(cores) = r.gpus.iter().map(|b| b.cores).filter(|c| *c > 0).max() {
        env.push(format!("CUDA_DEVICE_SM_LIMIT={cores}"));
    }
    env
}

/// The hooks of a slice held by `holder`. A container's bind the reservation to it and
/// release it when it stops. A claim holds its reservation from prepare to unprepare, so no
/// container binds or releases it; each container it is given to is recorded host-side, so
/// the node agent attributes the claim's processes by their cgroups and namespaces, never by
/// what the containers write.
fn holder_hooks(
    node: &NodeContext,
    binary: &Path,
    r: &Reservation,
    holder: Holder<'_>,
) -> Vec<gpuslice_cdi::Hook> {
    match holder {
        Holder::Container { .. } => vec![
            node.hook(
                binary,
                "createRuntime",
                &["hook", "create-runtime", "--reservation", &r.id],
            ),
            node.hook(
                binary,
                "poststop",
                &["hook", "poststop", "--reservation", &r.id],
            ),
        ],
        Holder::Claim { .. } => vec![node.hook(
            binary,
            "createRuntime",
            &["hook", "create-runtime", "--claim", &r.id],
        )],
    }
}

/// Builds the spec of the slice of reservation `r`, held by `holder`, from the node spec
/// `node_spec`; `slice_dir` holds `limits.json` and `usage`.
pub fn slice_spec(
    node: &NodeContext,
    binary: &Path,
    node_spec: &Spec,
    r: &Reservation,
    slice_dir: &Path,
    holder: Holder<'_>,
) -> Result<Spec, SliceSpecError> {
    let config = node.config();
    let mut edits = ContainerEdits {
        env: slice_env(r),
        ..Default::default()
    };
    let mut gpus: Vec<_> = r.gpus.iter().collect();
    gpus.sort_by_key(|b| b.index);
    for b in gpus {
        let dev = node_spec
            .device(&b.uuid)
            .ok_or_else(|| SliceSpecError::UnknownGpu {
                uuid: b.uuid.clone(),
            })?;
        edits
            .device_nodes
            .extend(dev.container_edits.device_nodes.iter().cloned());
    }
    edits
        .device_nodes
        .extend(node_spec.container_edits.device_nodes.iter().cloned());
    edits
        .mounts
        .extend(node_spec.container_edits.mounts.iter().cloned());
    let file = |name: &str| -> PathBuf { slice_dir.join(name) };
    edits.mounts.push(Mount::bind(
        config.shim.library.display().to_string(),
        SHIM_CONTAINER_PATH,
        RO_BIND,
    ));
    edits.mounts.push(Mount::bind(
        config.state_dir.join(PRELOAD_FILE).display().to_string(),
        "/etc/ld.so.preload",
        RO_BIND,
    ));
    edits.mounts.push(Mount::bind(
        file(LIMITS_FILE).display().to_string(),
        CONTAINER_LIMITS,
        RO_BIND,
    ));
    edits.mounts.push(Mount::bind(
        file(USAGE_FILE).display().to_string(),
        CONTAINER_USAGE,
        RW_BIND,
    ));
    edits.hooks = holder_hooks(node, binary, r, holder);
    let mut spec = Spec::new(holder.kind());
    spec.devices.push(Device::new(holder.device_name(), edits));
    Ok(spec)
}
