//! The shared state file: one fixed-size file in the sim state dir, mapped `MAP_SHARED` by
//! every process using the simulated driver (host and containers alike), holding per-device
//! timelines and per-process slots as atomics. Everything is zero-initialised, so the file
//! needs no set-up step and concurrent creators cannot race. Cross-process exclusion uses
//! `fcntl` open-file-description locks on single bytes, which the kernel drops when their
//! holder dies, in any pid namespace.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::devices::MAX_DEVICES;

/// File name of the shared state inside the sim state dir.
pub const STATE_FILE: &str = "state.bin";
/// Most processes that can use the simulated node at once.
pub const MAX_SLOTS: usize = 512;
/// Utilisation history: this many buckets ...
pub const BUCKETS: usize = 128;
/// ... of this many nanoseconds each.
pub const BUCKET_NS: u64 = 100_000_000;
/// Per-process utilisation history: this many [`BUCKET_NS`] buckets per device (6.4 s):
/// what NVML's buffer of per-process samples is made of (a few seconds of samples, each
/// over the second before it; see `gpuslice-sim-nvml`'s `samples`).
pub const SLOT_BUCKETS: usize = 64;

const MAGIC: u64 = u64::from_le_bytes(*b"GSLSIM\0\x01");
const LAYOUT_VERSION: u64 = 3;

/// File header.
#[repr(C, align(64))]
pub(crate) struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    /// One past the highest slot index ever claimed: scans stop there.
    pub slots_hwm: AtomicU64,
    /// Hash of the boot id the timelines belong to (CLOCK_MONOTONIC restarts at boot).
    pub boot: AtomicU64,
}

/// Per-device state.
#[repr(C, align(64))]
pub(crate) struct DeviceState {
    /// CLOCK_MONOTONIC ns at which the last scheduled kernel ends.
    pub free_at: AtomicU64,
    /// Sum of the durations of all kernels ever scheduled.
    pub busy_ns: AtomicU64,
    /// Kernels ever scheduled.
    pub launches: AtomicU64,
    /// Busy ns per [`BUCKET_NS`] bucket: epoch in the high 32 bits, ns in the low 32.
    pub buckets: [AtomicU64; BUCKETS],
}

/// Per-process slot.
#[repr(C, align(64))]
pub(crate) struct SlotState {
    /// 1 while a process holds the slot (its liveness is the slot's lock).
    pub in_use: AtomicU64,
    /// The pid as the process sees it.
    pub pid: AtomicU64,
    /// Inode of the process's pid namespace.
    pub pid_ns: AtomicU64,
    /// Device memory held, per device index.
    pub used: [AtomicU64; MAX_DEVICES],
    /// Contexts held, per device index (a process with a context shows in NVML).
    pub contexts: [AtomicU64; MAX_DEVICES],
    /// Kernel time this process ever ran, per device index (what NVML's per-process SM
    /// utilisation is made of).
    pub busy_ns: [AtomicU64; MAX_DEVICES],
    /// This process's busy ns per [`BUCKET_NS`] bucket and device, encoded like the
    /// device buckets.
    pub buckets: [[AtomicU64; SLOT_BUCKETS]; MAX_DEVICES],
}

#[repr(C)]
pub(crate) struct Layout {
    pub header: Header,
    pub devices: [DeviceState; MAX_DEVICES],
    pub slots: [SlotState; MAX_SLOTS],
}

/// Size of the state file.
pub const STATE_SIZE: usize = std::mem::size_of::<Layout>();

/// The state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot open the simulated driver state {path}: {source}; the sim state dir must be writable by every GPU process (mode 1777)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot map the simulated driver state {path}: {source}")]
    Map {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a gpuslice simulated driver state file of layout {LAYOUT_VERSION}; remove it when no GPU process runs")]
    Layout { path: PathBuf },
    #[error("cannot lock {what} in {path}: {source}")]
    Lock {
        path: PathBuf,
        what: String,
        source: std::io::Error,
    },
    #[error("all {MAX_SLOTS} process slots of {path} are taken by live processes")]
    SlotsFull { path: PathBuf },
}

/// A mapped state file.
pub struct SharedState {
    path: PathBuf,
    /// Descriptor of the mapping; also the open file description used to probe slot locks.
    file: File,
    map: *mut Layout,
    /// Serialises the threads of this process around device locks (an OFD lock does not
    /// exclude threads sharing its descriptor).
    device_mutexes: [Mutex<()>; MAX_DEVICES],
    /// Serialises reaping in this process (see `reap_dead`).
    pub(crate) reap_mutex: Mutex<()>,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

// SAFETY: the mapping is only accessed through atomics (`Layout` consists of atomics only),
// and it lives as long as the `SharedState`.
unsafe impl Send for SharedState {}
// SAFETY: as above; shared access to atomics is what they are for.
unsafe impl Sync for SharedState {}

impl Drop for SharedState {
    fn drop(&mut self) {
        // SAFETY: `map` came from a successful mmap of STATE_SIZE bytes and no reference into
        // it outlives `self` (all accessors borrow `self`).
        unsafe {
            libc::munmap(self.map.cast(), STATE_SIZE);
        }
    }
}

pub(crate) fn open_rw(path: &Path) -> Result<(File, bool), std::io::Error> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(path)
    {
        Ok(f) => {
            // The umask may have narrowed the mode: every user's processes share the file.
            f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
            Ok((f, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok((OpenOptions::new().read(true).write(true).open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

impl SharedState {
    /// Opens (creating at fixed size on first use) and maps the state file at `path`.
    pub fn open(path: &Path) -> Result<SharedState, StateError> {
        let open_err = |source| StateError::Open {
            path: path.to_path_buf(),
            source,
        };
        let (file, _created) = open_rw(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        if len < STATE_SIZE as u64 {
            // Growing to the same size from several processes is harmless; never shrink.
            file.set_len(STATE_SIZE as u64).map_err(open_err)?;
        }
        // SAFETY: mapping a regular file we opened read-write, at least STATE_SIZE long,
        // shared; the result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(StateError::Map {
                path: path.to_path_buf(),
                source: std::io::Error::last_os_error(),
            });
        }
        let state = SharedState {
            path: path.to_path_buf(),
            file,
            map: ptr.cast(),
            device_mutexes: std::array::from_fn(|_| Mutex::new(())),
            reap_mutex: Mutex::new(()),
        };
        let h = &state.layout().header;
        let magic = match h
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => MAGIC,
            Err(found) => found,
        };
        let version =
            match h
                .version
                .compare_exchange(0, LAYOUT_VERSION, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => LAYOUT_VERSION,
                Err(found) => found,
            };
        if magic != MAGIC || version != LAYOUT_VERSION {
            return Err(StateError::Layout {
                path: path.to_path_buf(),
            });
        }
        state.reset_timelines_after_reboot(boot_hash());
        Ok(state)
    }

    /// A state file kept across a reboot (not on tmpfs) holds timelines of the old
    /// CLOCK_MONOTONIC: the first opener after the boot clears them.
    fn reset_timelines_after_reboot(&self, boot: u64) {
        let h = &self.layout().header;
        let old = h.boot.load(Ordering::Acquire);
        if old == boot
            || h.boot
                .compare_exchange(old, boot, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        for d in &self.layout().devices {
            d.free_at.store(0, Ordering::Release);
            for b in &d.buckets {
                b.store(0, Ordering::Release);
            }
        }
    }

    pub(crate) fn layout(&self) -> &Layout {
        // SAFETY: `map` points to STATE_SIZE mapped bytes, valid and suitably aligned
        // (page-aligned) for `Layout`, whose all-zero bit pattern is valid; only atomics are
        // reached through the reference.
        unsafe { &*self.map }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn slots_hwm(&self) -> usize {
        (self.layout().header.slots_hwm.load(Ordering::Acquire) as usize).min(MAX_SLOTS)
    }

    /// Runs `f` holding device `dev`'s lock, exclusive across threads and processes.
    pub(crate) fn with_device_lock<T>(
        &self,
        dev: usize,
        f: impl FnOnce() -> T,
    ) -> Result<T, StateError> {
        let _thread = lock_ignoring_poison(&self.device_mutexes[dev]);
        let offset = device_lock_offset(dev);
        let what = || format!("device {dev}");
        ofd_lock(
            &self.file,
            offset,
            libc::F_OFD_SETLKW,
            libc::F_WRLCK as libc::c_short,
        )
        .map_err(|source| StateError::Lock {
            path: self.path.clone(),
            what: what(),
            source,
        })?;
        let out = f();
        ofd_lock(
            &self.file,
            offset,
            libc::F_OFD_SETLK,
            libc::F_UNLCK as libc::c_short,
        )
        .map_err(|source| StateError::Lock {
            path: self.path.clone(),
            what: what(),
            source,
        })?;
        Ok(out)
    }

    /// Tries to take slot `i`'s lock through this mapping's descriptor: `Ok(true)` means no
    /// other open file description holds it (its owner is gone).
    pub(crate) fn probe_slot_lock(&self, i: usize) -> Result<bool, StateError> {
        try_lock(&self.file, slot_lock_offset(i)).map_err(|source| StateError::Lock {
            path: self.path.clone(),
            what: format!("slot {i}"),
            source,
        })
    }

    pub(crate) fn release_probe_lock(&self, i: usize) {
        let _ = ofd_lock(
            &self.file,
            slot_lock_offset(i),
            libc::F_OFD_SETLK,
            libc::F_UNLCK as libc::c_short,
        );
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`, a UUID) folded to 64 bits; 1 when
/// unreadable. Stable across builds, unlike `std`'s hashers.
fn boot_hash() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = id.chars().filter(char::is_ascii_hexdigit).collect();
    let fold = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
    match hex.len() {
        32 => (fold(&hex[..16]) ^ fold(&hex[16..])) | 1,
        _ => 1,
    }
}

pub(crate) fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Byte locked to hold device `dev` (inside the device's record; locks are advisory).
fn device_lock_offset(dev: usize) -> u64 {
    (std::mem::offset_of!(Layout, devices) + dev * std::mem::size_of::<DeviceState>()) as u64
}

/// Byte locked by the process owning slot `i`.
pub(crate) fn slot_lock_offset(i: usize) -> u64 {
    (std::mem::offset_of!(Layout, slots) + i * std::mem::size_of::<SlotState>()) as u64
}

/// Non-blocking write lock of one byte; `Ok(false)` when another description holds it.
pub(crate) fn try_lock(file: &File, offset: u64) -> std::io::Result<bool> {
    match ofd_lock(
        file,
        offset,
        libc::F_OFD_SETLK,
        libc::F_WRLCK as libc::c_short,
    ) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

fn ofd_lock(
    file: &File,
    offset: u64,
    cmd: libc::c_int,
    kind: libc::c_short,
) -> std::io::Result<()> {
    // SAFETY: an all-zero `flock` is a valid value; OFD locks require l_pid == 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: fcntl with an OFD lock command and a pointer to a valid, initialised flock.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_at_fixed_size_with_shared_mode_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.len(), STATE_SIZE as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        a.layout().devices[3].busy_ns.store(42, Ordering::SeqCst);
        let b = SharedState::open(&p).unwrap();
        assert_eq!(
            b.layout().devices[3].busy_ns.load(Ordering::SeqCst),
            42,
            "one shared mapping"
        );
    }

    #[test]
    fn timelines_of_another_boot_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        a.layout().devices[0]
            .free_at
            .store(u64::MAX / 2, Ordering::SeqCst);
        a.reset_timelines_after_reboot(boot_hash());
        assert_eq!(
            a.layout().devices[0].free_at.load(Ordering::SeqCst),
            u64::MAX / 2,
            "same boot: kept"
        );
        a.reset_timelines_after_reboot(42);
        assert_eq!(
            a.layout().devices[0].free_at.load(Ordering::SeqCst),
            0,
            "new boot: cleared"
        );
    }

    #[test]
    fn foreign_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        std::fs::write(&p, vec![7u8; STATE_SIZE]).unwrap();
        let e = SharedState::open(&p).unwrap_err().to_string();
        assert!(e.contains(STATE_FILE) && e.contains("layout"), "{e}");
    }

    #[test]
    fn device_lock_excludes_other_descriptions() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(STATE_FILE);
        let a = SharedState::open(&p).unwrap();
        let other = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let held = a
            .with_device_lock(2, || try_lock(&other, device_lock_offset(2)).unwrap())
            .unwrap();
        assert!(
            !held,
            "another description must not get the lock while it is held"
        );
        assert!(
            try_lock(&other, device_lock_offset(2)).unwrap(),
            "released afterwards"
        );
    }
}
