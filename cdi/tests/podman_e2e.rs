//! End to end: podman 4.3 on this machine (whose vendored CDI library knows only versions
//! 0.3.0–0.5.0) accepts a spec written by `write_spec` and applies its edits.
//!
//! Needs root and podman; run with
//! `cargo test -p gpuslice-cdi --test cdi -- --ignored podman_e2e::`.
//! Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (no `cdi_spec_dirs`
//! setting yet), so the spec goes to /var/run/cdi under a kind unique to this run and is
//! removed afterwards.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use gpuslice_cdi::{
    read_spec, remove_spec, write_spec, CdiVersion, ContainerEdits, Device, DeviceNode, Mount, Spec,
};

const IMAGE: &str = "localhost/gpuslice-cdi-test";
const SPEC_DIR: &str = "/var/run/cdi";

/// Removes the spec file when the test ends, passing or not.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = remove_spec(&self.0);
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn podman(args: &[&str]) -> Output {
    // The flags this host needs (runc, cgroupfs, explicit ulimits); `timeout` bounds a hang.
    let mut cmd = Command::new("timeout");
    cmd.args([
        "120",
        "podman",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
    ])
    .args(args);
    run(&mut cmd)
}

fn ensure_image(work: &Path) {
    if podman(&["image", "exists", IMAGE]).status.success() {
        return;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static must be installed (/bin/busybox)");
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).expect("rootfs/bin");
    std::fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/sh")).expect("symlink sh");
    let script = format!(
        "tar -C '{}' -c . | podman import - {IMAGE}",
        rootfs.display()
    );
    let out = run(Command::new("sh").args(["-c", &script]));
    assert!(
        out.status.success(),
        "podman import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs root and podman: cargo test -p gpuslice-cdi --test cdi -- --ignored podman_e2e::"]
fn podman_accepts_and_applies_a_written_spec() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test needs root (podman run, /var/run/cdi)");
    let version = run(Command::new("podman").arg("--version"));
    assert!(version.status.success(), "podman is not installed");

    let work = tempfile::tempdir().expect("tempdir");
    ensure_image(work.path());

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let token = format!("{}-{nanos}", std::process::id());
    let kind = format!("gpuslice.io/test-{token}");
    let payload = work.path().join("payload");
    std::fs::write(&payload, format!("payload {token}\n")).expect("payload");

    let mut spec = Spec::new(kind.clone());
    spec.devices.push(Device::new(
        "probe",
        ContainerEdits {
            env: vec![format!("GPUSLICE_CDI_TEST={token}")],
            mounts: vec![Mount::bind(
                payload.display().to_string(),
                "/run/gpuslice-cdi-test/payload",
                &["ro", "nosuid", "nodev", "bind"],
            )],
            device_nodes: vec![DeviceNode {
                path: "/dev/gpuslice-cdi-null".into(),
                host_path: Some("/dev/null".into()),
                permissions: Some("rw".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
    ));
    let path = write_spec(Path::new(SPEC_DIR), &spec).expect("write spec");
    let _cleanup = RemoveOnDrop(path.clone());
    let written = read_spec(&path).expect("read back");
    let stamped: CdiVersion = written.cdi_version.parse().expect("known version");
    assert!(
        stamped <= CdiVersion::V0_5_0,
        "podman 4.3 knows CDI up to 0.5.0, got {stamped}"
    );

    let device = format!("{kind}=probe");
    let script = "echo \"env=$GPUSLICE_CDI_TEST\"; cat /run/gpuslice-cdi-test/payload; \
                  test -c /dev/gpuslice-cdi-null && echo char-device; \
                  echo x > /dev/gpuslice-cdi-null && echo writable";
    let out = podman(&[
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--device",
        &device,
        IMAGE,
        "/bin/sh",
        "-c",
        script,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "podman run failed ({}): {stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("env={token}"),
            format!("payload {token}"),
            "char-device".into(),
            "writable".into()
        ],
        "stderr: {stderr}"
    );

    // Control: podman really resolves devices from our spec, so a name not in it fails.
    let missing = format!("{kind}=absent");
    let out = podman(&[
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--device",
        &missing,
        IMAGE,
        "/bin/true",
    ]);
    assert!(
        !out.status.success(),
        "an unknown CDI device must be refused"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unresolvable CDI devices"));
}
