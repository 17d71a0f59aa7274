//! The static (musl) build of `gpuslice` and where it hands over to the full (glibc) build.
//!
//! A container's create path runs `gpuslice-runtime` three times and the `gpuslice` hooks
//! twice; on virtual machines where `cpuid` traps, a dynamically linked glibc process spends
//! most of its ~1 ms start-up detecting CPU features, a static musl one starts in ~0.3 ms
//! (docs/benchmarks.md, "Create path"). But a static binary cannot `dlopen` NVML, so the
//! static `gpuslice` runs only the hooks itself and re-executes every other command
//! (`status`, `serve`, `cdi generate`, …) with the full build installed beside it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// File name of the full (glibc, NVML-capable) build of `gpuslice` that a static build
/// hands its non-hook commands to.
pub const FULL_BUILD_NAME: &str = "gpuslice-full";

/// Whether this binary is the static (musl) build.
pub const IS_STATIC: bool = cfg!(target_env = "musl");

/// The subcommand of a `gpuslice` command line (arguments after the program name): the first
/// argument that is not the global `--config PATH` / `--config=PATH` or another flag.
pub fn subcommand(args: &[OsString]) -> Option<&OsStr> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            it.next();
            continue;
        }
        if a.to_str().is_some_and(|s| s.starts_with('-')) {
            continue;
        }
        return Some(a.as_os_str());
    }
    None
}

/// Whether a command line runs a hook (the create path: `gpuslice hook …`).
pub fn is_hook(args: &[OsString]) -> bool {
    subcommand(args).is_some_and(|s| s == "hook")
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

/// The full build a static `gpuslice` should re-execute `args` with: `None` for hook
/// commands (and `--help`/`--version` without a subcommand), which it runs itself, and when
/// no full build is installed (then it runs the command itself and only NVML is missing).
pub fn handover_target(args: &[OsString], exe: &Path) -> Option<PathBuf> {
    match subcommand(args) {
        None => None,
        Some(s) if s == "hook" => None,
        Some(_) => full_build_candidates(exe).into_iter().find(|p| p.is_file()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_subcommand_skips_the_global_config_flag() {
        assert_eq!(
            subcommand(&args(&["--config", "/x/hook", "status"])),
            Some(OsStr::new("status"))
        );
        assert_eq!(
            subcommand(&args(&["--config=/x", "hook", "poststop"])),
            Some(OsStr::new("hook"))
        );
        assert_eq!(subcommand(&args(&["--version"])), None);
        assert!(is_hook(&args(&[
            "hook",
            "--config",
            "/c",
            "create-runtime"
        ])));
        // A config file named `hook` is not the hook subcommand.
        assert!(!is_hook(&args(&["--config", "hook", "status"])));
    }

    #[test]
    fn hooks_stay_in_the_static_build_and_other_commands_go_to_the_full_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let bin = dir.path().join("bin");
        let lib = dir.path().join("lib/gpuslice");
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&lib).unwrap_or_else(|e| panic!("{e}"));
        let exe = bin.join("gpuslice");
        // No full build installed: everything runs here.
        assert_eq!(handover_target(&args(&["status"]), &exe), None);
        // The package layout: <prefix>/lib/gpuslice/gpuslice-full.
        std::fs::write(lib.join(FULL_BUILD_NAME), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            handover_target(&args(&["status", "--json"]), &exe),
            Some(lib.join(FULL_BUILD_NAME))
        );
        assert_eq!(handover_target(&args(&["hook", "poststop"]), &exe), None);
        assert_eq!(handover_target(&args(&["--help"]), &exe), None);
        // Next to the binary wins (the build tree's target/release/static/).
        std::fs::write(bin.join(FULL_BUILD_NAME), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            handover_target(&args(&["--config", "/c", "serve"]), &exe),
            Some(bin.join(FULL_BUILD_NAME))
        );
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
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let lib = dir.path().join("lib/gpuslice");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&lib).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
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
