//! Reading `registry.json` as this build writes it without serde's generic deserializer:
//! every registry operation parses the whole file under the lock (three per container), and
//! the per-value dispatch of the compact arrays was half of an operation.
//!
//! Only the exact layout [`crate::fastwrite`] produces is read here: the top-level fields in
//! their order, no whitespace, strings without escapes, plain unsigned integers. Anything
//! else — an escape, a version 1 file, a hand-edited or corrupt file — returns `None` and
//! the caller parses with serde, which also gives the error message. So this path accepts
//! nothing serde would refuse and yields the same values (tests compare the two).

use crate::model::{
    Booking, Counters, Inventory, KubernetesRef, Owner, ProcessRef, RegistryFile, Reservation,
    ReservationState,
};

/// The file, when it has exactly the layout this build writes.
#[cfg(test)]
pub(crate) fn read_registry(text: &str) -> Option<RegistryFile> {
    read_registry_spans(text).map(|(f, _)| f)
}

/// Where one reservation's text lies in the file and, when it left out its owner's boot id
/// (the same as the reservation's before it), where that boot id is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) range: std::ops::Range<usize>,
    /// Set when the text left the boot id out: its place in an earlier reservation's text.
    pub(crate) left_out_boot: Option<std::ops::Range<usize>>,
}

/// As [`read_registry`], with the span of each reservation's text.
pub(crate) fn read_registry_spans(text: &str) -> Option<(RegistryFile, Vec<Span>)> {
    let mut c = Cursor {
        s: text,
        i: 0,
        left_out: None,
        boot: None,
    };
    c.lit("{\"version\":")?;
    let version = u32::try_from(c.num()?).ok()?;
    c.lit(",\"inventory\":")?;
    let inventory: Inventory = serde_json::from_str(c.object()?).ok()?;
    c.lit(",\"reservations\":[")?;
    let mut reservations = Vec::with_capacity(128);
    let mut spans = Vec::with_capacity(128);
    if !c.eat(b']') {
        loop {
            let start = c.i;
            reservations.push(c.reservation()?);
            spans.push(Span {
                range: start..c.i,
                left_out_boot: c.left_out.take(),
            });
            if c.eat(b']') {
                break;
            }
            c.lit(",")?;
        }
    }
    c.lit(",\"counters\":")?;
    let counters: Counters = serde_json::from_str(c.object()?).ok()?;
    c.lit(",\"processes_checked_ms\":")?;
    let processes_checked_ms = c.num()?;
    c.lit("}")?;
    (c.i == text.len()).then_some((
        RegistryFile {
            version,
            inventory,
            reservations,
            counters,
            processes_checked_ms,
        },
        spans,
    ))
}

/// The index of the first byte at or after `i` that is `"`, `\\` or a control character
/// (`b.len()` when there is none), eight bytes a step: the strings of the registry (ids,
/// UUIDs, boot ids) are most of its text.
fn special_from(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set where it is zero (`quote`, `backslash`) or below 0x20
        // (`x`); the lowest set one is exact (borrows only make later bytes look set).
        let hit = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (x.wrapping_sub(ONES * 0x20) & !x);
        let hit = hit & HIGH;
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    b.len()
}

struct Cursor<'a> {
    s: &'a str,
    i: usize,
    /// Where the last boot id written out lies.
    boot: Option<std::ops::Range<usize>>,
    /// The process just read left out its boot id: where it is written (`boot` then).
    left_out: Option<std::ops::Range<usize>>,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.i += 1;
        }
        hit
    }

    fn lit(&mut self, l: &str) -> Option<()> {
        // A byte loop: the literals are a few bytes, shorter than a call to `memcmp`.
        let rest = self.s.as_bytes().get(self.i..)?;
        let l = l.as_bytes();
        if rest.len() < l.len() || rest.iter().zip(l).any(|(a, b)| a != b) {
            return None;
        }
        self.i += l.len();
        Some(())
    }

    /// An unsigned integer as serde_json reads it into a `u64`: no sign, no leading zero,
    /// no fraction or exponent, no overflow.
    fn num(&mut self) -> Option<u64> {
        let b = self.s.as_bytes();
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(d) = b.get(self.i).filter(|d| d.is_ascii_digit()) {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let len = self.i - start;
        let ok = len > 0 && !(len > 1 && b[start] == b'0');
        // A fraction or exponent would make it a float, which serde refuses for integers.
        (ok && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))).then_some(n)
    }

    fn opt_num(&mut self) -> Option<Option<u64>> {
        if self.lit("null").is_some() {
            return Some(None);
        }
        self.num().map(Some)
    }

    /// A string without escapes or control characters (else `None`: serde decides).
    fn str(&mut self) -> Option<&'a str> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        let end = special_from(self.s.as_bytes(), start);
        if self.s.as_bytes().get(end) != Some(&b'"') {
            return None; // an escape, a control character or the end of the text
        }
        let out = self.s.get(start..end)?;
        self.i = end + 1;
        Some(out)
    }

    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        if self.lit("null").is_some() {
            return Some(None);
        }
        self.str().map(Some)
    }

    fn bool(&mut self) -> Option<bool> {
        if self.lit("true").is_some() {
            Some(true)
        } else {
            self.lit("false").map(|_| false)
        }
    }

    /// The text of a JSON object starting here (strings may hold braces), for serde.
    fn object(&mut self) -> Option<&'a str> {
        let b = self.s.as_bytes();
        let start = self.i;
        if b.get(start) != Some(&b'{') {
            return None;
        }
        let mut depth = 0usize;
        let mut in_str = false;
        while let Some(&c) = b.get(self.i) {
            self.i += 1;
            if in_str {
                match c {
                    b'\\' => self.i += 1,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return self.s.get(start..self.i);
                    }
                }
                _ => {}
            }
        }
        None
    }

    fn reservation(&mut self) -> Option<Reservation> {
        self.lit("[")?;
        let id = self.str()?.to_string();
        self.lit(",")?;
        let state = match self.str()? {
            "pending" => ReservationState::Pending,
            "bound" => ReservationState::Bound,
            _ => return None,
        };
        self.lit(",")?;
        let owner = self.owner()?;
        self.lit(",[")?;
        let mut gpus = Vec::new();
        if !self.eat(b']') {
            loop {
                gpus.push(self.booking()?);
                if self.eat(b']') {
                    break;
                }
                self.lit(",")?;
            }
        }
        self.lit(",")?;
        let whole_gpu = self.bool()?;
        self.lit(",")?;
        let created_ms = self.num()?;
        self.lit(",")?;
        let deadline_ms = self.opt_num()?;
        self.lit(",")?;
        let bound_ms = self.opt_num()?;
        self.lit("]")?;
        Some(Reservation {
            id,
            state,
            owner,
            whole_gpu,
            gpus,
            created_ms,
            deadline_ms,
            bound_ms,
        })
    }

    fn owner(&mut self) -> Option<Owner> {
        let owner = if self.lit("[\"container\",").is_some() {
            let container_id = self.opt_str()?.map(str::to_string);
            self.lit(",")?;
            let process = if self.lit("null").is_some() {
                None
            } else {
                Some(self.process()?)
            };
            self.lit(",")?;
            let kubernetes = if self.lit("null").is_some() {
                None
            } else {
                self.lit("[")?;
                let namespace = self.str()?.to_string();
                self.lit(",")?;
                let pod = self.str()?.to_string();
                self.lit(",")?;
                let pod_uid = self.opt_str()?.map(str::to_string);
                self.lit(",")?;
                let container = self.str()?.to_string();
                self.lit("]")?;
                Some(KubernetesRef {
                    namespace,
                    pod,
                    pod_uid,
                    container,
                })
            };
            Owner::Container {
                container_id,
                process,
                kubernetes,
            }
        } else {
            self.lit("[\"dra_claim\",")?;
            let claim_uid = self.str()?.to_string();
            self.lit(",")?;
            let namespace = self.str()?.to_string();
            self.lit(",")?;
            let name = self.str()?.to_string();
            Owner::DraClaim {
                claim_uid,
                namespace,
                name,
            }
        };
        self.lit("]")?;
        Some(owner)
    }

    fn process(&mut self) -> Option<ProcessRef> {
        self.lit("[")?;
        let pid = u32::try_from(self.num()?).ok()?;
        self.lit(",")?;
        let start_time = self.num()?;
        let boot_id = if self.eat(b',') {
            let start = self.i + 1;
            let b = self.str()?.to_string();
            self.boot = Some(start..start + b.len());
            b
        } else {
            let at = self.boot.clone()?;
            self.left_out = Some(at.clone());
            self.s.get(at)?.to_string()
        };
        self.lit("]")?;
        Some(ProcessRef {
            pid,
            start_time,
            boot_id,
        })
    }

    fn booking(&mut self) -> Option<Booking> {
        self.lit("[")?;
        let index = u32::try_from(self.num()?).ok()?;
        self.lit(",")?;
        let uuid = self.str()?.to_string();
        self.lit(",")?;
        let memory = self.num()?;
        self.lit(",")?;
        let cores = u8::try_from(self.num()?).ok()?;
        self.lit("]")?;
        Some(Booking {
            index,
            uuid,
            memory,
            cores,
        })
    }
}

/// Whether the reservation text at `span` of `text` (as [`read_registry_spans`] found it)
/// reads as `r`, compared field by field without building anything. A boot id the text left
/// out is the one at `span.left_out_boot`.
pub(crate) fn reads_as(text: &str, span: &Span, r: &Reservation) -> bool {
    let boot = span.left_out_boot.clone().and_then(|b| text.get(b));
    let mut c = Cursor {
        s: text.get(..span.range.end).unwrap_or_default(),
        i: span.range.start,
        left_out: None,
        boot: None,
    };
    c.same_reservation(r, boot).is_some() && c.i == span.range.end
}

/// `Some(())` when `a == b`: the comparing walker stops at the first difference with `?`.
fn same<T: PartialEq + ?Sized>(a: &T, b: &T) -> Option<()> {
    (a == b).then_some(())
}

impl Cursor<'_> {
    // The walkers below destructure every struct without `..`, so that a field added to the
    // model fails to compile here until it is compared.

    fn same_reservation(&mut self, r: &Reservation, boot: Option<&str>) -> Option<()> {
        let Reservation {
            id,
            state,
            owner,
            whole_gpu,
            gpus,
            created_ms,
            deadline_ms,
            bound_ms,
        } = r;
        self.lit("[")?;
        same(self.str()?, id.as_str())?;
        self.lit(",")?;
        let read = match self.str()? {
            "pending" => ReservationState::Pending,
            "bound" => ReservationState::Bound,
            _ => return None,
        };
        same(&read, state)?;
        self.lit(",")?;
        self.same_owner(owner, boot)?;
        self.lit(",[")?;
        let mut expected = gpus.iter();
        if !self.eat(b']') {
            loop {
                self.same_booking(expected.next()?)?;
                if self.eat(b']') {
                    break;
                }
                self.lit(",")?;
            }
        }
        if expected.next().is_some() {
            return None;
        }
        self.lit(",")?;
        same(&self.bool()?, whole_gpu)?;
        self.lit(",")?;
        same(&self.num()?, created_ms)?;
        self.lit(",")?;
        same(&self.opt_num()?, deadline_ms)?;
        self.lit(",")?;
        same(&self.opt_num()?, bound_ms)?;
        self.lit("]")
    }

    fn same_owner(&mut self, owner: &Owner, boot: Option<&str>) -> Option<()> {
        match owner {
            Owner::Container {
                container_id,
                process,
                kubernetes,
            } => {
                self.lit("[\"container\",")?;
                same(&self.opt_str()?, &container_id.as_deref())?;
                self.lit(",")?;
                match process {
                    None => self.lit("null")?,
                    Some(ProcessRef {
                        pid,
                        start_time,
                        boot_id,
                    }) => {
                        self.lit("[")?;
                        same(&self.num()?, &u64::from(*pid))?;
                        self.lit(",")?;
                        same(&self.num()?, start_time)?;
                        let read = if self.eat(b',') { self.str()? } else { boot? };
                        same(read, boot_id.as_str())?;
                        self.lit("]")?;
                    }
                }
                self.lit(",")?;
                match kubernetes {
                    None => self.lit("null")?,
                    Some(KubernetesRef {
                        namespace,
                        pod,
                        pod_uid,
                        container,
                    }) => {
                        self.lit("[")?;
                        same(self.str()?, namespace.as_str())?;
                        self.lit(",")?;
                        same(self.str()?, pod.as_str())?;
                        self.lit(",")?;
                        same(&self.opt_str()?, &pod_uid.as_deref())?;
                        self.lit(",")?;
                        same(self.str()?, container.as_str())?;
                        self.lit("]")?;
                    }
                }
            }
            Owner::DraClaim {
                claim_uid,
                namespace,
                name,
            } => {
                self.lit("[\"dra_claim\",")?;
                same(self.str()?, claim_uid.as_str())?;
                self.lit(",")?;
                same(self.str()?, namespace.as_str())?;
                self.lit(",")?;
                same(self.str()?, name.as_str())?;
            }
        }
        self.lit("]")
    }

    fn same_booking(&mut self, b: &Booking) -> Option<()> {
        let Booking {
            index,
            uuid,
            memory,
            cores,
        } = b;
        self.lit("[")?;
        same(&self.num()?, &u64::from(*index))?;
        self.lit(",")?;
        same(self.str()?, uuid.as_str())?;
        self.lit(",")?;
        same(&self.num()?, memory)?;
        self.lit(",")?;
        same(&self.num()?, &u64::from(*cores))?;
        self.lit("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fastwrite::tests::file;

    fn text(f: &RegistryFile) -> String {
        let mut out = Vec::new();
        crate::fastwrite::write_registry(&mut out, f).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn reads_what_this_build_writes_as_serde_does() {
        let mut rs = crate::compact::tests::samples();
        rs[1].id = "no-escapes-but-{braces}-and-[brackets]-é".into();
        if let Owner::Container { container_id, .. } = &mut rs[1].owner {
            *container_id = Some("c{1}".into());
        }
        let f = file(rs);
        let t = text(&f);
        let fast = read_registry(&t);
        let slow: RegistryFile = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fast.as_ref(), Some(&slow));
        assert_eq!(fast.as_ref(), Some(&f));
        assert_eq!(
            read_registry(&text(&file(Vec::new()))),
            Some(file(Vec::new()))
        );
    }

    #[test]
    fn special_bytes_are_found_where_a_byte_loop_finds_them() {
        let naive = |b: &[u8], i: usize| {
            (i..b.len())
                .find(|&k| b[k] == b'"' || b[k] == b'\\' || b[k] < 0x20)
                .unwrap_or(b.len())
        };
        // Every special byte (and some that are not: 0x20, 0x7f, UTF-8 bytes) at every
        // position of texts of every length up to 24, from every start.
        for special in [b'"', b'\\', 0x00, 0x1f, 0x0a] {
            for len in 0..24 {
                for at in 0..=len {
                    let mut b: Vec<u8> = (0..len)
                        .map(|k| [b'a', 0x20, 0x7f, 0xc3, 0xa9, b'Z'][k % 6])
                        .collect();
                    if at < len {
                        b[at] = special;
                        if at + 2 < len {
                            b[at + 2] = b'"';
                        }
                    }
                    for start in 0..=len {
                        assert_eq!(
                            special_from(&b, start),
                            naive(&b, start),
                            "{b:?} from {start}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        let f = file(crate::compact::tests::samples());
        let t = text(&f);
        // The samples hold an escaped container id: serde reads it, this path declines.
        assert!(t.contains("\\\""));
        assert_eq!(read_registry(&t), None);
        let mut plain = crate::compact::tests::samples();
        plain[1].owner = Owner::container();
        let t = text(&file(plain));
        assert!(read_registry(&t).is_some());
        for bad in [
            t.replacen("{\"version\":2", "{ \"version\":2", 1), // whitespace
            t.replacen(":1796067552114}", ":01796067552114}", 1),
            t.replacen(":1796067552114}", ":1796067552114.0}", 1),
            t.replacen(":1796067552114}", ":-1796067552114}", 1),
            t.replacen("\"pending\"", "\"Pending\"", 1),
            t.replacen(",30]", ",300]", 1), // cores above u8
            format!("{t}\n"),
            t[..t.len() - 1].to_string(),
        ] {
            assert_ne!(bad, t, "each case changes the text");
            assert_eq!(read_registry(&bad), None, "{bad}");
        }
        // Version 1 objects.
        let v1 = r#"{"version":1,"inventory":{"gpus":[]},"reservations":[{"id":"x"}]}"#;
        assert_eq!(read_registry(v1), None);
    }
}
