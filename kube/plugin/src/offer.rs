//! What each GPU of the node offers the scheduler under the publication mode in effect: only
//! what the node paths (annotations, whole GPUs of the node CDI spec) and the claims the
//! scheduler cannot see in this mode have not booked in the registry. The slices carrying the
//! offer are built by `gpuslice_dra::slices`. A GPU the driver reported unhealthy
//! (`health.json`), and every GPU while that record exists but cannot be read, carries the
//! device taint [`UNHEALTHY_TAINT`], or is withdrawn where the API server keeps no device
//! taints.

use std::collections::{BTreeMap, BTreeSet};

use gpuslice_config::TaintEffect;
use gpuslice_dra::slices::{slot_cores, slot_memory, OfferedGpu, SlotOffer, MEMORY_STEP};
use gpuslice_driver::health::{find, Unhealthy};
use gpuslice_registry::{claim_uid, gpu_loads, Inventory, Reservation};

/// The key of the device taint an unhealthy GPU carries.
pub const UNHEALTHY_TAINT: &str = "gpuslice.io/unhealthy";

/// The taint value of every GPU while the health record cannot be read.
pub const RECORD_UNREADABLE: &str = "health-record-unreadable";

/// What the node's health record (`health.json`) says of its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeHealth {
    /// The record as read (none listed: no record, or every GPU healthy).
    Read(Vec<Unhealthy>),
    /// The record exists but cannot be read: any GPU may be unhealthy, so none is offered
    /// to new claims, as the create path and the plugin's prepare refuse them meanwhile.
    Unreadable {
        /// Why, naming the record's path.
        error: String,
        /// When it was first found unreadable, whole seconds since the Unix epoch.
        since_s: i64,
    },
}

impl NodeHealth {
    /// The GPUs the record lists unhealthy; none while it cannot be read.
    pub fn listed(&self) -> &[Unhealthy] {
        match self {
            NodeHealth::Read(list) => list,
            NodeHealth::Unreadable { .. } => &[],
        }
    }

    /// Whether any GPU is kept from new claims.
    pub fn any_unavailable(&self) -> bool {
        !matches!(self, NodeHealth::Read(list) if list.is_empty())
    }
}

/// Why a GPU's devices carry [`UNHEALTHY_TAINT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintReason {
    /// The driver reported this fatal XID for the GPU.
    Xid(u32),
    /// The health record cannot be read, so the GPU's health is not known.
    RecordUnreadable,
}

impl TaintReason {
    /// The taint's value: `xid-<N>`, or [`RECORD_UNREADABLE`].
    pub fn value(self) -> String {
        match self {
            TaintReason::Xid(xid) => format!("xid-{xid}"),
            TaintReason::RecordUnreadable => RECORD_UNREADABLE.to_string(),
        }
    }
}

/// The taint of one unavailable GPU's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthTaint {
    /// The GPU's index (its devices are `gpu-<index>` and `gpu-<index>-slot-<j>`).
    pub index: u32,
    pub reason: TaintReason,
    /// When the XID was reported, or the record first found unreadable: whole seconds since
    /// the Unix epoch (as the API server keeps a taint's `timeAdded`).
    pub since_s: i64,
    pub effect: TaintEffect,
}

/// What is published of `gpus` given the node's `health`: where the API server keeps device
/// taints, every GPU, and a taint for each unavailable one; where it does not, only the
/// available GPUs. An unhealthy GPU's taint has `effect` (`health.taint_effect`); while the
/// record cannot be read every GPU's taint is `NoSchedule`, whatever `effect` says: nothing is
/// known to be wrong with the GPUs, and running containers are left alone (as the node paths
/// leave them).
pub fn with_health(
    mut gpus: Vec<OfferedGpu>,
    health: &NodeHealth,
    taints_kept: bool,
    effect: TaintEffect,
) -> (Vec<OfferedGpu>, Vec<HealthTaint>) {
    let taint_of = |g: &OfferedGpu| match health {
        NodeHealth::Read(list) => find(list, &g.uuid).map(|u| HealthTaint {
            index: g.index,
            reason: TaintReason::Xid(u.xid),
            since_s: i64::try_from(u.since_ms / 1000).unwrap_or(i64::MAX),
            effect,
        }),
        NodeHealth::Unreadable { since_s, .. } => Some(HealthTaint {
            index: g.index,
            reason: TaintReason::RecordUnreadable,
            since_s: *since_s,
            effect: TaintEffect::NoSchedule,
        }),
    };
    if !taints_kept {
        gpus.retain(|g| taint_of(g).is_none());
        return (gpus, Vec::new());
    }
    let taints = gpus.iter().filter_map(taint_of).collect();
    (gpus, taints)
}

/// How the GPUs are published: the mode in effect (`dra.mode` resolved against what the API
/// server keeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    /// One shared device per GPU with consumable capacities.
    Capacity,
    /// This many unshared slot devices per GPU.
    Slots(u32),
}

impl std::fmt::Display for Publication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Publication::Capacity => write!(f, "capacity mode (one shared device per GPU)"),
            Publication::Slots(n) => write!(f, "slot mode ({n} slot devices per GPU)"),
        }
    }
}

/// What a prepared claim holds on this node, as its allocation names it: the publisher offers
/// the scheduler only what it cannot see otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Shared capacity devices (`gpu-<index>`).
    Capacity,
    /// Slot devices, as (GPU index, slot).
    Slots(Vec<(u32, u32)>),
}

/// What each GPU of `inventory` offers in capacity mode when every claim holds capacity
/// devices: its memory and compute minus what reservations not held by claims book on it.
pub fn offered(inventory: &Inventory, reservations: &[Reservation]) -> Vec<OfferedGpu> {
    let held: BTreeMap<String, Held> = reservations
        .iter()
        .filter_map(|r| claim_uid(r).map(|u| (u.to_string(), Held::Capacity)))
        .collect();
    offer(inventory, reservations, Publication::Capacity, &held)
}

/// What each GPU of `inventory` offers under `publication`: its memory and compute minus what
/// the scheduler cannot see in this mode — the node paths' reservations, and claims that hold
/// devices of the other mode (a cluster that changed mode) or whose devices are not yet known
/// (`held` lacks them). Claims on devices of this mode are the scheduler's own bookkeeping; in
/// slot mode the slots they hold stay published, so the scheduler counts them. A GPU with
/// nothing left to offer (booked whole, say) is not offered.
pub fn offer(
    inventory: &Inventory,
    reservations: &[Reservation],
    publication: Publication,
    held: &BTreeMap<String, Held>,
) -> Vec<OfferedGpu> {
    let mut held_slots: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let foreign: Vec<Reservation> = reservations
        .iter()
        .filter(|r| {
            let Some(uid) = claim_uid(r) else {
                return true;
            };
            match (held.get(uid), publication) {
                (Some(Held::Capacity), Publication::Capacity) => false,
                (Some(Held::Slots(list)), Publication::Slots(_)) => {
                    for (index, j) in list {
                        held_slots.entry(*index).or_default().insert(*j);
                    }
                    false
                }
                _ => true,
            }
        })
        .cloned()
        .collect();
    let loads = gpu_loads(&foreign);
    let mut out: Vec<OfferedGpu> = inventory
        .gpus
        .iter()
        .filter_map(|g| {
            let load = loads.get(&g.uuid).copied().unwrap_or_default();
            if load.whole {
                return None;
            }
            let memory = g.memory_total.saturating_sub(load.memory) / MEMORY_STEP * MEMORY_STEP;
            let slots = match publication {
                Publication::Capacity => None,
                Publication::Slots(n) => {
                    let size = slot_memory(g.memory_total, n);
                    if size < MEMORY_STEP {
                        return None;
                    }
                    let mine = held_slots.get(&g.index).cloned().unwrap_or_default();
                    let taken = u64::try_from(mine.len()).unwrap_or(u64::MAX);
                    let free_memory = g
                        .memory_total
                        .saturating_sub(load.memory)
                        .saturating_sub(taken.saturating_mul(size));
                    // A slot promises its share of compute too: the node paths' cores take
                    // whole slots as their memory does.
                    // (Slots of more than 100 a GPU promise none.)
                    let per = u64::from(slot_cores(n));
                    let by_cores = 100u64
                        .saturating_sub(u64::from(load.cores))
                        .saturating_sub(taken.saturating_mul(per))
                        .checked_div(per)
                        .unwrap_or(u64::MAX);
                    let free = (free_memory / size)
                        .min(by_cores)
                        .min(u64::from(n).saturating_sub(taken));
                    let mut published = mine.clone();
                    published.extend(
                        (0..n)
                            .filter(|j| !mine.contains(j))
                            .take(usize::try_from(free).unwrap_or(usize::MAX)),
                    );
                    if published.is_empty() {
                        return None;
                    }
                    Some(SlotOffer {
                        memory: size,
                        cores: slot_cores(n),
                        published: published.into_iter().collect(),
                    })
                }
            };
            (memory >= MEMORY_STEP || slots.is_some()).then(|| OfferedGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                numa_node: g.numa_node,
                pcie_root: g.pcie_root.clone(),
                memory,
                cores: 100u32.saturating_sub(load.cores),
                slots,
            })
        })
        .collect();
    out.sort_by_key(|g| g.index);
    out
}

#[cfg(test)]
mod tests {
    use gpuslice_registry::{Booking, Gpu, Owner, ReservationState};

    use gpuslice_config::quantity::parse_kube_quantity;
    use gpuslice_dra::slices::{build_slices, ATTR_NUMA, ATTR_PCIE_ROOT};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn gpu(index: u32, memory_total: u64) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            model: "NVIDIA H200".into(),
            memory_total,
            minor: index,
            pci_bus_id: None,
            numa_node: (index == 1).then_some(1),
            pcie_root: (index == 1).then(|| "pci0000:16".to_string()),
        }
    }

    fn reservation(owner: Owner, whole: bool, uuid: &str, memory: u64, cores: u8) -> Reservation {
        Reservation {
            id: "0123456789abcdef".into(),
            state: ReservationState::Bound,
            owner,
            whole_gpu: whole,
            gpus: vec![Booking {
                index: 0,
                uuid: uuid.into(),
                memory,
                cores,
                unknown: Default::default(),
            }],
            created_ms: 0,
            deadline_ms: None,
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        }
    }

    #[test]
    fn capacity_is_what_node_paths_left_rounded_down_to_the_step() {
        // 141 GiB plus half a MiB: rounded down to whole MiB.
        let inv = Inventory {
            gpus: vec![
                gpu(0, 141 * 1024 * MIB + MIB / 2),
                gpu(1, 80 * 1024 * MIB),
                gpu(2, 8 * 1024 * MIB),
            ],
        };
        let claim = Owner::DraClaim {
            claim_uid: "u".into(),
            namespace: "n".into(),
            members: Vec::new(),
            name: "c".into(),
            gone: None,
        };
        let held = vec![
            // An annotation slice: subtracted.
            reservation(
                Owner::container(),
                false,
                &inv.gpus[1].uuid,
                10 * 1024 * MIB + 3,
                30,
            ),
            // A claim: the scheduler counts it itself.
            reservation(claim, false, &inv.gpus[0].uuid, 20 * 1024 * MIB, 50),
            // A whole GPU from the node CDI spec: not offered at all.
            reservation(
                Owner::container(),
                true,
                &inv.gpus[2].uuid,
                8 * 1024 * MIB,
                100,
            ),
        ];
        let o = offered(&inv, &held);
        assert_eq!(o.len(), 2);
        assert_eq!(o[0].memory, 141 * 1024 * MIB);
        assert_eq!(o[0].cores, 100);
        assert_eq!(
            o[1].memory,
            70 * 1024 * MIB - MIB,
            "10 GiB + 3 bytes taken, rounded down"
        );
        assert_eq!(o[1].cores, 70);
        let slices = build_slices("node-a", &o, 4, None).unwrap();
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("node-a-gpuslice.io"));
        assert_eq!(s.spec.driver, "gpuslice.io");
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.pool.generation, 4);
        assert_eq!(s.spec.pool.resource_slice_count, 1);
        let devices = s.spec.devices.as_ref().unwrap();
        assert_eq!(devices[0].name, "gpu-0");
        assert_eq!(devices[0].allow_multiple_allocations, Some(true));
        let attrs = devices[1].attributes.as_ref().unwrap();
        assert_eq!(attrs["index"].int, Some(1));
        assert_eq!(attrs["productName"].string.as_deref(), Some("NVIDIA H200"));
        assert_eq!(attrs[ATTR_NUMA].int, Some(1));
        assert_eq!(attrs[ATTR_PCIE_ROOT].string.as_deref(), Some("pci0000:16"));
        let unknown = devices[0].attributes.as_ref().unwrap();
        assert!(!unknown.contains_key(ATTR_NUMA) && !unknown.contains_key(ATTR_PCIE_ROOT));
        // The API server's rule: default and max are multiples of the step, within value.
        for d in devices {
            let cap = d.capacity.as_ref().unwrap();
            let mem = &cap["memory"];
            let value = parse_kube_quantity(&mem.value.0).unwrap();
            let policy = mem.request_policy.as_ref().unwrap();
            let range = policy.valid_range.as_ref().unwrap();
            let step = parse_kube_quantity(&range.step.as_ref().unwrap().0).unwrap();
            assert_eq!(step, MIB);
            assert_eq!(parse_kube_quantity(&range.min.0).unwrap(), MIB);
            let max = parse_kube_quantity(&range.max.as_ref().unwrap().0).unwrap();
            let default = parse_kube_quantity(&policy.default.as_ref().unwrap().0).unwrap();
            assert_eq!(max % step, 0);
            assert_eq!(default % step, 0);
            assert!(max <= value && default <= value);
            let cores = &cap["cores"];
            let cp = cores.request_policy.as_ref().unwrap();
            assert_eq!(cp.default.as_ref().unwrap().0, "0");
            assert_eq!(
                cp.valid_range.as_ref().unwrap().max.as_ref().unwrap().0,
                cores.value.0
            );
        }
        assert_eq!(devices[1].capacity.as_ref().unwrap()["cores"].value.0, "70");
    }

    fn claim_owner(uid: &str) -> Owner {
        Owner::DraClaim {
            claim_uid: uid.into(),
            namespace: "n".into(),
            members: Vec::new(),
            name: "c".into(),
            gone: None,
        }
    }

    #[test]
    fn an_unhealthy_gpu_is_tainted_or_withdrawn() {
        let inv = Inventory {
            gpus: vec![gpu(0, 16 * 1024 * MIB), gpu(1, 16 * 1024 * MIB)],
        };
        let gpus = offered(&inv, &[]);
        let sick = vec![Unhealthy {
            index: 1,
            uuid: inv.gpus[1].uuid.clone(),
            xid: 79,
            since_ms: 1_796_000_000_999,
            recovery_seen: false,
        }];
        let sick = NodeHealth::Read(sick);
        let (kept, taints) = with_health(gpus.clone(), &sick, true, TaintEffect::NoSchedule);
        assert_eq!(kept, gpus, "tainted, still published");
        assert_eq!(
            taints,
            [HealthTaint {
                index: 1,
                reason: TaintReason::Xid(79),
                since_s: 1_796_000_000,
                effect: TaintEffect::NoSchedule
            }]
        );
        let (kept, taints) = with_health(gpus.clone(), &sick, false, TaintEffect::NoSchedule);
        assert_eq!(kept.iter().map(|g| g.index).collect::<Vec<_>>(), [0]);
        assert!(taints.is_empty());
        let none = NodeHealth::Read(Vec::new());
        assert!(!none.any_unavailable());
        let (kept, taints) = with_health(gpus.clone(), &none, true, TaintEffect::NoExecute);
        assert_eq!((kept, taints), (gpus, Vec::new()));
    }

    #[test]
    fn every_gpu_is_tainted_or_withdrawn_while_the_health_record_cannot_be_read() {
        let inv = Inventory {
            gpus: vec![gpu(0, 16 * 1024 * MIB), gpu(1, 16 * 1024 * MIB)],
        };
        let gpus = offered(&inv, &[]);
        let unreadable = NodeHealth::Unreadable {
            error: "/run/gpuslice/health.json is not a valid GPU health record".into(),
            since_s: 1_796_000_000,
        };
        assert!(unreadable.any_unavailable());
        assert!(unreadable.listed().is_empty());
        // NoSchedule whatever health.taint_effect says: no GPU is known to be unhealthy.
        let (kept, taints) = with_health(gpus.clone(), &unreadable, true, TaintEffect::NoExecute);
        assert_eq!(kept, gpus, "tainted, still published");
        let each = |index| HealthTaint {
            index,
            reason: TaintReason::RecordUnreadable,
            since_s: 1_796_000_000,
            effect: TaintEffect::NoSchedule,
        };
        assert_eq!(taints, [each(0), each(1)]);
        assert_eq!(taints[0].reason.value(), "health-record-unreadable");
        let (kept, taints) = with_health(gpus, &unreadable, false, TaintEffect::NoSchedule);
        assert!(kept.is_empty(), "every GPU withdrawn: {kept:?}");
        assert!(taints.is_empty());
    }

    #[test]
    fn slots_others_hold_are_withdrawn_and_slots_claims_hold_stay_published() {
        let inv = Inventory {
            gpus: vec![
                gpu(0, 16 * 1024 * MIB),
                gpu(1, 16 * 1024 * MIB),
                gpu(2, 16 * 1024 * MIB),
            ],
        };
        // 4 slots of 4 GiB per GPU.
        let held: BTreeMap<String, Held> = [
            ("slot-claim".to_string(), Held::Slots(vec![(0, 0), (0, 2)])),
            ("cap-claim".to_string(), Held::Capacity),
        ]
        .into_iter()
        .collect();
        let reservations = vec![
            // The claim on slots 0 and 2 of GPU 0 (8 GiB).
            reservation(
                claim_owner("slot-claim"),
                false,
                &inv.gpus[0].uuid,
                8 << 30,
                0,
            ),
            // An annotation slice of 5 GiB on GPU 0: two slots' worth (rounded up) go.
            reservation(Owner::container(), false, &inv.gpus[0].uuid, 5 << 30, 0),
            // A claim of capacity mode (before the cluster changed mode): 4 GiB of GPU 1.
            reservation(
                claim_owner("cap-claim"),
                false,
                &inv.gpus[1].uuid,
                4 << 30,
                0,
            ),
            // A claim not read back yet: taken, whatever it is.
            reservation(claim_owner("unknown"), false, &inv.gpus[1].uuid, 1 << 30, 0),
            // A whole GPU of the node CDI spec.
            reservation(Owner::container(), true, &inv.gpus[2].uuid, 16 << 30, 100),
        ];
        let o = offer(&inv, &reservations, Publication::Slots(4), &held);
        let published: Vec<(u32, Vec<u32>)> = o
            .iter()
            .map(|g| (g.index, g.slots.as_ref().unwrap().published.clone()))
            .collect();
        // GPU 0: slots 0 and 2 (held) stay, 16-8-5 = 3 GiB left: no free slot.
        // GPU 1: 16-4-1 = 11 GiB: two free slots, the lowest.
        // GPU 2: booked whole: not offered.
        assert_eq!(published, [(0, vec![0, 2]), (1, vec![0, 1])]);
        // In capacity mode the slot claim is what the scheduler cannot see.
        let o = offer(&inv, &reservations, Publication::Capacity, &held);
        assert_eq!(o[0].memory, 3 << 30);
        assert_eq!(
            o[1].memory,
            15 << 30,
            "the capacity claim is the scheduler's; the unknown one is taken"
        );
        assert!(o.iter().all(|g| g.slots.is_none()));
    }

    /// A slot promises 100 / N percent of compute: the cores the node paths hold take whole
    /// slots as their memory does, so no set of published slots asks more than is free.
    #[test]
    fn slots_withdraw_the_cores_node_paths_hold() {
        let inv = Inventory {
            gpus: vec![gpu(0, 16 * 1024 * MIB), gpu(1, 16 * 1024 * MIB)],
        };
        let held: BTreeMap<String, Held> = [("slot-claim".to_string(), Held::Slots(vec![(1, 3)]))]
            .into_iter()
            .collect();
        let reservations = vec![
            // GPU 0: 1 GiB at 80 % of compute: 20 % left, no 25 % slot fits.
            reservation(Owner::container(), false, &inv.gpus[0].uuid, 1 << 30, 80),
            // GPU 1: 1 GiB at 30 %: with the claim's slot (its 25 %), one more slot fits.
            reservation(Owner::container(), false, &inv.gpus[1].uuid, 1 << 30, 30),
            reservation(
                claim_owner("slot-claim"),
                false,
                &inv.gpus[1].uuid,
                4 << 30,
                25,
            ),
        ];
        let o = offer(&inv, &reservations, Publication::Slots(4), &held);
        let published: Vec<(u32, Vec<u32>)> = o
            .iter()
            .map(|g| (g.index, g.slots.as_ref().unwrap().published.clone()))
            .collect();
        // GPU 1 promises 2 × 25 % beside the node paths' 30 %.
        assert_eq!(published, [(1, vec![0, 3])]);
        // Slots of more than 100 a GPU promise no compute: cores withdraw none of them.
        let o = offer(
            &inv,
            &reservations[..1],
            Publication::Slots(128),
            &BTreeMap::new(),
        );
        assert_eq!(o[0].slots.as_ref().unwrap().cores, 0);
        assert_eq!(o[0].slots.as_ref().unwrap().published.len(), 120);
    }
}
