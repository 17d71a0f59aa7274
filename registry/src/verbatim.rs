//! Rewriting `registry.json` by copying the text of the reservations an operation left as they
//! were: an operation changes one or two of a hundred, and serialising the others again was
//! most of its write. A reservation's text is copied only when it equals, value for value,
//! what was read and its boot id is left out (or not) as it was then, so the file is byte for
//! byte what [`crate::fastwrite`] would write (tests compare).

use crate::fastread::Span;
use crate::model::Reservation;

/// The text a registry was read from and, per reservation as read, its value and its text.
#[derive(Debug)]
pub(crate) struct Origin {
    text: String,
    entries: Vec<(Reservation, Span)>,
}

impl Origin {
    /// `reservations` as read from `text`, with their spans (the same length).
    pub(crate) fn new(text: String, reservations: &[Reservation], spans: Vec<Span>) -> Origin {
        Origin {
            text,
            entries: reservations.iter().cloned().zip(spans).collect(),
        }
    }

    /// A cursor for one write, which visits reservations in file order.
    pub(crate) fn reuse(&self) -> Reuse<'_> {
        Reuse {
            origin: self,
            at: 0,
        }
    }
}

/// Finds the text of each reservation of a write in the file it was read from.
pub(crate) struct Reuse<'a> {
    origin: &'a Origin,
    /// Entries before this one were passed (reservations keep their order in the file).
    at: usize,
}

impl<'a> Reuse<'a> {
    /// The text `r` was read as, if it is unchanged and `elide` (whether its boot id is left
    /// out now) is what it was.
    pub(crate) fn text_of(&mut self, r: &Reservation, elide: bool) -> Option<&'a [u8]> {
        let origin = self.origin;
        let rest = origin.entries.get(self.at..)?;
        let k = rest.iter().position(|(o, _)| o.id == r.id)?;
        self.at += k + 1;
        let (o, span) = rest.get(k)?;
        if span.elided != elide || o != r {
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
        let origin = Origin::new(s, &f.reservations, spans);
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
