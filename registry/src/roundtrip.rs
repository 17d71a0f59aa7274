//! Tests that `registry.json` and `reservation.json` hold every value the registry can hold:
//! any [`RegistryFile`] written, read and written again gives the same bytes and an equal
//! value, and every field of every persisted type survives (the literals below name every
//! field, so a new one does not compile until it is given a value here and checked).

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;

use crate::model::{
    Booking, ClaimGone, Counters, Gpu, Inventory, KubernetesRef, Owner, ProcessRef, RegistryFile,
    Reservation, ReservationState, Unknown, REGISTRY_VERSION,
};
use crate::store::{self, Loaded, Paths};

/// Writes `file` as `registry.json` in `dir`, reads it back and writes that again: the bytes
/// of both writes, and the value read, must match.
fn round_trip(dir: &Path, file: &RegistryFile) -> Result<(), TestCaseError> {
    let first = dir.join("first.json");
    let second = dir.join("second.json");
    store::save(&first, file).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let read = match store::load(&first).map_err(|e| TestCaseError::fail(e.to_string()))? {
        Loaded::Ok(f) => f,
        other => return Err(TestCaseError::fail(format!("read back as {other:?}"))),
    };
    prop_assert_eq!(&read, file);
    store::save(&second, &read).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(bytes(&first)?, bytes(&second)?);
    Ok(())
}

fn bytes(path: &Path) -> Result<Vec<u8>, TestCaseError> {
    std::fs::read(path).map_err(|e| TestCaseError::fail(format!("{}: {e}", path.display())))
}

/// Writes each reservation's `reservation.json` and reads it back: an equal value, and the
/// same bytes when written again.
fn records_round_trip(dir: &Path, file: &RegistryFile) -> Result<(), TestCaseError> {
    let paths = Paths::new(dir);
    paths
        .create()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let fail = |e: store::StoreError| TestCaseError::fail(e.to_string());
    for r in &file.reservations {
        let record = paths
            .slice_dir(&r.id)
            .map_err(fail)?
            .join(store::RECORD_FILE);
        store::write_record(&paths, r).map_err(fail)?;
        let first = bytes(&record)?;
        let read = store::read_record(&paths, &r.id).map_err(fail)?;
        prop_assert_eq!(read.as_ref(), Some(r));
        if let Some(read) = read {
            store::write_record(&paths, &read).map_err(fail)?;
        }
        prop_assert_eq!(first, bytes(&record)?);
        store::remove_slice(&paths, &r.id).map_err(fail)?;
    }
    Ok(())
}

/// Strings that need escaping or are not ASCII: quotes, backslashes, control characters,
/// U+2028, astral characters, and anything else.
fn odd_string() -> impl Strategy<Value = String> {
    let c = prop_oneof![
        Just('"'),
        Just('\\'),
        Just('/'),
        (0u8..0x20).prop_map(char::from),
        Just('\u{7f}'),
        Just('é'),
        Just('\u{2028}'),
        Just('\u{fffd}'),
        Just('😀'),
        proptest::char::range('a', 'z'),
        any::<char>(),
    ];
    proptest::collection::vec(c, 0..12).prop_map(String::from_iter)
}

fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just((1 << 53) + 1),
        any::<u64>()
    ]
}

fn any_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0), Just(u32::MAX), any::<u32>()]
}

fn id() -> impl Strategy<Value = String> {
    "[0-9a-f]{16}"
}

fn gpu() -> impl Strategy<Value = Gpu> {
    (
        any_u32(),
        odd_string(),
        odd_string(),
        any_u64(),
        any_u32(),
        proptest::option::of(odd_string()),
        proptest::option::of(prop_oneof![
            Just(i32::MIN),
            Just(-1),
            Just(i32::MAX),
            any::<i32>()
        ]),
        proptest::option::of(odd_string()),
    )
        .prop_map(
            |(index, uuid, model, memory_total, minor, pci_bus_id, numa_node, pcie_root)| Gpu {
                index,
                uuid,
                model,
                memory_total,
                minor,
                pci_bus_id,
                numa_node,
                pcie_root,
            },
        )
}

fn process() -> impl Strategy<Value = ProcessRef> {
    (
        any_u32(),
        any_u64(),
        odd_string(),
        proptest::option::of(odd_string()),
    )
        .prop_map(|(pid, start_time, boot_id, cgroup)| ProcessRef {
            pid,
            start_time,
            boot_id,
            cgroup,
            unknown: Default::default(),
        })
}

fn kubernetes() -> impl Strategy<Value = KubernetesRef> {
    (
        odd_string(),
        odd_string(),
        proptest::option::of(odd_string()),
        odd_string(),
    )
        .prop_map(|(namespace, pod, pod_uid, container)| KubernetesRef {
            namespace,
            pod,
            pod_uid,
            container,
            unknown: Default::default(),
        })
}

fn owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        (
            proptest::option::of(odd_string()),
            proptest::option::of(process()),
            proptest::option::of(kubernetes()),
        )
            .prop_map(|(container_id, process, kubernetes)| Owner::Container {
                container_id,
                process,
                kubernetes,
            }),
        (
            odd_string(),
            odd_string(),
            odd_string(),
            proptest::option::of((any_u64(), odd_string())),
        )
            .prop_map(|(claim_uid, namespace, name, gone)| Owner::DraClaim {
                claim_uid,
                namespace,
                members: Vec::new(),
                name,
                gone: gone.map(|(since_ms, why)| ClaimGone { since_ms, why }),
            }),
    ]
}

fn booking() -> impl Strategy<Value = Booking> {
    (any_u32(), odd_string(), any_u64(), any::<u8>()).prop_map(|(index, uuid, memory, cores)| {
        Booking {
            index,
            uuid,
            memory,
            cores,
            unknown: Default::default(),
        }
    })
}

fn reservation() -> impl Strategy<Value = Reservation> {
    (
        id(),
        prop_oneof![
            Just(ReservationState::Pending),
            Just(ReservationState::Bound)
        ],
        owner(),
        any::<bool>(),
        proptest::collection::vec(booking(), 0..4),
        any_u64(),
        proptest::option::of(any_u64()),
        proptest::option::of(any_u64()),
        proptest::option::of(process()),
    )
        .prop_map(
            |(
                id,
                state,
                owner,
                whole_gpu,
                gpus,
                created_ms,
                deadline_ms,
                bound_ms,
                reserved_by,
            )| {
                Reservation {
                    id,
                    state,
                    owner,
                    whole_gpu,
                    gpus,
                    created_ms,
                    deadline_ms,
                    bound_ms,
                    reserved_by,
                    unknown: Default::default(),
                }
            },
        )
}

fn counters() -> impl Strategy<Value = Counters> {
    (
        any_u64(),
        any_u64(),
        any_u64(),
        proptest::collection::btree_map(odd_string(), any_u64(), 0..4),
    )
        .prop_map(
            |(reserved_total, released_total, reaped_total, refused_total)| Counters {
                reserved_total,
                released_total,
                reaped_total,
                refused_total,
                unknown: Default::default(),
            },
        )
}

fn registry_file() -> impl Strategy<Value = RegistryFile> {
    (
        proptest::collection::vec(gpu(), 0..4),
        proptest::collection::vec(reservation(), 0..6),
        counters(),
        any_u64(),
    )
        .prop_map(
            |(gpus, reservations, counters, processes_checked_ms)| RegistryFile {
                version: REGISTRY_VERSION,
                inventory: Inventory { gpus },
                reservations,
                counters,
                processes_checked_ms,
                unknown: Default::default(),
            },
        )
}

/// A throwaway directory, on tmpfs when there is one (as `state_dir` is on a node).
fn temp_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_registry_round_trips_byte_for_byte(file in registry_file()) {
        let dir = temp_dir().map_err(|e| TestCaseError::fail(e.to_string()))?;
        round_trip(dir.path(), &file)?;
        records_round_trip(dir.path(), &file)?;
    }
}

/// Every field of every persisted type, none at its default (a field dropped by the writer
/// would read back as its default), fields of a newer build included.
fn every_field_set() -> RegistryFile {
    // What a newer build adds without a new version: kept, at every level that keeps it.
    let newer = |what: &str| {
        Unknown::from_iter([(
            format!("newer_{what}"),
            serde_json::json!({"of": what, "n": [1, -2.5, null, "\u{2028}"]}),
        )])
    };
    let gpu = Gpu {
        index: 3,
        uuid: "GPU-\"3\"\\".into(),
        model: "NVIDIA H200 é".into(),
        memory_total: u64::MAX,
        minor: 7,
        pci_bus_id: Some("0000:01:00.0".into()),
        numa_node: Some(-1),
        pcie_root: None,
    };
    let booking = Booking {
        index: 3,
        uuid: gpu.uuid.clone(),
        memory: u64::MAX - 1,
        cores: 100,
        unknown: newer("booking"),
    };
    let container = Owner::Container {
        container_id: Some("ctr\u{1}".into()),
        process: Some(ProcessRef {
            pid: u32::MAX,
            start_time: u64::MAX,
            boot_id: "boot\n".into(),
            cgroup: Some("pids/ctr\u{1}/x".into()),
            unknown: newer("process"),
        }),
        kubernetes: Some(KubernetesRef {
            namespace: "ns".into(),
            pod: "pod😀".into(),
            pod_uid: Some("uid".into()),
            container: "c".into(),
            unknown: newer("kubernetes"),
        }),
    };
    let claim = Owner::DraClaim {
        claim_uid: "claim-uid".into(),
        namespace: "claim-ns".into(),
        members: Vec::new(),
        name: "claim-name".into(),
        gone: None,
    };
    let reservation = |id: &str, state, owner| Reservation {
        id: id.into(),
        state,
        owner,
        whole_gpu: true,
        gpus: vec![booking.clone()],
        created_ms: 1,
        deadline_ms: Some(2),
        bound_ms: Some(3),
        reserved_by: Some(ProcessRef {
            pid: 9,
            start_time: 10,
            boot_id: "boot".into(),
            cgroup: None,
            unknown: newer("reserved_by"),
        }),
        unknown: newer("reservation"),
    };
    RegistryFile {
        version: REGISTRY_VERSION,
        inventory: Inventory {
            gpus: vec![gpu.clone()],
        },
        reservations: vec![
            reservation("0123456789abcdef", ReservationState::Bound, container),
            reservation("1123456789abcdef", ReservationState::Pending, claim),
        ],
        counters: Counters {
            reserved_total: 4,
            released_total: 5,
            reaped_total: 6,
            refused_total: BTreeMap::from([("no-fit".to_string(), 7)]),
            unknown: newer("counters"),
        },
        processes_checked_ms: 8,
        unknown: newer("file"),
    }
}

#[test]
fn every_field_of_every_persisted_type_is_written_and_read_back() {
    let file = every_field_set();
    let dir = temp_dir().unwrap();
    round_trip(dir.path(), &file).unwrap();
    records_round_trip(dir.path(), &file).unwrap();
}
