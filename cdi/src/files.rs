//! Spec files in a CDI spec directory: atomic writes (readers such as podman or containerd
//! see the old file or the new one, never a partial one), reads that validate, removal.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpuslice_fsutil::{atomic_write, remove_synced, AtomicWriteError};

use crate::json::{from_json, to_json, to_json_compact, JsonError};
use crate::model::Spec;
use crate::names::{spec_file_name, transient_spec_file_name, NameError};

/// Mode of a CDI spec file.
pub const SPEC_FILE_MODE: u32 = 0o644;
/// Mode of a spec directory this crate creates.
pub const SPEC_DIR_MODE: u32 = 0o755;

/// A spec file operation that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    /// The file name cannot be derived from the spec's kind or id.
    #[error("cannot name the CDI spec file: {0}")]
    Name(#[from] NameError),
    /// An explicit file name that an engine would not load or that leaves the directory.
    #[error("CDI spec file name {name:?} is not accepted; accepted: a plain file name ending in .json, not starting with '.'")]
    FileName { name: String },
    /// The spec directory is missing and cannot be created.
    #[error("cannot create CDI spec directory {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The spec is invalid; nothing was written.
    #[error("refusing to write {path}: {source}")]
    Encode { path: PathBuf, source: JsonError },
    /// The atomic write failed; the previous file is untouched.
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    /// The file cannot be read.
    #[error("cannot read CDI spec {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a valid CDI spec.
    #[error("CDI spec {path}: {source}")]
    Decode { path: PathBuf, source: JsonError },
    /// The spec directory cannot be listed.
    #[error("cannot list CDI spec directory {dir}: {source}")]
    List {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The file cannot be removed.
    #[error("cannot remove CDI spec {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The path the spec of `kind` has in `dir`, e.g. `/var/run/cdi/gpuslice.io-gpu.json`.
pub fn spec_path(dir: &Path, kind: &str) -> Result<PathBuf, SpecFileError> {
    Ok(dir.join(spec_file_name(kind)?))
}

/// The path of the transient spec of `kind` tied to `id` in `dir`, e.g.
/// `/var/run/cdi/gpuslice.io-slice_3f9a0c1d2e4b5a69.json`.
pub fn transient_spec_path(dir: &Path, kind: &str, id: &str) -> Result<PathBuf, SpecFileError> {
    Ok(dir.join(transient_spec_file_name(kind, id)?))
}

/// The ids of the transient specs of `kind` in `dir` (from their file names, sorted), so a
/// garbage collector can remove those whose reservation is gone. A missing `dir` has none.
pub fn list_transient_specs(dir: &Path, kind: &str) -> Result<Vec<String>, SpecFileError> {
    let prefix = spec_file_name(kind)?.trim_end_matches(".json").to_string() + "_";
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SpecFileError::List {
                dir: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| SpecFileError::List {
            dir: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix(".json"))
        else {
            continue;
        };
        if transient_spec_file_name(kind, id).is_ok() {
            ids.push(id.to_string());
        }
    }
    ids.sort();
    Ok(ids)
}

/// Writes `spec` (version stamped, validated) to `dir/<vendor>-<class>.json` atomically,
/// creating `dir` (mode 0755) if missing. Returns the file's path.
pub fn write_spec(dir: &Path, spec: &Spec) -> Result<PathBuf, SpecFileError> {
    let name = spec_file_name(&spec.kind)?;
    write_spec_as(dir, &name, spec)
}

/// Writes a transient spec tied to `id` (a reservation) to
/// `dir/<vendor>-<class>_<id>.json`, as [`write_spec`] does. Returns the file's path.
pub fn write_transient_spec(dir: &Path, spec: &Spec, id: &str) -> Result<PathBuf, SpecFileError> {
    let name = transient_spec_file_name(&spec.kind, id)?;
    write_spec_as(dir, &name, spec)
}

/// Writes `spec` to `dir/file_name` as [`write_spec`] does; `file_name` must be a plain
/// name ending in `.json`.
pub fn write_spec_as(dir: &Path, file_name: &str, spec: &Spec) -> Result<PathBuf, SpecFileError> {
    write_named(dir, file_name, spec, to_json)
}

/// As [`write_spec_as`], without indentation ([`crate::to_json_compact`]): for a private copy
/// that gpuslice reads on every create.
pub fn write_spec_compact_as(
    dir: &Path,
    file_name: &str,
    spec: &Spec,
) -> Result<PathBuf, SpecFileError> {
    write_named(dir, file_name, spec, to_json_compact)
}

fn write_named(
    dir: &Path,
    file_name: &str,
    spec: &Spec,
    encode: fn(&Spec) -> Result<Vec<u8>, JsonError>,
) -> Result<PathBuf, SpecFileError> {
    let plain = !file_name.is_empty()
        && !file_name.starts_with('.')
        && !file_name.contains('/')
        && !file_name.contains('\0')
        && file_name.len() > ".json".len()
        && file_name.ends_with(".json");
    if !plain {
        return Err(SpecFileError::FileName {
            name: file_name.to_string(),
        });
    }
    let path = dir.join(file_name);
    let bytes = encode(spec).map_err(|source| SpecFileError::Encode {
        path: path.clone(),
        source,
    })?;
    ensure_dir(dir)?;
    atomic_write(&path, &bytes, SPEC_FILE_MODE)?;
    Ok(path)
}

fn ensure_dir(dir: &Path) -> Result<(), SpecFileError> {
    if dir.is_dir() {
        return Ok(());
    }
    let err = |source| SpecFileError::CreateDir {
        dir: dir.to_path_buf(),
        source,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(SPEC_DIR_MODE)
        .create(dir)
        .map_err(err)?;
    // The umask may have narrowed the mode; engines running as other users must read it.
    fs::set_permissions(dir, fs::Permissions::from_mode(SPEC_DIR_MODE)).map_err(err)
}

/// Reads, parses (strictly) and validates the JSON spec file at `path` (gpuslice writes
/// JSON only; YAML specs are not read).
pub fn read_spec(path: &Path) -> Result<Spec, SpecFileError> {
    let bytes = fs::read(path).map_err(|source| SpecFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    from_json(&bytes).map_err(|source| SpecFileError::Decode {
        path: path.to_path_buf(),
        source,
    })
}

/// Removes the spec file at `path` and syncs its directory; a missing file is not an error.
pub fn remove_spec(path: &Path) -> Result<(), SpecFileError> {
    remove_synced(path).map_err(|source| SpecFileError::Remove {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerEdits, Device};
    use std::os::unix::fs::PermissionsExt;

    fn spec(kind: &str) -> Spec {
        let mut s = Spec::new(kind);
        s.devices.push(Device::new(
            "0",
            ContainerEdits {
                env: vec!["A=1".into()],
                ..Default::default()
            },
        ));
        s
    }

    #[test]
    fn write_read_remove() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cdi");
        let path = write_spec(&dir, &spec("gpuslice.io/gpu")).expect("write");
        assert_eq!(path, dir.join("gpuslice.io-gpu.json"));
        assert_eq!(
            fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(
            fs::metadata(&path).expect("file").permissions().mode() & 0o777,
            0o644
        );
        let back = read_spec(&path).expect("read");
        assert_eq!(back.cdi_version, "0.5.0");
        assert_eq!(
            back.qualified_device_names(),
            vec!["gpuslice.io/gpu=0".to_string()]
        );
        remove_spec(&path).expect("remove");
        assert!(!path.exists());
        remove_spec(&path).expect("second remove is fine");
    }

    #[test]
    fn transient_and_explicit_names() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = write_transient_spec(tmp.path(), &spec("gpuslice.io/slice"), "3f9a0c1d2e4b5a69")
            .expect("write");
        assert_eq!(
            p.file_name().and_then(|n| n.to_str()),
            Some("gpuslice.io-slice_3f9a0c1d2e4b5a69.json")
        );
        let p = write_spec_as(
            tmp.path(),
            "gpuslice.io-slice-x.json",
            &spec("gpuslice.io/slice"),
        )
        .expect("write");
        assert!(p.ends_with("gpuslice.io-slice-x.json"));
        for bad in ["../x.json", "x.yaml", ".x.json", ".json", "a/b.json", ""] {
            assert!(
                matches!(
                    write_spec_as(tmp.path(), bad, &spec("a.io/b")),
                    Err(SpecFileError::FileName { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn transient_specs_are_listed_by_kind() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(
            list_transient_specs(&tmp.path().join("absent"), "gpuslice.io/slice")
                .expect("none")
                .is_empty()
        );
        for id in ["b2", "a1"] {
            write_transient_spec(tmp.path(), &spec("gpuslice.io/slice"), id).expect("write");
        }
        write_spec(tmp.path(), &spec("gpuslice.io/slice")).expect("non-transient");
        write_transient_spec(tmp.path(), &spec("gpuslice.io/gpu"), "c3").expect("other kind");
        fs::write(tmp.path().join("gpuslice.io-slice_x.yaml"), b"").expect("not json");
        let ids = list_transient_specs(tmp.path(), "gpuslice.io/slice").expect("list");
        assert_eq!(ids, ["a1", "b2"]);
        let p = transient_spec_path(tmp.path(), "gpuslice.io/slice", "a1").expect("path");
        assert!(p.exists());
    }

    #[test]
    fn invalid_spec_leaves_old_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_spec(tmp.path(), &spec("gpuslice.io/gpu")).expect("write");
        let before = fs::read(&path).expect("read");
        let mut bad = spec("gpuslice.io/gpu");
        bad.devices[0].container_edits.env[0] = "NOEQUALS".into();
        let e = write_spec(tmp.path(), &bad).expect_err("invalid");
        assert!(e.to_string().contains("gpuslice.io-gpu.json"), "{e}");
        assert_eq!(fs::read(&path).expect("read"), before);
    }

    #[test]
    fn read_errors_name_the_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = tmp.path().join("broken.json");
        fs::write(&p, b"{\"cdiVersion\":").expect("write");
        let e = read_spec(&p).expect_err("broken").to_string();
        assert!(e.contains("broken.json"), "{e}");
        let e = read_spec(&tmp.path().join("missing.json"))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
