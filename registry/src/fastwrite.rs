//! Writing `registry.json` without serde's generic serializer: every registry operation
//! rewrites the whole file under the lock (three per container), and serde's per-value
//! dispatch made the write a quarter of an operation. The output is byte-for-byte what
//! `serde_json::to_vec(&RegistryFile)` gives (compact form of [`crate::compact`]); the tests
//! compare the two on every owner kind and on strings that need escaping.

use crate::model::{Booking, KubernetesRef, Owner, ProcessRef, RegistryFile, Reservation};
use crate::verbatim::Origin;

/// Appends the JSON of `file` to `out`.
#[cfg(test)]
pub(crate) fn write_registry(out: &mut Vec<u8>, file: &RegistryFile) -> serde_json::Result<()> {
    write_registry_from(out, file, None)
}

/// As [`write_registry`], copying the text of reservations unchanged since `origin` was read.
pub(crate) fn write_registry_from(
    out: &mut Vec<u8>,
    file: &RegistryFile,
    origin: Option<&Origin>,
) -> serde_json::Result<()> {
    let mut reuse = origin.map(Origin::reuse);
    out.extend_from_slice(b"{\"version\":");
    num(out, u64::from(file.version));
    out.extend_from_slice(b",\"inventory\":");
    serde_json::to_writer(&mut *out, &file.inventory)?;
    out.extend_from_slice(b",\"reservations\":[");
    let mut last_boot: Option<&str> = None;
    for (i, r) in file.reservations.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let boot = r.owner.process().map(|p| p.boot_id.as_str());
        let elide = boot.is_some() && boot == last_boot;
        match reuse.as_mut().and_then(|u| u.text_of(r, elide)) {
            Some(text) => out.extend_from_slice(text),
            None => reservation(out, r, elide)?,
        }
        if boot.is_some() {
            last_boot = boot;
        }
    }
    out.extend_from_slice(b"],\"counters\":");
    serde_json::to_writer(&mut *out, &file.counters)?;
    out.extend_from_slice(b",\"processes_checked_ms\":");
    num(out, file.processes_checked_ms);
    out.push(b'}');
    Ok(())
}

fn reservation(out: &mut Vec<u8>, r: &Reservation, elide_boot: bool) -> serde_json::Result<()> {
    out.push(b'[');
    string(out, &r.id)?;
    out.extend_from_slice(b",\"");
    out.extend_from_slice(r.state.as_str().as_bytes());
    out.extend_from_slice(b"\",");
    owner(out, &r.owner, elide_boot)?;
    out.extend_from_slice(b",[");
    for (i, b) in r.gpus.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        booking(out, b)?;
    }
    out.extend_from_slice(if r.whole_gpu { b"],true," } else { b"],false," });
    num(out, r.created_ms);
    out.push(b',');
    opt_num(out, r.deadline_ms);
    out.push(b',');
    opt_num(out, r.bound_ms);
    out.push(b']');
    Ok(())
}

fn owner(out: &mut Vec<u8>, o: &Owner, elide_boot: bool) -> serde_json::Result<()> {
    match o {
        Owner::Container {
            container_id,
            process: p,
            kubernetes,
        } => {
            out.extend_from_slice(b"[\"container\",");
            opt_string(out, container_id.as_deref())?;
            out.push(b',');
            match p {
                Some(p) => process(out, p, elide_boot)?,
                None => out.extend_from_slice(b"null"),
            }
            out.push(b',');
            match kubernetes {
                Some(k) => kube(out, k)?,
                None => out.extend_from_slice(b"null"),
            }
        }
        Owner::DraClaim {
            claim_uid,
            namespace,
            name,
        } => {
            out.extend_from_slice(b"[\"dra_claim\",");
            string(out, claim_uid)?;
            out.push(b',');
            string(out, namespace)?;
            out.push(b',');
            string(out, name)?;
        }
    }
    out.push(b']');
    Ok(())
}

fn process(out: &mut Vec<u8>, p: &ProcessRef, elide_boot: bool) -> serde_json::Result<()> {
    out.push(b'[');
    num(out, u64::from(p.pid));
    out.push(b',');
    num(out, p.start_time);
    if !elide_boot {
        out.push(b',');
        string(out, &p.boot_id)?;
    }
    out.push(b']');
    Ok(())
}

fn kube(out: &mut Vec<u8>, k: &KubernetesRef) -> serde_json::Result<()> {
    out.push(b'[');
    string(out, &k.namespace)?;
    out.push(b',');
    string(out, &k.pod)?;
    out.push(b',');
    opt_string(out, k.pod_uid.as_deref())?;
    out.push(b',');
    string(out, &k.container)?;
    out.push(b']');
    Ok(())
}

fn booking(out: &mut Vec<u8>, b: &Booking) -> serde_json::Result<()> {
    out.push(b'[');
    num(out, u64::from(b.index));
    out.push(b',');
    string(out, &b.uuid)?;
    out.push(b',');
    num(out, b.memory);
    out.push(b',');
    num(out, u64::from(b.cores));
    out.push(b']');
    Ok(())
}

/// A JSON string: copied as is when nothing in it needs escaping, else through serde_json
/// (the same escapes as the serde path).
fn string(out: &mut Vec<u8>, s: &str) -> serde_json::Result<()> {
    if s.bytes().all(|c| c >= 0x20 && c != b'"' && c != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        serde_json::to_writer(&mut *out, s)
    }
}

fn opt_string(out: &mut Vec<u8>, s: Option<&str>) -> serde_json::Result<()> {
    match s {
        Some(s) => string(out, s),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

fn num(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn opt_num(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => num(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{Counters, Inventory, ReservationState};

    /// A registry file around `reservations` (also used by `fastread`'s tests).
    pub(crate) fn file(reservations: Vec<Reservation>) -> RegistryFile {
        let mut counters = Counters {
            reserved_total: 3,
            ..Default::default()
        };
        counters.refused_total.insert("no-fit".into(), 2);
        RegistryFile {
            version: 2,
            inventory: Inventory::default(),
            reservations,
            counters,
            processes_checked_ms: 1_796_067_552_114,
        }
    }

    fn same_as_serde(f: &RegistryFile) {
        let mut fast = Vec::new();
        write_registry(&mut fast, f).unwrap_or_else(|e| panic!("{e}"));
        let slow = serde_json::to_vec(f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&slow)
        );
    }

    #[test]
    fn writes_what_serde_writes_for_every_owner_kind() {
        same_as_serde(&file(crate::compact::tests::samples()));
        same_as_serde(&file(Vec::new()));
    }

    #[test]
    fn strings_that_need_escaping_and_extreme_numbers() {
        let mut rs = crate::compact::tests::samples();
        rs[0].id = "quote\" back\\ tab\t nl\n ctl\u{1} del\u{7f} é /".into();
        rs[0].created_ms = u64::MAX;
        rs[0].deadline_ms = Some(0);
        rs[1].gpus[0].index = u32::MAX;
        rs[1].gpus[0].cores = u8::MAX;
        rs[1].gpus[0].uuid = "GPU-\u{2028}".into();
        if let Owner::Container {
            process: Some(p), ..
        } = &mut rs[1].owner
        {
            p.pid = u32::MAX;
            p.boot_id = "\\".into();
        }
        // Two processes with the same boot id in a row: the second leaves it out.
        let mut again = rs[1].clone();
        again.id = "3123456789abcdef".into();
        again.state = ReservationState::Pending;
        rs.push(again);
        same_as_serde(&file(rs));
    }
}
