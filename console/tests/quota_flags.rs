//! `kubectl gpuslice`'s flags of `quota`, `allocate` and `release`, through the built binary:
//! bad ones are refused with one line before the cluster is asked anything (the kubeconfig
//! names a closed port), and `--help` says what the command lists or writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};

fn plugin(args: &[&str], kubeconfig: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-gpuslice"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A kubeconfig whose API server is a closed port: a command that got past its flags fails
/// naming the connection, not the flags.
fn closed_port() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kubeconfig"),
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n\
users: [{name: u, user: {token: t}}]\n\
contexts: [{name: t, context: {cluster: c, user: u, namespace: team-a}}]\n",
    )
    .unwrap();
    dir
}

#[test]
fn bad_flags_are_one_line_before_the_cluster_is_asked() {
    let dir = closed_port();
    let kc = dir.path().join("kubeconfig");
    for (args, says) in [
        (
            vec!["quota", "-n", "team-a", "-A"],
            "error: quota: -n team-a and -A both given; pass one (-n NAMESPACE for one namespace, -A for every namespace)",
        ),
        (
            vec!["quota", "-n", "Team_A"],
            "error: quota: namespace `Team_A` is not valid; accepted: a DNS-1123 label (a-z, 0-9, '-', at most 63)",
        ),
        (
            vec!["allocate", "deployment/web", "--memory", "8Gi", "-A"],
            "error: allocate: -A (every namespace) does not apply: allocate changes one workload in one namespace; pass -n NAMESPACE, or neither for the context's namespace",
        ),
        (
            vec!["release", "-A", "deployment/web", "--dry-run"],
            "error: release: -A (every namespace) does not apply: release changes one workload in one namespace; pass -n NAMESPACE, or neither for the context's namespace",
        ),
        (
            vec!["release", "deployment/web", "-n", "team-a", "-A"],
            "error: release: -A (every namespace) does not apply: release changes one workload in one namespace; pass -n NAMESPACE, or neither for the context's namespace",
        ),
    ] {
        let out = plugin(&args, &kc);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(stderr.trim_end(), says, "{args:?}");
    }
    // clap's own refusal of an unknown output names the accepted ones.
    let out = plugin(&["quota", "-o", "xml"], &kc);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("error: invalid value 'xml' for '--output <OUTPUT>'")
            && stderr.contains("[possible values: wide, json, yaml]"),
        "{stderr}"
    );
    // Good flags reach the cluster: the failure names the unreachable API server.
    let out = plugin(&["quota", "-A", "-o", "json"], &kc);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot list resourcequotas"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    // Without -A, release reaches the cluster too (in the context's namespace).
    let out = plugin(&["release", "deployment/web", "--dry-run"], &kc);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("error: cannot list resourceclaimtemplates"),
        "{stderr}"
    );
}

#[test]
fn help_says_what_quota_lists() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuslice"))
        .args(["quota", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for says in [
        "limits.gpuslice.io/memory",
        "limits.nvidia.com/gpumem",
        "gpuslice.io/hami-compat=true",
        "ClusterQueue",
        "-A, --all-namespaces",
        "-o, --output <OUTPUT>",
    ] {
        assert!(help.contains(says), "--help does not say {says}:\n{help}");
    }
    let top = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuslice"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&top.stdout).contains("quota"));
}

#[test]
fn help_says_which_form_allocate_writes_and_release_removes() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuslice"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let allocate = help(&["allocate", "--help"]);
    for says in [
        "gpuslice.io/* limits in the containers, which the webhook turns into a claim of each pod, or a ResourceClaimTemplate and a claim",
        "for a new slice the limits form when the webhook (pods.gpuslice.io) is installed, else the claim form",
    ] {
        assert!(allocate.contains(says), "--help does not say {says}:\n{allocate}");
    }
    let release = help(&["release", "--help"]);
    assert!(
        release.contains("the gpuslice.io/* limits or the claim removed"),
        "{release}"
    );
    // The command list shows the first paragraph only.
    let top = help(&["--help"]);
    assert!(
        top.contains("gpuslice.io/* limits in the containers"),
        "{top}"
    );
    assert!(!top.contains("else the claim form"), "{top}");
}
