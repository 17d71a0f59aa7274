//! What `gpuslice status` shows of the enforcer: its record (`enforcer.json`) as an
//! `enforcer` object beside `gpus` and `reservations`, and in the table its totals and the
//! latest events. A record that cannot be read is shown as such, never fatal.

use std::path::Path;

use serde_json::{json, Value};

use crate::enforce::events::read_record;

/// Events printed in the table.
pub const SHOWN_EVENTS: usize = 10;

/// The `enforcer` value of `status --json`: the record, `null` when no enforcer ever ran,
/// or `{"error": …}` when the record is unreadable.
pub fn json_of(state_dir: &Path) -> Value {
    match read_record(state_dir) {
        Ok(Some(r)) => serde_json::to_value(r).unwrap_or(Value::Null),
        Ok(None) => Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// Adds `enforcer` to a `status --json` object.
pub fn add_json(status: &mut Value, state_dir: &Path) {
    if let Some(o) = status.as_object_mut() {
        o.insert("enforcer".into(), json_of(state_dir));
    }
}

/// The enforcer's part of the status table (empty when no enforcer ever ran).
pub fn render_text(state_dir: &Path) -> String {
    let r = match read_record(state_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return String::new(),
        Err(e) => return format!("\nENFORCER: {e}\n"),
    };
    let mut out = format!(
        "\nENFORCER: {} killed, {} escalations, {} memory reports, {} compute reports, {} throttled, {} unowned\n",
        r.kills_total,
        r.escalations_total,
        r.memory_reports_total,
        r.compute_reports_total,
        r.throttles_total,
        r.unowned_total
    );
    let skip = r.events.len().saturating_sub(SHOWN_EVENTS);
    for e in &r.events[skip..] {
        let line = e.line();
        let text = line
            .strip_prefix("gpuslice serve: enforcer: ")
            .unwrap_or(&line);
        out.push_str(&format!("  {text}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::events::{publish, Event, EventKind, Shared, ENFORCER_FILE};

    #[test]
    fn status_shows_the_record_or_nothing_or_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = json!({"gpus": [], "reservations": []});
        add_json(&mut v, dir.path());
        assert_eq!(v["enforcer"], Value::Null);
        assert_eq!(render_text(dir.path()), "");
        let e = Event {
            kind: EventKind::MemoryKill,
            at_ms: 5,
            reservation: "abc".into(),
            container_id: Some("ctr".into()),
            uuid: "GPU-x".into(),
            pid: 42,
            slice_bytes: Some(10),
            limit_bytes: Some(2),
            process_bytes: Some(10),
            share: None,
            share_limit: None,
            error: None,
        };
        publish(&Shared::default(), dir.path(), vec![e]).unwrap();
        add_json(&mut v, dir.path());
        assert_eq!(v["enforcer"]["kills_total"], 1);
        assert_eq!(v["enforcer"]["events"][0]["pid"], 42);
        assert_eq!(v["enforcer"]["events"][0]["kind"], "memory_kill");
        let t = render_text(dir.path());
        assert!(t.contains("ENFORCER: 1 killed"), "{t}");
        assert!(
            t.contains("memory_kill pid 42 of reservation abc (container ctr) on GPU-x"),
            "{t}"
        );
        std::fs::write(dir.path().join(ENFORCER_FILE), "nope").unwrap();
        assert!(render_text(dir.path()).contains(ENFORCER_FILE));
        add_json(&mut v, dir.path());
        assert!(v["enforcer"]["error"]
            .as_str()
            .unwrap()
            .contains(ENFORCER_FILE));
    }
}
