//! The static (musl) build of `gpuslice` and where it hands over to the full (glibc) build.
//!
//! A container's create path runs `gpuslice-runtime` three times and the `gpuslice` hooks
//! twice; on virtual machines where `cpuid` traps, a dynamically linked glibc process spends
//! most of its ~1 ms start-up detecting CPU features, a static musl one starts in ~0.3 ms
//! (docs/benchmarks.md, "Create path"). But a static binary cannot `dlopen` NVML, so the
//! static `gpuslice` runs only the hook lines `create::hookargv` reads and re-executes every
//! other command line (`status`, `serve`, `cdi generate`, `--help`, …) with the full build
//! installed beside it, `gpuslice-full`; without one it fails naming where it looked.

use std::path::{Path, PathBuf};

/// File name of the full (glibc, NVML-capable) build of `gpuslice` that a static build
/// hands its non-hook commands to.
pub const FULL_BUILD_NAME: &str = "gpuslice-full";

/// Whether this binary is the static (musl) build.
pub const IS_STATIC: bool = cfg!(target_env = "musl");

/// The static build allocates with dlmalloc: musl's own allocator maps and unmaps pages
/// for most growing buffers, a third of a hook's kernel time (docs/benchmarks.md, "The
/// static build's allocator"). The glibc build keeps glibc's.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The static build has no full build to hand a command line over to.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("cannot locate the running executable to find {FULL_BUILD_NAME} next to it: {0}")]
    CurrentExe(std::io::Error),
    #[error("this static gpuslice runs only the OCI hooks and hands every other command to the full build, which is missing: no {FULL_BUILD_NAME} at {}; install it there (the package puts it in /usr/lib/gpuslice/) or run the glibc build of gpuslice", .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or "))]
    Missing { searched: Vec<PathBuf> },
}

/// Where the full build is looked for, next to `exe` first, then in the package's
/// library directory (`<prefix>/bin/gpuslice` → `<prefix>/lib/gpuslice/gpuslice-full`).
pub fn full_build_candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.parent() {
        out.push(dir.join(FULL_BUILD_NAME));
        if let Some(prefix) = dir.parent() {
            out.push(prefix.join("lib/gpuslice").join(FULL_BUILD_NAME));
        }
    }
    out
}

/// Where a sibling binary `name` (`gpuslice`, `gpuslice-runtime`) of the running executable
/// `exe` is looked for: beside it; for the full build, also `<prefix>/bin/<name>` (the inverse
/// of [`full_build_candidates`]), so that specs, hooks.d files and engine registrations
/// written by `gpuslice-full` name the installed `/usr/bin` binaries.
pub fn sibling_candidates(exe: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.parent() {
        out.push(dir.join(name));
        if exe.file_name().is_some_and(|n| n == FULL_BUILD_NAME) {
            if let Some(prefix) = dir.parent().and_then(Path::parent) {
                out.push(prefix.join("bin").join(name));
            }
        }
    }
    out
}

/// The first of [`sibling_candidates`] that exists; `Err` names where it was expected
/// (beside `exe`, else `/usr/bin/<name>`), for the error message.
pub fn find_sibling(exe: &Path, name: &str) -> Result<PathBuf, PathBuf> {
    let candidates = sibling_candidates(exe, name);
    if let Some(found) = candidates.iter().find(|p| p.exists()) {
        return Ok(found.clone());
    }
    Err(candidates
        .into_iter()
        .next()
        .unwrap_or_else(|| Path::new("/usr/bin").join(name)))
}

/// The full build a static `gpuslice` at `exe` hands a command line over to: the first of
/// [`full_build_candidates`] that is a file.
pub fn full_build(exe: &Path) -> Result<PathBuf, HandoverError> {
    let searched = full_build_candidates(exe);
    match searched.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(HandoverError::Missing { searched }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefix in a temporary directory with `bin/` and `lib/gpuslice/`.
    fn prefix() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let bin = dir.path().join("bin");
        let lib = dir.path().join("lib/gpuslice");
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&lib).unwrap_or_else(|e| panic!("{e}"));
        (dir, bin, lib)
    }

    #[test]
    fn the_full_build_is_found_beside_the_binary_or_in_the_package_and_named_when_missing() {
        let (_dir, bin, lib) = prefix();
        let exe = bin.join("gpuslice");
        // No full build installed: one error naming every place looked at.
        let err = full_build(&exe).err().map(|e| e.to_string());
        let err = err.unwrap_or_else(|| panic!("found a full build in an empty tree"));
        assert!(
            err.contains(&bin.join(FULL_BUILD_NAME).display().to_string())
                && err.contains(&lib.join(FULL_BUILD_NAME).display().to_string()),
            "{err}"
        );
        // A directory of that name is not a build.
        std::fs::create_dir(lib.join(FULL_BUILD_NAME)).unwrap_or_else(|e| panic!("{e}"));
        assert!(full_build(&exe).is_err());
        std::fs::remove_dir(lib.join(FULL_BUILD_NAME)).unwrap_or_else(|e| panic!("{e}"));
        // The package layout: <prefix>/lib/gpuslice/gpuslice-full.
        std::fs::write(lib.join(FULL_BUILD_NAME), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(full_build(&exe).ok(), Some(lib.join(FULL_BUILD_NAME)));
        // Next to the binary wins (the build tree's target/release/static/).
        std::fs::write(bin.join(FULL_BUILD_NAME), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(full_build(&exe).ok(), Some(bin.join(FULL_BUILD_NAME)));
    }

    #[test]
    fn the_full_build_finds_the_static_gpuslice_that_started_it() {
        let packaged = Path::new("/usr/lib/gpuslice").join(FULL_BUILD_NAME);
        assert_eq!(
            sibling_candidates(&packaged, "gpuslice"),
            vec![
                PathBuf::from("/usr/lib/gpuslice/gpuslice"),
                PathBuf::from("/usr/bin/gpuslice")
            ]
        );
        // Each way round: the static build's handover target maps back to it.
        assert!(full_build_candidates(Path::new("/usr/bin/gpuslice")).contains(&packaged));
        let tree = Path::new("/t/release/static");
        assert_eq!(
            sibling_candidates(&tree.join(FULL_BUILD_NAME), "gpuslice").first(),
            Some(&tree.join("gpuslice"))
        );
        assert_eq!(
            sibling_candidates(&packaged, "gpuslice-runtime").last(),
            Some(&PathBuf::from("/usr/bin/gpuslice-runtime"))
        );
        // Any other binary: only beside it.
        assert_eq!(
            sibling_candidates(Path::new("/usr/bin/gpuslice-runtime"), "gpuslice"),
            vec![PathBuf::from("/usr/bin/gpuslice")]
        );
    }

    #[test]
    fn find_sibling_prefers_an_existing_candidate_and_names_the_first_otherwise() {
        let (_dir, bin, lib) = prefix();
        let full = lib.join(FULL_BUILD_NAME);
        assert_eq!(
            find_sibling(&full, "gpuslice-runtime"),
            Err(lib.join("gpuslice-runtime"))
        );
        std::fs::write(bin.join("gpuslice-runtime"), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            find_sibling(&full, "gpuslice-runtime"),
            Ok(bin.join("gpuslice-runtime"))
        );
    }
}
