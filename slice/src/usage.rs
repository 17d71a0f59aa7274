//! The shared `usage` accounting file of a slice: one fixed-size file, created by the host
//! before the container starts and mapped `MAP_SHARED` by every shim in the container, so
//! all processes of a container share one memory account and one compute pacing clock.
//!
//! Layout (native endian, version [`USAGE_VERSION`], [`USAGE_FILE_SIZE`] bytes):
//!
//! | offset | what |
//! |---|---|
//! | 0 | header: magic `GPUSLUSG`, version, max devices, max slots, slot size, slot high-water mark |
//! | 64 | [`MAX_DEVICES`] device records of 64 bytes: cumulative busy ns, pacing clock, launches |
//! | 4096 | [`MAX_SLOTS`] process slots of 256 bytes: pid, pid namespace, per-device used bytes |
//!
//! Device `i` here is entry `i` of `limits.json`'s `devices`.
//!
//! A slot belongs to the process holding an `fcntl` OFD write lock on the slot's first byte
//! (taken through a descriptor of its own, never the one the file was mapped from, since a
//! mapping keeps its open file description, and so its locks, alive across `fork`).
//! The kernel drops that lock when the process dies (even by SIGKILL, in any pid namespace),
//! so a slot whose lock can be taken is dead: whoever takes it zeroes its counters, which
//! returns the dead process's memory. No lock is ever waited for, so nothing can deadlock.
//!
//! Memory is reserved then verified: a process adds the request to its own slot, then sums
//! all slots; over the limit, it takes the request back. With sequentially consistent
//! atomics, of two concurrent reservations at least one sees the other, so concurrent
//! allocators in several processes can never together exceed the limit.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::SeqCst};

/// First bytes of every usage file.
pub const USAGE_MAGIC: [u8; 8] = *b"GPUSLUSG";
/// The only layout version this build reads and writes.
pub const USAGE_VERSION: u32 = 1;
/// Devices per slice the file has room for.
pub const MAX_DEVICES: usize = 16;
/// Processes per container that can hold memory at the same time.
pub const MAX_SLOTS: usize = 1024;
const HEADER_SIZE: usize = 4096;
const SLOT_SIZE: usize = 256;
/// Exact size of a usage file.
pub const USAGE_FILE_SIZE: u64 = (HEADER_SIZE + MAX_SLOTS * SLOT_SIZE) as u64;

/// How often reservations and releases check the file's size with `fstat` (1 ms).
pub const SIZE_CHECK_INTERVAL_NS: u64 = 1_000_000;

/// CLOCK_MONOTONIC in ns (a vDSO call, no system call).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

const NO_SLOT: u32 = u32::MAX;
const CLAIMING: u32 = u32::MAX - 1;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    max_devices: u32,
    max_slots: u32,
    slot_size: u32,
    /// One past the highest slot index ever claimed; sums scan only below it.
    slot_hwm: AtomicU32,
    _reserved: [u32; 9],
    devices: [DeviceRecord; MAX_DEVICES],
}

/// Per-device counters shared by all processes of the container.
#[repr(C, align(64))]
pub struct DeviceRecord {
    /// Cumulative measured kernel time of the container on this device, ns.
    pub busy_ns: AtomicU64,
    /// Compute pacing clock (CLOCK_MONOTONIC ns), owned by the shim's pacer.
    pub pace_clock: AtomicU64,
    /// Kernel launches counted while paced.
    pub launches: AtomicU64,
    _reserved: [u64; 5],
}

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    _pad: u32,
    pid_ns: AtomicU64,
    claims: AtomicU64,
    _reserved: [u64; 5],
    used: [AtomicU64; MAX_DEVICES],
    _tail: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<DeviceRecord>() == 64);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);
const _: () = assert!(std::mem::offset_of!(Header, devices) == 64);

/// A usage file that cannot be created, opened or used.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("cannot create usage file {path}: {source}")]
    Create {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error("usage file {path}: cannot open: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("usage file {path}: size {found} bytes, expected exactly {USAGE_FILE_SIZE} (create it with create_usage_file)")]
    Size { path: PathBuf, found: u64 },
    #[error("usage file {path}: not a gpuslice usage file (bad magic)")]
    Magic { path: PathBuf },
    #[error("usage file {path}: layout version {found} is not supported; this build reads version {USAGE_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("usage file {path}: cannot map: {source}")]
    Map {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("usage file {path}: all {MAX_SLOTS} process slots are held by live processes")]
    Full { path: PathBuf },
    #[error("usage file {path}: cannot lock slot {slot}: {source}")]
    Lock {
        path: PathBuf,
        slot: usize,
        source: std::io::Error,
    },
    #[error("usage file {path}: device index {index} is outside 0-{}", MAX_DEVICES - 1)]
    Device { path: PathBuf, index: usize },
    #[error("device {device}: {requested} bytes refused: {used} of {limit} bytes in use")]
    OutOfMemory {
        device: usize,
        requested: u64,
        used: u64,
        limit: u64,
    },
}

/// Creates (or replaces) a zeroed usage file with a valid header, mode 0666 so that
/// non-root users in the container can map it read-write. Called by the host.
pub fn create_usage_file(path: &Path) -> Result<(), UsageError> {
    // The header; everything after it starts as zeros, left as a hole in the file so the
    // create path does not write (or the tmpfs allocate) the whole account up front.
    let mut head = [0u8; 24];
    head[0..8].copy_from_slice(&USAGE_MAGIC);
    head[8..12].copy_from_slice(&USAGE_VERSION.to_ne_bytes());
    head[12..16].copy_from_slice(&(MAX_DEVICES as u32).to_ne_bytes());
    head[16..20].copy_from_slice(&(MAX_SLOTS as u32).to_ne_bytes());
    head[20..24].copy_from_slice(&(SLOT_SIZE as u32).to_ne_bytes());
    gpuslice_fsutil::atomic_write_sized(path, &head, USAGE_FILE_SIZE, 0o666).map_err(|source| {
        UsageError::Create {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Who a slot belongs to, as the process sees itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// Inode of the pid namespace (`/proc/self/ns/pid`), 0 when unknown.
    pub pid_ns: u64,
}

impl ProcessIdentity {
    /// The calling process, reading its pid namespace under `proc_root` (normally `/proc`).
    pub fn current(proc_root: &Path) -> ProcessIdentity {
        use std::os::unix::fs::MetadataExt;
        let pid_ns = std::fs::metadata(proc_root.join("self/ns/pid"))
            .map(|m| m.ino())
            .unwrap_or(0);
        ProcessIdentity {
            pid: std::process::id(),
            pid_ns,
        }
    }
}

/// A read-write or read-only `mmap` of a whole usage file.
struct Mapping {
    ptr: *mut u8,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics (or fields
// that are written once by the host before any process maps the file).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, path: &Path, writable: bool) -> Result<Mapping, UsageError> {
        let found = file
            .metadata()
            .map_err(|source| UsageError::Open {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if found != USAGE_FILE_SIZE {
            return Err(UsageError::Size {
                path: path.to_path_buf(),
                found,
            });
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping a file we hold open, at its exact size; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                USAGE_FILE_SIZE as usize,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let source = std::io::Error::last_os_error();
            return Err(UsageError::Map {
                path: path.to_path_buf(),
                source,
            });
        }
        let map = Mapping { ptr: ptr.cast() };
        let h = map.header();
        if h.magic != USAGE_MAGIC {
            return Err(UsageError::Magic {
                path: path.to_path_buf(),
            });
        }
        if h.version != USAGE_VERSION
            || h.max_devices as usize != MAX_DEVICES
            || h.max_slots as usize != MAX_SLOTS
            || h.slot_size as usize != SLOT_SIZE
        {
            return Err(UsageError::Version {
                path: path.to_path_buf(),
                found: h.version,
            });
        }
        Ok(map)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is USAGE_FILE_SIZE bytes, page aligned, and Header fits in
        // its first HEADER_SIZE bytes; all shared mutable fields are atomics.
        unsafe { &*self.ptr.cast::<Header>() }
    }

    fn slot(&self, index: usize) -> &Slot {
        debug_assert!(index < MAX_SLOTS);
        // SAFETY: index < MAX_SLOTS keeps the slot inside the mapping; slots are 256-byte
        // aligned and hold only atomics and padding.
        unsafe { &*self.ptr.add(HEADER_SIZE + index * SLOT_SIZE).cast::<Slot>() }
    }

    fn hwm(&self) -> usize {
        (self.header().slot_hwm.load(SeqCst) as usize).min(MAX_SLOTS)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr came from a successful mmap of this length and is unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), USAGE_FILE_SIZE as usize) };
    }
}

fn slot_offset(index: usize) -> i64 {
    (HEADER_SIZE + index * SLOT_SIZE) as i64
}

/// Sets (`F_WRLCK`), clears (`F_UNLCK`) or tests (`cmd = F_OFD_GETLK`) the OFD lock on a
/// slot's first byte without waiting. Returns false when another holder has it.
fn slot_lock(
    fd: RawFd,
    index: usize,
    cmd: libc::c_int,
    kind: libc::c_int,
) -> std::io::Result<bool> {
    // SAFETY: flock is plain old data; zeroed is a valid value (l_pid must be 0 for OFD).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = slot_offset(index);
    fl.l_len = 1;
    // SAFETY: fcntl with a valid fd and a pointer to a live flock.
    let rc = unsafe { libc::fcntl(fd, cmd, &mut fl) };
    if rc == 0 {
        if cmd == libc::F_OFD_GETLK {
            return Ok(fl.l_type == libc::F_UNLCK as libc::c_short);
        }
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Takes (`F_WRLCK`, waiting) or drops (`F_UNLCK`) an OFD lock on one byte.
fn lock_range(fd: RawFd, offset: i64, kind: libc::c_int) -> bool {
    // SAFETY: flock is plain old data; zeroed is valid (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset;
    fl.l_len = 1;
    loop {
        // SAFETY: fcntl with a valid fd and a pointer to a live flock.
        if unsafe { libc::fcntl(fd, libc::F_OFD_SETLKW, &mut fl) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Held while a process of the container is in a device's critical section.
pub struct DeviceLock<'a> {
    fd: RawFd,
    offset: i64,
    _usage: &'a UsageFile,
}

impl Drop for DeviceLock<'_> {
    fn drop(&mut self) {
        lock_range(self.fd, self.offset, libc::F_UNLCK);
    }
}

fn zero_slot(slot: &Slot) {
    for u in &slot.used {
        u.store(0, SeqCst);
    }
    slot.pid.store(0, SeqCst);
    slot.pid_ns.store(0, SeqCst);
}

/// A process's read-write attachment to a usage file: the mapping plus (lazily) its own
/// slot. Used by the shim.
pub struct UsageFile {
    path: PathBuf,
    map: Mapping,
    identity: ProcessIdentity,
    /// The descriptor holding our slot's OFD lock, -1 when none.
    fd: AtomicI32,
    /// Our slot index, NO_SLOT, or CLAIMING while a thread claims one.
    slot: AtomicU32,
    /// What this process reserved per device, kept in its own memory: a slot lowered by
    /// another writer of the shared file cannot make this process take more than the limit.
    mine: [AtomicU64; MAX_DEVICES],
    /// CLOCK_MONOTONIC ns of the last check that found the file's size right (0: none).
    size_checked_ns: AtomicU64,
}

impl std::fmt::Debug for UsageFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageFile")
            .field("path", &self.path)
            .field("slot", &self.slot)
            .finish()
    }
}

impl UsageFile {
    /// Maps an existing usage file read-write and claims a slot for `identity`.
    pub fn open(path: &Path, identity: ProcessIdentity) -> Result<UsageFile, UsageError> {
        // The mapping holds a reference to the open file description it was made from, and
        // a fork copies mappings: locks must therefore live on a second description that
        // only the lock descriptor refers to, or a forked child would keep them alive.
        let map = Mapping::new(&open_rw(path)?, path, true)?;
        let file = open_rw(path)?;
        let usage = UsageFile {
            path: path.to_path_buf(),
            map,
            identity,
            fd: AtomicI32::new(-1),
            slot: AtomicU32::new(NO_SLOT),
            mine: std::array::from_fn(|_| AtomicU64::new(0)),
            size_checked_ns: AtomicU64::new(0),
        };
        usage.claim_with(file)?;
        Ok(usage)
    }

    /// The slot this process holds, if any.
    pub fn slot_index(&self) -> Option<usize> {
        match self.slot.load(SeqCst) {
            NO_SLOT | CLAIMING => None,
            s => Some(s as usize),
        }
    }

    /// Takes the first slot whose lock is free (its owner, if any, is dead), zeroes it and
    /// publishes our identity. The descriptor stays open to keep the lock.
    fn claim_with(&self, file: File) -> Result<usize, UsageError> {
        let fd = file.as_raw_fd();
        for index in 0..MAX_SLOTS {
            let got = slot_lock(fd, index, libc::F_OFD_SETLK, libc::F_WRLCK).map_err(|source| {
                UsageError::Lock {
                    path: self.path.clone(),
                    slot: index,
                    source,
                }
            })?;
            if !got {
                continue;
            }
            let slot = self.map.slot(index);
            zero_slot(slot);
            slot.pid_ns.store(self.identity.pid_ns, SeqCst);
            slot.pid.store(self.identity.pid, SeqCst);
            slot.claims.fetch_add(1, SeqCst);
            self.map
                .header()
                .slot_hwm
                .fetch_max(index as u32 + 1, SeqCst);
            self.fd
                .store(std::os::fd::IntoRawFd::into_raw_fd(file), SeqCst);
            self.slot.store(index as u32, SeqCst);
            return Ok(index);
        }
        Err(UsageError::Full {
            path: self.path.clone(),
        })
    }

    /// Our slot, claiming one if a fork left us without.
    fn own_slot(&self) -> Result<usize, UsageError> {
        loop {
            match self.slot.load(SeqCst) {
                NO_SLOT => {
                    if self
                        .slot
                        .compare_exchange(NO_SLOT, CLAIMING, SeqCst, SeqCst)
                        .is_err()
                    {
                        continue;
                    }
                    let result = open_rw(&self.path).and_then(|f| self.claim_with(f));
                    if result.is_err() {
                        self.slot.store(NO_SLOT, SeqCst);
                    }
                    return result;
                }
                // Another thread is claiming; it does not wait on anything, so this ends.
                CLAIMING => std::thread::yield_now(),
                s => return Ok(s as usize),
            }
        }
    }

    /// For a `pthread_atfork` child handler (async-signal-safe): drops the inherited
    /// descriptor so the parent's slot dies with the parent, and forgets the slot; the
    /// child claims its own at its next reservation.
    pub fn forget_after_fork(&self) {
        let fd = self.fd.swap(-1, SeqCst);
        if fd >= 0 {
            // SAFETY: fd is the child's copy of our descriptor; closing it does not release
            // the parent's lock, which the parent's copy keeps.
            unsafe { libc::close(fd) };
        }
        for m in &self.mine {
            m.store(0, SeqCst);
        }
        self.slot.store(NO_SLOT, SeqCst);
    }

    /// Whether the file is still what was mapped: its header (magic and layout, loads from
    /// the mapping) every time, its size (a file truncated under a mapping turns loads into
    /// SIGBUS; an `fstat`) at most once per [`SIZE_CHECK_INTERVAL_NS`]. Reservations and
    /// releases run it first, so a damaged file refuses instead of crashing without a system
    /// call on every allocation. A truncation within the interval, or racing with the check,
    /// can still fault (documented in docs/shim.md).
    pub fn intact(&self) -> Result<(), UsageError> {
        let fd = self.fd.load(SeqCst);
        let now = monotonic_ns();
        let last = self.size_checked_ns.load(SeqCst);
        if fd >= 0 && (last == 0 || now.saturating_sub(last) >= SIZE_CHECK_INTERVAL_NS) {
            let found = file_size(fd);
            if found != Some(USAGE_FILE_SIZE) {
                self.size_checked_ns.store(0, SeqCst);
                return Err(UsageError::Size {
                    path: self.path.clone(),
                    found: found.unwrap_or(0),
                });
            }
            self.size_checked_ns.store(now.max(1), SeqCst);
        }
        let h = self.map.header();
        if h.magic != USAGE_MAGIC {
            return Err(UsageError::Magic {
                path: self.path.clone(),
            });
        }
        if h.version != USAGE_VERSION
            || h.max_devices as usize != MAX_DEVICES
            || h.max_slots as usize != MAX_SLOTS
            || h.slot_size as usize != SLOT_SIZE
        {
            return Err(UsageError::Version {
                path: self.path.clone(),
                found: h.version,
            });
        }
        Ok(())
    }

    fn check_device(&self, device: usize) -> Result<(), UsageError> {
        if device >= MAX_DEVICES {
            return Err(UsageError::Device {
                path: self.path.clone(),
                index: device,
            });
        }
        Ok(())
    }

    /// Sum of all slots' use of `device` (dead ones included until reclaimed). This
    /// process's own slot always counts: a high-water mark lowered below it (the header is
    /// writable by every process of the container) must not hide it, or [`UsageFile::reserve`]
    /// would take the process's own use away from the others' instead of adding it.
    pub fn used(&self, device: usize) -> u64 {
        if device >= MAX_DEVICES {
            return 0;
        }
        let hwm = self.map.hwm();
        let mut total = 0u64;
        for i in 0..hwm {
            total = total.saturating_add(self.map.slot(i).used[device].load(SeqCst));
        }
        if let Some(own) = self.slot_index().filter(|s| *s >= hwm && *s < MAX_SLOTS) {
            total = total.saturating_add(self.map.slot(own).used[device].load(SeqCst));
        }
        total
    }

    /// Bytes of `device` held by this process's slot.
    pub fn own_used(&self, device: usize) -> u64 {
        match (self.slot_index(), device < MAX_DEVICES) {
            (Some(s), true) => self.map.slot(s).used[device].load(SeqCst),
            _ => 0,
        }
    }

    /// Reserves `bytes` of `device` against `limit` for this process. Past the limit it
    /// first reclaims dead processes' memory, then refuses with `OutOfMemory`. A damaged
    /// file (see [`UsageFile::intact`]) or counts that would overflow refuse too. The
    /// process's own share is the larger of its slot and what it knows it reserved, so a
    /// slot lowered by someone else cannot raise what this process gets.
    pub fn reserve(&self, device: usize, bytes: u64, limit: u64) -> Result<(), UsageError> {
        self.check_device(device)?;
        self.intact()?;
        let refuse = |used: u64| UsageError::OutOfMemory {
            device,
            requested: bytes,
            used,
            limit,
        };
        if bytes > limit {
            return Err(refuse(self.used(device)));
        }
        let own = &self.map.slot(self.own_slot()?).used[device];
        if own
            .fetch_update(SeqCst, SeqCst, |v| v.checked_add(bytes))
            .is_err()
        {
            return Err(refuse(u64::MAX));
        }
        let mine = &self.mine[device];
        let my_total = mine.fetch_add(bytes, SeqCst).saturating_add(bytes);
        let mut reclaimed = false;
        loop {
            let slot_now = own.load(SeqCst);
            let total = self
                .used(device)
                .saturating_sub(slot_now)
                .saturating_add(slot_now.max(my_total));
            if total <= limit {
                return Ok(());
            }
            if !reclaimed {
                reclaimed = true;
                if self.reclaim_dead() > 0 {
                    continue;
                }
            }
            let _ = own.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
            let _ = mine.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
            return Err(refuse(total.saturating_sub(bytes)));
        }
    }

    /// Returns `bytes` of `device` this process reserved earlier (saturating at zero); the
    /// slot of a damaged file is left alone.
    pub fn release(&self, device: usize, bytes: u64) {
        if device >= MAX_DEVICES || bytes == 0 {
            return;
        }
        let _ = self.mine[device].fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
        let Some(s) = self.slot_index() else { return };
        if self.intact().is_err() {
            return;
        }
        let own = &self.map.slot(s).used[device];
        let _ = own.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
    }

    /// Bytes of `device` this process reserved and has not released, from its own memory.
    pub fn reserved_here(&self, device: usize) -> u64 {
        self.mine.get(device).map_or(0, |m| m.load(SeqCst))
    }

    /// Zeroes every slot whose owner is dead (its lock can be taken). Returns how many
    /// slots held memory.
    pub fn reclaim_dead(&self) -> usize {
        let fd = self.fd.load(SeqCst);
        let own = self.slot_index();
        if fd < 0 {
            return 0;
        }
        let mut freed = 0;
        for i in 0..self.map.hwm() {
            if Some(i) == own {
                continue;
            }
            let slot = self.map.slot(i);
            let holds = slot.pid.load(SeqCst) != 0 || slot.used.iter().any(|u| u.load(SeqCst) != 0);
            if !holds {
                continue;
            }
            if let Ok(true) = slot_lock(fd, i, libc::F_OFD_SETLK, libc::F_WRLCK) {
                if slot.used.iter().any(|u| u.load(SeqCst) != 0) {
                    freed += 1;
                }
                zero_slot(slot);
                let _ = slot_lock(fd, i, libc::F_OFD_SETLK, libc::F_UNLCK);
            }
        }
        freed
    }

    /// Serialises a short critical section on `device` among the container's processes
    /// (an OFD lock on the device record, waited for; the kernel releases it if the holder
    /// dies, so it cannot be left held). Threads of one process share the lock's owner and
    /// need their own mutex. `None` when this process holds no slot descriptor.
    pub fn device_lock(&self, device: usize) -> Option<DeviceLock<'_>> {
        let fd = self.fd.load(SeqCst);
        if fd < 0 || device >= MAX_DEVICES {
            return None;
        }
        let offset = (std::mem::offset_of!(Header, devices) + device * 64) as i64;
        lock_range(fd, offset, libc::F_WRLCK).then_some(DeviceLock {
            fd,
            offset,
            _usage: self,
        })
    }

    /// The shared counters of `device` (busy time, pacing clock).
    pub fn device(&self, device: usize) -> Option<&DeviceRecord> {
        self.map.header().devices.get(device)
    }
}

impl Drop for UsageFile {
    fn drop(&mut self) {
        let fd = self.fd.swap(-1, SeqCst);
        if fd >= 0 {
            // The slot is zeroed through the mapping only while the file still has its
            // size (every time here, not once a millisecond): stores past the end of a file
            // truncated under the mapping would be SIGBUS. A damaged file's slot is left as
            // it is; closing the descriptor below still frees it for reclaim.
            if let (Some(s), Some(USAGE_FILE_SIZE)) = (self.slot_index(), file_size(fd)) {
                zero_slot(self.map.slot(s));
            }
            // SAFETY: we own this descriptor; closing it releases our slot's lock.
            unsafe { libc::close(fd) };
        }
    }
}

/// The size of the file behind `fd` (`fstat`), `None` when it cannot be read.
fn file_size(fd: RawFd) -> Option<u64> {
    // SAFETY: stat is plain old data; zeroed is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor of ours with a live out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    u64::try_from(st.st_size).ok()
}

fn open_rw(path: &Path) -> Result<File, UsageError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| UsageError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// What the exporter sees of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Bytes held by live processes.
    pub used: u64,
    /// Cumulative measured kernel time of the container, ns.
    pub busy_ns: u64,
}

/// One live process holding a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Pid as the process sees itself (its own pid namespace).
    pub pid: u32,
    /// Inode of its pid namespace, to translate to a host pid through `/proc/*/status`.
    pub pid_ns: u64,
    /// Bytes held per device, indexed like `limits.json` devices.
    pub used: Vec<u64>,
}

/// A point-in-time view of a usage file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSnapshot {
    /// [`MAX_DEVICES`] entries; entry `i` is `limits.json` device `i`.
    pub devices: Vec<DeviceUsage>,
    pub processes: Vec<ProcessUsage>,
}

/// Read-only access for the exporter; never takes or changes a lock. It reads with `pread`
/// and never maps the file: containers have their usage file mounted read-write and may
/// truncate it, which would turn loads from a mapping into SIGBUS in the (root) reader. A
/// short or damaged file is an error of one snapshot instead, checked on every snapshot.
pub struct UsageReader {
    path: PathBuf,
    file: File,
}

impl std::fmt::Debug for UsageReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageReader")
            .field("path", &self.path)
            .finish()
    }
}

/// A native-endian integer at `offset` of a buffer known to be long enough (0 otherwise).
fn ne_u64(buf: &[u8], offset: usize) -> u64 {
    buf.get(offset..offset + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0)
}

fn ne_u32(buf: &[u8], offset: usize) -> u32 {
    buf.get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

impl UsageReader {
    /// Opens a usage file read-only and checks its size and header.
    pub fn open(path: &Path) -> Result<UsageReader, UsageError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| UsageError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let reader = UsageReader {
            path: path.to_path_buf(),
            file,
        };
        reader.read_header()?;
        Ok(reader)
    }

    /// Reads `len` bytes at `offset`; a file shorter than a usage file is a size error.
    fn read_at(&self, offset: usize, len: usize) -> Result<Vec<u8>, UsageError> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, offset as u64)
            .map_err(|source| match self.file.metadata() {
                Ok(m) if m.len() != USAGE_FILE_SIZE => UsageError::Size {
                    path: self.path.clone(),
                    found: m.len(),
                },
                _ => UsageError::Open {
                    path: self.path.clone(),
                    source,
                },
            })?;
        Ok(buf)
    }

    /// The header bytes, checked like a mapping's (size, magic, layout).
    fn read_header(&self) -> Result<Vec<u8>, UsageError> {
        let found = self
            .file
            .metadata()
            .map_err(|source| UsageError::Open {
                path: self.path.clone(),
                source,
            })?
            .len();
        if found != USAGE_FILE_SIZE {
            return Err(UsageError::Size {
                path: self.path.clone(),
                found,
            });
        }
        let h = self.read_at(0, HEADER_SIZE)?;
        if h[..8] != USAGE_MAGIC {
            return Err(UsageError::Magic {
                path: self.path.clone(),
            });
        }
        let version = ne_u32(&h, std::mem::offset_of!(Header, version));
        if version != USAGE_VERSION
            || ne_u32(&h, std::mem::offset_of!(Header, max_devices)) as usize != MAX_DEVICES
            || ne_u32(&h, std::mem::offset_of!(Header, max_slots)) as usize != MAX_SLOTS
            || ne_u32(&h, std::mem::offset_of!(Header, slot_size)) as usize != SLOT_SIZE
        {
            return Err(UsageError::Version {
                path: self.path.clone(),
                found: version,
            });
        }
        Ok(h)
    }

    /// Live processes' memory and the busy counters; dead slots are left out (not
    /// reclaimed: that is the shims' job).
    pub fn snapshot(&self) -> Result<UsageSnapshot, UsageError> {
        let h = self.read_header()?;
        let devices_at = std::mem::offset_of!(Header, devices);
        let busy_at = std::mem::offset_of!(DeviceRecord, busy_ns);
        let record = std::mem::size_of::<DeviceRecord>();
        let mut devices: Vec<DeviceUsage> = (0..MAX_DEVICES)
            .map(|d| DeviceUsage {
                used: 0,
                busy_ns: ne_u64(&h, devices_at + d * record + busy_at),
            })
            .collect();
        let hwm = (ne_u32(&h, std::mem::offset_of!(Header, slot_hwm)) as usize).min(MAX_SLOTS);
        let slots = self.read_at(HEADER_SIZE, hwm * SLOT_SIZE)?;
        let mut processes = Vec::new();
        for (i, slot) in slots.chunks_exact(SLOT_SIZE).enumerate() {
            let pid = ne_u32(slot, std::mem::offset_of!(Slot, pid));
            let used_at = std::mem::offset_of!(Slot, used);
            let used: Vec<u64> = (0..MAX_DEVICES)
                .map(|d| ne_u64(slot, used_at + d * 8))
                .collect();
            if pid == 0 && used.iter().all(|&u| u == 0) {
                continue;
            }
            let unlocked = slot_lock(self.file.as_raw_fd(), i, libc::F_OFD_GETLK, libc::F_WRLCK)
                .map_err(|source| UsageError::Lock {
                    path: self.path.clone(),
                    slot: i,
                    source,
                })?;
            if unlocked {
                continue;
            }
            for (d, u) in devices.iter_mut().zip(&used) {
                d.used = d.used.saturating_add(*u);
            }
            processes.push(ProcessUsage {
                pid,
                pid_ns: ne_u64(slot, std::mem::offset_of!(Slot, pid_ns)),
                used,
            });
        }
        Ok(UsageSnapshot { devices, processes })
    }
}

/// Opens `path` read-only and takes one snapshot.
pub fn read_snapshot(path: &Path) -> Result<UsageSnapshot, UsageError> {
    UsageReader::open(path)?.snapshot()
}

#[cfg(test)]
mod tests;
