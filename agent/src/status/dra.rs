//! The DRA kubelet plugin's part of `gpuslice status`: the mode it publishes the node's GPUs
//! in (capacity or slots), as the plugin recorded it at start in the state directory, and the
//! claim bookings kept after their claim left the API server, with why.

use std::path::Path;

use gpuslice_registry::{printable, RegistryFile};
use serde_json::Value;

/// The plugin's record, `None` when no plugin ever ran on this node (or it is unreadable:
/// the text says so).
fn record(path: &Path) -> Option<Result<Value, String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("cannot read {}: {e}", path.display()))),
    };
    Some(serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display())))
}

/// The warning of a slot count above what the scheduler decides in time (a record's
/// `slots_per_gpu` past `u32` is above it too).
fn warning(slots_per_gpu: u64) -> Option<String> {
    gpuslice_config::slots_per_gpu_warning(u32::try_from(slots_per_gpu).unwrap_or(u32::MAX))
}

/// Adds `dra` (the plugin's record, with `warning` when its slot count is above what the
/// scheduler decides in time, or `{"error": …}`) to `status --json` when a plugin ran.
pub fn add_json(status: &mut Value, path: &Path) {
    let Some(r) = record(path) else {
        return;
    };
    if let Some(o) = status.as_object_mut() {
        let mut v = r.unwrap_or_else(|e| serde_json::json!({ "error": e }));
        if let Some(w) = v["slots_per_gpu"].as_u64().and_then(warning) {
            v["warning"] = Value::String(w);
        }
        o.insert("dra".into(), v);
    }
}

/// The plugin's line of the status table (empty when no plugin ran on this node).
pub fn render_text(path: &Path) -> String {
    match record(path) {
        None => String::new(),
        Some(Err(e)) => format!("\nDRA: {e}\n"),
        Some(Ok(v)) => {
            let mode = v["mode"].as_str().unwrap_or("?");
            let configured = v["configured"].as_str().unwrap_or("?");
            match v["slots_per_gpu"].as_u64() {
                Some(n) => {
                    let mut text =
                        format!("\nDRA: slot mode, {n} slots per GPU (dra.mode = {configured})\n");
                    if let Some(w) = warning(n) {
                        text.push_str(&format!("  warning: {w}\n"));
                    }
                    text
                }
                None => format!("\nDRA: {mode} mode (dra.mode = {configured})\n"),
            }
        }
    }
}

/// One line per claim booking kept for its running containers after the claim left the API
/// server (empty when there is none): the claim, the reservation, what the API server said and
/// how many containers keep it. `status --json` shows the same as the owner's `gone`.
pub fn render_kept(file: &RegistryFile) -> String {
    let mut out = String::new();
    for r in &file.reservations {
        if let Some(g) = r.owner.claim_gone() {
            out.push_str(&format!(
                "DRA: reservation {} of {} is kept: {}, but {} container(s) it was given to still run; offered to no one, released when the last exits\n",
                r.id,
                printable(&r.owner.to_string()),
                printable(&g.why),
                r.owner.processes().len()
            ));
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("\n{out}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookings_kept_after_their_claim_left_are_shown_with_why() {
        let file: RegistryFile = serde_json::from_value(serde_json::json!({
            "version": gpuslice_registry::REGISTRY_VERSION,
            "reservations": [
                {"id": "0123456789abcdef", "state": "bound", "created_ms": 1, "gpus": [],
                 "owner": {"kind": "dra_claim", "claim_uid": "u1", "namespace": "ns", "name": "held",
                    "members": [{"pid": 7, "start_time": 1, "boot_id": "b"}],
                    "gone": {"since_ms": 5, "why": "the claim no longer exists"}}},
                {"id": "0123456789abcdee", "state": "bound", "created_ms": 1, "gpus": [],
                 "owner": {"kind": "dra_claim", "claim_uid": "u2", "namespace": "ns", "name": "live"}},
            ],
        }))
        .unwrap();
        assert_eq!(
            render_kept(&file),
            "\nDRA: reservation 0123456789abcdef of claim ns/held is kept: the claim no longer exists, but 1 container(s) it was given to still run; offered to no one, released when the last exits\n"
        );
        let none: RegistryFile = serde_json::from_value(serde_json::json!({
            "version": gpuslice_registry::REGISTRY_VERSION,
        }))
        .unwrap();
        assert_eq!(render_kept(&none), "");
    }

    #[test]
    fn the_recorded_mode_is_shown_and_absent_without_a_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet-plugin.json");
        assert_eq!(render_text(&path), "");
        let mut v = serde_json::json!({});
        add_json(&mut v, &path);
        assert!(v.get("dra").is_none());
        std::fs::write(
            &path,
            r#"{"mode":"slots","configured":"auto","slots_per_gpu":16,"node":"n1"}"#,
        )
        .unwrap();
        // 16 slots: above what the 1.34/1.35 scheduler decides in time, said with the value.
        let text = render_text(&path);
        assert!(
            text.starts_with("\nDRA: slot mode, 16 slots per GPU (dra.mode = auto)\n  warning: dra.slots_per_gpu = 16 is above 6"),
            "{text}"
        );
        add_json(&mut v, &path);
        assert_eq!(v["dra"]["mode"], "slots");
        assert!(
            v["dra"]["warning"]
                .as_str()
                .unwrap()
                .contains("10 s filter timeout"),
            "{v}"
        );
        std::fs::write(
            &path,
            r#"{"mode":"slots","configured":"slots","slots_per_gpu":6,"node":"n1"}"#,
        )
        .unwrap();
        assert_eq!(
            render_text(&path),
            "\nDRA: slot mode, 6 slots per GPU (dra.mode = slots)\n"
        );
        add_json(&mut v, &path);
        assert!(v["dra"].get("warning").is_none(), "{v}");
        std::fs::write(
            &path,
            r#"{"mode":"capacity","configured":"capacity","node":"n1"}"#,
        )
        .unwrap();
        assert_eq!(
            render_text(&path),
            "\nDRA: capacity mode (dra.mode = capacity)\n"
        );
    }
}
