//! The GPUs' health in `gpuslice status`: what the health watch of `gpuslice serve` recorded
//! (`health.json`): per GPU in `--json`, `healthy` and, when not, `xid` and
//! `unhealthy_since`; in the table, one line per unhealthy GPU.

use std::path::Path;

use gpuslice_driver::health::{find, read_health};
use serde_json::{json, Value};

/// Adds `healthy`, `xid` and `unhealthy_since` to each GPU of `status --json`, and
/// `health_error` when the record cannot be read.
pub fn add_json(status: &mut Value, path: &Path) {
    let list = match read_health(path) {
        Ok(l) => l,
        Err(e) => {
            status["health_error"] = Value::String(e.to_string());
            return;
        }
    };
    let Some(gpus) = status["gpus"].as_array_mut() else {
        return;
    };
    for g in gpus {
        let sick = g["uuid"].as_str().and_then(|u| find(&list, u)).cloned();
        g["healthy"] = json!(sick.is_none());
        g["xid"] = json!(sick.as_ref().map(|u| u.xid));
        g["unhealthy_since"] = json!(sick.as_ref().map(|u| u.since_text()));
    }
}

/// One line per unhealthy GPU (empty when all are healthy).
pub fn render_text(path: &Path) -> String {
    match read_health(path) {
        Err(e) => format!("warning: {e}\n"),
        Ok(list) => list
            .iter()
            .map(|u| format!("{u}: offered to no one new\n"))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_driver::health::{write_health, Unhealthy};

    #[test]
    fn unhealthy_gpus_show_with_xid_and_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("health.json");
        let mut v = json!({"gpus": [
            {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000"},
            {"index": 1, "uuid": "GPU-11111111-0000-0000-0000-000000000000"},
        ]});
        add_json(&mut v, &path);
        assert_eq!(v["gpus"][1]["healthy"], true);
        assert!(render_text(&path).is_empty());
        let sick = Unhealthy {
            index: 1,
            uuid: "GPU-11111111-0000-0000-0000-000000000000".into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        };
        write_health(&path, &[sick]).expect("write");
        add_json(&mut v, &path);
        assert_eq!(v["gpus"][0]["healthy"], true);
        assert_eq!(v["gpus"][0]["xid"], Value::Null);
        assert_eq!(v["gpus"][1]["healthy"], false);
        assert_eq!(v["gpus"][1]["xid"], 79);
        assert_eq!(v["gpus"][1]["unhealthy_since"], "2026-11-30T00:53:20Z");
        let text = render_text(&path);
        assert!(
            text.starts_with("GPU 1 (GPU-11111111-0000-0000-0000-000000000000) is unhealthy: the driver reported XID 79 at 2026-11-30T00:53:20Z"),
            "{text}"
        );
    }
}
