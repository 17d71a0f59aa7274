//! `gpuslice-runtime` on the calls it only passes through (start, delete, state …): it execs
//! the configured runtime with the unchanged arguments, reads nothing of the config but
//! `runtime.path`, and keeps working when the rest of the config is broken; `create` with a
//! broken config is refused with one line. A shell script stands in for runc and records how
//! it was called.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        // `configured` is named by runtime.path; `runc` is the default found in PATH.
        for name in ["configured", "bin/runc"] {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let log = dir.path().join(format!("{}.log", name.replace('/', "-")));
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {}\nexit 7\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Setup { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn config(&self, text: &str) -> PathBuf {
        let p = self.path("config.toml");
        std::fs::write(
            &p,
            text.replace("@DIR@", &self.dir.path().display().to_string()),
        )
        .unwrap();
        p
    }

    fn run(&self, config: &Path, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gpuslice-runtime"))
            .args(args)
            .env("GPUSLICE_CONFIG", config)
            .env("PATH", self.path("bin"))
            .output()
            .unwrap()
    }

    /// The arguments the stand-in `name` (`configured` or `bin-runc`) was called with.
    fn called(&self, name: &str) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(self.path(&format!("{name}.log"))).ok()?;
        Some(text.lines().map(str::to_string).collect())
    }
}

const ARGS: &[&str] = &[
    "--root",
    "/run/containerd/runc/k8s.io",
    "--log",
    "/run/x/log.json",
    "--log-format",
    "json",
    "delete",
    "--force",
    "c1",
];

#[test]
fn passes_through_to_the_configured_runtime_with_unchanged_arguments() {
    let s = Setup::new();
    let cfg = s.config("[runtime]\npath = \"@DIR@/configured\"\n");
    for args in [
        ARGS,
        &["start", "c1"],
        &["state", "c 2"],
        &["kill", "c1", "KILL"],
    ] {
        let out = s.run(&cfg, args);
        assert_eq!(out.status.code(), Some(7), "the runtime's exit status");
        assert_eq!(s.called("configured").unwrap(), args, "{args:?}");
    }
    assert_eq!(s.called("bin-runc"), None);
}

#[test]
fn a_broken_config_keeps_pass_through_working() {
    let s = Setup::new();
    // A valid runtime.path beside a key the strict reader refuses: still used.
    let cfg = s.config("bogus = 1\n[runtime]\npath = \"@DIR@/configured\"\n");
    assert_eq!(s.run(&cfg, ARGS).status.code(), Some(7));
    assert_eq!(s.called("configured").unwrap(), ARGS);
    // A file that is not TOML, a refused runtime.path, a missing file: `runc` from PATH.
    for text in [
        "[runtime\npath = \"@DIR@/configured\"\n",
        "[runtime]\npath = \"configured/../x\"\n",
    ] {
        std::fs::remove_file(s.path("bin-runc.log")).ok();
        let cfg = s.config(text);
        assert_eq!(s.run(&cfg, ARGS).status.code(), Some(7), "{text:?}");
        assert_eq!(s.called("bin-runc").unwrap(), ARGS, "{text:?}");
    }
    std::fs::remove_file(s.path("bin-runc.log")).ok();
    assert_eq!(s.run(&s.path("missing.toml"), ARGS).status.code(), Some(7));
    assert_eq!(s.called("bin-runc").unwrap(), ARGS);
}

#[test]
fn create_with_a_broken_config_is_refused_in_one_line() {
    let s = Setup::new();
    let cfg = s.config("bogus = 1\n[runtime]\npath = \"@DIR@/configured\"\n");
    let bundle = s.path("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("config.json"), "{}").unwrap();
    let out = s.run(
        &cfg,
        &["create", "--bundle", bundle.to_str().unwrap(), "c1"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unknown key `bogus`"), "{err}");
    assert_eq!(s.called("configured"), None, "the runtime is not run");
    assert_eq!(
        std::fs::read_to_string(bundle.join("config.json")).unwrap(),
        "{}"
    );
}
