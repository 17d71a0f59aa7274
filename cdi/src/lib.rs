//! The CDI (Container Device Interface) layer of gpuslice: the spec model up to CDI 1.1.0,
//! strict validation, the lowest `cdiVersion` a spec needs, deterministic atomic spec files,
//! and injection of CDI edits into OCI runtime specs — one mechanism for every path
//! (engines reading our specs, and gpuslice editing `config.json` itself).
//!
//! ```
//! use gpuslice_cdi::{ContainerEdits, Device, DeviceNode, Spec};
//!
//! let mut spec = Spec::new("gpuslice.io/gpu");
//! spec.devices.push(Device::new("0", ContainerEdits {
//!     env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
//!     device_nodes: vec![DeviceNode::char_device("/dev/nvidia0", 195, 0)],
//!     ..Default::default()
//! }));
//! let bytes = gpuslice_cdi::to_json(&spec).unwrap();
//! assert!(String::from_utf8(bytes).unwrap().contains("\"cdiVersion\": \"0.5.0\""));
//!
//! let mut oci = serde_json::json!({"process": {"env": ["PATH=/bin"]}, "x-unknown": 1});
//! gpuslice_cdi::inject(&mut oci, &spec, &["gpuslice.io/gpu=0"]).unwrap();
//! assert_eq!(oci["linux"]["devices"][0]["path"], "/dev/nvidia0");
//! assert_eq!(oci["x-unknown"], 1);
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod annotations;
mod files;
mod inject;
mod json;
mod lazy;
mod model;
mod names;
mod validate;
mod version;

pub use annotations::TOTAL_ANNOTATION_SIZE_LIMIT;
pub use files::{
    list_transient_specs, read_spec, remove_spec, spec_path, transient_spec_path, write_spec,
    write_spec_as, write_spec_compact_as, write_transient_spec, SpecFileError, SPEC_DIR_MODE,
    SPEC_FILE_MODE,
};
pub use inject::{
    apply_edits, apply_edits_with, inject, inject_with, resolve_edits, DeviceStat, HostDevice,
    HostDeviceStat, HostDeviceType, InjectError,
};
pub use json::{from_json, stamped, to_json, to_json_compact, JsonError};
pub use lazy::{read_own_spec, LazySpec};
pub use model::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
pub use names::{
    is_qualified_name, qualified_name, spec_file_name, transient_spec_file_name, validate_class,
    validate_device_name, validate_vendor, Kind, NameError, QualifiedName, MAX_CLASS_LEN,
    MAX_VENDOR_LEN,
};
pub use validate::{validate_edits, ValidationError, DEVICE_TYPES, HOOK_NAMES};
pub use version::{minimum_version, CdiVersion, VersionError};
