//! The registry's files in `state_dir`: the lock, `registry.json` (replaced atomically,
//! read without the lock by status and the exporter) and the per-reservation records in
//! `slices/<id>/reservation.json` that `gc --rebuild` reconstructs from.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::id::is_valid_id;
use crate::model::{RegistryFile, Reservation, REGISTRY_VERSION};

/// The registry file in `state_dir`.
pub const REGISTRY_FILE: &str = "registry.json";
/// The lock file in `state_dir`, held with `flock` during every read-modify-write.
pub const LOCK_FILE: &str = "registry.lock";
/// The directory of slice directories in `state_dir`.
pub const SLICES_DIR: &str = "slices";
/// The reservation record in a slice directory.
pub const RECORD_FILE: &str = "reservation.json";
/// Version of `reservation.json`.
pub const RECORD_VERSION: u32 = 1;

/// A file operation of the registry that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] gpuslice_fsutil::AtomicWriteError),
    #[error("reservation record {path} is unreadable: {detail}")]
    Record { path: PathBuf, detail: String },
    #[error("`{id}` is not a reservation id, so it names no slice directory; accepted: 16 lowercase hex characters")]
    InvalidId { id: String },
    #[error("{what} {path} is refused: {detail}; accepted: {accepted}")]
    Unsafe {
        what: &'static str,
        path: PathBuf,
        detail: String,
        accepted: String,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The registry's paths under one state directory.
#[derive(Debug, Clone)]
pub struct Paths {
    pub state_dir: PathBuf,
    pub registry: PathBuf,
    pub lock: PathBuf,
    pub slices: PathBuf,
}

impl Paths {
    pub fn new(state_dir: &Path) -> Paths {
        Paths {
            state_dir: state_dir.to_path_buf(),
            registry: state_dir.join(REGISTRY_FILE),
            lock: state_dir.join(LOCK_FILE),
            slices: state_dir.join(SLICES_DIR),
        }
    }

    /// `slices/<id>`; an `id` that is not a reservation id (`..`, `/`) is refused.
    pub fn slice_dir(&self, id: &str) -> Result<PathBuf, StoreError> {
        if !is_valid_id(id) {
            return Err(StoreError::InvalidId { id: id.to_string() });
        }
        Ok(self.slices.join(id))
    }

    /// Creates the state directory (0755) and `slices/` (0700: host users never reach a
    /// slice's files; containers reach theirs through bind mounts, which runtimes set up
    /// as root) when missing, and tightens a `slices/` an older build left open.
    pub fn create(&self) -> Result<(), StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.state_dir)
            .map_err(io("create directory", &self.state_dir))?;
        match DirBuilder::new().mode(0o700).create(&self.slices) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create directory", &self.slices)(e)),
        }
        let meta = fs::symlink_metadata(&self.slices).map_err(io("inspect", &self.slices))?;
        if !meta.is_dir() {
            return Err(StoreError::Unsafe {
                what: "slices directory",
                path: self.slices.clone(),
                detail: "it is not a directory".into(),
                accepted: "a directory (not a symbolic link)".into(),
            });
        }
        if meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(&self.slices, fs::Permissions::from_mode(0o700))
                .map_err(io("set mode 0700 on", &self.slices))?;
        }
        Ok(())
    }
}

/// Refuses `state_dir`, and its `registry.json` when present, if either is a symbolic link,
/// is not owned by uid `owner` (root on a node) or is writable by group or others: whoever
/// could change them could make the hooks, which run as root, book or remove what they
/// choose. A missing state directory is fine (it is created 0755).
pub fn check_state_dir(state_dir: &Path, owner: u32) -> Result<(), StoreError> {
    let check = |what: &'static str, path: &Path, dir: bool| -> Result<(), StoreError> {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("inspect", path)(e)),
        };
        let accepted = format!(
            "a {} (not a symbolic link) owned by uid {owner}, not writable by group or others",
            if dir { "directory" } else { "regular file" }
        );
        let refuse = |detail: String| StoreError::Unsafe {
            what,
            path: path.to_path_buf(),
            detail,
            accepted: accepted.clone(),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(refuse("it is a symbolic link".into()));
        }
        if (dir && !kind.is_dir()) || (!dir && !kind.is_file()) {
            return Err(refuse(format!(
                "it is not a {}",
                if dir { "directory" } else { "regular file" }
            )));
        }
        if meta.uid() != owner {
            return Err(refuse(format!("it is owned by uid {}", meta.uid())));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(refuse(format!("it has mode {mode:04o}")));
        }
        Ok(())
    };
    check("state directory", state_dir, true)?;
    check("registry file", &state_dir.join(REGISTRY_FILE), false)
}

/// An exclusive `flock` on the lock file, released when dropped (or by the kernel when the
/// holder dies).
#[derive(Debug)]
pub struct LockGuard {
    _file: File,
}

/// How long [`lock`] tries before it sleeps in `flock`.
const LOCK_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Takes the registry lock, waiting for it.
pub fn lock(path: &Path) -> Result<LockGuard, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io("open lock file", path))?;
    // Try, yielding between tries, for a few operations' worth of time before sleeping in
    // flock: a sleeper is woken on the releasing process's CPU and waits there until that
    // process is done with its own work after the lock, so under contention a trying
    // waiter takes a free lock a scheduling delay earlier (a quarter more operations per
    // second with 16 writers here). Uncontended, the first try succeeds.
    let started = std::time::Instant::now();
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(LockGuard { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(StoreError::Io {
                    op: "lock",
                    path: path.to_path_buf(),
                    source: e.into(),
                })
            }
        }
        if started.elapsed() >= LOCK_SPIN {
            break;
        }
        std::thread::yield_now();
    }
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive) {
            Ok(()) => return Ok(LockGuard { _file: file }),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(StoreError::Io {
                    op: "lock",
                    path: path.to_path_buf(),
                    source: e.into(),
                })
            }
        }
    }
}

/// What `registry.json` held.
#[derive(Debug)]
pub enum Loaded {
    /// No file yet: a fresh node.
    Missing,
    Ok(RegistryFile),
    /// Unparseable or another version: never guessed at or overwritten.
    Corrupt(String),
}

#[derive(Deserialize)]
struct VersionProbe {
    version: u32,
}

/// Parses registry text; `Err` carries what is wrong, for the corrupt-file message.
pub fn parse_registry(text: &[u8]) -> Result<RegistryFile, String> {
    // Validating UTF-8 once for the whole file and parsing from `str` spares serde_json a
    // validation per string.
    let text = std::str::from_utf8(text).map_err(|e| {
        format!(
            "invalid UTF-8 at byte {}; accepted: a JSON document",
            e.valid_up_to()
        )
    })?;
    let unsupported = |v: u32| {
        format!("version {v} is not supported (this build reads version {REGISTRY_VERSION})")
    };
    match serde_json::from_str::<RegistryFile>(text) {
        Ok(f) if f.version == REGISTRY_VERSION => {
            // Ids become paths (`slices/<id>`, CDI spec names): one that is not an id
            // makes the whole file unusable rather than a path outside `slices/`.
            match f.reservations.iter().find(|r| !is_valid_id(&r.id)) {
                Some(r) => Err(format!(
                    "reservation id `{}` is not a reservation id; accepted: 16 lowercase hex characters",
                    r.id.escape_debug()
                )),
                None => Ok(f),
            }
        }
        Ok(f) => Err(unsupported(f.version)),
        // Another version's layout fails to parse as this one: name the version, not the
        // first field that differs.
        Err(e) => match serde_json::from_str::<VersionProbe>(text) {
            Ok(p) if p.version != REGISTRY_VERSION => Err(unsupported(p.version)),
            _ => Err(format!("invalid JSON: {e}")),
        },
    }
}

/// Reads and parses `registry.json`.
pub fn load(path: &Path) -> Result<Loaded, StoreError> {
    // `read_to_end` sizes the buffer from the file's length.
    let mut text = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut text).map_err(io("read", path))?,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(io("open", path)(e)),
    };
    Ok(match parse_registry(&text) {
        Ok(f) => Loaded::Ok(f),
        Err(detail) => Loaded::Corrupt(detail),
    })
}

/// Replaces `registry.json` atomically, mode 0600.
pub fn save(path: &Path, file: &RegistryFile) -> Result<(), StoreError> {
    let text = serde_json::to_vec(file).map_err(|e| StoreError::Io {
        op: "serialise",
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    gpuslice_fsutil::atomic_write(path, &text, 0o600)?;
    Ok(())
}

/// `reservation.json`: a [`Reservation`] (owned when read, borrowed when written).
#[derive(Serialize, Deserialize)]
struct Record<R> {
    version: u32,
    reservation: R,
}

/// Creates `slices/<id>/` if needed and (re)writes its `reservation.json`. A directory made
/// here is synced into `slices/` before the record is written: a power loss after return
/// cannot leave the registry listing a booking whose directory and record are gone.
pub fn write_record(paths: &Paths, r: &Reservation) -> Result<(), StoreError> {
    let dir = paths.slice_dir(&r.id)?;
    match DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => gpuslice_fsutil::sync_dir(&paths.slices).map_err(io("sync", &paths.slices))?,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("create directory", &dir)(e)),
    }
    let text = serde_json::to_vec(&Record {
        version: RECORD_VERSION,
        reservation: r,
    })
    .map_err(|e| StoreError::Io {
        op: "serialise",
        path: dir.clone(),
        source: std::io::Error::other(e),
    })?;
    gpuslice_fsutil::atomic_write(&dir.join(RECORD_FILE), &text, 0o600)?;
    Ok(())
}

/// Writes `r`'s record (and its directory) when `slices/<id>/reservation.json` is missing:
/// a crash between listing a booking in `registry.json` and writing its record, or a power
/// loss that took the directory, leaves a listed booking without them, and whoever is handed
/// it again writes its slice files there. A record present is left as it is.
pub fn ensure_record(paths: &Paths, r: &Reservation) -> Result<(), StoreError> {
    let path = paths.slice_dir(&r.id)?.join(RECORD_FILE);
    match fs::symlink_metadata(&path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => write_record(paths, r),
        Err(e) => Err(io("inspect", &path)(e)),
    }
}

/// Reads `slices/<id>/reservation.json`; `Ok(None)` when the directory or record is absent.
pub fn read_record(paths: &Paths, id: &str) -> Result<Option<Reservation>, StoreError> {
    let path = paths.slice_dir(id)?.join(RECORD_FILE);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", &path)(e)),
    };
    let rec: Record<Reservation> =
        serde_json::from_slice(&text).map_err(|e| StoreError::Record {
            path: path.clone(),
            detail: format!("invalid JSON: {e}"),
        })?;
    if rec.version != RECORD_VERSION {
        return Err(StoreError::Record {
            path,
            detail: format!(
                "version {} is not supported (this build reads version {RECORD_VERSION})",
                rec.version
            ),
        });
    }
    if rec.reservation.id != id {
        return Err(StoreError::Record {
            path,
            detail: format!("it names reservation {}", rec.reservation.id),
        });
    }
    Ok(Some(rec.reservation))
}

/// Removes `slices/<id>/` and everything in it; a missing directory is fine.
pub fn remove_slice(paths: &Paths, id: &str) -> Result<(), StoreError> {
    let dir = paths.slice_dir(id)?;
    match fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove", &dir)(e)),
    }
}

/// Ids of the slice directories present (names that are not reservation ids are skipped).
pub fn slice_ids(paths: &Paths) -> Result<Vec<String>, StoreError> {
    let entries = match fs::read_dir(&paths.slices) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list", &paths.slices)(e)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("list", &paths.slices))?;
        if let Some(name) = entry.file_name().to_str() {
            if is_valid_id(name) {
                ids.push(name.to_string());
            }
        }
    }
    ids.sort();
    Ok(ids)
}

/// Removes temp files that killed writers of `registry.json` left behind. Only safe under
/// the lock, since every writer of the registry holds it.
pub fn remove_stale_temps(paths: &Paths) -> Result<usize, StoreError> {
    let prefix = format!(".{REGISTRY_FILE}.tmp.");
    let mut removed = 0;
    let entries = fs::read_dir(&paths.state_dir).map_err(io("list", &paths.state_dir))?;
    for entry in entries {
        let entry = entry.map_err(io("list", &paths.state_dir))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            let p = entry.path();
            match fs::remove_file(&p) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove", &p)(e)),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_and_unknown_versions_are_named() {
        let current = format!(r#"{{"version":{REGISTRY_VERSION}}}"#);
        assert_eq!(
            parse_registry(current.as_bytes()).map(|f| f.version),
            Ok(REGISTRY_VERSION)
        );
        // Versions 1 and 2 (never released; 2 kept reservations as arrays) are refused by
        // name, like any other version.
        for (text, version) in [
            (&br#"{"version":1}"#[..], 1),
            (br#"{"version":2}"#, 2),
            (
                br#"{"version":2,"reservations":[["0123456789abcdef","pending",["container",null,null,null],[],false,1,null,null]]}"#,
                2,
            ),
            (br#"{"version":4,"whatever":[1]}"#, 4),
            (br#"{"version":4,"reservations":"no"}"#, 4),
            (br#"{"version":0}"#, 0),
        ] {
            let e = parse_registry(text).expect_err("another version");
            assert!(
                e.contains(&format!(
                    "version {version} is not supported (this build reads version {REGISTRY_VERSION})"
                )),
                "{e}"
            );
        }
        let e = parse_registry(b"{\"version\":3,\"reserv").expect_err("truncated");
        assert!(e.contains("invalid JSON"), "{e}");
        let e = parse_registry(br#"{"version":3,"reservations":[["0123456789abcdef"]]}"#)
            .expect_err("an array where a reservation belongs");
        assert!(
            e.contains("invalid JSON") && e.contains("struct Reservation"),
            "{e}"
        );
        assert!(parse_registry(b"").is_err());
        let e = parse_registry(b"{\"version\":3,\"x\":\"\xff\"}").expect_err("not UTF-8");
        assert!(e.contains("invalid UTF-8 at byte 18"), "{e}");
    }

    /// A reservation as a newer build might write it, a field this build does not know at
    /// each level it reads into a type of its own (the owner's tag is exact, so none there).
    fn newer_reservation(id: &str) -> serde_json::Value {
        serde_json::json!({
            "id": id,
            "state": "bound",
            "owner": {
                "kind": "container",
                "container_id": "c1",
                "process": {"pid": 7, "start_time": 9, "boot_id": "b", "pidfd_inode": 42},
                "kubernetes": {"namespace": "ns", "pod": "p", "container": "c", "qos": "Burstable"}
            },
            "gpus": [{"index": 0, "uuid": "GPU-a", "memory": 1024, "cores": 10,
                      "mig_profile": {"name": "1g.10gb", "slices": [1, 2]}}],
            "created_ms": 5,
            "priority": -3
        })
    }

    /// The fields of [`newer_reservation`] this build does not know, as found in `r`.
    fn unknown_fields(r: &serde_json::Value) -> [&serde_json::Value; 4] {
        [
            &r["priority"],
            &r["gpus"][0]["mig_profile"],
            &r["owner"]["process"]["pidfd_inode"],
            &r["owner"]["kubernetes"]["qos"],
        ]
    }

    #[test]
    fn fields_of_a_newer_build_survive_a_read_modify_write() {
        // A build rolled back to reads what a newer one wrote and rewrites it: what it does
        // not know comes back unchanged beside what it changed, for the newer build to find.
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(dir.path());
        paths.create().expect("create");
        let id = "0123456789abcdef";
        let newer = serde_json::json!({
            "version": REGISTRY_VERSION,
            "reservations": [newer_reservation(id)],
            "counters": {"reserved_total": 1, "evicted_total": 4},
            "node_epoch": {"boot": "e1"}
        });
        fs::write(&paths.registry, newer.to_string()).expect("write");
        let Loaded::Ok(mut file) = load(&paths.registry).expect("load") else {
            panic!("not read")
        };
        file.reservations[0].bound_ms = Some(11);
        file.counters.reserved_total += 1;
        save(&paths.registry, &file).expect("save");
        let back: serde_json::Value =
            serde_json::from_slice(&fs::read(&paths.registry).expect("read")).expect("JSON");
        let r = &back["reservations"][0];
        assert_eq!(unknown_fields(r), unknown_fields(&newer["reservations"][0]));
        assert_eq!(back["node_epoch"], newer["node_epoch"]);
        assert_eq!(back["counters"]["evicted_total"], 4);
        assert_eq!(
            (
                r["bound_ms"].as_u64(),
                back["counters"]["reserved_total"].as_u64()
            ),
            (Some(11), Some(2))
        );

        // A slice's record likewise.
        let record = paths.slice_dir(id).expect("dir");
        fs::create_dir(&record).expect("mkdir");
        let record = record.join(RECORD_FILE);
        let newer =
            serde_json::json!({"version": RECORD_VERSION, "reservation": newer_reservation(id)});
        fs::write(&record, newer.to_string()).expect("write");
        let mut r = read_record(&paths, id).expect("read").expect("present");
        r.bound_ms = Some(11);
        write_record(&paths, &r).expect("write");
        let back: serde_json::Value =
            serde_json::from_slice(&fs::read(&record).expect("read")).expect("JSON");
        assert_eq!(
            unknown_fields(&back["reservation"]),
            unknown_fields(&newer["reservation"])
        );
        assert_eq!(back["reservation"]["bound_ms"], 11);
    }

    #[test]
    fn load_reports_a_file_that_is_not_utf8_as_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(REGISTRY_FILE);
        fs::write(&p, b"{\"version\":3,\"x\":\"\xff\"}").expect("write");
        match load(&p).expect("load") {
            Loaded::Corrupt(e) => assert!(e.contains("invalid UTF-8 at byte 18"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_waiter_gets_the_lock_after_a_long_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(LOCK_FILE);
        let held = lock(&p).expect("lock");
        let (started, is_started) = std::sync::mpsc::channel();
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                started.send(()).expect("tell the holder");
                let g = lock(&p).expect("lock after the holder");
                (t.elapsed(), g)
            })
        };
        // Held from the waiter's start for longer than the trying phase (however late the
        // waiter is scheduled): the waiter sleeps in flock, then is woken.
        is_started.recv().expect("waiter started");
        std::thread::sleep(LOCK_SPIN * 5);
        drop(held);
        let (waited, _g) = waiter.join().expect("waiter");
        assert!(waited >= LOCK_SPIN * 4, "{waited:?}");
    }

    #[test]
    fn lock_excludes_a_second_open_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(LOCK_FILE);
        let held = lock(&p).expect("lock");
        let other = File::open(&p).expect("open");
        let try_lock =
            rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        assert_eq!(try_lock, Err(rustix::io::Errno::WOULDBLOCK));
        drop(held);
        assert!(
            rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        );
    }
}
