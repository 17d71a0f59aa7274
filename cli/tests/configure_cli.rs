//! `gpuslice configure containerd` through the `gpuslice` binary: the command line wires the
//! engine registration up (its one-line refusals included) and takes a relative
//! `--config-path` from the working directory. The registration itself is tested with
//! gpuslice-configure (configure/tests/containerd.rs).

use std::process::Command;

use crate::configure_common::{fixture, stage};

#[test]
fn the_cli_wires_it_up() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "debian").join("input"), d.path());
    let cfg = d.path().join("config.toml");
    let gs = env!("CARGO_BIN_EXE_gpuslice");
    let run = |extra: &[&str]| {
        Command::new(gs)
            .args([
                "--config",
                "/dev/null",
                "configure",
                "containerd",
                "--config-path",
            ])
            .arg(&cfg)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("restart"));
    let out = run(&["--remove"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&cfg, "version = 2\n[plugins\n").unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("gpuslice: ") && err.contains("line 2"),
        "{err}"
    );
}

/// A relative `--config-path`, as an operator types it in containerd's directory
/// (once refused as "the result does not import the drop-in (a gpuslice bug)"): taken from
/// the working directory, so the main config imports the drop-in and the drop-in names the
/// wrapper by absolute paths, and `--remove` with the same relative path restores the file.
#[test]
fn a_relative_config_path_is_taken_from_the_working_directory() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().canonicalize().unwrap();
    let original = "version = 3\n";
    std::fs::write(dir.join("config.toml"), original).unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .current_dir(&dir)
            .args(["--config", "/dev/null", "configure", "containerd"])
            .args(["--config-path", "config.toml"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let drop_in = dir.join("conf.d/gpuslice.toml");
    let wrapper = dir.join("gpuslice-runtime.sh");
    let main: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
    assert_eq!(
        main["imports"],
        toml::Value::Array(vec![drop_in.display().to_string().into()])
    );
    let drop: toml::Table = toml::from_str(&std::fs::read_to_string(&drop_in).unwrap()).unwrap();
    assert_eq!(
        drop["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpuslice"]
            ["options"]["BinaryName"]
            .as_str(),
        Some(wrapper.display().to_string().as_str())
    );
    assert!(wrapper.exists());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("--runtime {}`", wrapper.display())),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(&["--remove"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("config.toml")).unwrap(),
        original
    );
    assert!(!drop_in.exists() && !wrapper.exists());
}
