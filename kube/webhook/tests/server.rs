//! The server refuses to start without a usable certificate, and serves a renewed one
//! without a restart.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_webhook::tls::{CertFiles, Reloading, CHECK_EVERY};
use gpuslice_webhook::{run_until_signal, WebhookArgs, WebhookError};

fn args() -> WebhookArgs {
    WebhookArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls_cert: None,
        tls_key: None,
        kubeconfig: None,
        hami_compat: false,
        unused_template_grace: 600,
        budget_recount: 15,
        budget_lease: None,
    }
}

/// A self-signed EC pair for `cn` in `dir`.
pub fn pair(dir: &Path, cn: &str) -> CertFiles {
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={cn}")])
        .arg("-keyout")
        .arg(&files.key)
        .arg("-out")
        .arg(&files.cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    files
}

#[test]
fn without_tls_it_does_not_start() {
    let err = run_until_signal(args()).unwrap_err();
    assert!(matches!(err, WebhookError::NoTls), "{err}");
    assert!(
        err.to_string()
            .contains("--tls-cert PATH and --tls-key PATH"),
        "{err}"
    );
    let mut half = args();
    half.tls_cert = Some("/nonexistent.crt".into());
    assert!(matches!(
        run_until_signal(half).unwrap_err(),
        WebhookError::NoTls
    ));
}

#[test]
fn an_unusable_pair_is_refused_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = pair(dir.path(), "a");
    let mut a = args();
    a.tls_cert = Some(files.cert.clone());
    a.tls_key = Some(dir.path().join("missing.key"));
    let err = run_until_signal(a).unwrap_err().to_string();
    assert!(
        err.contains("--tls-key") && err.contains("missing.key"),
        "{err}"
    );
    std::fs::write(&files.cert, "not pem").unwrap();
    let mut a = args();
    a.tls_cert = Some(files.cert.clone());
    a.tls_key = Some(files.key.clone());
    let err = run_until_signal(a).unwrap_err().to_string();
    assert!(
        err.contains("--tls-cert") && err.contains("tls.crt"),
        "{err}"
    );
}

#[test]
fn a_renewed_certificate_is_served_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let files = pair(dir.path(), "first");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let r = Reloading::new(files.clone(), provider).unwrap();
    let first = r.current().cert[0].clone();
    std::thread::sleep(CHECK_EVERY + Duration::from_millis(100));
    pair(dir.path(), "second");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let second = loop {
        let now = r.current().cert[0].clone();
        if now != first {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the renewed certificate was not loaded"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // A half-written file keeps the last good pair.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\ntrunc").unwrap();
    std::thread::sleep(CHECK_EVERY + Duration::from_millis(100));
    assert_eq!(r.current().cert[0], second);
}
