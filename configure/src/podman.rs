//! `gpuslice configure podman`: the hooks.d file that runs `gpuslice hook precreate` for
//! containers carrying any `gpuslice.io/` annotation, with `--config` when the config is not
//! the default. The hook refuses a key it does not know (a misspelled `gpuslice.io/memroy`),
//! so such a container is refused rather than started without its GPU.

use std::path::{Path, PathBuf};

use serde_json::json;

use gpuslice_hook::create::annotations::PREFIX;
use gpuslice_hook::node::{NodeContext, NodeError, HOOK_ENV};

/// File name of the hook in the hooks directory.
pub const HOOK_FILE: &str = "gpuslice.json";

/// The podman hook could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("cannot create hooks directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The annotation-key regex that triggers the hook: every `gpuslice.io/` key, known or not
/// (the hook itself tells a request, an opt-out and an unknown key apart).
pub fn annotation_regex() -> String {
    format!("^{}", PREFIX.replace('.', "\\."))
}

/// The hooks.d JSON (OCI hooks schema 1.0.0).
pub fn hook_json(node: &NodeContext) -> Result<String, PodmanError> {
    let binary = node.hook_binary()?;
    let doc = json!({
        "version": "1.0.0",
        "hook": {
            "path": binary.display().to_string(),
            "args": node.hook_args(&["hook", "precreate"]),
            "env": HOOK_ENV,
        },
        "when": { "annotations": { annotation_regex(): ".*" } },
        "stages": ["precreate"],
    });
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    ))
}

/// Writes (or with `remove`, deletes) the hook file in `hooks_dir`. Returns a line to print.
pub fn configure(
    node: &NodeContext,
    hooks_dir: &Path,
    dry_run: bool,
    remove: bool,
) -> Result<String, PodmanError> {
    let path = hooks_dir.join(HOOK_FILE);
    if remove {
        if dry_run {
            return Ok(format!("would remove {}\n", path.display()));
        }
        match std::fs::remove_file(&path) {
            Ok(()) => return Ok(format!("removed {}\n", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(format!("{} was not installed\n", path.display()))
            }
            Err(source) => return Err(PodmanError::Remove { path, source }),
        }
    }
    let text = hook_json(node)?;
    if dry_run {
        return Ok(format!("would write {}:\n{text}", path.display()));
    }
    std::fs::create_dir_all(hooks_dir).map_err(|source| PodmanError::Dir {
        path: hooks_dir.to_path_buf(),
        source,
    })?;
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(format!("{} is up to date\n", path.display()));
    }
    gpuslice_fsutil::atomic_write(&path, text.as_bytes(), 0o644).map_err(|source| {
        PodmanError::Write {
            path: path.clone(),
            source,
        }
    })?;
    Ok(format!("wrote {}\n", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_matches_every_gpuslice_key_by_its_prefix() {
        assert_eq!(annotation_regex(), "^gpuslice\\.io/");
    }
}
