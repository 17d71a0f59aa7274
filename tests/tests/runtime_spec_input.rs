//! With real runc through `gpuslice-runtime`: a spec runc
//! accepts that carries no request (invalid UTF-8 and a lone surrogate in env values,
//! nesting 200 deep) runs, its config.json never rewritten; a sliced container's edited spec
//! keeps every number as written (`12345678901234567890123`, `1E+2`, `-0`, `1.50`) in
//! unknown fields and in known fields the edit does not change; a large spec with a request
//! is edited within a small multiple of its size.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

use gpuslice_e2e::runc::{run, Bundle, RUNC_ROOT};
use gpuslice_e2e::{bin, lock, Resource, TestNode};
use serde_json::{json, Value};

/// `c` as JSON text with each `"@name@"` string replaced by raw JSON text.
fn with_raw(c: &Value, raw: &[(&str, &[u8])]) -> Vec<u8> {
    let mut text = serde_json::to_vec(c).unwrap();
    for (name, bytes) in raw {
        let needle = format!("\"@{name}@\"");
        let at = text
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
            .unwrap_or_else(|| panic!("{needle} not in the spec"));
        text.splice(at..at + needle.len(), bytes.iter().copied());
    }
    text
}

#[test]
fn runc_runs_a_spec_without_a_request_whatever_is_in_it() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("echo \"A=$A B=$B\"; echo DONE", &[("note", "n")]);
    let mut c = bundle.config();
    let env = c["process"]["env"].as_array_mut().unwrap();
    env.push(json!("@a@"));
    env.push(json!("@b@"));
    c["x-deep"] = json!("@deep@");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let text = with_raw(
        &c,
        &[
            ("a", b"\"A=\xff\xfe\""),
            ("b", br#""B=\udc00""#),
            ("deep", deep.as_bytes()),
        ],
    );
    std::fs::write(bundle.config_path(), &text).unwrap();
    let before = std::fs::metadata(bundle.config_path()).unwrap();
    let out = run(&node, &bundle, "gpuslice-e2e-passable");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("DONE"),
        "runc did not run it: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // runc reads invalid UTF-8 and the lone surrogate as U+FFFD.
    assert!(stdout.contains("B=\u{fffd}"), "{stdout}");
    assert_eq!(std::fs::read(bundle.config_path()).unwrap(), text);
    let after = std::fs::metadata(bundle.config_path()).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    assert!(node.reservations().is_empty());
}

/// Numbers `Value` cannot hold as written, as `"key":number` text.
const ODD: &str = r#"{"big":12345678901234567890123,"exp":1E+2,"neg0":-0,"frac":1.50}"#;

#[test]
fn a_sliced_spec_keeps_every_number_as_written() {
    let _s = lock(&[Resource::Cdi]);
    let node = TestNode::new(&["10Gi"]);
    let bundle = Bundle::new("echo DONE", &[("gpuslice.io/memory", "1Gi")]);
    let mut c = bundle.config();
    c["x-vendor"] = json!("@odd@");
    c["process"]["x-vendor"] = json!("@odd@");
    c["process"]["oomScoreAdj"] = json!("@neg0@");
    c["root"]["x-vendor"] = json!("@odd@");
    c["linux"]["resources"]["x-vendor"] = json!("@odd@");
    c["linux"]["x-vendor"] = json!("@odd@");
    let text = with_raw(
        &c,
        &[
            ("odd", ODD.as_bytes()),
            ("odd", ODD.as_bytes()),
            ("neg0", b"-0"),
            ("odd", ODD.as_bytes()),
            ("odd", ODD.as_bytes()),
            ("odd", ODD.as_bytes()),
        ],
    );
    std::fs::write(bundle.config_path(), &text).unwrap();
    let out = run(&node, &bundle, "gpuslice-e2e-numbers");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("DONE"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let edited = String::from_utf8(std::fs::read(bundle.config_path()).unwrap()).unwrap();
    assert!(
        edited.contains("\"gpuslice.io/reservation\""),
        "not edited: {edited}"
    );
    assert_eq!(
        edited.matches(ODD).count(),
        5,
        "a number was re-encoded: {edited}"
    );
    assert!(edited.contains("\"oomScoreAdj\":-0"), "{edited}");
    // What was edited reads as before, plus the slice.
    let v: Value = serde_json::from_str(&edited).unwrap();
    assert_eq!(v["process"]["args"], c["process"]["args"]);
    assert!(v["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e.as_str().is_some_and(|e| e.starts_with("GPUSLICE"))));
    assert!(node.reservations().is_empty());
}

#[test]
fn a_large_spec_with_a_request_is_edited_in_a_small_multiple_of_its_size() {
    let _s = lock(&[Resource::Cdi]);
    // A stand-in for runc: the wrapper's own memory is measured, not the container's.
    let tools = tempfile::tempdir().unwrap();
    let runtime = tools.path().join("runtime");
    std::fs::write(&runtime, "#!/bin/sh\nexit 7\n").unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = TestNode::with(
        &["10Gi"],
        &format!("[runtime]\npath = \"{}\"\n", runtime.display()),
    );
    let bundle = tempfile::tempdir().unwrap();
    // 12 MiB: 4 MiB of env entries (edited) and 8 MiB of small unknown values (2 bytes of
    // text each, 32 bytes each as a parsed tree).
    let env: Vec<String> = (0..40_000)
        .map(|i| format!("V{i}={}", "x".repeat(96)))
        .collect();
    let mut zeros = b"[".to_vec();
    while zeros.len() < (8 << 20) {
        zeros.extend_from_slice(b"0,");
    }
    zeros.extend_from_slice(b"0]");
    let c = json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["true"], "cwd": "/", "env": env},
        "root": {"path": "rootfs"},
        "annotations": {"gpuslice.io/memory": "1Gi"},
        "x-vendor": "@zeros@",
    });
    let text = with_raw(&c, &[("zeros", &zeros)]);
    std::fs::write(bundle.path().join("config.json"), &text).unwrap();
    let mib = text.len() >> 20;
    // Data segment: 5 times the spec plus 48 MiB for the program itself.
    let limit_kib = (5 * mib + 48) << 10;
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -d {limit_kib}; exec \"$0\" \"$@\""))
        .arg(bin("gpuslice-runtime"))
        .args(["--root", RUNC_ROOT, "create", "--bundle"])
        .arg(bundle.path())
        .arg("gpuslice-e2e-large")
        .env("GPUSLICE_CONFIG", node.config_str())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "the {mib} MiB spec was not edited within {} MiB: {}",
        limit_kib >> 10,
        String::from_utf8_lossy(&out.stderr)
    );
    let edited = std::fs::read(bundle.path().join("config.json")).unwrap();
    let v: Value = serde_json::from_slice(&edited).unwrap();
    let id = v["annotations"]["gpuslice.io/reservation"]
        .as_str()
        .expect("edited")
        .to_string();
    let key = b"\"x-vendor\":";
    let at = edited
        .windows(key.len())
        .position(|w| w == key)
        .expect("x-vendor kept");
    assert!(
        edited[at + key.len()..].starts_with(&zeros),
        "x-vendor changed"
    );
    assert_eq!(v["process"]["env"][39_999], c["process"]["env"][39_999]);
    // The stand-in runtime failed (exit 7), so the wrapper gave the edit's reservation back.
    assert!(
        node.reservations().iter().all(|r| r["id"] != id.as_str()),
        "reservation {id} left after the runtime failed: {:?}",
        node.reservations()
    );
    assert!(node.reservations().is_empty());
}
