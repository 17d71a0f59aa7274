//! The registry's persistent data: what `registry.json` and each slice's `reservation.json`
//! hold. Plain serde types; behaviour lives in the modules that use them.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The fields of a persisted object this build does not know, as read: those of a newer build
/// that added them without a new version. Kept and written back beside the known ones (a
/// `#[serde(flatten)]` field), so a build rolled back to, which reads and rewrites the
/// registry and the slice records, loses none of them and the newer build finds them again.
/// Empty in what this build makes: one pointer, nothing allocated while no field is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Unknown(Option<Box<Map<String, Value>>>);

impl FromIterator<(String, Value)> for Unknown {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(fields: I) -> Unknown {
        let map: Map<String, Value> = fields.into_iter().collect();
        Unknown((!map.is_empty()).then(|| Box::new(map)))
    }
}

impl Serialize for Unknown {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.0.as_deref();
        let mut map = serializer.serialize_map(fields.map(Map::len))?;
        for (name, value) in fields.into_iter().flatten() {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Unknown {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Unknown, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Unknown;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("fields of a newer build")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<Unknown, A::Error> {
                let mut kept: Option<Box<Map<String, Value>>> = None;
                while let Some((name, value)) = fields.next_entry::<String, Value>()? {
                    kept.get_or_insert_default().insert(name, value);
                }
                Ok(Unknown(kept))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// The `registry.json` version this build reads and writes: [`RegistryFile`] as serde_json
/// writes it (version 2 stored reservations as arrays; it is refused, like any other).
pub const REGISTRY_VERSION: u32 = 3;

/// One GPU of the node, as taken by `gpuslice cdi generate` (NVML or the simulated list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-<uuid>`: the stable identity bookings refer to.
    pub uuid: String,
    pub model: String,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// The PCIe root complex (`pci<domain>:<bus>`), where sysfs tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
}

/// The node's GPUs, cached in the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
}

impl Inventory {
    /// The GPU with this UUID (bookings copy the inventory's spelling, so this is exact).
    pub fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// Whether a reservation is tied to a running owner yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationState {
    /// Reserved at create time, not yet bound to a container's process; reaped after its
    /// deadline.
    Pending,
    /// Held by a live owner: a container's process, or a DRA claim.
    Bound,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Pending => "pending",
            ReservationState::Bound => "bound",
        }
    }
}

impl fmt::Display for ReservationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A process instance: a pid is only the same process while start time and boot id match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id` when the process was seen.
    pub boot_id: String,
    /// The cgroup the process was in when seen, relative to the cgroup root (`pids/x/y` on
    /// cgroup v1, `unified/x/y` on a hybrid host's v2 tree, `x/y` on v2). An owner bound to
    /// a container's init lives while this cgroup still holds processes, also after init
    /// exited (a container without its own pid namespace leaves its children running).
    /// Absent for older records, for processes in a root cgroup, and where the cgroup held
    /// other processes when the container was recorded (not the container's own to follow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl ProcessRef {
    /// The same process instance: pid, start time and boot id match (the cgroup it was
    /// seen in is not part of its identity).
    pub fn same_process(&self, other: &ProcessRef) -> bool {
        self.pid == other.pid
            && self.start_time == other.start_time
            && self.boot_id == other.boot_id
    }
}

/// Where a container sits in Kubernetes, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesRef {
    pub namespace: String,
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    pub container: String,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// Who holds a reservation, and so what keeps it alive.
///
/// Serialised internally tagged: `"kind": "container"` or `"dra_claim"` beside the
/// variant's fields; a field of the other kind is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Owner {
    /// A container: pending until bound to its init process, then held while that process
    /// lives.
    Container {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process: Option<ProcessRef>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kubernetes: Option<KubernetesRef>,
    },
    /// A Kubernetes DRA claim: held from the kubelet's prepare to its unprepare, whatever its
    /// containers do; released, never reaped, while the claim exists (see `gone`).
    DraClaim {
        claim_uid: String,
        namespace: String,
        name: String,
        /// The containers the claim's CDI spec was applied to, each recorded host-side by
        /// the spec's `createRuntime` hook (init pid, start time, boot id and cgroup, read
        /// from `/proc`): what the node agent attributes the claim's GPU processes by.
        /// Entries whose process and cgroup are gone are dropped when another joins.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<ProcessRef>,
        /// Set when the claim left the API server (deleted, re-created under another UID, or
        /// no longer allocated here) while containers it was given to still ran: the booking
        /// stays, offered to no one, until the last of those `members` has exited, and is then
        /// reaped like a container's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gone: Option<ClaimGone>,
    },
}

/// Why, and since when, a claim's booking is held by its running containers alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimGone {
    /// Unix milliseconds when the plugin found the claim gone.
    pub since_ms: u64,
    /// What the API server said, one line (`the claim no longer exists`, …).
    pub why: String,
}

impl Owner {
    /// A container owner known by nothing yet (the usual create-time request).
    pub fn container() -> Owner {
        Owner::Container {
            container_id: None,
            process: None,
            kubernetes: None,
        }
    }

    /// The container id, once known.
    pub fn container_id(&self) -> Option<&str> {
        match self {
            Owner::Container { container_id, .. } => container_id.as_deref(),
            Owner::DraClaim { .. } => None,
        }
    }

    /// The process that keeps this reservation alive, if any.
    pub fn process(&self) -> Option<&ProcessRef> {
        match self {
            Owner::Container { process, .. } => process.as_ref(),
            Owner::DraClaim { .. } => None,
        }
    }

    /// Why a claim's booking outlives its claim, when it does.
    pub fn claim_gone(&self) -> Option<&ClaimGone> {
        match self {
            Owner::DraClaim { gone, .. } => gone.as_ref(),
            Owner::Container { .. } => None,
        }
    }

    /// The container init processes whose containers hold this reservation's slice, as
    /// recorded host-side: a container's own init, or every container a claim was given to.
    pub fn processes(&self) -> &[ProcessRef] {
        match self {
            Owner::Container { process, .. } => process.as_slice(),
            Owner::DraClaim { members, .. } => members,
        }
    }
}

impl fmt::Display for Owner {
    /// Short human form: `ns/pod/container`, the container id, or `claim ns/name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Container {
                kubernetes: Some(k),
                ..
            } => {
                write!(f, "{}/{}/{}", k.namespace, k.pod, k.container)
            }
            Owner::Container {
                container_id: Some(id),
                ..
            } => f.write_str(id),
            Owner::Container { .. } => f.write_str("-"),
            Owner::DraClaim {
                namespace, name, ..
            } => write!(f, "claim {namespace}/{name}"),
        }
    }
}

/// What a reservation holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Booking {
    /// The GPU's index when booked (kept in step with the inventory; for display).
    pub index: u32,
    pub uuid: String,
    /// Bytes booked.
    pub memory: u64,
    /// Compute share in percent; 0 when none is booked.
    pub cores: u8,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// One reservation: a slice of one or more GPUs held by an owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// 16 lowercase hex characters.
    pub id: String,
    pub state: ReservationState,
    pub owner: Owner,
    /// A whole-GPU booking (CDI `gpuslice.io/gpu=…`): nothing else may share its GPUs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_gpu: bool,
    pub gpus: Vec<Booking>,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// A pending reservation not bound by then is reaped (unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_ms: Option<u64>,
    /// The process that made a container's pending reservation (the runtime wrapper or the
    /// precreate hook). While it lives, only its descendants may bind the reservation, and
    /// it may give back what it reserved when the runtime fails before any hook bound it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_by: Option<ProcessRef>,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// Running totals for the exporter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    #[serde(default)]
    pub reserved_total: u64,
    #[serde(default)]
    pub released_total: u64,
    #[serde(default)]
    pub reaped_total: u64,
    /// Refused requests by reason (`no-fit`, `bad-selector`, `bad-request`, `no-inventory`,
    /// `unhealthy`).
    #[serde(default)]
    pub refused_total: BTreeMap<String, u64>,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// The whole of `registry.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryFile {
    pub version: u32,
    #[serde(default)]
    pub inventory: Inventory,
    #[serde(default)]
    pub reservations: Vec<Reservation>,
    #[serde(default)]
    pub counters: Counters,
    /// When every bound owner's start time was last read (unix ms). Until `recheck` later,
    /// operations only probe that the pids exist; processes added since were verified when
    /// added.
    #[serde(default)]
    pub processes_checked_ms: u64,
    /// Fields of a newer build ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl Default for RegistryFile {
    fn default() -> Self {
        RegistryFile {
            version: REGISTRY_VERSION,
            inventory: Inventory::default(),
            reservations: Vec::new(),
            counters: Counters::default(),
            processes_checked_ms: 0,
            unknown: Unknown::default(),
        }
    }
}

impl RegistryFile {
    /// The reservation with this id.
    pub fn reservation(&self, id: &str) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_serialises_as_tagged_variant() {
        let o = Owner::Container {
            container_id: Some("c1".into()),
            process: Some(ProcessRef {
                pid: 7,
                start_time: 9,
                boot_id: "b".into(),
                cgroup: None,
                unknown: Unknown::default(),
            }),
            kubernetes: None,
        };
        let v = serde_json::to_value(&o).expect("serialise");
        assert_eq!(v["kind"], "container");
        assert_eq!(v["process"]["pid"], 7);
        assert!(v.get("kubernetes").is_none());
        let d = Owner::DraClaim {
            claim_uid: "u".into(),
            namespace: "ns".into(),
            members: Vec::new(),
            name: "n".into(),
            gone: Some(ClaimGone {
                since_ms: 5,
                why: "the claim no longer exists".into(),
            }),
        };
        let back: Owner =
            serde_json::from_value(serde_json::to_value(&d).expect("ser")).expect("de");
        assert_eq!(back, d);
        assert_eq!(d.to_string(), "claim ns/n");
        assert_eq!(Owner::container().to_string(), "-");
        for bad in [
            r#"{"kind":"dra_claim","claim_uid":"u","namespace":"n"}"#,
            r#"{"kind":"container","name":"x"}"#,
            r#"{"kind":"pod"}"#,
            r#"{"container_id":"c"}"#,
        ] {
            assert!(serde_json::from_str::<Owner>(bad).is_err(), "{bad}");
        }
        let c: Owner = serde_json::from_str(r#"{"kind":"container"}"#).expect("bare container");
        assert_eq!(c, Owner::container());
    }

    #[test]
    fn minimal_file_parses_with_defaults() {
        let text = format!(r#"{{"version":{REGISTRY_VERSION}}}"#);
        let f: RegistryFile = serde_json::from_str(&text).expect("parses");
        assert_eq!(f, RegistryFile::default());
    }
}
