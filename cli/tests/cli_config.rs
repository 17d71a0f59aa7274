//! The `gpuslice` binary with bad configuration: each mistake gives one line naming the
//! file, the key, the value and what is accepted, and exit status 2; and a node configured
//! for NVML without a driver says so and how to simulate one.

use std::process::{Command, Output};

fn gpuslice(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("GPUSLICE_CONFIG")
        .output()
        .unwrap()
}

fn refused(text: &str, want: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, text).unwrap();
    for args in [&["status"][..], &["cdi", "generate"][..], &["gc"][..]] {
        let out = gpuslice(&cfg, args);
        assert_eq!(out.status.code(), Some(2), "{args:?} with {text:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "not one line: {err}");
        assert!(err.contains(&format!("config {}", cfg.display())), "{err}");
        for w in want {
            assert!(err.contains(w), "{err} lacks {w}");
        }
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn unknown_key() {
    refused(
        "[placement]\npolcy = \"spread\"\n",
        &["unknown key `placement.polcy`", "policy"],
    );
}

#[test]
fn wrong_type() {
    refused(
        "[registry]\npending_timeout = 120\n",
        &[
            "key `registry.pending_timeout`",
            "value 120",
            "expected a string",
        ],
    );
}

#[test]
fn bad_quantity() {
    refused(
        "[inventory]\nsource = \"simulated\"\n[[inventory.simulated]]\nmemory = \"100m\"\n",
        &["key `inventory.simulated[0].memory`", "\"100m\"", "Gi"],
    );
}

#[test]
fn bad_policy() {
    refused(
        "[placement]\npolicy = \"fastest\"\n",
        &[
            "key `placement.policy`",
            "\"fastest\"",
            "`binpack` or `spread`",
        ],
    );
}

#[test]
fn missing_explicit_config_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("absent.toml");
    let out = gpuslice(&cfg, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.toml"));
}

#[test]
fn nvml_without_a_driver_says_how_to_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n",
            dir.path().join("state").display(),
            dir.path().join("cdi").display()
        ),
    )
    .unwrap();
    let out = gpuslice(&cfg, &["cdi", "generate"]);
    if out.status.success() {
        // A machine with a real NVIDIA driver has nothing to report here.
        return;
    }
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("NVML is not available"), "{err}");
    assert!(
        err.contains("source = \"simulated\"") && err.contains(&cfg.display().to_string()),
        "{err}"
    );
    assert!(
        !dir.path().join("cdi").exists(),
        "a spec was written despite the failure"
    );
}

/// The console and the webhook are cluster services that never read the node config: a
/// node's malformed config does not stop them (each fails here on its own input instead).
#[test]
fn cluster_services_do_not_read_the_node_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "state_dir = [\n").unwrap();
    let cert = dir.path().join("absent-cert.pem");
    let out = gpuslice(
        &cfg,
        &[
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            cert.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !err.contains("config.toml") && err.contains("absent-cert.pem"),
        "{err}"
    );
    let kubeconfig = dir.path().join("absent-kubeconfig");
    let out = gpuslice(
        &cfg,
        &[
            "console",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !err.contains("config.toml") && err.contains("absent-kubeconfig"),
        "{err}"
    );
}
