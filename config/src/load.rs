//! Finding the config file: `--config PATH`, else `GPUSLICE_CONFIG`, else the default path
//! (whose absence means "all defaults").

use std::path::{Path, PathBuf};

use crate::model::{Config, DEFAULT_CONFIG_PATH};
use crate::parse::{parse_config, ConfigError};

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "GPUSLICE_CONFIG";

/// How the config file was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// The default path; `exists` is false when it is absent and defaults apply.
    Default { exists: bool },
    /// `--config PATH`.
    Flag,
    /// `GPUSLICE_CONFIG`.
    Env,
}

/// A loaded config and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// Absolute path of the file (the default path when defaults apply).
    pub path: PathBuf,
    pub origin: ConfigOrigin,
}

impl LoadedConfig {
    /// The `--config PATH` arguments hooks must carry: empty when the config is the default.
    pub fn hook_args(&self) -> Vec<String> {
        if self.path == Path::new(DEFAULT_CONFIG_PATH) {
            Vec::new()
        } else {
            vec!["--config".to_string(), self.path.display().to_string()]
        }
    }

    /// Whether the config is the default one.
    pub fn is_default(&self) -> bool {
        self.path == Path::new(DEFAULT_CONFIG_PATH)
    }
}

/// Loads the config: `flag` wins, then `env` (the value of `GPUSLICE_CONFIG`), then the
/// default path. An explicitly named file must exist; the default may be absent.
pub fn load_config(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
) -> Result<LoadedConfig, ConfigError> {
    let (path, origin) = config_path(flag, env);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(LoadedConfig {
            config: parse_config(&text, &path)?,
            path,
            origin,
        }),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && matches!(origin, ConfigOrigin::Default { .. }) =>
        {
            Ok(LoadedConfig {
                config: Config::default(),
                path,
                origin: ConfigOrigin::Default { exists: false },
            })
        }
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// The config file `flag`, else `env`, else the default path names (made absolute).
pub(crate) fn config_path(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
) -> (PathBuf, ConfigOrigin) {
    let (path, origin) = match (flag, env.filter(|e| !e.is_empty())) {
        (Some(p), _) => (p.to_path_buf(), ConfigOrigin::Flag),
        (None, Some(e)) => (PathBuf::from(e), ConfigOrigin::Env),
        (None, None) => (
            PathBuf::from(DEFAULT_CONFIG_PATH),
            ConfigOrigin::Default { exists: true },
        ),
    };
    (absolute(&path), origin)
}

/// Loads from the process environment (`GPUSLICE_CONFIG`) and an optional flag.
pub fn load_from_env(flag: Option<&Path>) -> Result<LoadedConfig, ConfigError> {
    load_config(flag, std::env::var_os(CONFIG_ENV).as_deref())
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}
