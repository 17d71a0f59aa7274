//! Garbage in the shared usage file (random bytes, truncation, huge counts, a wrong version,
//! torn slots, a forged pacing clock): the accounting refuses or recovers, and never crashes,
//! hangs or lets an honest process hold more than its limit. A property test drives the
//! real accounting code (`gpuslice_slice::usage::UsageFile`, what the shim maps) over random
//! file contents and writes; the other tests run the built shim in a probe process.

use crate::common;
use common::*;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use gpuslice_slice::usage::{
    create_usage_file, ProcessIdentity, UsageFile, MAX_DEVICES, USAGE_FILE_SIZE,
};
use proptest::prelude::*;

const HEADER: u64 = 4096;
const SLOT: u64 = 256;
/// Offset of `used[0]` in a slot, and of the pacing clock in device record 0.
const USED_AT: u64 = 64;
const PACE_CLOCK_AT: u64 = 64 + 8;
const LIMIT: u64 = 1 << 20;

fn me() -> ProcessIdentity {
    ProcessIdentity {
        pid: std::process::id(),
        pid_ns: 0,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        dev: usize,
        bytes: u64,
    },
    /// Releases this fraction (in 1/256) of what the model says the process holds.
    Release {
        dev: usize,
        part: u8,
    },
    /// Another writer puts `bytes` at `offset` of the file (the header, a record, a slot:
    /// ours included).
    Scribble {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Another writer shrinks the file, then (maybe) grows it back to its size.
    Truncate {
        to: u64,
        restore: bool,
    },
}

/// Where another writer scribbles: anywhere, but mostly the header, the device records and
/// the first slots (this process's among them), where garbage matters.
fn scribble_offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => 0..USAGE_FILE_SIZE - 16,
        1 => 0..HEADER,
        2 => HEADER..HEADER + 4 * SLOT,
        // Exactly a used counter of the first slots, with a whole 8-byte value.
        2 => (0u64..4, 0u64..MAX_DEVICES as u64).prop_map(|(s, d)| HEADER + s * SLOT + USED_AT + d * 8),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, 0..=LIMIT + 2).prop_map(|(dev, bytes)| Op::Reserve { dev, bytes }),
        2 => (0..MAX_DEVICES, any::<u8>()).prop_map(|(dev, part)| Op::Release { dev, part }),
        1 => (0..4usize, prop_oneof![Just(0u64), Just(u64::MAX), Just(u64::MAX - LIMIT), any::<u64>()])
            .prop_map(|(dev, v)| Op::Scribble {
                offset: HEADER + USED_AT + dev as u64 * 8,
                bytes: v.to_ne_bytes().to_vec(),
            }),
        3 => (scribble_offset(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(offset, bytes)| Op::Scribble { offset, bytes }),
        1 => (0..USAGE_FILE_SIZE, any::<bool>()).prop_map(|(to, restore)| Op::Truncate { to, restore }),
    ]
}

/// What the file holds before the process maps it.
#[derive(Debug, Clone)]
enum Start {
    /// A file from `create_usage_file`, then garbage at random places (slots with huge
    /// counts, a random high-water mark, torn slots).
    Valid(Vec<(u64, Vec<u8>)>),
    /// Random bytes of the right size.
    Random(Vec<u8>),
    /// A file of the wrong size.
    Sized(u64),
}

fn start() -> impl Strategy<Value = Start> {
    prop_oneof![
        6 => prop::collection::vec(
            (0..USAGE_FILE_SIZE - 16, prop::collection::vec(any::<u8>(), 1..16)),
            0..24
        )
        .prop_map(Start::Valid),
        1 => prop::collection::vec(any::<u8>(), USAGE_FILE_SIZE as usize).prop_map(Start::Random),
        1 => (0..USAGE_FILE_SIZE * 2).prop_map(Start::Sized),
    ]
}

fn write_start(path: &Path, s: &Start) {
    match s {
        Start::Valid(writes) => {
            create_usage_file(path).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            for (off, bytes) in writes {
                f.write_all_at(bytes, *off).unwrap();
            }
        }
        Start::Random(bytes) => std::fs::write(path, bytes).unwrap(),
        Start::Sized(n) => {
            create_usage_file(path).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(*n).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever the file holds and whatever another writer does to it, the process's own
    /// memory never exceeds the limit, and no call panics or blocks.
    #[test]
    fn garbage_never_grants_an_honest_process_more_than_the_limit(
        s in start(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        write_start(&path, &s);
        let Ok(usage) = UsageFile::open(&path, me()) else {
            // Refused: what a damaged file may do.
            return Ok(());
        };
        let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut held = [0u64; MAX_DEVICES];
        for op in ops {
            match op {
                Op::Reserve { dev, bytes } => {
                    if usage.reserve(dev, bytes, LIMIT).is_ok() {
                        held[dev] += bytes;
                    }
                }
                Op::Release { dev, part } => {
                    let bytes = held[dev] * u64::from(part) / 256;
                    usage.release(dev, bytes);
                    held[dev] -= bytes;
                }
                Op::Scribble { offset, bytes } => {
                    // Through a descriptor of the file, as another process writes it (the
                    // mapping sees it).
                    if other.metadata().unwrap().len() >= offset + bytes.len() as u64 {
                        other.write_all_at(&bytes, offset).unwrap();
                    }
                }
                Op::Truncate { to, restore } => {
                    other.set_len(to).unwrap();
                    if restore {
                        other.set_len(USAGE_FILE_SIZE).unwrap();
                    }
                    // Allocations check the size at most once a millisecond.
                    std::thread::sleep(std::time::Duration::from_nanos(
                        gpuslice_slice::usage::SIZE_CHECK_INTERVAL_NS * 2,
                    ));
                }
            }
            for (dev, h) in held.iter().enumerate() {
                prop_assert!(*h <= LIMIT, "device {dev}: {h} bytes granted, limit {LIMIT}");
                prop_assert_eq!(usage.reserved_here(dev), *h, "device {}", dev);
            }
        }
        // Only while the file is intact is the slot still read; a damaged file refuses.
        if usage.intact().is_err() {
            prop_assert!(usage.reserve(0, 1, LIMIT).is_err());
        }
    }
}

/// The file's own slot count can be lowered by another writer; the process still counts
/// what it holds.
#[test]
fn a_lowered_own_slot_does_not_raise_what_the_process_gets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    create_usage_file(&path).unwrap();
    let usage = UsageFile::open(&path, me()).unwrap();
    usage.reserve(0, LIMIT, LIMIT).unwrap();
    let slot = usage.slot_index().unwrap() as u64;
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&0u64.to_ne_bytes(), HEADER + slot * SLOT + USED_AT)
        .unwrap();
    assert!(
        usage.reserve(0, 1, LIMIT).is_err(),
        "zeroed slot let it allocate again"
    );
    // A count near u64::MAX in the own slot cannot wrap around to a small number.
    f.write_all_at(
        &(u64::MAX - 10).to_ne_bytes(),
        HEADER + slot * SLOT + USED_AT,
    )
    .unwrap();
    usage.release(0, LIMIT);
    assert!(usage.reserve(0, 100, LIMIT).is_err());
}

/// Runs `cmd`, killing it if it has not ended within `limit` (a hang fails the test).
fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn probe");
    let pid = child.id();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for probe"),
        Err(_) => {
            // SAFETY: signalling the child this test spawned, by its pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!(
                "probe hung for {:?} on a damaged usage file",
                start.elapsed()
            );
        }
    }
}

/// The probe ended by itself (no signal: no SIGBUS, SIGSEGV or abort).
fn exited(out: &Output) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.signal().is_none(),
        "probe killed by signal {:?}; stderr:\n{}",
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code().expect("exit code")
}

fn usage_path(node: &SliceNode) -> std::path::PathBuf {
    node.slice_dir.join("usage")
}

fn alloc_bounded(node: &SliceNode) -> (i32, Output) {
    let out = run_bounded(
        node.probe(&["alloc", "--chunk", "512Mi", "--api", "alloc"]),
        Duration::from_secs(60),
    );
    (exited(&out), out)
}

#[test]
fn a_file_that_is_not_a_usage_file_refuses_cuda() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let path = usage_path(&node);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..USAGE_FILE_SIZE)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let mut wrong_version = std::fs::read(&path).unwrap();
    wrong_version[8..12].copy_from_slice(&7u32.to_ne_bytes());
    for (what, bytes) in [
        ("random bytes", random),
        ("wrong version", wrong_version),
        ("truncated", vec![0u8; 4096]),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let (code, out) = alloc_bounded(&node);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code, 3, "{what}: CUDA initialisation refused: {err}");
        assert!(err.contains("usage file"), "{what}: names the file: {err}");
        assert!(json_lines(&out).is_empty(), "{what}: nothing allocated");
    }
}

#[test]
fn huge_counts_and_torn_slots_of_dead_processes_are_reclaimed() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let path = usage_path(&node);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // A high-water mark past the slots, slots with huge and torn counts, no owner alive.
    f.write_all_at(&u32::MAX.to_ne_bytes(), 24).unwrap();
    for slot in [0u64, 1, 5, 1023] {
        let at = HEADER + slot * SLOT;
        f.write_all_at(&(slot as u32 + 7).to_ne_bytes(), at)
            .unwrap();
        f.write_all_at(&u64::MAX.to_ne_bytes(), at + USED_AT)
            .unwrap();
    }
    f.write_all_at(&(3u64 << 30).to_ne_bytes(), HEADER + 2 * SLOT + USED_AT)
        .unwrap();
    let (code, out) = alloc_bounded(&node);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_lines(&out).pop().expect("json");
    assert_eq!(u(&v, "total"), 4 * GIB, "dead slots are reclaimed: {v}");
}

#[test]
fn a_live_slot_with_a_huge_count_refuses_and_never_wraps() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 0)]);
    let path = usage_path(&node);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // Slot 0 is held (this test holds its lock, as a live process does) and claims almost
    // 2^64 bytes: a sum that wrapped around would look small.
    f.write_all_at(&1u32.to_ne_bytes(), 24).unwrap();
    f.write_all_at(&(u64::MAX - 1024).to_ne_bytes(), HEADER + USED_AT)
        .unwrap();
    // SAFETY: flock is plain old data; zeroed is valid (l_pid 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = HEADER as i64;
    fl.l_len = 1;
    // SAFETY: fcntl on an open descriptor with a live flock.
    let locked = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    assert_eq!(locked, 0, "lock slot 0");
    let (code, out) = alloc_bounded(&node);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_lines(&out).pop().expect("json");
    assert_eq!(u(&v, "total"), 0, "{v}");
    assert_eq!(v["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    assert_eq!(u(&v, "mem_free"), 0, "{v}");
    drop(f);
}

#[test]
fn a_pacing_clock_far_in_the_future_does_not_hang_launches() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 30)]);
    let path = usage_path(&node);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&(u64::MAX - 5).to_ne_bytes(), PACE_CLOCK_AT)
        .unwrap();
    let out = run_bounded(
        node.probe(&["burn", "--seconds", "1", "--kernel-us", "1000"]),
        Duration::from_secs(60),
    );
    assert_eq!(exited(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pacing clock"), "the damage is logged: {err}");
    let v = json_lines(&out).pop().expect("json");
    assert!(v["launches"].as_u64().unwrap_or(0) > 0, "{v}");
}
