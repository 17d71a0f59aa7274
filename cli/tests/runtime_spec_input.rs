//! `gpuslice-runtime create` on what a bundle's `config.json` may hold:
//! a spec without a request that runc accepts is handed over byte for byte whatever
//! is in it (invalid UTF-8, a lone surrogate, nesting deeper than serde_json's 128 levels);
//! an unparsable spec that mentions `gpuslice.io/` is refused in one line naming the file;
//! a symlink to `/dev/zero`, a FIFO or a spec over 16 MiB is refused in one line naming the
//! path and the limit, within a small memory budget. A shell script stands in for runc (it
//! exits 7, so reaching it is seen); the end-to-end runs with real runc are in
//! tests/tests/runtime_spec_input.rs. The hooks bound their stdin (spec or OCI state) the same
//! way.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("runtime");
        std::fs::write(&runtime, "#!/bin/sh\nexit 7\n").unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "state_dir = \"{}\"\n[runtime]\npath = \"{}\"\n",
                dir.path().join("state").display(),
                runtime.display()
            ),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("bundle")).unwrap();
        Setup { dir }
    }

    fn config_json(&self) -> PathBuf {
        self.dir.path().join("bundle/config.json")
    }

    /// `gpuslice-runtime create` on the bundle, its data segment limited to `data_mib`.
    fn create(&self, data_mib: u64) -> Output {
        Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -d {}; exec \"$0\" \"$@\"", data_mib << 10))
            .arg(env!("CARGO_BIN_EXE_gpuslice-runtime"))
            .args(["create", "--bundle"])
            .arg(self.dir.path().join("bundle"))
            .arg("c1")
            .env("GPUSLICE_CONFIG", self.dir.path().join("config.toml"))
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// A spec runc accepts (it replaces invalid UTF-8 and lone surrogates, and has no nesting
/// limit) without a gpuslice request.
fn passable_specs() -> Vec<(&'static str, Vec<u8>)> {
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    vec![
        (
            "invalid UTF-8 in an env value",
            b"{\"ociVersion\":\"1.0.2\",\"process\":{\"env\":[\"A=\xff\xfe\"]},\"annotations\":{\"a\":\"b\"}}".to_vec(),
        ),
        (
            "a lone surrogate in an env value",
            br#"{"ociVersion":"1.0.2","process":{"env":["A=\udc00"]}}"#.to_vec(),
        ),
        (
            "a lone surrogate in an annotation",
            br#"{"annotations":{"note":"\ud800"},"process":{"env":[]}}"#.to_vec(),
        ),
        (
            "nesting 200 deep",
            format!(r#"{{"ociVersion":"1.0.2","x-vendor":{deep}}}"#).into_bytes(),
        ),
        (
            "odd numbers, spaces and key order",
            b"{ \"z\" : 1E+2 , \"ociVersion\":\"1.0.2\", \"n\": -0, \"big\": 12345678901234567890123 }\n"
                .to_vec(),
        ),
        (
            "an opt-out with invalid UTF-8 elsewhere",
            b"{\"annotations\":{\"gpuslice.io/gpus.sidecar\":\"0\",\"io.kubernetes.cri.container-name\":\"sidecar\"},\"process\":{\"env\":[\"A=\xff\"]}}".to_vec(),
        ),
    ]
}

#[test]
fn specs_without_a_request_reach_the_runtime_byte_for_byte() {
    for (what, bytes) in passable_specs() {
        let s = Setup::new();
        std::fs::write(s.config_json(), &bytes).unwrap();
        let before = std::fs::metadata(s.config_json()).unwrap();
        let out = s.create(256);
        assert_eq!(
            out.status.code(),
            Some(7),
            "{what}: not handed to the runtime: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read(s.config_json()).unwrap(), bytes, "{what}");
        let after = std::fs::metadata(s.config_json()).unwrap();
        assert_eq!(
            (before.ino(), before.mtime_nsec()),
            (after.ino(), after.mtime_nsec()),
            "{what}: config.json was rewritten"
        );
    }
}

#[test]
fn an_unparsable_spec_that_mentions_gpuslice_is_refused_in_one_line() {
    let s = Setup::new();
    let bytes =
        b"{\"annotations\":{\"gpuslice.io/memory\":\"4Gi\"},\"process\":{\"env\":[\"A=\xff\"]}}";
    std::fs::write(s.config_json(), bytes).unwrap();
    let err = one_line_error(&s.create(256));
    let path = s.config_json().display().to_string();
    assert!(
        err.contains(&format!("OCI spec {path} is not a valid JSON object"))
            && err.contains("invalid UTF-8"),
        "{err}"
    );
    assert_eq!(std::fs::read(s.config_json()).unwrap(), bytes);
}

fn assert_refused(s: &Setup, want: &str) {
    let err = one_line_error(&s.create(64));
    let path = s.config_json().display().to_string();
    assert!(
        err.contains(&format!("OCI spec {path} {want}")) && err.contains("16 MiB"),
        "{err}"
    );
}

#[test]
fn what_is_not_a_regular_file_is_refused_without_reading() {
    let s = Setup::new();
    std::os::unix::fs::symlink("/dev/zero", s.config_json()).unwrap();
    assert_refused(&s, "is a character device, not a regular file");
    std::fs::remove_file(s.config_json()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        s.config_json(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert_refused(&s, "is a FIFO, not a regular file");
}

#[test]
fn a_spec_over_the_limit_is_refused_and_one_under_it_is_read_in_little_memory() {
    let s = Setup::new();
    // 17 MiB: refused before it is read.
    let big = vec![b' '; 17 << 20];
    std::fs::write(s.config_json(), &big).unwrap();
    assert_refused(&s, "is larger than 16 MiB");
    // 15 MiB of small values (the worst case for a parsed tree: 32 bytes per 2-byte item),
    // without a request: read within 64 MiB of data segment, handed over unchanged.
    let mut spec = b"{\"ociVersion\":\"1.0.2\",\"x-vendor\":[".to_vec();
    while spec.len() < (15 << 20) {
        spec.extend_from_slice(b"0,");
    }
    spec.extend_from_slice(b"0]}");
    std::fs::write(s.config_json(), &spec).unwrap();
    let out = s.create(64);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(s.config_json()).unwrap(), spec);
}

/// `gpuslice hook LINE` with `/dev/zero` (endless input) on stdin, its data segment limited
/// to `data_mib`.
fn hook_on_endless_stdin(s: &Setup, line: &[&str], data_mib: u64) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -d {}; exec \"$0\" \"$@\"", data_mib << 10))
        .arg(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--config")
        .arg(s.dir.path().join("config.toml"))
        .args(line)
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap()
}

#[test]
fn hooks_read_at_most_16_mib_of_stdin() {
    // The engine hands precreate the spec, the other hooks the OCI state, on stdin: an
    // endless stream is refused after 16 MiB in one line, not read until memory runs out.
    let s = Setup::new();
    for line in [
        &["hook", "precreate"][..],
        &[
            "hook",
            "create-runtime",
            "--reservation",
            "0123456789abcdef",
        ],
        &["hook", "poststop", "--reservation", "0123456789abcdef"],
    ] {
        let out = hook_on_endless_stdin(&s, line, 64);
        let err = one_line_error(&out);
        assert!(
            err.contains("the input on stdin is larger than 16 MiB") && err.contains("accepted:"),
            "{line:?}: {err}"
        );
        assert!(
            !s.dir.path().join("state/registry.json").exists(),
            "{line:?}"
        );
    }
}
