//! Tests of the usage file: layout checks, accounting, and several real processes
//! (this test binary re-run as a helper) reserving, dying by SIGKILL and being reclaimed.

use super::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const GIB: u64 = 1 << 30;

fn me() -> ProcessIdentity {
    ProcessIdentity::current(Path::new("/proc"))
}

fn fresh() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage");
    create_usage_file(&path).expect("create");
    (dir, path)
}

/// Aborts the whole test binary if a multi-process test hangs (a deadlock is the bug
/// these tests look for); not a timing assertion.
fn watchdog(name: &'static str) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        eprintln!("{name}: hung for 120 s (deadlock?)");
        std::process::abort();
    });
}

/// Runs this test binary as a helper process in `mode` (see `child_helper`).
fn spawn_child(
    mode: &str,
    path: &Path,
    bytes: u64,
    limit: u64,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "--ignored",
            "--exact",
            "usage::tests::child_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GPUSLICE_USAGE_CHILD", mode)
        .env("GPUSLICE_USAGE_PATH", path)
        .env("GPUSLICE_USAGE_BYTES", bytes.to_string())
        .env("GPUSLICE_USAGE_LIMIT", limit.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn helper");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    (child, out)
}

/// Reads the helper's output until its `RESULT <word>` line.
fn result_line(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).expect("read helper");
        assert!(n > 0, "helper exited without a RESULT line");
        // The harness prints "test child_helper ... " before the helper's own output.
        if let Some(at) = line.find("RESULT ") {
            return line[at + 7..].trim().to_string();
        }
    }
}

fn kill(mut child: Child) {
    // SAFETY: sending SIGKILL to our own child, whose pid is live until we wait for it.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().expect("wait helper");
}

/// Helper process body; does nothing unless started by `spawn_child`.
#[test]
#[ignore = "helper process for the multi-process tests"]
fn child_helper() {
    let Ok(mode) = std::env::var("GPUSLICE_USAGE_CHILD") else {
        return;
    };
    // SAFETY: plain prctl; the helper must not outlive a test that failed before killing it.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let path = PathBuf::from(std::env::var("GPUSLICE_USAGE_PATH").expect("path"));
    let num = |k: &str| std::env::var(k).expect(k).parse::<u64>().expect(k);
    let (bytes, limit) = (num("GPUSLICE_USAGE_BYTES"), num("GPUSLICE_USAGE_LIMIT"));
    let usage = UsageFile::open(&path, me()).expect("open usage");
    match mode.as_str() {
        "hold" => {
            let r = usage.reserve(0, bytes, limit);
            println!("RESULT {}", if r.is_ok() { "ok" } else { "oom" });
        }
        "churn" => {
            println!("RESULT ready");
            let mut x = std::process::id() as u64;
            loop {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let n = (x >> 33) % bytes + 1;
                if usage.reserve(0, n, limit).is_ok() {
                    usage.release(0, n);
                }
            }
        }
        other => panic!("unknown helper mode {other}"),
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn created_file_has_exact_size_mode_and_header() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, path) = fresh();
    let meta = std::fs::metadata(&path).expect("meta");
    assert_eq!(meta.len(), USAGE_FILE_SIZE);
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(snap.devices.len(), MAX_DEVICES);
    assert!(snap.processes.is_empty());
    assert!(snap.devices.iter().all(|d| d.used == 0 && d.busy_ns == 0));
}

#[test]
fn refuses_foreign_files_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let short = dir.path().join("short");
    std::fs::write(&short, b"xx").expect("write");
    let e = UsageFile::open(&short, me()).expect_err("wrong size");
    assert!(
        e.to_string().contains("short") && e.to_string().contains("size 2"),
        "{e}"
    );
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; USAGE_FILE_SIZE as usize]).expect("write");
    let e = UsageReader::open(&junk).expect_err("bad magic");
    assert!(
        e.to_string().contains("junk") && e.to_string().contains("magic"),
        "{e}"
    );
    let e = UsageFile::open(&dir.path().join("missing"), me()).expect_err("missing");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn reserve_stops_at_limit_and_release_returns() {
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    u.reserve(0, 3 * GIB, 4 * GIB).expect("3 GiB fits");
    let e = u.reserve(0, 2 * GIB, 4 * GIB).expect_err("5 GiB does not");
    assert!(
        matches!(e, UsageError::OutOfMemory { used, .. } if used == 3 * GIB),
        "{e}"
    );
    assert_eq!(u.used(0), 3 * GIB, "a refusal leaves no trace");
    u.reserve(0, GIB, 4 * GIB).expect("exactly the limit fits");
    assert!(u.reserve(0, 1, 4 * GIB).is_err());
    u.release(0, 2 * GIB);
    u.reserve(0, 2 * GIB, 4 * GIB)
        .expect("freed memory is usable");
    assert_eq!(u.used(1), 0, "devices are separate");
    assert!(u.reserve(0, u64::MAX, 4 * GIB).is_err(), "no overflow");
    assert!(matches!(
        u.reserve(MAX_DEVICES, 1, 1),
        Err(UsageError::Device { .. })
    ));
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(snap.devices[0].used, 4 * GIB);
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].pid, std::process::id());
}

/// A high-water mark written below a process's slot (the header is writable by every
/// process of the container) must not hide that process's own use from its reservations.
#[test]
fn a_lowered_high_water_mark_does_not_hide_the_own_slot() {
    let (_d, path) = fresh();
    let first = UsageFile::open(&path, me()).expect("open");
    first.reserve(0, 3 * GIB, 4 * GIB).expect("3 GiB fits");
    // A second attachment (its own descriptor, so its own slot) of this process.
    let second = UsageFile::open(&path, me()).expect("open");
    second.reserve(0, 1, 4 * GIB).expect("1 byte fits");
    let own = second.slot_index().expect("a slot");
    assert!(own >= 1, "slot {own}");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    std::os::unix::fs::FileExt::write_at(
        &file,
        &(own as u32).to_ne_bytes(),
        std::mem::offset_of!(Header, slot_hwm) as u64,
    )
    .expect("write the high-water mark");
    assert_eq!(second.used(0), 3 * GIB + 1, "its own slot still counts");
    assert!(
        second.reserve(0, 2 * GIB, 4 * GIB).is_err(),
        "3 GiB + 1 + 2 GiB is over the limit"
    );
    second
        .reserve(0, GIB - 1, 4 * GIB)
        .expect("exactly the limit fits");
    assert_eq!(second.used(0), 4 * GIB);
}

/// A process whose usage file was truncated under its mapping (by a peer in the container)
/// and is then dropped must not fault: zeroing its slot would store past the file's end.
#[test]
fn dropping_after_the_file_was_truncated_does_not_fault() {
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    u.reserve(0, GIB, 4 * GIB).expect("claims a slot");
    let other = OpenOptions::new().write(true).open(&path).expect("open");
    other.set_len(0).expect("truncate");
    std::thread::sleep(Duration::from_nanos(SIZE_CHECK_INTERVAL_NS * 2));
    assert!(
        matches!(
            u.reserve(0, 1, 4 * GIB),
            Err(UsageError::Size { found: 0, .. })
        ),
        "a truncated file refuses"
    );
    drop(u);

    // An intact file still has the slot zeroed at drop.
    other.set_len(USAGE_FILE_SIZE).expect("restore");
    create_usage_file(&path).expect("recreate");
    let u = UsageFile::open(&path, me()).expect("open");
    u.reserve(1, GIB, 4 * GIB).expect("fits");
    drop(u);
    assert_eq!(read_snapshot(&path).expect("snapshot").devices[1].used, 0);
}

#[test]
fn threads_of_one_process_never_exceed() {
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    let granted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    if u.reserve(0, 3, 100).is_ok() {
                        let now = u.used(0);
                        assert!(now <= 100, "{now} over the limit");
                        granted.fetch_add(1, SeqCst);
                        u.release(0, 3);
                    }
                }
            });
        }
    });
    assert!(granted.load(SeqCst) > 0);
    assert_eq!(u.used(0), 0);
}

#[test]
fn two_processes_share_the_limit_and_sigkill_returns_memory() {
    watchdog("two_processes_share_the_limit_and_sigkill_returns_memory");
    let (_d, path) = fresh();
    let (child, mut out) = spawn_child("hold", &path, 3 * GIB, 4 * GIB);
    assert_eq!(result_line(&mut out), "ok");
    let u = UsageFile::open(&path, me()).expect("open");
    assert!(
        u.reserve(0, 2 * GIB, 4 * GIB).is_err(),
        "3 + 2 GiB must not fit in 4"
    );
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(snap.devices[0].used, 3 * GIB);
    assert!(snap
        .processes
        .iter()
        .any(|p| p.pid == child.id() && p.used[0] == 3 * GIB));
    kill(child);
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(
        snap.devices[0].used, 0,
        "the reader leaves dead processes out"
    );
    u.reserve(0, 4 * GIB, 4 * GIB)
        .expect("dead process's memory is reclaimed at the next allocation");
    assert_eq!(u.used(0), 4 * GIB);
}

#[test]
fn concurrent_processes_never_oversubscribe() {
    watchdog("concurrent_processes_never_oversubscribe");
    let (_d, path) = fresh();
    let children: Vec<_> = (0..8)
        .map(|_| spawn_child("hold", &path, GIB, 4 * GIB))
        .collect();
    let mut ok = 0;
    let mut procs = Vec::new();
    for (child, mut out) in children {
        if result_line(&mut out) == "ok" {
            ok += 1;
        }
        procs.push(child);
    }
    assert!(
        (1..=4).contains(&ok),
        "{ok} of 8 one-GiB reservations granted under 4 GiB"
    );
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(snap.devices[0].used, ok * GIB);
    assert_eq!(snap.processes.len(), 8, "every helper holds a slot");
    procs.into_iter().for_each(kill);
}

#[test]
fn sigkill_mid_allocation_in_a_loop_never_hangs_or_leaks() {
    watchdog("sigkill_mid_allocation_in_a_loop_never_hangs_or_leaks");
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    for round in 0..15u64 {
        let a = spawn_child("churn", &path, GIB, 4 * GIB);
        let b = spawn_child("churn", &path, 3 * GIB, 4 * GIB);
        let mut churners = Vec::new();
        for (child, mut out) in [a, b] {
            assert_eq!(result_line(&mut out), "ready");
            churners.push(child);
        }
        std::thread::sleep(Duration::from_millis(round % 5));
        churners.into_iter().for_each(kill);
        u.reserve(0, 4 * GIB, 4 * GIB).unwrap_or_else(|e| {
            panic!("round {round}: killed churners' memory not reclaimed: {e}")
        });
        u.release(0, 4 * GIB);
    }
    let snap = read_snapshot(&path).expect("snapshot");
    assert_eq!(
        snap.processes.len(),
        1,
        "only this process is live: {snap:?}"
    );
}

#[test]
fn slots_of_dead_processes_are_reused() {
    watchdog("slots_of_dead_processes_are_reused");
    let (_d, path) = fresh();
    for _ in 0..5 {
        let (child, mut out) = spawn_child("hold", &path, 1, 10);
        assert_eq!(result_line(&mut out), "ok");
        kill(child);
    }
    let u = UsageFile::open(&path, me()).expect("open");
    assert_eq!(
        u.slot_index(),
        Some(0),
        "the first dead slot is taken again"
    );
    assert_eq!(u.used(0), 0, "claiming zeroes the dead owner's counters");
}

#[test]
fn forget_after_fork_claims_a_new_slot() {
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    u.reserve(0, 5, 10).expect("reserve");
    assert_eq!(u.slot_index(), Some(0));
    // A fork leaves the parent a copy of the descriptor: model it with a duplicate (close
    // on exec, so helpers that parallel tests spawn do not inherit it).
    // SAFETY: duplicating a descriptor this test owns.
    let parent_fd = unsafe { libc::fcntl(u.fd.load(SeqCst), libc::F_DUPFD_CLOEXEC, 0) };
    assert!(parent_fd >= 0);
    u.forget_after_fork();
    assert_eq!(u.slot_index(), None);
    u.reserve(0, 1, 10).expect("reserve after fork");
    assert_eq!(u.slot_index(), Some(1), "slot 0 stays the parent's");
    assert_eq!(u.used(0), 6, "the parent's bytes still count");
    // SAFETY: closing our duplicate: the "parent" exits, its slot can be reclaimed.
    unsafe { libc::close(parent_fd) };
    // The lock goes with the last reference to the open file: a child that a parallel test
    // forks in this moment holds one until its exec closes it (close on exec), so allow
    // that window to pass.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut reclaimed = u.reclaim_dead();
    while reclaimed == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        reclaimed = u.reclaim_dead();
    }
    assert_eq!(reclaimed, 1);
    assert_eq!(u.used(0), 1);
}

#[test]
fn reader_survives_a_file_truncated_or_overwritten_under_it() {
    let (_d, path) = fresh();
    let u = UsageFile::open(&path, me()).expect("open");
    u.reserve(1, GIB, 4 * GIB).expect("reserve");
    u.device(1).expect("device").busy_ns.fetch_add(7, SeqCst);
    let reader = UsageReader::open(&path).expect("reader");
    let snap = reader.snapshot().expect("snapshot");
    assert_eq!(snap.devices[1].used, GIB);
    assert_eq!(snap.devices[1].busy_ns, 7);
    assert_eq!(snap.processes[0].pid_ns, me().pid_ns);
    // A container may truncate its (read-write mounted) usage file: the reader reports it,
    // it does not fault.
    let f = OpenOptions::new().write(true).open(&path).expect("open rw");
    f.set_len(100).expect("truncate");
    let e = reader.snapshot().expect_err("truncated");
    assert!(matches!(e, UsageError::Size { found: 100, .. }), "{e}");
    // Overwritten in place with junk of the right size: the header is checked every time.
    f.set_len(USAGE_FILE_SIZE).expect("extend");
    std::os::unix::fs::FileExt::write_all_at(&f, b"junkjunk", 0).expect("overwrite");
    let e = reader.snapshot().expect_err("junk");
    assert!(matches!(e, UsageError::Magic { .. }), "{e}");
}
