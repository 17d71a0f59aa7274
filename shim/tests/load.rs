//! Acceptance 6: ordinary programs run normally with the shim preloaded (its `dlvsym` answers
//! other libraries' symbols as glibc's does); the portable build
//! stays under the documented glibc floor (objdump) and loads and enforces inside a Debian
//! bullseye (glibc 2.31) root filesystem. The last two need `scripts/build-portable.sh`
//! and fail, naming it, when its output is missing; the chroot test needs root and prints
//! `SKIP:` without it.

use crate::common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The documented floor (docs/shim.md).
const GLIBC_FLOOR: &str = "2.17";

#[test]
fn shell_ls_and_python_run_normally_under_the_shim() {
    let art = artifacts();
    for argv in [
        &["sh", "-c", "true"][..],
        &["ls", "/"],
        &["python3", "-c", "print(1)"],
    ] {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .env("LD_PRELOAD", &art.shim)
            .env_remove("GPUSLICE_DIR")
            .output()
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(
            out.status.success(),
            "{argv:?} failed under the shim: {out:?}"
        );
        assert!(
            out.stderr.is_empty(),
            "{argv:?} printed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("python3")
        .args(["-c", "import ctypes, json; print(json.dumps([1]))"])
        .env("LD_PRELOAD", &art.shim)
        .output()
        .expect("python3");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[1]",
        "dlsym-heavy imports work: {out:?}"
    );
}

/// Looks symbols up with `dlvsym` from Python (ctypes): through the global scope (where the
/// shim's export comes first), a library handle and `RTLD_NEXT`, with a right and a wrong
/// version.
const DLVSYM_SCRIPT: &str = r#"
import ctypes, json, platform
V = ctypes.c_void_p
libc = ctypes.CDLL("libc.so.6")
scope = ctypes.CDLL(None)
dlvsym = scope.dlvsym
dlvsym.restype = V
dlvsym.argtypes = [V, ctypes.c_char_p, ctypes.c_char_p]
addr = lambda f: ctypes.cast(f, V).value
malloc = addr(libc.malloc)
ver = b"GLIBC_2.2.5" if platform.machine() == "x86_64" else b"GLIBC_2.17"
print(json.dumps({
    "interposed": addr(scope.dlvsym) != addr(libc.dlvsym),
    "default": dlvsym(None, b"malloc", ver) == malloc,
    "handle": dlvsym(libc._handle, b"malloc", ver) == malloc,
    "next": dlvsym(V(-1), b"malloc", ver) == malloc,
    "wrong": dlvsym(None, b"malloc", b"GPUSLICE_NONE"),
    "next_wrong": dlvsym(V(-1), b"malloc", b"GPUSLICE_NONE"),
}))
"#;

#[test]
fn dlvsym_answers_other_symbols_as_glibc_does() {
    let art = artifacts();
    let run = |preload: bool| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", DLVSYM_SCRIPT]);
        if preload {
            cmd.env("LD_PRELOAD", &art.shim);
        }
        let out = cmd.output().expect("python3");
        assert!(out.status.success(), "{out:?}");
        json_lines(&out).pop().unwrap_or_else(|| panic!("{out:?}"))
    };
    let (bare, shim) = (run(false), run(true));
    assert_eq!(shim["interposed"], true, "the shim exports dlvsym: {shim}");
    assert_eq!(shim["default"], true, "{shim}");
    assert_eq!(shim["handle"], true, "{shim}");
    assert!(shim["wrong"].is_null(), "{shim}");
    // RTLD_NEXT keeps the caller's meaning (ctypes calls from libffi, which libc follows):
    // the answer glibc gives without the shim.
    assert_eq!(bare["next"], true, "{bare}");
    assert_eq!(shim["next"], bare["next"], "{shim} vs {bare}");
    assert!(shim["next_wrong"].is_null(), "{shim}");
}

/// `target/portable` (from `scripts/build-portable.sh`), or `GPUSLICE_TEST_PORTABLE_DIR`.
fn portable_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUSLICE_TEST_PORTABLE_DIR") {
        return PathBuf::from(d);
    }
    let profile = gpuslice_sim_core::testing::target_profile_dir().expect("target dir");
    profile.parent().expect("target dir").join("portable")
}

fn portable(name: &str) -> PathBuf {
    let p = portable_dir().join(name);
    assert!(
        p.exists(),
        "missing {}: run scripts/build-portable.sh (with the same CARGO_TARGET_DIR) first",
        p.display()
    );
    p
}

fn max_glibc(file: &Path) -> String {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump");
    assert!(
        out.status.success(),
        "objdump -T {}: {out:?}",
        file.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut versions: Vec<Vec<u32>> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .map(|v| v.split('.').filter_map(|n| n.parse().ok()).collect())
        .collect();
    versions.sort();
    versions
        .last()
        .map(|v| v.iter().map(u32::to_string).collect::<Vec<_>>().join("."))
        .unwrap_or_default()
}

fn version_le(a: &str, b: &str) -> bool {
    let p = |s: &str| {
        s.split('.')
            .filter_map(|n| n.parse::<u32>().ok())
            .collect::<Vec<_>>()
    };
    p(a) <= p(b)
}

#[test]
fn portable_build_needs_no_glibc_above_the_floor() {
    for name in [
        "libgpuslice_shim.so",
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "gpuslice-probe",
    ] {
        let f = portable(name);
        let max = max_glibc(&f);
        assert!(!max.is_empty(), "{}: no GLIBC versions seen", f.display());
        assert!(
            version_le(&max, GLIBC_FLOOR),
            "{} needs GLIBC_{max}, above the floor {GLIBC_FLOOR}",
            f.display()
        );
    }
    // The host build, by contrast, is what the floor protects against.
    assert!(version_le("2.17", &max_glibc(&artifacts().shim)));
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A cached `debootstrap --variant=minbase bullseye` tree under the workspace's target/.
fn bullseye_rootfs() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bullseye-rootfs");
    if root.join("etc/debian_version").exists() {
        return root;
    }
    let tmp = root.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::create_dir_all(tmp.parent().expect("parent")).expect("target dir");
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", "bullseye"])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .status()
        .expect("debootstrap must be installed (apt-get install debootstrap)");
    assert!(
        status.success(),
        "debootstrap bullseye into {} failed",
        tmp.display()
    );
    if std::fs::rename(&tmp, &root).is_err() {
        let _ = std::fs::remove_dir_all(&tmp); // another test run won the race
    }
    root
}

#[test]
fn loads_and_enforces_inside_a_bullseye_rootfs() {
    if !is_root() {
        println!("SKIP: loads_and_enforces_inside_a_bullseye_rootfs needs root (chroot)");
        return;
    }
    let files: Vec<PathBuf> = [
        "libgpuslice_shim.so",
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "gpuslice-probe",
    ]
    .iter()
    .map(|n| portable(n))
    .collect();
    let cached = bullseye_rootfs();
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let copy = node.sim.dir.path().join("rootfs");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&cached)
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(status.success(), "copying the rootfs failed");
    let opt = copy.join("opt/gpuslice");
    std::fs::create_dir_all(&opt).expect("opt");
    for f in &files {
        std::fs::copy(f, opt.join(f.file_name().expect("name"))).expect("copy artifact");
    }
    // The simulated node and the slice, inside the copy.
    let sim = copy.join("sim");
    std::fs::create_dir_all(sim.join("dev")).expect("sim dev");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&node.sim.paths.state_dir)
        .arg(sim.join("state"))
        .status()
        .expect("cp");
    assert!(status.success());
    std::fs::write(sim.join("dev/nvidia0"), b"").expect("device file");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&node.slice_dir)
        .arg(copy.join("slice"))
        .status()
        .expect("cp");
    assert!(status.success());
    std::fs::write(
        copy.join("etc/ld.so.preload"),
        "/opt/gpuslice/libgpuslice_shim.so\n",
    )
    .expect("preload");
    let glibc = std::fs::read_to_string(copy.join("etc/debian_version")).unwrap_or_default();
    assert!(glibc.starts_with("11"), "not bullseye: {glibc}");

    let chroot = |argv: &[&str]| {
        Command::new("chroot")
            .arg(&copy)
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("GPUSLICE_SIM_STATE", "/sim/state")
            .env("GPUSLICE_SIM_DEV", "/sim/dev")
            .env("GPUSLICE_DIR", "/slice")
            .env("LD_LIBRARY_PATH", "/opt/gpuslice")
            .output()
            .expect("chroot")
    };
    for argv in [&["/bin/sh", "-c", "true"][..], &["/bin/ls", "/"]] {
        let out = chroot(argv);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{argv:?} in bullseye with the shim: {out:?}"
        );
    }
    let out = chroot(&[
        "/opt/gpuslice/gpuslice-probe",
        "--json",
        "alloc",
        "--chunk",
        "1Gi",
    ]);
    let v = json_lines(&out)
        .pop()
        .unwrap_or_else(|| panic!("probe in bullseye: {out:?}"));
    assert_eq!(u(&v, "total"), 4 * GIB, "enforced inside bullseye: {v}");
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    // dlvsym, which glibc 2.31 keeps in libdl.so.2, on a driver without version tables.
    strip_symbol_versions(&opt.join("libcuda.so.1"));
    let out = chroot(&[
        "/opt/gpuslice/gpuslice-probe",
        "--json",
        "--resolve",
        "dlvsym",
        "alloc",
        "--chunk",
        "1Gi",
    ]);
    let v = json_lines(&out)
        .pop()
        .unwrap_or_else(|| panic!("probe in bullseye: {out:?}"));
    assert_eq!(u(&v, "total"), 4 * GIB, "dlvsym inside bullseye: {v}");
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
}
