//! Where the simulated node lives for this process: the sim state dir (devices.json and the
//! shared state file) and the device-node dir whose `nvidia<minor>` entries decide which
//! GPUs the process sees, as device nodes do for the real driver in a container.

use std::ffi::OsString;
use std::path::PathBuf;

/// The environment variables and in-container directory of the simulated node, defined by
/// the product's simulated inventory.
pub use gpuslice_driver::simulated::{CONTAINER_STATE_DIR, DEV_ENV, STATE_ENV};

/// The simulated node's directories as seen by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPaths {
    /// Holds `devices.json` and the shared state file.
    pub state_dir: PathBuf,
    /// Holds `nvidia<minor>` for each GPU this process may use.
    pub dev_dir: PathBuf,
}

/// The sim dirs could not be found.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find the simulated node: {STATE_ENV} is not set, {CONTAINER_STATE_DIR} does not exist and the gpuslice config cannot be read: {source}")]
    Config {
        source: gpuslice_config::ConfigError,
    },
}

/// Inputs of the resolution, so tests need not touch the process environment or `/run`.
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    /// Value of `GPUSLICE_SIM_STATE`.
    pub state_env: Option<OsString>,
    /// Value of `GPUSLICE_SIM_DEV`.
    pub dev_env: Option<OsString>,
    /// The in-container state dir (normally [`CONTAINER_STATE_DIR`]).
    pub container_dir: PathBuf,
}

impl Lookup {
    /// The real process environment and `/run/gpuslice-sim`.
    pub fn from_process() -> Lookup {
        Lookup {
            state_env: std::env::var_os(STATE_ENV).filter(|v| !v.is_empty()),
            dev_env: std::env::var_os(DEV_ENV).filter(|v| !v.is_empty()),
            container_dir: PathBuf::from(CONTAINER_STATE_DIR),
        }
    }
}

impl SimPaths {
    /// Resolves: state from `GPUSLICE_SIM_STATE`, else the container dir if it exists, else
    /// `<state_dir>/sim/state` of the gpuslice config (`config()` is only called then, or
    /// when the dev dir needs it). Dev dir from `GPUSLICE_SIM_DEV`, else `/dev` for the
    /// container dir, else `<state_dir>/sim/dev`.
    pub fn resolve(
        lookup: &Lookup,
        config: impl FnOnce() -> Result<gpuslice_config::Config, gpuslice_config::ConfigError>,
    ) -> Result<SimPaths, PathsError> {
        let mut config = Some(config);
        let mut sim_root = || -> Result<PathBuf, PathsError> {
            match config.take() {
                Some(load) => load()
                    .map(|c| c.sim_root())
                    .map_err(|source| PathsError::Config { source }),
                // Only reached once per resolution; kept total for safety.
                None => Ok(PathBuf::from(gpuslice_config::DEFAULT_STATE_DIR).join("sim")),
            }
        };
        let (state_dir, in_container) = match &lookup.state_env {
            Some(s) => (PathBuf::from(s), false),
            None if lookup.container_dir.is_dir() => (lookup.container_dir.clone(), true),
            None => (sim_root()?.join("state"), false),
        };
        let dev_dir = match &lookup.dev_env {
            Some(d) => PathBuf::from(d),
            None if in_container => PathBuf::from("/dev"),
            None => match &lookup.state_env {
                // The config is only needed for the dev dir; the standard layout puts it next
                // to the state dir, which is also where a config-less setup keeps it.
                Some(_) => match sim_root() {
                    Ok(root) => root.join("dev"),
                    Err(_) => state_dir
                        .parent()
                        .map(|p| p.join("dev"))
                        .unwrap_or_else(|| PathBuf::from("/dev")),
                },
                None => state_dir
                    .parent()
                    .map(|p| p.join("dev"))
                    .unwrap_or_else(|| PathBuf::from("/dev")),
            },
        };
        Ok(SimPaths { state_dir, dev_dir })
    }

    /// Resolves from the process environment and the gpuslice config file.
    pub fn from_env() -> Result<SimPaths, PathsError> {
        SimPaths::resolve(&Lookup::from_process(), || {
            gpuslice_config::load_from_env(None).map(|l| l.config)
        })
    }

    /// True when `<dev_dir>/nvidia<minor>` exists (any file type: tests use regular files).
    pub fn is_visible(&self, minor: u32) -> bool {
        self.dev_dir
            .join(format!("nvidia{minor}"))
            .symlink_metadata()
            .is_ok()
    }

    /// The shared state file.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join(crate::state::STATE_FILE)
    }

    /// `devices.json`.
    pub fn devices_file(&self) -> PathBuf {
        self.state_dir.join(crate::devices::DEVICES_FILE)
    }

    /// For messages.
    pub fn describe(&self) -> String {
        format!(
            "state {} devices {}",
            self.state_dir.display(),
            self.dev_dir.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_config::{Config, ConfigError};
    use std::path::Path;

    fn cfg(state: &Path) -> impl FnOnce() -> Result<Config, ConfigError> + '_ {
        move || {
            Ok(Config {
                state_dir: state.to_path_buf(),
                ..Config::default()
            })
        }
    }

    fn never() -> Result<Config, ConfigError> {
        panic!("config must not be loaded")
    }

    #[test]
    fn env_wins_and_dev_env_is_honoured() {
        let l = Lookup {
            state_env: Some("/s".into()),
            dev_env: Some("/d".into()),
            container_dir: "/nonexistent-gpuslice".into(),
        };
        let p = SimPaths::resolve(&l, never).unwrap();
        assert_eq!(
            p,
            SimPaths {
                state_dir: "/s".into(),
                dev_dir: "/d".into()
            }
        );
    }

    #[test]
    fn container_dir_uses_dev() {
        let dir = tempfile::tempdir().unwrap();
        let l = Lookup {
            container_dir: dir.path().to_path_buf(),
            ..Lookup::default()
        };
        let p = SimPaths::resolve(&l, never).unwrap();
        assert_eq!(p.state_dir, dir.path());
        assert_eq!(p.dev_dir, Path::new("/dev"));
    }

    #[test]
    fn config_gives_sim_state_and_dev() {
        let l = Lookup {
            container_dir: "/nonexistent-gpuslice".into(),
            ..Lookup::default()
        };
        let p = SimPaths::resolve(&l, cfg(Path::new("/var/gs"))).unwrap();
        assert_eq!(p.state_dir, Path::new("/var/gs/sim/state"));
        assert_eq!(p.dev_dir, Path::new("/var/gs/sim/dev"));

        let l = Lookup {
            state_env: Some("/s/state".into()),
            container_dir: "/nonexistent-gpuslice".into(),
            ..Lookup::default()
        };
        let p = SimPaths::resolve(&l, cfg(Path::new("/var/gs"))).unwrap();
        assert_eq!(p.dev_dir, Path::new("/var/gs/sim/dev"));
    }

    #[test]
    fn visibility_follows_device_nodes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia1"), b"").unwrap();
        let p = SimPaths {
            state_dir: dir.path().into(),
            dev_dir: dir.path().into(),
        };
        assert!(p.is_visible(1));
        assert!(!p.is_visible(0));
    }
}
