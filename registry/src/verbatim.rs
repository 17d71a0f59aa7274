//! Rewriting `registry.json` by copying the text of the reservations an operation left as they
//! were: an operation changes one or two of a hundred, and serialising the others again was
//! most of its write. A reservation's text is copied only when it equals, value for value,
//! what was read and its boot id is left out (or not) as it was then, so the file is byte for
//! byte what [`crate::fastwrite`] would write (tests compare).

use crate::fastread::{reads_as, Span};
use crate::model::Reservation;

/// The text a registry was read from and where each reservation's text lies in it.
#[derive(Debug)]
pub(crate) struct Origin {
    text: String,
    spans: Vec<Span>,
}

impl Origin {
    /// The text and the spans of its reservations, as read.
    pub(crate) fn new(text: String, spans: Vec<Span>) -> Origin {
        Origin { text, spans }
    }

    /// A cursor for one write, which visits reservations in file order.
    pub(crate) fn reuse(&self) -> Reuse<'_> {
        Reuse {
            origin: self,
            at: 0,
        }
    }

    /// The id a span's text starts with (`["<id>",…`).
    fn id_of(&self, span: &Span) -> Option<&str> {
        let rest = self.text.get(span.range.start + 2..span.range.end)?;
        rest.get(..rest.find('"')?)
    }
}

/// Finds the text of each reservation of a write in the file it was read from.
pub(crate) struct Reuse<'a> {
    origin: &'a Origin,
    /// Spans before this one were passed (reservations keep their order in the file).
    at: usize,
}

impl<'a> Reuse<'a> {
    /// The text `r` was read as, if it is unchanged and `elide` (whether its boot id is left
    /// out now) is what it was.
    pub(crate) fn text_of(&mut self, r: &Reservation, elide: bool) -> Option<&'a [u8]> {
        let origin = self.origin;
        let rest = origin.spans.get(self.at..)?;
        let k = rest
            .iter()
            .position(|span| origin.id_of(span) == Some(r.id.as_str()))?;
        self.at += k + 1;
        let span = rest.get(k)?;
        if span.left_out_boot.is_some() != elide || !reads_as(&origin.text, span, r) {
            return None;
        }
        origin.text.as_bytes().get(span.range.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fastwrite::tests::file;
    use crate::fastwrite::{write_registry, write_registry_from};
    use crate::model::{Owner, ProcessRef, RegistryFile, ReservationState};

    /// Five reservations: pending, three bound on one boot (the second and third leave the
    /// boot id out), one bound on another boot.
    fn reservations() -> Vec<Reservation> {
        let mut base = crate::compact::tests::samples().remove(0);
        base.gpus[0].uuid = "GPU-371d38fa-b643-52bd-b498-5aaafe5093ad".into();
        (0..5u32)
            .map(|i| {
                let mut r = base.clone();
                r.id = format!("{i:x}123456789abcde");
                if i > 0 {
                    r.state = ReservationState::Bound;
                    r.deadline_ms = None;
                    r.bound_ms = Some(100 + u64::from(i));
                    r.owner = Owner::Container {
                        container_id: Some(format!("c{i}")),
                        process: Some(ProcessRef {
                            pid: 1000 + i,
                            start_time: 5,
                            boot_id: if i < 4 { "boot-a" } else { "boot-b" }.into(),
                        }),
                        kubernetes: None,
                    };
                }
                r
            })
            .collect()
    }

    fn text(f: &RegistryFile) -> Vec<u8> {
        let mut out = Vec::new();
        write_registry(&mut out, f).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    /// The file read back with its origin, as an update loads it.
    fn read(t: &[u8]) -> (RegistryFile, Origin) {
        let s = String::from_utf8(t.to_vec()).unwrap_or_else(|e| panic!("{e}"));
        let (f, spans) =
            crate::fastread::read_registry_spans(&s).unwrap_or_else(|| panic!("fast path"));
        let origin = Origin::new(s, spans);
        (f, origin)
    }

    fn rewritten(f: &RegistryFile, origin: &Origin) -> Vec<u8> {
        let mut out = Vec::new();
        write_registry_from(&mut out, f, Some(origin)).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    #[test]
    fn unchanged_reservations_are_copied_and_the_file_is_the_same() {
        let t = text(&file(reservations()));
        assert_eq!(t.windows(6).filter(|w| w == b"boot-a").count(), 1, "elided");
        let (f, origin) = read(&t);
        let mut reuse = origin.reuse();
        for r in &f.reservations {
            let elided = matches!(r.owner.process(), Some(p) if p.pid > 1001 && p.pid < 1004);
            let copied = reuse
                .text_of(r, elided)
                .unwrap_or_else(|| panic!("{}", r.id));
            assert!(copied.starts_with(format!("[\"{}\"", r.id).as_bytes()));
        }
        assert_eq!(rewritten(&f, &origin), t);
    }

    /// The comparison behind the copy: every reservation reads as itself (the left-out boot
    /// ids included), and a change to any one field is seen.
    #[test]
    fn a_change_to_any_field_is_seen() {
        let mut rs = reservations();
        rs[2].owner = Owner::Container {
            container_id: None,
            process: rs[2].owner.process().cloned(),
            kubernetes: Some(crate::model::KubernetesRef {
                namespace: "ns".into(),
                pod: "p".into(),
                pod_uid: Some("u".into()),
                container: "c".into(),
            }),
        };
        rs.push(Reservation {
            owner: Owner::DraClaim {
                claim_uid: "claim".into(),
                namespace: "ns".into(),
                name: "n".into(),
            },
            id: "e123456789abcdef".into(),
            ..rs[0].clone()
        });
        let t = text(&file(rs));
        let s = String::from_utf8(t.clone()).unwrap_or_else(|e| panic!("{e}"));
        let (f, spans) =
            crate::fastread::read_registry_spans(&s).unwrap_or_else(|| panic!("fast path"));
        assert!(spans.iter().filter(|sp| sp.left_out_boot.is_some()).count() >= 2);
        for (r, span) in f.reservations.iter().zip(&spans) {
            assert!(crate::fastread::reads_as(&s, span, r), "{}", r.id);
        }
        type Change = (&'static str, fn(&mut Reservation));
        let changes: Vec<Change> = vec![
            ("id", |r| r.id.push('0')),
            ("state", |r| {
                r.state = match r.state {
                    ReservationState::Pending => ReservationState::Bound,
                    ReservationState::Bound => ReservationState::Pending,
                }
            }),
            ("whole gpu", |r| r.whole_gpu = !r.whole_gpu),
            ("a gpu more", |r| r.gpus.push(r.gpus[0].clone())),
            ("a gpu less", |r| r.gpus.clear()),
            ("gpu index", |r| r.gpus[0].index += 1),
            ("gpu uuid", |r| r.gpus[0].uuid.push('x')),
            ("gpu memory", |r| r.gpus[0].memory += 1),
            ("gpu cores", |r| r.gpus[0].cores += 1),
            ("created", |r| r.created_ms += 1),
            ("deadline", |r| {
                r.deadline_ms = Some(r.deadline_ms.unwrap_or(0) + 1)
            }),
            ("bound", |r| r.bound_ms = Some(r.bound_ms.unwrap_or(0) + 1)),
            ("owner", |r| match &mut r.owner {
                Owner::Container {
                    container_id,
                    process,
                    kubernetes,
                } => {
                    if let Some(k) = kubernetes {
                        k.pod_uid = None;
                    } else if let Some(p) = process {
                        p.boot_id.push('x');
                    } else {
                        *container_id = Some("other".into());
                    }
                }
                Owner::DraClaim { name, .. } => name.push('x'),
            }),
            ("pid", |r| {
                if let Owner::Container {
                    process: Some(p), ..
                } = &mut r.owner
                {
                    p.pid += 1;
                } else {
                    r.created_ms += 1;
                }
            }),
            ("start time", |r| {
                if let Owner::Container {
                    process: Some(p), ..
                } = &mut r.owner
                {
                    p.start_time += 1;
                } else {
                    r.created_ms += 1;
                }
            }),
        ];
        for (what, change) in changes {
            for (r, span) in f.reservations.iter().zip(&spans) {
                let mut changed = r.clone();
                change(&mut changed);
                assert_ne!(&changed, r, "{what} changes {}", r.id);
                assert!(
                    !crate::fastread::reads_as(&s, span, &changed),
                    "{what} of {} not seen",
                    r.id
                );
            }
        }
    }

    #[test]
    fn every_kind_of_change_gives_what_a_full_write_gives() {
        let t = text(&file(reservations()));
        type Change = (&'static str, fn(&mut RegistryFile));
        let changes: Vec<Change> = vec![
            ("bind the pending one", |f| {
                f.reservations[0].state = ReservationState::Bound;
                f.reservations[0].bound_ms = Some(7);
            }),
            ("release the first with a full boot id", |f| {
                f.reservations.remove(1);
            }),
            ("release the one between two of a boot", |f| {
                f.reservations.remove(2);
            }),
            ("release the last", |f| {
                f.reservations.pop();
            }),
            ("reserve a new one", |f| {
                let mut r = f.reservations[0].clone();
                r.id = "f123456789abcdef".into();
                f.reservations.push(r);
            }),
            ("change a boot id the next one leaves out", |f| {
                if let Owner::Container {
                    process: Some(p), ..
                } = &mut f.reservations[1].owner
                {
                    p.boot_id = "boot-c".into();
                }
            }),
            ("reorder", |f| f.reservations.swap(1, 3)),
            ("counters only", |f| f.counters.released_total += 1),
            ("release all", |f| f.reservations.clear()),
        ];
        for (what, change) in changes {
            let (mut f, origin) = read(&t);
            change(&mut f);
            assert_eq!(
                String::from_utf8_lossy(&rewritten(&f, &origin)),
                String::from_utf8_lossy(&text(&f)),
                "{what}"
            );
        }
    }
}
