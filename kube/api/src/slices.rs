//! A node's ResourceSlices as objects: one pool named after the node, and per GPU either one
//! device (`gpu-<index>`, shared by several claims) with `memory` and `cores` capacities whose
//! request policies the API server accepts (capacity mode), or N equal unshared slot devices
//! (`gpu-<index>-slot-<j>`, slot mode, for API servers without consumable capacity); the device
//! names, attribute and capacity keys they carry. Pure functions: the kubelet plugin publishes
//! the slices, the webhook and the console read them back.

use std::collections::BTreeMap;

use gpuslice_config::quantity::format_kube_quantity;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::DRIVER;

/// The memory step of every device: requests are rounded up to it, capacity down.
pub const MEMORY_STEP: u64 = 1 << 20;

/// A request of `bytes` rounded up to [`MEMORY_STEP`], as the scheduler rounds it; `None`
/// within one step of `u64::MAX`, which has no such multiple (unchecked, it would wrap to a
/// request of nothing).
pub fn round_up_request(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(MEMORY_STEP)
}

/// The largest request in whole [`MEMORY_STEP`]s, for messages refusing a larger one.
pub fn max_request() -> String {
    format!("{}Mi", u64::MAX / MEMORY_STEP)
}
/// The API server's limit of devices per ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The API server's limit of a string attribute's length.
pub const MAX_STRING_ATTRIBUTE: usize = 64;
/// The API server's limit of an object name (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// Attribute and capacity names (bare: the driver's own domain).
pub const ATTR_UUID: &str = "uuid";
pub const ATTR_INDEX: &str = "index";
pub const ATTR_PRODUCT: &str = "productName";
/// The slot number of a slot device (what the `slots.gpuslice.io` DeviceClass selects by).
pub const ATTR_SLOT: &str = "slot";
/// The standard NUMA node attribute, published where the inventory knows it.
pub const ATTR_NUMA: &str = "resource.kubernetes.io/numaNode";
/// The standard PCIe root complex attribute (`pci<domain>:<bus>`), published where the
/// inventory knows it: a claim aligns a GPU with a NIC by `matchAttribute` on it.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
pub const CAP_MEMORY: &str = "memory";
pub const CAP_CORES: &str = "cores";

/// The slices cannot be made for this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("node name `{name}` is not a DNS subdomain of at most {max} characters (lowercase letters, digits, `-` and `.`, starting and ending with a letter or digit); pass the Node object's name with --node-name or $NODE_NAME", max = MAX_NAME - SLICE_SUFFIX.len() - 4)]
    NodeName { name: String },
}

/// `<node>-gpuslice.io`, the first slice's name; others add `-<n>`.
pub const SLICE_SUFFIX: &str = "-gpuslice.io";

/// The slots of one GPU in slot mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotOffer {
    /// Bytes of each slot.
    pub memory: u64,
    /// Percent of compute each slot may carry.
    pub cores: u32,
    /// The slots published, ascending: those claims hold and those free.
    pub published: Vec<u32>,
}

/// What one GPU offers the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedGpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub numa_node: Option<i32>,
    /// The PCIe root complex, where the inventory knows it.
    pub pcie_root: Option<String>,
    /// Bytes not booked by node paths, rounded down to [`MEMORY_STEP`].
    pub memory: u64,
    /// Percent of compute not booked by node paths.
    pub cores: u32,
    /// The slot devices in slot mode; `None` in capacity mode.
    pub slots: Option<SlotOffer>,
}

/// The bytes of each of the `n` slots of a GPU of `total` bytes, rounded down to
/// [`MEMORY_STEP`].
pub fn slot_memory(total: u64, n: u32) -> u64 {
    total / u64::from(n.max(1)) / MEMORY_STEP * MEMORY_STEP
}

/// The percent of compute each of `n` slots may carry (their sum never exceeds 100).
pub fn slot_cores(n: u32) -> u32 {
    100 / n.max(1)
}

/// The device name of GPU `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The name of slot `j` of GPU `index`.
pub fn slot_device_name(index: u32, j: u32) -> String {
    format!("gpu-{index}-slot-{j}")
}

/// A device name of ours, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRef {
    /// `gpu-<index>`: the shared device of capacity mode.
    Gpu(u32),
    /// `gpu-<index>-slot-<j>`: a slot of slot mode.
    Slot(u32, u32),
}

fn number(digits: &str) -> Option<u32> {
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

/// The GPU index a capacity device name of ours names (`gpu-3` → 3).
pub fn device_index(name: &str) -> Option<u32> {
    number(name.strip_prefix("gpu-")?)
}

/// What a device name of ours names, either mode.
pub fn parse_device(name: &str) -> Option<DeviceRef> {
    let rest = name.strip_prefix("gpu-")?;
    match rest.split_once("-slot-") {
        Some((index, j)) => Some(DeviceRef::Slot(number(index)?, number(j)?)),
        None => Some(DeviceRef::Gpu(number(rest)?)),
    }
}

/// Whether `name` is a DNS label (RFC 1123, what a namespace is): 1–63 of `a-z0-9-`,
/// alphanumeric at both ends.
pub fn is_dns_label(name: &str) -> bool {
    is_dns_subdomain(name, 63) && !name.contains('.')
}

/// Whether `name` is a DNS subdomain (RFC 1123) of at most `max` characters.
pub fn is_dns_subdomain(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && label.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// The name of the pool's `n`-th slice.
pub fn slice_name(node: &str, n: usize) -> String {
    if n == 0 {
        format!("{node}{SLICE_SUFFIX}")
    } else {
        format!("{node}{SLICE_SUFFIX}-{n}")
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn quantity(s: String) -> Quantity {
    Quantity(s)
}

/// The attributes every device of a GPU carries, either mode.
fn attributes(g: &OfferedGpu) -> BTreeMap<String, DeviceAttribute> {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        ATTR_UUID.to_string(),
        DeviceAttribute {
            string: Some(truncate(&g.uuid, MAX_STRING_ATTRIBUTE)),
            ..Default::default()
        },
    );
    attributes.insert(
        ATTR_INDEX.to_string(),
        DeviceAttribute {
            int: Some(i64::from(g.index)),
            ..Default::default()
        },
    );
    attributes.insert(
        ATTR_PRODUCT.to_string(),
        DeviceAttribute {
            string: Some(truncate(&g.model, MAX_STRING_ATTRIBUTE)),
            ..Default::default()
        },
    );
    if let Some(n) = g.numa_node.filter(|n| *n >= 0) {
        attributes.insert(
            ATTR_NUMA.to_string(),
            DeviceAttribute {
                int: Some(i64::from(n)),
                ..Default::default()
            },
        );
    }
    if let Some(root) = g.pcie_root.as_deref().filter(|r| !r.is_empty()) {
        attributes.insert(
            ATTR_PCIE_ROOT.to_string(),
            DeviceAttribute {
                string: Some(truncate(root, MAX_STRING_ATTRIBUTE)),
                ..Default::default()
            },
        );
    }
    attributes
}

/// The devices of one offered GPU: its shared device in capacity mode, its published slots in
/// slot mode.
pub fn devices(g: &OfferedGpu) -> Vec<Device> {
    let Some(slots) = &g.slots else {
        return vec![device(g)];
    };
    let attributes = attributes(g);
    let mut capacity = BTreeMap::new();
    capacity.insert(
        CAP_MEMORY.to_string(),
        DeviceCapacity {
            value: quantity(format_kube_quantity(slots.memory)),
            request_policy: None,
        },
    );
    capacity.insert(
        CAP_CORES.to_string(),
        DeviceCapacity {
            value: quantity(slots.cores.to_string()),
            request_policy: None,
        },
    );
    slots
        .published
        .iter()
        .map(|j| Device {
            name: slot_device_name(g.index, *j),
            attributes: Some({
                let mut a = attributes.clone();
                a.insert(
                    ATTR_SLOT.to_string(),
                    DeviceAttribute {
                        int: Some(i64::from(*j)),
                        ..Default::default()
                    },
                );
                a
            }),
            capacity: Some(capacity.clone()),
            ..Default::default()
        })
        .collect()
}

/// The shared device of one offered GPU (capacity mode).
pub fn device(g: &OfferedGpu) -> Device {
    let attributes = attributes(g);
    let memory = format_kube_quantity(g.memory);
    let mut capacity = BTreeMap::new();
    capacity.insert(
        CAP_MEMORY.to_string(),
        DeviceCapacity {
            value: quantity(memory.clone()),
            request_policy: Some(CapacityRequestPolicy {
                // A request that names no memory consumes the whole GPU (as the annotation).
                default: Some(quantity(memory.clone())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: quantity(format_kube_quantity(MEMORY_STEP)),
                    step: Some(quantity(format_kube_quantity(MEMORY_STEP))),
                    max: Some(quantity(memory)),
                }),
                valid_values: None,
            }),
        },
    );
    capacity.insert(
        CAP_CORES.to_string(),
        DeviceCapacity {
            value: quantity(g.cores.to_string()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(quantity("0".into())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: quantity("0".into()),
                    step: Some(quantity("1".into())),
                    max: Some(quantity(g.cores.to_string())),
                }),
                valid_values: None,
            }),
        },
    );
    Device {
        name: device_name(g.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// The pool's slices at `generation`: devices in index order (the scheduler's first-fit
/// order), at most [`MAX_DEVICES_PER_SLICE`] a slice, at least one slice (an empty pool says
/// the node offers nothing).
pub fn build_slices(
    node: &str,
    gpus: &[OfferedGpu],
    generation: i64,
    owner: Option<&OwnerReference>,
) -> Result<Vec<ResourceSlice>, SliceError> {
    let all: Vec<Device> = gpus.iter().flat_map(devices).collect();
    let longest = slice_name(node, all.len() / MAX_DEVICES_PER_SLICE + 1);
    if !is_dns_subdomain(node, MAX_NAME) || !is_dns_subdomain(&longest, MAX_NAME) {
        return Err(SliceError::NodeName {
            name: node.to_string(),
        });
    }
    let chunks: Vec<&[Device]> = if all.is_empty() {
        vec![&[]]
    } else {
        all.chunks(MAX_DEVICES_PER_SLICE).collect()
    };
    let count = chunks.len() as i64;
    Ok(chunks
        .into_iter()
        .enumerate()
        .map(|(n, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, n)),
                owner_references: owner.map(|o| vec![o.clone()]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(chunk.to_vec()),
                ..Default::default()
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use gpuslice_config::quantity::parse_kube_quantity;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn gpu(index: u32, memory: u64) -> OfferedGpu {
        OfferedGpu {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            model: "NVIDIA H200".into(),
            numa_node: None,
            pcie_root: None,
            memory,
            cores: 100,
            slots: None,
        }
    }

    /// GPU `index` of `total` bytes in slot mode, all `n` slots free.
    fn slotted(index: u32, total: u64, n: u32) -> OfferedGpu {
        OfferedGpu {
            slots: Some(SlotOffer {
                memory: slot_memory(total, n),
                cores: slot_cores(n),
                published: (0..n).collect(),
            }),
            ..gpu(index, total)
        }
    }

    #[test]
    fn slot_mode_publishes_equal_unshared_slots_carrying_the_gpus_attributes() {
        let o = vec![
            slotted(0, 80 * 1024 * MIB, 16),
            slotted(1, 141 * 1024 * MIB, 16),
        ];
        let slices = build_slices("node-a", &o, 1, None).unwrap();
        assert_eq!(
            slices.len(),
            1,
            "8 GPUs x 16 slots fit one slice; 2 GPUs surely"
        );
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert_eq!(devices.len(), 32);
        assert_eq!(devices[0].name, "gpu-0-slot-0");
        assert_eq!(devices[31].name, "gpu-1-slot-15");
        for d in devices {
            assert_eq!(d.allow_multiple_allocations, None, "{}", d.name);
            let caps = d.capacity.as_ref().unwrap();
            assert!(caps.values().all(|c| c.request_policy.is_none()));
            let attrs = d.attributes.as_ref().unwrap();
            let DeviceRef::Slot(index, _) = parse_device(&d.name).unwrap() else {
                panic!("{}", d.name)
            };
            assert_eq!(attrs["uuid"].string, Some(o[index as usize].uuid.clone()));
            assert_eq!(attrs["index"].int, Some(i64::from(index)));
            assert_eq!(attrs["productName"].string.as_deref(), Some("NVIDIA H200"));
            let want = if index == 0 {
                5 * 1024 * MIB
            } else {
                slot_memory(141 << 30, 16)
            };
            assert_eq!(parse_kube_quantity(&caps["memory"].value.0).unwrap(), want);
            assert_eq!(caps["cores"].value.0, "6");
        }
        // 141 GiB / 16, rounded down to whole MiB.
        assert_eq!(slot_memory(141 << 30, 16), 9024 * MIB);
        // 8 GPUs of 16 slots: one slice of 128; 9 GPUs: two.
        let o: Vec<OfferedGpu> = (0..9).map(|i| slotted(i, 80 << 30, 16)).collect();
        let sizes: Vec<usize> = build_slices("n", &o, 1, None)
            .unwrap()
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 16]);
    }

    #[test]
    fn slices_respect_the_api_servers_limits() {
        // 300 GPUs: 128 + 128 + 44 devices, one pool of three slices.
        let o: Vec<OfferedGpu> = (0..300).map(|i| gpu(i, 16 << 30)).collect();
        let slices = build_slices("n1", &o, 1, None).unwrap();
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 128, 44]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));
        assert_eq!(slices[2].metadata.name.as_deref(), Some("n1-gpuslice.io-2"));
        // Device names are DNS labels and read back to their index.
        for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            assert!(is_dns_label(&d.name));
            assert!(device_index(&d.name).is_some());
        }
        // A long model name is cut to the API server's 64 characters, on a char boundary.
        let mut long = gpu(0, 16 << 30);
        long.model = "é".repeat(40);
        let d = device(&long);
        let p = d.attributes.unwrap()["productName"].string.clone().unwrap();
        assert!(
            p.len() <= MAX_STRING_ATTRIBUTE && p.chars().all(|c| c == 'é'),
            "{p}"
        );
        // Node names the API server would refuse in a slice name.
        for bad in ["", "Node", "-a", "a_b", &"a".repeat(250)] {
            let e = build_slices(bad, &[], 1, None).unwrap_err();
            assert!(e.to_string().contains("--node-name"), "{e}");
        }
        // An empty pool still publishes one (empty) slice.
        let empty = build_slices("n1", &[], 2, None).unwrap();
        assert_eq!(empty.len(), 1);
        assert!(empty[0].spec.devices.as_ref().unwrap().is_empty());
    }

    #[test]
    fn device_names_read_back() {
        assert_eq!(device_name(7), "gpu-7");
        assert_eq!(device_index("gpu-7"), Some(7));
        assert_eq!(device_index("gpu-10"), Some(10));
        for bad in [
            "gpu-",
            "gpu-07",
            "gpu--1",
            "gpu-1a",
            "cpu-1",
            "gpu-99999999999",
        ] {
            assert_eq!(device_index(bad), None, "{bad}");
        }
    }

    #[test]
    fn slot_names_read_back() {
        assert_eq!(slot_device_name(3, 15), "gpu-3-slot-15");
        assert_eq!(parse_device("gpu-3-slot-15"), Some(DeviceRef::Slot(3, 15)));
        assert_eq!(parse_device("gpu-3"), Some(DeviceRef::Gpu(3)));
        for bad in [
            "gpu-3-slot-",
            "gpu-3-slot-01",
            "gpu--slot-1",
            "gpu-3-slot-1-x",
            "gpu-3-slots-1",
        ] {
            assert_eq!(parse_device(bad), None, "{bad}");
        }
    }
}
