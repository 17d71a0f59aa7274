//! The node context every subcommand starts from: the loaded config, its registry, where the
//! `gpuslice` binary lives (for hooks written into specs) and the hooks' fixed environment.

use std::path::{Path, PathBuf};

use gpuslice_config::{load_from_env, Config, ConfigError, LoadedConfig};
use gpuslice_registry::{Registry, RegistryError, Reservation};

use crate::specfiles::Holder;

/// The explicit, minimal environment every hook runs with — never the image's
/// (cf. CVE-2025-23266: an image's `LD_PRELOAD` reaching a hook that runs as root).
pub const HOOK_ENV: &[&str] =
    &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"];

/// Where the `gpuslice` binary is not found.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot locate the running executable to find `gpuslice` next to it: {0}; set hook.path in the config")]
    CurrentExe(std::io::Error),
    #[error("hook binary {path} does not exist; set hook.path in the config to the installed `gpuslice`")]
    MissingHookBinary { path: PathBuf },
}

/// The node context every command starts from: the loaded configuration, and what follows
/// from it (the registry, the hook binary, hook lines).
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub loaded: LoadedConfig,
}

impl NodeContext {
    /// Loads the config from `--config`, `GPUSLICE_CONFIG` or the default path.
    pub fn load(flag: Option<&Path>) -> Result<NodeContext, ConfigError> {
        Ok(NodeContext {
            loaded: load_from_env(flag)?,
        })
    }

    /// Builds a node from an already loaded config (tests).
    pub fn from_loaded(loaded: LoadedConfig) -> NodeContext {
        NodeContext { loaded }
    }

    pub fn config(&self) -> &Config {
        &self.loaded.config
    }

    /// Opens the node's registry; a released or reaped slice loses its CDI spec file in
    /// `cdi.spec_dir` with it (a container's slice spec, or a DRA claim's own spec).
    pub fn open_registry(&self) -> Result<Registry, RegistryError> {
        let spec_dir = self.config().cdi.spec_dir.clone();
        let cleanup = Box::new(move |r: &Reservation| {
            if let Some(path) = Holder::of(r).spec_path(&spec_dir) {
                let _ = gpuslice_cdi::remove_spec(&path);
            }
        });
        Registry::open_config(self.config(), cleanup)
    }

    /// Releases the pending reservations this process made that no hook bound: the
    /// give-back of a create that fails after its spec edit reserved (the runtime wrapper's
    /// when the runtime fails, the precreate hook's when the edited spec cannot be handed
    /// back), so the slice does not wait for `registry.pending_timeout`.
    pub fn give_back_pending(&self) -> Result<Vec<Reservation>, RegistryError> {
        self.open_registry()?.give_back_pending()
    }

    /// Absolute path of the `gpuslice` binary that hooks run: `hook.path` of the config,
    /// else the `gpuslice` next to the running executable (also when that is
    /// `gpuslice-runtime`); the full build started by the static `gpuslice` names that one
    /// (see `staticbuild::sibling_candidates`).
    pub fn hook_binary(&self) -> Result<PathBuf, NodeError> {
        if let Some(p) = &self.config().hook.path {
            return Ok(p.clone());
        }
        let exe = std::env::current_exe().map_err(NodeError::CurrentExe)?;
        let exe = exe.canonicalize().unwrap_or(exe);
        crate::staticbuild::find_sibling(&exe, "gpuslice")
            .map_err(|path| NodeError::MissingHookBinary { path })
    }

    /// A CDI hook entry running `gpuslice <sub…>` at stage `name`: absolute path, `--config`
    /// when needed, and the fixed environment.
    pub fn hook(&self, binary: &Path, name: &str, sub: &[&str]) -> gpuslice_cdi::Hook {
        gpuslice_cdi::Hook {
            hook_name: name.to_string(),
            path: binary.display().to_string(),
            args: self.hook_args(sub),
            env: HOOK_ENV.iter().map(|s| s.to_string()).collect(),
            timeout: None,
        }
    }

    /// Arguments of a hook entry: program name, `--config PATH` when the config is not the
    /// default, then `sub`.
    pub fn hook_args(&self, sub: &[&str]) -> Vec<String> {
        let mut args = vec!["gpuslice".to_string()];
        args.extend(self.loaded.hook_args());
        args.extend(sub.iter().map(|s| s.to_string()));
        args
    }
}
