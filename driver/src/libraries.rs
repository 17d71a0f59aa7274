//! The user-space driver libraries the CUDA stack needs, located under a driver root through
//! its ld.so cache (or its library directories), as versioned files with their sonames.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::ldcache::{read_ld_cache, CacheEntry};

/// Base names of the compute and utility libraries of the NVIDIA driver that CUDA programs
/// and NVML tools load (the NVIDIA Container Toolkit's "compute" and "utility" sets).
pub const COMPUTE_LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
];

/// Library directories searched when the root has no ld.so cache entry for a library.
pub const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
];

/// One driver library to mount into containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverLibrary {
    /// Soname, e.g. `libcuda.so.1`.
    pub soname: String,
    /// The versioned file on the host (symlinks resolved inside the root).
    pub host_path: PathBuf,
    /// Where the loader finds it in a container: the soname in the directory where the root's
    /// loader finds it, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub container_path: PathBuf,
}

/// A driver library that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LibrariesError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a shared library: {detail}")]
    NotElf { path: PathBuf, detail: String },
    #[error("{path} points outside the driver root {root} or loops")]
    Escapes { path: PathBuf, root: PathBuf },
}

/// Resolves `inside` (an absolute path in the root's view) to a real file on the host,
/// following symlinks as if `root` were `/`. Never leaves `root`.
pub fn resolve_in_root(root: &Path, inside: &Path) -> Result<PathBuf, LibrariesError> {
    let escapes = || LibrariesError::Escapes {
        path: inside.to_path_buf(),
        root: root.to_path_buf(),
    };
    let mut pending: Vec<std::ffi::OsString> = inside
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut current: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            current.pop();
            continue;
        }
        current.push(part);
        let host: PathBuf = current.iter().fold(root.to_path_buf(), |p, c| p.join(c));
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(escapes());
                }
                let target = std::fs::read_link(&host).map_err(|source| LibrariesError::Read {
                    path: host.clone(),
                    source,
                })?;
                current.pop();
                if target.is_absolute() {
                    current.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(s) => pending.push(s.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            Ok(_) => {}
            Err(source) => return Err(LibrariesError::Read { path: host, source }),
        }
    }
    Ok(current.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// Reads the ELF soname of a shared library.
pub fn elf_soname(path: &Path) -> Result<Option<String>, LibrariesError> {
    let data = std::fs::read(path).map_err(|source| LibrariesError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let elf = goblin::elf::Elf::parse(&data).map_err(|e| LibrariesError::NotElf {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(elf.soname.map(str::to_string))
}

fn candidates_from_cache(root: &Path) -> Vec<CacheEntry> {
    read_ld_cache(&root.join("etc/ld.so.cache")).unwrap_or_default()
}

fn in_root(root: &Path, inside: &Path) -> PathBuf {
    root.join(inside.strip_prefix("/").unwrap_or(inside))
}

/// Finds the driver libraries under `root`. Libraries that are absent are skipped (a driver
/// ships only some of them); a library that is present but unreadable is an error.
pub fn discover_libraries(
    root: &Path,
    names: &[&str],
) -> Result<Vec<DriverLibrary>, LibrariesError> {
    let cache = candidates_from_cache(root);
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for base in names {
        let prefix = format!("{base}.");
        // 1. The root's ld.so cache, as its loader would.
        let mut from_cache: Vec<&CacheEntry> = cache
            .iter()
            .filter(|e| e.soname.starts_with(&prefix))
            .collect();
        from_cache.sort_by(|a, b| a.soname.cmp(&b.soname));
        let mut located = Vec::new();
        for entry in from_cache {
            located.push((entry.soname.clone(), entry.path.clone()));
        }
        // 2. Otherwise the standard library directories: files named `<base>.*` whose ELF
        //    soname starts with the base name.
        if located.is_empty() {
            for dir in LIBRARY_DIRS {
                let host_dir = in_root(root, Path::new(dir));
                let Ok(entries) = std::fs::read_dir(&host_dir) else {
                    continue;
                };
                let mut names: Vec<String> = entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect();
                names.sort();
                for name in names {
                    let inside = Path::new(dir).join(&name);
                    let real = resolve_in_root(root, &inside)?;
                    if !real.is_file() {
                        continue;
                    }
                    if let Some(soname) = elf_soname(&real)? {
                        if soname.starts_with(&prefix) {
                            located.push((soname, Path::new(dir).join(&name)));
                        }
                    }
                }
                if !located.is_empty() {
                    break;
                }
            }
        }
        for (soname, inside) in located {
            if !seen.insert(soname.clone()) {
                continue;
            }
            let host_path = resolve_in_root(root, &inside)?;
            if !host_path.is_file() {
                continue;
            }
            let dir = inside.parent().unwrap_or(Path::new("/"));
            found.push(DriverLibrary {
                container_path: dir.join(&soname),
                soname,
                host_path,
            });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn resolves_absolute_and_relative_links_inside_root() {
        let root = tempfile::tempdir().expect("tempdir");
        let lib = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).expect("mkdir");
        std::fs::write(lib.join("libcuda.so.550.54.15"), b"x").expect("write");
        symlink("libcuda.so.550.54.15", lib.join("libcuda.so.1")).expect("link");
        symlink(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            lib.join("libcuda.so"),
        )
        .expect("link");
        std::fs::create_dir_all(root.path().join("lib")).expect("mkdir");
        symlink(
            "/usr/lib/x86_64-linux-gnu",
            root.path().join("lib/x86_64-linux-gnu"),
        )
        .expect("link");
        let real = resolve_in_root(root.path(), Path::new("/lib/x86_64-linux-gnu/libcuda.so"))
            .expect("resolve");
        assert_eq!(real, lib.join("libcuda.so.550.54.15"));
    }

    #[test]
    fn a_link_cannot_escape_the_root() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("usr/lib")).expect("mkdir");
        symlink(
            "../../../../../../etc/passwd",
            root.path().join("usr/lib/libcuda.so.1"),
        )
        .expect("link");
        // `..` stops at the root, so this resolves to <root>/etc/passwd, which is absent.
        let e = resolve_in_root(root.path(), Path::new("/usr/lib/libcuda.so.1"))
            .expect_err("absent inside root");
        assert!(
            matches!(&e, LibrariesError::Read { path, .. } if path.starts_with(root.path())),
            "{e}"
        );
        symlink("loop", root.path().join("usr/lib/loop")).expect("link");
        assert!(matches!(
            resolve_in_root(root.path(), Path::new("/usr/lib/loop")),
            Err(LibrariesError::Escapes { .. })
        ));
    }
}
