//! Property tests: name round trips, deterministic and stable encoding, and that the
//! stamped cdiVersion is both sufficient and the lowest accepted.

use crate::support;

use gpuslice_cdi::{
    from_json, inject_with, minimum_version, stamped, to_json, CdiVersion, ContainerEdits, Device,
    DeviceNode, IntelRdt, Kind, Mount, NetDevice, QualifiedName, Spec, ValidationError,
};
use proptest::prelude::*;

fn segment() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_.-]{0,10}[a-z0-9]".prop_filter("no empty DNS label", |s| !s.contains(".."))
}

fn device_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-zA-Z0-9]", "[a-zA-Z0-9][a-zA-Z0-9_.:-]{0,20}[a-zA-Z0-9]"]
}

fn edits() -> impl Strategy<Value = ContainerEdits> {
    (
        prop::collection::vec("[A-Z_]{1,6}=[a-z0-9]{0,4}", 0..4),
        prop::collection::vec(
            (0u8..4, any::<bool>(), prop::option::of("r|rw|rwm|m")),
            0..3,
        ),
        prop::collection::vec(("/[a-z]{1,5}(/[a-z]{1,5}){0,2}", any::<bool>()), 0..3),
        prop::collection::vec(0u32..3, 0..3),
        prop::option::of((any::<bool>(), any::<bool>())),
        any::<bool>(),
    )
        .prop_map(|(env, nodes, mounts, gids, rdt, net)| ContainerEdits {
            env,
            device_nodes: nodes
                .into_iter()
                .map(|(i, host, perms)| DeviceNode {
                    host_path: host.then(|| format!("/dev/nvidia{i}")),
                    permissions: perms,
                    ..DeviceNode::char_device(format!("/dev/nvidia{i}"), 195, i64::from(i))
                })
                .collect(),
            mounts: mounts
                .into_iter()
                .map(|(dest, typed)| Mount {
                    mount_type: typed.then(|| "bind".to_string()),
                    ..Mount::bind(format!("/host{dest}"), dest, &["ro", "bind"])
                })
                .collect(),
            additional_gids: gids,
            intel_rdt: rdt.map(|(schemata, monitoring)| IntelRdt {
                clos_id: Some("c".into()),
                schemata: if schemata {
                    vec!["L3:0=f".into()]
                } else {
                    vec![]
                },
                enable_monitoring: monitoring,
                ..Default::default()
            }),
            net_devices: if net {
                vec![NetDevice {
                    host_interface_name: "eth9".into(),
                    name: "n0".into(),
                }]
            } else {
                vec![]
            },
            ..Default::default()
        })
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![
            Just("gpuslice.io/gpu"),
            Just("gpuslice.io/slice"),
            Just("example.com/a.b")
        ],
        prop::collection::btree_map(device_name(), edits(), 1..4),
        edits(),
        any::<bool>(),
    )
        .prop_map(|(kind, devices, common, annotate)| {
            let mut s = Spec::new(kind);
            s.container_edits = common;
            for (name, mut e) in devices {
                if e.is_empty() {
                    e.env.push("NONEMPTY=1".into());
                }
                s.devices.push(Device::new(name, e));
            }
            if annotate {
                s.annotations.insert("gpuslice.io/x".into(), "y".into());
            }
            s
        })
}

proptest! {
    #[test]
    fn valid_kinds_and_names_round_trip(vendor in segment(), class in segment(), name in device_name()) {
        let kind = format!("{vendor}/{class}");
        let parsed = Kind::parse(&kind).expect("valid kind");
        prop_assert_eq!(parsed.to_string(), kind.clone());
        let q = QualifiedName::new(&kind, &name).expect("valid name");
        prop_assert_eq!(QualifiedName::parse(&q.to_string()).expect("parses"), q);
    }

    #[test]
    fn parsing_never_accepts_what_it_cannot_print_back(s in "\\PC{0,30}") {
        if let Ok(k) = Kind::parse(&s) { prop_assert_eq!(k.to_string(), s.clone()); }
        if let Ok(q) = QualifiedName::parse(&s) { prop_assert_eq!(q.to_string(), s); }
    }

    #[test]
    fn encoding_is_deterministic_and_stable(s in spec()) {
        let a = to_json(&s).expect("encodes");
        let b = to_json(&s.clone()).expect("encodes");
        prop_assert_eq!(&a, &b);
        let back = from_json(&a).expect("decodes");
        prop_assert_eq!(&back, &stamped(&s));
        prop_assert_eq!(to_json(&back).expect("re-encodes"), a);
    }

    #[test]
    fn stamped_version_is_sufficient_and_lowest(s in spec()) {
        let v = minimum_version(&s);
        let mut at = s.clone();
        at.cdi_version = v.to_string();
        prop_assert!(at.validate().is_ok());
        for newer in CdiVersion::ALL.into_iter().filter(|x| *x > v) {
            at.cdi_version = newer.to_string();
            prop_assert!(at.validate().is_ok(), "newer {} must be accepted", newer);
        }
        for older in CdiVersion::ALL.into_iter().filter(|x| *x < v) {
            at.cdi_version = older.to_string();
            let rejected = matches!(at.validate(), Err(ValidationError::VersionTooOld { .. }));
            prop_assert!(rejected, "older {} must be rejected", older);
        }
    }

    #[test]
    fn injecting_twice_equals_injecting_once(s in spec()) {
        let names: Vec<&str> = s.devices.iter().map(|d| d.name.as_str()).collect();
        let stat = support::FakeStat::nvidia();
        let mut once: serde_json::Value = serde_json::from_str(include_str!("fixtures/runc-spec.json")).expect("fixture");
        inject_with(&mut once, &s, &names, &stat).expect("inject");
        let mut twice = once.clone();
        inject_with(&mut twice, &s, &names, &stat).expect("inject again");
        prop_assert_eq!(twice, once);
    }
}
