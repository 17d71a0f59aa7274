//! A small glibc test image made from this host's files: busybox (static) for the shell and
//! tools, and the host's glibc so dynamically linked programs (the probe) run inside.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::env::workspace;

/// Name of the test image in podman's store.
pub const PODMAN_IMAGE: &str = "localhost/gpuslice-e2e:1";

const GLIBC_LIBS: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
];

/// The image's root filesystem (built once, cached under `target/e2e/rootfs`; a build holds
/// `/run/lock/gpuslice-e2e.rootfs.lock`).
pub fn rootfs() -> PathBuf {
    let root = workspace().join("target/e2e/rootfs");
    let stamp = root.join(".gpuslice-e2e-image");
    if stamp.exists() {
        return root;
    }
    // Tests running at the same time: one builds, the others wait and then find the stamp.
    let _building = crate::env::setup_lock("rootfs");
    if stamp.exists() {
        return root;
    }
    let _ = std::fs::remove_dir_all(&root);
    for d in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/lib/x86_64-linux-gnu",
        "lib64",
        "etc",
        "tmp",
        "proc",
        "sys",
        "dev",
        "run",
        "root",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("create rootfs dirs");
    }
    // On Debian the multiarch dir is searched by default: the loader finds libcuda.so.1 there.
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).expect("lib link");
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("copy /bin/busybox (package busybox-static)");
    let list = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
    }
    for lib in GLIBC_LIBS {
        let src = Path::new("/lib/x86_64-linux-gnu").join(lib);
        std::fs::copy(&src, root.join("usr/lib/x86_64-linux-gnu").join(lib))
            .unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    }
    std::os::unix::fs::symlink(
        "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("lib64/ld-linux-x86-64.so.2"),
    )
    .expect("loader link");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
    std::fs::write(&stamp, b"1\n").expect("stamp");
    root
}

/// Imports the image into podman once; returns its name.
pub fn podman_image() -> &'static str {
    let exists = Command::new("podman")
        .args(["image", "exists", PODMAN_IMAGE])
        .status();
    if matches!(exists, Ok(s) if s.success()) {
        return PODMAN_IMAGE;
    }
    let root = rootfs();
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("tar");
    let stdout = tar.stdout.take().expect("tar stdout");
    let import = Command::new("podman")
        .args(["import", "-q", "-", PODMAN_IMAGE])
        .stdin(stdout)
        .output()
        .expect("podman import");
    let _ = tar.wait();
    assert!(
        import.status.success(),
        "podman import failed: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    PODMAN_IMAGE
}

/// Copies the image rootfs for one runc bundle (the copy is small: busybox and glibc).
pub fn copy_rootfs(dest: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(rootfs())
        .arg(dest)
        .status()
        .expect("cp -a");
    assert!(
        status.success(),
        "copying the test rootfs to {} failed",
        dest.display()
    );
}
