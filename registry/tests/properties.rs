//! Property test (acceptance 1): random sequences of reserve, bind, release, release by
//! container, gc, process deaths, pid reuse, clock jumps and reboots against a fake system.
//! After every step: the file parses, booked memory and cores stay within capacity (×
//! overcommit), whole GPUs stay exclusive, ids are unique and never reissued, release is
//! idempotent, no dead owner survives an operation, refusals are real and the slice
//! directories match the registry.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{state_dir, GI};
use gpuslice_config::{PlacementConfig, Policy, Quantity};
use gpuslice_registry::{
    place, read_registry, violations, FakeSystem, Gpu, Inventory, Options, Owner, RefusalReason,
    Registry, RegistryError, Request, Selector, System, RECORD_FILE,
};
use proptest::prelude::*;

const PIDS: [u32; 4] = [100, 101, 102, 103];
const CONTAINERS: [&str; 3] = ["c0", "c1", "c2"];

#[derive(Debug, Clone)]
enum OwnerChoice {
    Pending,
    Process(usize),
    Claim,
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        gpus: u32,
        memory: Option<Quantity>,
        cores: u8,
        selector: Option<u32>,
        whole: bool,
        owner: OwnerChoice,
        container: Option<usize>,
    },
    Bind {
        pick: usize,
        pid: usize,
        container: usize,
    },
    Release {
        pick: usize,
    },
    ReleaseContainer {
        container: usize,
    },
    Gc,
    Kill {
        pid: usize,
    },
    Respawn {
        pid: usize,
    },
    Advance {
        ms: u64,
    },
    Reboot,
}

fn memory() -> impl Strategy<Value = Option<Quantity>> {
    prop_oneof![
        1 => Just(None),
        4 => (1u64..=24).prop_map(|half_gi| Some(Quantity::Bytes(half_gi * (GI / 2)))),
        2 => (1u8..=100).prop_map(|p| Some(Quantity::Percent(p))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let reserve = (
        prop_oneof![6 => Just(1u32), 2 => Just(2u32), 1 => Just(3u32)],
        memory(),
        prop_oneof![Just(0u8), (1u8..=10).prop_map(|c| c * 10), 0u8..=100],
        proptest::option::weighted(0.2, 0u32..4),
        proptest::bool::weighted(0.1),
        prop_oneof![
            5 => Just(OwnerChoice::Pending),
            2 => (0..PIDS.len()).prop_map(OwnerChoice::Process),
            1 => Just(OwnerChoice::Claim),
        ],
        proptest::option::of(0..CONTAINERS.len()),
    )
        .prop_map(
            |(gpus, memory, cores, selector, whole, owner, container)| Op::Reserve {
                gpus,
                memory,
                cores,
                selector,
                whole,
                owner,
                container,
            },
        );
    prop_oneof![
        8 => reserve,
        4 => (any::<usize>(), 0..PIDS.len(), 0..CONTAINERS.len())
            .prop_map(|(pick, pid, container)| Op::Bind { pick, pid, container }),
        4 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => (0..CONTAINERS.len()).prop_map(|container| Op::ReleaseContainer { container }),
        1 => Just(Op::Gc),
        2 => (0..PIDS.len()).prop_map(|pid| Op::Kill { pid }),
        1 => (0..PIDS.len()).prop_map(|pid| Op::Respawn { pid }),
        2 => prop_oneof![0u64..2_000, 50_000u64..200_000].prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Reboot),
    ]
}

fn placement() -> impl Strategy<Value = PlacementConfig> {
    (
        prop_oneof![Just(Policy::Binpack), Just(Policy::Spread)],
        prop_oneof![Just(1.0f64), Just(1.5f64)],
        proptest::option::weighted(0.3, 2u32..5),
    )
        .prop_map(
            |(policy, memory_overcommit, max_slices_per_gpu)| PlacementConfig {
                policy,
                memory_overcommit,
                max_slices_per_gpu,
            },
        )
}

fn inventory() -> Inventory {
    let sizes = [8 * GI, 16 * GI, 10 * GI, 12 * GI];
    Inventory {
        gpus: sizes
            .iter()
            .enumerate()
            .map(|(i, &m)| Gpu {
                index: i as u32,
                uuid: format!("GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd"),
                model: if i < 2 {
                    "NVIDIA H200".into()
                } else {
                    "NVIDIA A100".into()
                },
                memory_total: m,
                minor: i as u32,
                pci_bus_id: None,
                numa_node: None,
                pcie_root: None,
            })
            .collect(),
    }
}

struct World {
    sys: Arc<FakeSystem>,
    reg: Registry,
    placement: PlacementConfig,
    issued: HashSet<String>,
    /// Ids in issue order, for picking targets of bind and release.
    order: Vec<String>,
    next_start: u64,
}

impl World {
    fn pick(&self, n: usize) -> Option<String> {
        (!self.order.is_empty()).then(|| self.order[n % self.order.len()].clone())
    }

    /// Applies `op`; true when it reached the registry (a bind to a dead pid fails before).
    fn apply(&mut self, op: &Op) -> Result<bool, TestCaseError> {
        match op {
            Op::Reserve {
                gpus,
                memory,
                cores,
                selector,
                whole,
                owner,
                container,
            } => {
                let cid = container.map(|c| CONTAINERS[c].to_string());
                let owner = match owner {
                    OwnerChoice::Pending => Owner::Container {
                        container_id: cid,
                        process: None,
                        kubernetes: None,
                    },
                    OwnerChoice::Process(p) => match self.reg.process_ref(PIDS[*p]) {
                        Ok(process) => Owner::Container {
                            container_id: cid,
                            process: Some(process),
                            kubernetes: None,
                        },
                        Err(RegistryError::NoProcess { .. }) => return Ok(false),
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    },
                    OwnerChoice::Claim => Owner::DraClaim {
                        claim_uid: "u".into(),
                        namespace: "ns".into(),
                        members: Vec::new(),
                        name: "claim".into(),
                        gone: None,
                    },
                };
                let request = Request {
                    gpus: *gpus,
                    memory: *memory,
                    cores: *cores,
                    selectors: selector.map(Selector::Index).into_iter().collect(),
                    model: None,
                    policy: None,
                    owner,
                    whole_gpu: *whole,
                    unhealthy: Vec::new(),
                };
                match self.reg.reserve(&request) {
                    Ok(r) => {
                        prop_assert!(self.issued.insert(r.id.clone()), "id {} issued twice", r.id);
                        self.order.push(r.id.clone());
                        prop_assert_eq!(r.gpus.len(), *gpus as usize);
                        let inv = inventory();
                        for b in &r.gpus {
                            let gpu = inv.gpu(&b.uuid).expect("booked GPU exists");
                            let want = match (*whole, memory) {
                                (true, _) | (false, None) => gpu.memory_total,
                                (false, Some(q)) => q.resolve(gpu.memory_total),
                            };
                            prop_assert_eq!(b.memory, want);
                            prop_assert_eq!(b.cores, if *whole { 100 } else { *cores });
                        }
                    }
                    Err(RegistryError::Refused(refusal)) => {
                        // The refusal is real: the registry as left still has no room.
                        let file = read_registry(self.reg.state_dir()).expect("parses");
                        prop_assert!(
                            place(
                                &file.inventory,
                                &file.reservations,
                                &self.placement,
                                &request
                            )
                            .is_err(),
                            "refused but fits: {}",
                            refusal
                        );
                        if refusal.reason == RefusalReason::NoFit {
                            prop_assert!(
                                refusal.message.contains("free per GPU"),
                                "{}",
                                refusal.message
                            );
                        }
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Bind {
                pick,
                pid,
                container,
            } => {
                if let Some(id) = self.pick(*pick) {
                    match self.reg.bind(&id, CONTAINERS[*container], PIDS[*pid]) {
                        Ok(r) => {
                            prop_assert_eq!(r.owner.container_id(), Some(CONTAINERS[*container]))
                        }
                        Err(RegistryError::NoProcess { .. }) => return Ok(false),
                        Err(
                            RegistryError::NotFound { .. }
                            | RegistryError::AlreadyBound { .. }
                            | RegistryError::HeldByClaim { .. },
                        ) => {}
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
            }
            Op::Release { pick } => {
                if let Some(id) = self.pick(*pick) {
                    self.reg.release(&id).expect("release");
                    let again = self.reg.release(&id).expect("release again");
                    prop_assert!(
                        again.reservations.is_empty(),
                        "second release removed something"
                    );
                    prop_assert!(read_registry(self.reg.state_dir())
                        .expect("parses")
                        .reservation(&id)
                        .is_none());
                    prop_assert!(!self.reg.slice_dir(&id).expect("slice dir").exists());
                }
            }
            Op::ReleaseContainer { container } => {
                let cid = CONTAINERS[*container];
                self.reg.release_container(cid).expect("release");
                prop_assert!(self
                    .reg
                    .release_container(cid)
                    .expect("again")
                    .reservations
                    .is_empty());
                let file = read_registry(self.reg.state_dir()).expect("parses");
                prop_assert!(file
                    .reservations
                    .iter()
                    .all(|r| r.owner.container_id() != Some(cid)));
            }
            Op::Gc => {
                self.reg.gc().expect("gc");
            }
            Op::Kill { pid } => {
                self.sys.kill(PIDS[*pid]);
                return Ok(false);
            }
            Op::Respawn { pid } => {
                self.next_start += 1;
                self.sys.spawn(PIDS[*pid], self.next_start);
                return Ok(false);
            }
            Op::Advance { ms } => {
                self.sys.advance_ms(*ms);
                return Ok(false);
            }
            Op::Reboot => {
                self.sys.reboot();
                for (i, &p) in PIDS.iter().enumerate() {
                    self.sys.spawn(p, i as u64);
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Invariants that hold after every step.
    fn check(&self, op: &Op, registry_ops: bool) -> Result<(), TestCaseError> {
        let file = read_registry(self.reg.state_dir()).expect("registry.json always parses");
        let broken = violations(&file, &self.placement);
        prop_assert!(broken.is_empty(), "after {:?}: {:?}", op, broken);
        if registry_ops {
            let now = self.sys.now_ms();
            let boot = self.sys.boot_id().expect("boot id");
            for r in &file.reservations {
                if let Some(p) = r.owner.process() {
                    // Exits and reboots are seen by every operation (pid reuse within the
                    // recheck interval may not be).
                    prop_assert!(
                        self.sys.process_exists(p.pid),
                        "{} survived the exit of {}",
                        r.id,
                        p.pid
                    );
                    prop_assert_eq!(&p.boot_id, &boot);
                    // A reused pid survives only until start times are read again.
                    if self.sys.start_time(p.pid) != Some(p.start_time) {
                        prop_assert!(
                            now.saturating_sub(file.processes_checked_ms) < 1_000,
                            "{} survived a start-time check after pid {} was reused",
                            r.id,
                            p.pid
                        );
                    }
                } else if let Some(deadline) = r.deadline_ms {
                    prop_assert!(deadline >= now, "{} survived its deadline", r.id);
                }
            }
            let mut dirs: Vec<String> = std::fs::read_dir(self.reg.state_dir().join("slices"))
                .expect("slices")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            dirs.sort();
            let mut ids: Vec<String> = file.reservations.iter().map(|r| r.id.clone()).collect();
            ids.sort();
            prop_assert_eq!(dirs, ids, "slice directories differ from the registry");
            for r in &file.reservations {
                let rec = std::fs::read_to_string(
                    self.reg
                        .slice_dir(&r.id)
                        .expect("slice dir")
                        .join(RECORD_FILE),
                )
                .expect("record");
                let v: serde_json::Value = serde_json::from_str(&rec).expect("record parses");
                prop_assert_eq!(&v["reservation"], &serde_json::to_value(r).expect("ser"));
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_the_registry_sound(
        placement in placement(),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let dir = state_dir();
        let sys = Arc::new(FakeSystem::new(1_700_000_000_000));
        for (i, &p) in PIDS.iter().enumerate() {
            sys.spawn(p, i as u64);
        }
        let options = Options {
            placement: placement.clone(),
            pending_timeout: Duration::from_secs(60),
            recheck_interval: Duration::from_secs(1),
        };
        let (reg, _) = common::open(dir.path(), options, sys.clone());
        reg.set_inventory(inventory()).expect("inventory");
        let mut world = World { sys, reg, placement, issued: HashSet::new(), order: Vec::new(), next_start: 1000 };
        for op in &ops {
            let touched = world.apply(op)?;
            world.check(op, touched)?;
        }
        // Releasing everything empties the registry.
        for id in world.order.clone() {
            world.reg.release(&id).expect("release");
        }
        let file = read_registry(world.reg.state_dir()).expect("parses");
        prop_assert!(file.reservations.is_empty());
    }
}
