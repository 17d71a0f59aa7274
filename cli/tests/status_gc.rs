//! Through the `gpuslice` binary on a hand-written registry:
//! `gc` and `gc --rebuild` remove slice CDI specs whose reservation is gone and keep a slice
//! directory whose record is unreadable, saying so; `status` escapes
//! control characters in owner names (JSON keeps them as JSON escapes); `status` says when
//! the registry books more than a GPU holds or lists an id twice, and prints huge figures in
//! a unit that fits.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";
const LIVE: &str = "0123456789abcdef";
const GONE: &str = "fedcba9876543210";

struct Node {
    _dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    cdi: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let cdi = dir.path().join("cdi");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&cdi).unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"1Gi\"\n",
                state.display(),
                cdi.display()
            ),
        )
        .unwrap();
        Node {
            _dir: dir,
            config,
            state,
            cdi,
        }
    }

    fn gpuslice(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env_remove("GPUSLICE_CONFIG")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.gpuslice(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Writes `registry.json` with one GPU of `memory_total` bytes and `reservations`.
    fn registry(&self, memory_total: u64, reservations: Vec<Value>) {
        let file = json!({
            "version": 3,
            "inventory": {"gpus": [{
                "index": 0, "uuid": UUID, "model": "NVIDIA H200",
                "memory_total": memory_total, "minor": 0
            }]},
            "reservations": reservations,
        });
        let path = self.state.join("registry.json");
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }

    fn spec(&self, name: &str) -> PathBuf {
        let p = self.cdi.join(name);
        std::fs::write(
            &p,
            br#"{"cdiVersion":"0.6.0","kind":"gpuslice.io/slice","devices":[]}"#,
        )
        .unwrap();
        p
    }
}

/// A pending reservation (deadline far ahead) of `memory` bytes, owned by a pod.
fn pending(id: &str, memory: u64, namespace: &str, pod: &str) -> Value {
    json!({
        "id": id,
        "state": "pending",
        "owner": {"kind": "container", "kubernetes": {
            "namespace": namespace, "pod": pod, "container": "main"
        }},
        "gpus": [{"index": 0, "uuid": UUID, "memory": memory, "cores": 0}],
        "created_ms": 1,
        "deadline_ms": 4_000_000_000_000u64,
    })
}

fn exists(p: &Path) -> bool {
    p.exists()
}

#[test]
fn gc_and_rebuild_remove_slice_specs_whose_reservation_is_gone() {
    let node = Node::new();
    node.registry(1 << 30, vec![pending(LIVE, 1 << 20, "ns", "pod")]);
    let live = node.spec(&format!("gpuslice.io-slice_{LIVE}.json"));
    let gone = node.spec(&format!("gpuslice.io-slice_{GONE}.json"));
    // Not gpuslice's slice specs (another kind, a name that is no reservation id): kept.
    let node_spec = node.spec("gpuslice.io-gpu.json");
    let other = node.spec(&format!("vendor.com-dev_{GONE}.json"));
    let odd = node.spec("gpuslice.io-slice_not-an-id.json");

    let out = node.ok(&["gc"]);
    assert!(!exists(&gone), "gc left {gone:?}: {out}");
    assert!(
        out.contains(&format!("removed CDI spec {}", gone.display())) && out.contains(GONE),
        "{out}"
    );
    for kept in [&live, &node_spec, &other, &odd] {
        assert!(exists(kept), "gc removed {kept:?}");
    }

    let again = node.spec(&format!("gpuslice.io-slice_{GONE}.json"));
    let out = node.ok(&["gc", "--rebuild"]);
    assert!(!exists(&again), "gc --rebuild left {again:?}: {out}");
    assert!(exists(&live) && exists(&node_spec) && exists(&other) && exists(&odd));
    // The healthy registry's live reservation (no slice record) is kept by the rebuild.
    assert!(out.contains(LIVE), "{out}");
}

#[test]
fn gc_reports_and_keeps_a_slice_directory_whose_record_is_unreadable() {
    let node = Node::new();
    node.registry(1 << 30, vec![]);
    // The registry does not list it and its record does not read (a newer build's, or
    // damaged): gc cannot tell it from a live slice, so it stays.
    let dir = node.state.join("slices").join(GONE);
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("reservation.json");
    std::fs::write(&record, br#"{"version":2}"#).unwrap();

    let out = node.ok(&["gc"]);
    assert!(record.is_file(), "gc removed {dir:?}: {out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("unreadable record: "))
        .unwrap_or_else(|| panic!("no report of the unreadable record: {out}"));
    assert!(
        line.contains(&record.display().to_string())
            && line.contains("invalid JSON")
            && line.contains("left in place"),
        "{out}"
    );

    // `gc --rebuild` does the same with what no usable registry lists.
    let out = node.ok(&["gc", "--rebuild"]);
    assert!(record.is_file(), "gc --rebuild removed {dir:?}: {out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("unreadable record: ") && l.contains(GONE)),
        "{out}"
    );
}

#[test]
fn status_escapes_control_characters_in_owner_names() {
    let node = Node::new();
    let ns = "ns\u{1b}[2J\u{7}";
    let pod = "pod\nfedcba9876543210  bound  forged/line";
    node.registry(1 << 30, vec![pending(LIVE, 1 << 20, ns, pod)]);
    let out = node.ok(&["status"]);
    assert!(
        !out.chars().any(|c| c.is_control() && c != '\n'),
        "control characters reach the terminal: {out:?}"
    );
    assert!(
        !out.lines().any(|l| l.starts_with(GONE)),
        "forged line: {out}"
    );
    assert!(
        out.contains("ns\\u{1b}[2J\\u{7}/pod\\nfedcba9876543210"),
        "{out}"
    );

    let out = node.ok(&["status", "--json"]);
    assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    assert!(out.contains("\\u001b[2J\\u0007"), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let owner = &v["reservations"][0]["owner"]["kubernetes"];
    assert_eq!(owner["namespace"], ns, "{v}");
    assert_eq!(owner["pod"], pod, "{v}");
}

#[test]
fn status_says_when_the_registry_overbooks_or_repeats_an_id() {
    let node = Node::new();
    node.registry(
        1 << 30,
        vec![
            pending(LIVE, 1 << 30, "ns", "a"),
            pending(LIVE, 1 << 29, "ns", "b"),
        ],
    );
    let out = node.ok(&["status"]);
    let capacity: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("more than it holds"))
        .collect();
    assert_eq!(capacity.len(), 1, "{out}");
    assert!(capacity[0].contains("GPU 0"), "{out}");
    let twice: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("appears twice"))
        .collect();
    assert_eq!(twice.len(), 1, "{out}");
    assert!(twice[0].contains(LIVE), "{out}");
    let v: Value = serde_json::from_str(&node.ok(&["status", "--json"])).unwrap();
    let problems = v["problems"].as_array().expect("problems in --json");
    assert_eq!(problems.len(), 2, "{v}");

    // A sound registry says nothing of the kind.
    node.registry(1 << 30, vec![pending(LIVE, 1 << 29, "ns", "a")]);
    let out = node.ok(&["status"]);
    assert!(
        !out.contains("more than it holds") && !out.contains("appears twice"),
        "{out}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&node.ok(&["status", "--json"])).unwrap()["problems"],
        json!([])
    );
}

#[test]
fn status_prints_the_largest_figures_in_a_unit_that_fits() {
    let node = Node::new();
    node.registry(u64::MAX, vec![pending(LIVE, u64::MAX, "ns", "a")]);
    let out = node.ok(&["status"]);
    assert!(!out.contains("17179869184"), "{out}");
    assert!(out.contains("16384Pi"), "{out}");
}
