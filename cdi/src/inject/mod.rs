//! Injection of CDI edits into an OCI runtime spec held as `serde_json::Value`, so that
//! fields this crate does not model survive untouched. Edits are applied to a copy of the
//! parts they touch, written back only on success: a failure never leaves a half-edited
//! spec.

mod apply;
mod mounts;
mod oci;
mod scratch;
mod stat;

pub use stat::{DeviceStat, HostDevice, HostDeviceStat, HostDeviceType};

use serde_json::Value;

use crate::model::{ContainerEdits, Spec};
use crate::names::{NameError, QualifiedName};
use crate::validate::{validate_edits, ValidationError};

/// Edits that could not be applied; the OCI spec is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The OCI spec's root is not an object.
    #[error("OCI spec is not a JSON object; accepted: an OCI runtime spec object")]
    NotAnObject,
    /// A field of the OCI spec has the wrong JSON type.
    #[error("OCI spec field {field} is not {expected}; cannot apply CDI edits")]
    Shape {
        field: String,
        expected: &'static str,
    },
    /// The CDI spec or edits break a CDI rule.
    #[error("invalid CDI edits: {0}")]
    Invalid(#[from] ValidationError),
    /// A requested device name is malformed.
    #[error("CDI device request: {0}")]
    DeviceName(#[from] NameError),
    /// A requested device is of another kind than the spec.
    #[error("CDI device {device:?} is not of kind {kind}; accepted: names of that kind")]
    WrongKind { device: String, kind: String },
    /// A requested device is not in the spec.
    #[error("CDI device {device:?} is not in spec {kind}; accepted: {known}")]
    UnknownDevice {
        device: String,
        kind: String,
        known: String,
    },
    /// The host node behind a device node cannot be looked up.
    #[error("cannot stat host device {host_path} for CDI device node {path}: {source}")]
    Stat {
        path: String,
        host_path: String,
        source: std::io::Error,
    },
    /// The host path of a device node is not a device node.
    #[error("host path {host_path} of CDI device node {path} is not a device node; accepted: a block, character or FIFO device")]
    NotADevice { path: String, host_path: String },
    /// A device node declares a type the host node does not have.
    #[error("CDI device node {path} declares type {declared:?} but host device {host_path} is of type {found:?}")]
    TypeMismatch {
        path: String,
        host_path: String,
        declared: String,
        found: String,
    },
}

/// The edits injecting `device_names` of `spec` makes: the spec's own edits, then each
/// named device's in order, merged as the reference library does. Names may be bare
/// (`0`) or qualified (`gpuslice.io/gpu=0`).
pub fn resolve_edits(spec: &Spec, device_names: &[&str]) -> Result<ContainerEdits, InjectError> {
    let mut edits = spec.container_edits.clone();
    for requested in device_names {
        let name = if requested.contains('=') {
            let q = QualifiedName::parse(requested)?;
            if q.kind().to_string() != spec.kind {
                return Err(InjectError::WrongKind {
                    device: requested.to_string(),
                    kind: spec.kind.clone(),
                });
            }
            q.name().to_string()
        } else {
            requested.to_string()
        };
        let device = spec
            .device(&name)
            .ok_or_else(|| InjectError::UnknownDevice {
                device: requested.to_string(),
                kind: spec.kind.clone(),
                known: spec
                    .devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        edits.append(&device.container_edits);
    }
    Ok(edits)
}

/// Injects the devices `device_names` of `spec` into `oci`, as a CDI-aware engine would:
/// the spec's edits once, then each device's. Host device nodes are looked up with
/// `lstat`. An empty `device_names` changes nothing (as in the reference library).
pub fn inject(oci: &mut Value, spec: &Spec, device_names: &[&str]) -> Result<(), InjectError> {
    inject_with(oci, spec, device_names, &HostDeviceStat)
}

/// [`inject`] with a chosen host device lookup.
pub fn inject_with(
    oci: &mut Value,
    spec: &Spec,
    device_names: &[&str],
    stat: &dyn DeviceStat,
) -> Result<(), InjectError> {
    spec.validate_content()?;
    if device_names.is_empty() {
        return Ok(());
    }
    let edits = resolve_edits(spec, device_names)?;
    apply_checked(oci, &edits, stat)
}

/// Applies one set of edits to `oci`. Host device nodes are looked up with `lstat`.
pub fn apply_edits(oci: &mut Value, edits: &ContainerEdits) -> Result<(), InjectError> {
    apply_edits_with(oci, edits, &HostDeviceStat)
}

/// [`apply_edits`] with a chosen host device lookup.
pub fn apply_edits_with(
    oci: &mut Value,
    edits: &ContainerEdits,
    stat: &dyn DeviceStat,
) -> Result<(), InjectError> {
    validate_edits(edits, "containerEdits")?;
    apply_checked(oci, edits, stat)
}

fn apply_checked(
    oci: &mut Value,
    edits: &ContainerEdits,
    stat: &dyn DeviceStat,
) -> Result<(), InjectError> {
    let mut work = scratch::extract(oci)?;
    apply::apply(&mut work, edits, stat)?;
    scratch::write_back(oci, work);
    Ok(())
}
