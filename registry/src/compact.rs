//! The compact encoding of reservations in `registry.json` (version 2): each reservation is
//! a JSON array rather than an object, so every registry operation, which reads and writes
//! the whole file under the lock, parses and writes a quarter of the strings. Version 1
//! files (reservations as objects) are still read. Slice records and `status --json` keep
//! the named form.
//!
//! ```text
//! reservation  [id, state, owner, gpus, whole_gpu, created_ms, deadline_ms|null, bound_ms|null]
//! owner        ["container", container_id|null, process|null, kubernetes|null]
//!              ["dra_claim", claim_uid, namespace, name]
//! process      [pid, start_time, boot_id]  or  [pid, start_time] when the boot id is the
//!              one of the process before it in the array (all of them, between reboots)
//! kubernetes   [namespace, pod, pod_uid|null, container]
//! booking      [index, uuid, memory, cores]
//! ```

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use crate::model::{Booking, KubernetesRef, Owner, ProcessRef, Reservation, ReservationState};

const CONTAINER: &str = "container";
const DRA_CLAIM: &str = "dra_claim";

/// A process; its boot id left out when `elide_boot`.
struct ProcessOut<'a> {
    p: &'a ProcessRef,
    elide_boot: bool,
}

impl Serialize for ProcessOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(if self.elide_boot { 2 } else { 3 })?;
        t.serialize_element(&self.p.pid)?;
        t.serialize_element(&self.p.start_time)?;
        if !self.elide_boot {
            t.serialize_element(&self.p.boot_id)?;
        }
        t.end()
    }
}

/// Reads a process, taking a left-out boot id from the process before it.
struct ProcessIn<'b>(&'b mut Option<String>);

impl<'de> DeserializeSeed<'de> for ProcessIn<'_> {
    type Value = Option<ProcessRef>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ProcessIn<'_> {
    type Value = Option<ProcessRef>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a process [pid, start_time, boot_id] or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let pid = next(&mut seq, "pid")?;
        let start_time = next(&mut seq, "start_time")?;
        let boot_id = match seq.next_element::<String>()? {
            Some(b) => {
                end(&mut seq, "process")?;
                *self.0 = Some(b.clone());
                b
            }
            None => self.0.clone().ok_or_else(|| {
                de::Error::custom("process [pid, start_time] has no boot id before it")
            })?,
        };
        Ok(Some(ProcessRef {
            pid,
            start_time,
            boot_id,
        }))
    }
}

#[derive(Serialize)]
struct KubernetesOut<'a>(&'a str, &'a str, Option<&'a str>, &'a str);

#[derive(Deserialize)]
struct KubernetesIn(String, String, Option<String>, String);

#[derive(Serialize)]
struct BookingOut<'a>(u32, &'a str, u64, u8);

#[derive(Deserialize)]
struct BookingIn(u32, String, u64, u8);

/// An owner; its process's boot id left out when `elide_boot`.
struct OwnerOut<'a> {
    owner: &'a Owner,
    elide_boot: bool,
}

impl Serialize for OwnerOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(4)?;
        match self.owner {
            Owner::Container {
                container_id,
                process,
                kubernetes,
            } => {
                t.serialize_element(CONTAINER)?;
                t.serialize_element(container_id)?;
                t.serialize_element(&process.as_ref().map(|p| ProcessOut {
                    p,
                    elide_boot: self.elide_boot,
                }))?;
                t.serialize_element(&kubernetes.as_ref().map(|k| {
                    KubernetesOut(&k.namespace, &k.pod, k.pod_uid.as_deref(), &k.container)
                }))?;
            }
            Owner::DraClaim {
                claim_uid,
                namespace,
                name,
            } => {
                t.serialize_element(DRA_CLAIM)?;
                t.serialize_element(claim_uid)?;
                t.serialize_element(namespace)?;
                t.serialize_element(name)?;
            }
        }
        t.end()
    }
}

/// One reservation in the compact form.
struct ReservationOut<'a> {
    r: &'a Reservation,
    elide_boot: bool,
}

impl Serialize for ReservationOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.r;
        let mut t = s.serialize_tuple(8)?;
        t.serialize_element(&r.id)?;
        t.serialize_element(&r.state)?;
        t.serialize_element(&OwnerOut {
            owner: &r.owner,
            elide_boot: self.elide_boot,
        })?;
        let gpus: Vec<BookingOut> = r
            .gpus
            .iter()
            .map(|b| BookingOut(b.index, &b.uuid, b.memory, b.cores))
            .collect();
        t.serialize_element(&gpus)?;
        t.serialize_element(&r.whole_gpu)?;
        t.serialize_element(&r.created_ms)?;
        t.serialize_element(&r.deadline_ms)?;
        t.serialize_element(&r.bound_ms)?;
        t.end()
    }
}

/// The next element of a compact array, or an error naming what is missing.
fn next<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
    seq: &mut A,
    what: &'static str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom(format_args!("compact array ends before `{what}`")))
}

/// Refuses elements after the last one expected.
fn end<'de, A: SeqAccess<'de>>(seq: &mut A, what: &'static str) -> Result<(), A::Error> {
    match seq.next_element::<IgnoredAny>()? {
        None => Ok(()),
        Some(_) => Err(de::Error::custom(format_args!(
            "compact {what} has more elements than it should"
        ))),
    }
}

/// The first element of an owner array.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Container,
    DraClaim,
}

/// Reads an owner; the boot id of its process may come from the one before.
struct OwnerIn<'b>(&'b mut Option<String>);

impl<'de> DeserializeSeed<'de> for OwnerIn<'_> {
    type Value = Owner;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Owner, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OwnerIn<'_> {
    type Value = Owner;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an owner array [\"container\" | \"dra_claim\", …]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Owner, A::Error> {
        let owner = match next(&mut seq, "owner kind")? {
            Kind::Container => Owner::Container {
                container_id: next(&mut seq, "container_id")?,
                process: seq
                    .next_element_seed(ProcessIn(self.0))?
                    .ok_or_else(|| de::Error::custom("compact array ends before `process`"))?,
                kubernetes: next::<_, Option<KubernetesIn>>(&mut seq, "kubernetes")?.map(|k| {
                    KubernetesRef {
                        namespace: k.0,
                        pod: k.1,
                        pod_uid: k.2,
                        container: k.3,
                    }
                }),
            },
            Kind::DraClaim => Owner::DraClaim {
                claim_uid: next(&mut seq, "claim_uid")?,
                namespace: next(&mut seq, "namespace")?,
                name: next(&mut seq, "name")?,
            },
        };
        end(&mut seq, "owner")?;
        Ok(owner)
    }
}

/// One reservation of `registry.json`: the compact array, or the named object of version 1.
/// Holds the last boot id read, for processes that leave theirs out.
struct ReservationIn<'b>(&'b mut Option<String>);

impl<'de> DeserializeSeed<'de> for ReservationIn<'_> {
    type Value = Reservation;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Reservation, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReservationIn<'_> {
    type Value = Reservation;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a reservation (an array, or an object in version 1)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Reservation, A::Error> {
        let r = Reservation {
            id: next(&mut seq, "id")?,
            state: next::<_, ReservationState>(&mut seq, "state")?,
            owner: seq
                .next_element_seed(OwnerIn(self.0))?
                .ok_or_else(|| de::Error::custom("compact array ends before `owner`"))?,
            gpus: next::<_, Vec<BookingIn>>(&mut seq, "gpus")?
                .into_iter()
                .map(|b| Booking {
                    index: b.0,
                    uuid: b.1,
                    memory: b.2,
                    cores: b.3,
                })
                .collect(),
            whole_gpu: next(&mut seq, "whole_gpu")?,
            created_ms: next(&mut seq, "created_ms")?,
            deadline_ms: next(&mut seq, "deadline_ms")?,
            bound_ms: next(&mut seq, "bound_ms")?,
        };
        end(&mut seq, "reservation")?;
        Ok(r)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Reservation, A::Error> {
        let r = Reservation::deserialize(de::value::MapAccessDeserializer::new(map))?;
        if let Some(p) = r.owner.process() {
            *self.0 = Some(p.boot_id.clone());
        }
        Ok(r)
    }
}

/// `#[serde(with)]` for `RegistryFile::reservations`.
pub(crate) mod reservations {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(rs: &[Reservation], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(rs.len()))?;
        let mut last_boot: Option<&str> = None;
        for r in rs {
            let boot = r.owner.process().map(|p| p.boot_id.as_str());
            seq.serialize_element(&ReservationOut {
                r,
                elide_boot: boot.is_some() && boot == last_boot,
            })?;
            if boot.is_some() {
                last_boot = boot;
            }
        }
        seq.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<Reservation>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<Reservation>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of reservations")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // serde_json gives no length; start where a busy node is, not at zero, so
                // the vector is not copied on every doubling.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(128).min(4096));
                let mut last_boot = None;
                while let Some(r) = seq.next_element_seed(ReservationIn(&mut last_boot))? {
                    out.push(r);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::model::RegistryFile;

    use super::*;

    pub(crate) fn samples() -> Vec<Reservation> {
        let booking = |index, cores| Booking {
            index,
            uuid: format!("GPU-{index}"),
            memory: 4 << 30,
            cores,
        };
        vec![
            Reservation {
                id: "0123456789abcdef".into(),
                state: ReservationState::Pending,
                owner: Owner::container(),
                whole_gpu: false,
                gpus: vec![booking(0, 30)],
                created_ms: 10,
                deadline_ms: Some(20),
                bound_ms: None,
            },
            Reservation {
                id: "1123456789abcdef".into(),
                state: ReservationState::Bound,
                owner: Owner::Container {
                    container_id: Some("c\"1\\".into()),
                    process: Some(ProcessRef {
                        pid: 7,
                        start_time: 9,
                        boot_id: "b".into(),
                    }),
                    kubernetes: Some(KubernetesRef {
                        namespace: "ns".into(),
                        pod: "p".into(),
                        pod_uid: None,
                        container: "c".into(),
                    }),
                },
                whole_gpu: true,
                gpus: vec![booking(1, 100), booking(2, 100)],
                created_ms: 11,
                deadline_ms: None,
                bound_ms: Some(12),
            },
            Reservation {
                id: "2123456789abcdef".into(),
                state: ReservationState::Bound,
                owner: Owner::DraClaim {
                    claim_uid: "u".into(),
                    namespace: "ns".into(),
                    name: "claim".into(),
                },
                whole_gpu: false,
                gpus: vec![booking(3, 0)],
                created_ms: 13,
                deadline_ms: None,
                bound_ms: Some(13),
            },
        ]
    }

    #[test]
    fn round_trips_every_owner_kind() {
        let file = RegistryFile {
            reservations: samples(),
            ..RegistryFile::default()
        };
        let text = serde_json::to_string(&file).unwrap();
        assert!(text.contains(r#"["0123456789abcdef","pending",["container",null,null,null],[[0,"GPU-0",4294967296,30]],false,10,20,null]"#), "{text}");
        let back: RegistryFile = serde_json::from_str(&text).unwrap();
        assert_eq!(back, file);
    }

    #[test]
    fn boot_id_is_written_once_per_run_of_equal_ones() {
        let bound = |id: &str, pid: u32, boot: &str| Reservation {
            id: id.into(),
            state: ReservationState::Bound,
            owner: Owner::Container {
                container_id: Some(format!("c{pid}")),
                process: Some(ProcessRef {
                    pid,
                    start_time: 1,
                    boot_id: boot.into(),
                }),
                kubernetes: None,
            },
            whole_gpu: false,
            gpus: vec![],
            created_ms: 1,
            deadline_ms: None,
            bound_ms: Some(1),
        };
        let mut rs = samples();
        rs.insert(2, bound("3123456789abcdef", 8, "b"));
        rs.push(bound("4123456789abcdef", 9, "other-boot"));
        rs.push(bound("5123456789abcdef", 10, "other-boot"));
        let file = RegistryFile {
            reservations: rs.clone(),
            ..RegistryFile::default()
        };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(text.matches(r#""b""#).count(), 1, "{text}");
        assert_eq!(text.matches(r#""other-boot""#).count(), 1, "{text}");
        assert!(text.contains("[8,1]"), "{text}");
        assert!(text.contains("[10,1]"), "{text}");
        let back: RegistryFile = serde_json::from_str(&text).unwrap();
        assert_eq!(back.reservations, rs);
        // A left-out boot id needs a process before it.
        let bad = r#"{"version":2,"reservations":[["0123456789abcdef","bound",["container",null,[5,1],null],[],false,1,null,1]]}"#;
        let e = serde_json::from_str::<RegistryFile>(bad).unwrap_err();
        assert!(e.to_string().contains("no boot id before it"), "{e}");
    }

    #[test]
    fn reads_version_1_objects() {
        let named: Vec<serde_json::Value> = samples()
            .iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect();
        let text = serde_json::json!({"version": 1, "reservations": named}).to_string();
        let back: RegistryFile = serde_json::from_str(&text).unwrap();
        assert_eq!(back.reservations, samples());
    }

    #[test]
    fn refuses_wrong_shapes_with_what_is_wrong() {
        for (bad, says) in [
            (r#"[["0123456789abcdef","pending"]]"#, "before `owner`"),
            (
                r#"[["0123456789abcdef","pending",["pod",null,null,null],[],false,1,null,null]]"#,
                "unknown variant `pod`",
            ),
            (
                r#"[["0123456789abcdef","pending",["container",null,null,null],[],false,1,null,null,5]]"#,
                "more elements",
            ),
            (
                r#"[["0123456789abcdef","pending",["dra_claim","u","ns","n","x"],[],false,1,null,null]]"#,
                "compact owner has more elements",
            ),
            (r#"["0123456789abcdef"]"#, "a reservation"),
        ] {
            let text = format!(r#"{{"version":2,"reservations":{bad}}}"#);
            let e = serde_json::from_str::<RegistryFile>(&text).unwrap_err();
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }
}
