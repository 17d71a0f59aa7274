//! The build scripts install what they built with `install_atomic` (scripts/lib/install.sh):
//! `cp` over a program that is running fails with "Text file busy" (and over a loaded
//! library rewrites it under the processes that run it), so `scripts/build.sh` failed while
//! a probe ran from `target/portable`. These run the function itself on a running binary.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpuslice_e2e::env::workspace;

/// `install_atomic src dest` from the scripts' shared file, in bash as the scripts run it.
fn install(src: &Path, dest: &Path) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(r#"set -euo pipefail; . "$0"; install_atomic "$1" "$2""#)
        .arg(workspace().join("scripts/lib/install.sh"))
        .arg(src)
        .arg(dest)
        .output()
        .expect("bash")
}

/// The names in `dir`, sorted (a temporary file left behind would show here).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `cp src dest` in a process of its own: a file this test process wrote itself could
/// still be open for writing in a child another test thread forked meanwhile, and then
/// could not be executed ("Text file busy").
fn copy(src: &str, dest: &Path) {
    let status = Command::new("cp").arg(src).arg(dest).status().unwrap();
    assert!(status.success(), "cp {src} {}", dest.display());
}

#[test]
fn a_running_program_is_replaced_and_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("prog");
    copy("/bin/cat", &prog);
    let mut running = Command::new(&prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // What `cp` does, and why it failed: the running program cannot be opened for writing
    // (once the kernel maps it; retried while it is still starting).
    let busy = (0..100).any(|_| {
        let e = std::fs::OpenOptions::new().write(true).open(&prog).err();
        if e.as_ref().and_then(|e| e.raw_os_error())
            == Some(rustix::io::Errno::TXTBSY.raw_os_error())
        {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        false
    });
    assert!(busy, "{} never became busy", prog.display());
    let new = dir.path().join("new");
    copy("/bin/echo", &new);
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o750)).unwrap();

    let out = install(&new, &prog);
    assert!(
        out.status.success(),
        "install_atomic over a running program: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&prog).unwrap(),
        std::fs::read("/bin/echo").unwrap()
    );
    let mode = std::fs::metadata(&prog).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "mode of the installed file");
    assert_eq!(names(dir.path()), ["new", "prog"], "files left beside it");
    // The running one is unaffected: it still runs its own (now unlinked) file.
    let mut stdin = running.stdin.take().unwrap();
    stdin.write_all(b"still here\n").unwrap();
    drop(stdin);
    let done = running.wait_with_output().unwrap();
    assert!(done.status.success(), "{:?}", done.status);
    assert_eq!(done.stdout, b"still here\n");
    // The next start runs the new one.
    let echo = Command::new(&prog).arg("hi").output().unwrap();
    assert_eq!(echo.stdout, b"hi\n");
}

#[test]
fn into_a_directory_and_a_failure_leaves_the_destination_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let src = dir.path().join("libthing.so");
    std::fs::write(&src, b"v1").unwrap();
    let out = install(&src, &out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(out_dir.join("libthing.so")).unwrap(), b"v1");

    let out = install(&dir.path().join("missing"), &out_dir.join("libthing.so"));
    assert!(!out.status.success(), "installing a missing file succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot install"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(out_dir.join("libthing.so")).unwrap(), b"v1");
    assert_eq!(names(&out_dir), ["libthing.so"], "files left beside it");
}
