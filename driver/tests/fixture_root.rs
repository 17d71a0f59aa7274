//! Driver discovery against fixture driver roots in temp dirs: real ELF libraries with
//! sonames, symlink chains, and an ld.so cache written by the real `ldconfig`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_driver::libraries::{discover_libraries, COMPUTE_LIBRARIES};

/// Builds an empty shared library with `soname` at `path` (needs a C compiler, as cargo does).
fn shared_lib(path: &Path, soname: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let status = Command::new("cc")
        .args(["-shared", "-nostdlib", "-x", "c", "/dev/null", "-o"])
        .arg(path)
        .arg(format!("-Wl,-soname,{soname}"))
        .status()
        .expect("run cc (a C compiler is needed for this test)");
    assert!(status.success(), "cc failed for {}", path.display());
}

fn driver_root(lib_dir: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join(lib_dir.trim_start_matches('/'));
    for (file, soname) in [
        ("libcuda.so.550.54.15", "libcuda.so.1"),
        ("libnvidia-ml.so.550.54.15", "libnvidia-ml.so.1"),
        (
            "libnvidia-ptxjitcompiler.so.550.54.15",
            "libnvidia-ptxjitcompiler.so.1",
        ),
        ("libnvidia-nvvm.so.550.54.15", "libnvidia-nvvm.so.4"),
    ] {
        shared_lib(&dir.join(file), soname);
        symlink(file, dir.join(soname)).expect("soname link");
    }
    // A development symlink and an unrelated library must not confuse discovery.
    symlink("libcuda.so.1", dir.join("libcuda.so")).expect("dev link");
    shared_lib(&dir.join("libcudart.so.12.4.127"), "libcudart.so.12");
    (root, dir)
}

#[test]
fn finds_versioned_files_and_sonames_by_directory_scan() {
    let (root, dir) = driver_root("/usr/lib/x86_64-linux-gnu");
    let libs = discover_libraries(root.path(), COMPUTE_LIBRARIES).expect("discover");
    let got: Vec<(String, PathBuf, PathBuf)> = libs
        .iter()
        .map(|l| {
            (
                l.soname.clone(),
                l.host_path.clone(),
                l.container_path.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "libcuda.so.1".into(),
                dir.join("libcuda.so.550.54.15"),
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into()
            ),
            (
                "libnvidia-ml.so.1".into(),
                dir.join("libnvidia-ml.so.550.54.15"),
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into()
            ),
            (
                "libnvidia-ptxjitcompiler.so.1".into(),
                dir.join("libnvidia-ptxjitcompiler.so.550.54.15"),
                "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1".into()
            ),
            (
                "libnvidia-nvvm.so.4".into(),
                dir.join("libnvidia-nvvm.so.550.54.15"),
                "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4".into()
            ),
        ]
    );
}

#[test]
fn rhel_style_lib64_root() {
    let (root, dir) = driver_root("/usr/lib64");
    let libs = discover_libraries(root.path(), &["libcuda.so"]).expect("discover");
    assert_eq!(libs.len(), 1);
    assert_eq!(libs[0].host_path, dir.join("libcuda.so.550.54.15"));
    assert_eq!(libs[0].container_path, Path::new("/usr/lib64/libcuda.so.1"));
}

#[test]
fn empty_root_finds_nothing_without_error() {
    let root = tempfile::tempdir().expect("tempdir");
    assert!(discover_libraries(root.path(), COMPUTE_LIBRARIES)
        .expect("discover")
        .is_empty());
}

/// The ld.so cache path: libraries in a directory only the root's ld.so.conf names, as a
/// driver installed under /opt would be. Needs root (`ldconfig -r` chroots).
#[test]
fn finds_libraries_through_the_roots_ld_cache() {
    if !rustix::process::geteuid().is_root() {
        println!(
            "SKIP: ldconfig -r needs root; run the suite as root (the README's test command does)"
        );
        return;
    }
    let (root, dir) = driver_root("/opt/nvidia/lib");
    std::fs::create_dir_all(root.path().join("etc")).expect("etc");
    std::fs::write(root.path().join("etc/ld.so.conf"), "/opt/nvidia/lib\n").expect("ld.so.conf");
    let status = Command::new("ldconfig")
        .arg("-r")
        .arg(root.path())
        .status()
        .expect("ldconfig");
    assert!(status.success());
    let libs =
        discover_libraries(root.path(), &["libcuda.so", "libnvidia-nvvm.so"]).expect("discover");
    let got: Vec<_> = libs
        .iter()
        .map(|l| {
            (
                l.soname.as_str(),
                l.host_path.clone(),
                l.container_path.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "libcuda.so.1",
                dir.join("libcuda.so.550.54.15"),
                PathBuf::from("/opt/nvidia/lib/libcuda.so.1")
            ),
            (
                "libnvidia-nvvm.so.4",
                dir.join("libnvidia-nvvm.so.550.54.15"),
                PathBuf::from("/opt/nvidia/lib/libnvidia-nvvm.so.4")
            ),
        ]
    );
}
