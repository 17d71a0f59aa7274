//! What an engine is told to run as the `gpuslice` runtime. Engines call runtimes with runc's
//! arguments only, so `gpuslice-runtime` finds its config through `GPUSLICE_CONFIG` or the
//! default path. With the default config the engine runs `gpuslice-runtime` itself; with any
//! other config it runs a two-line wrapper script (written next to the engine's config) that
//! sets `GPUSLICE_CONFIG` and `exec`s `gpuslice-runtime`. That keeps `configure` a single
//! self-contained step, removable with `--remove`, with no edit to the engine's service unit.

use std::path::{Path, PathBuf};

use crate::files::{read, FileError, Plan};
use gpuslice_hook::node::NodeContext;

/// The first line of every wrapper gpuslice writes (how `--remove` recognises its own).
pub const WRAPPER_MARKER: &str = "# Written by `gpuslice configure";

/// File name of the wrapper in the engine's config directory.
pub const WRAPPER_NAME: &str = "gpuslice-runtime.sh";

/// Name of the runtime binary installed next to `gpuslice`.
pub const RUNTIME_BINARY: &str = "gpuslice-runtime";

/// The runtime could not be located or its wrapper is not gpuslice's.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot locate the running executable to find `gpuslice-runtime` next to it: {0}")]
    CurrentExe(std::io::Error),
    #[error("{path} does not exist; install `gpuslice-runtime` next to `gpuslice`")]
    MissingRuntime { path: PathBuf },
    #[error("{path} exists and was not written by gpuslice; move it away, then run again")]
    ForeignWrapper { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
}

/// The runtime binary and the gpuslice config it must be told about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Absolute path of `gpuslice-runtime`.
    pub runtime: PathBuf,
    /// The gpuslice config when it is not the default path (`None`: default).
    pub config: Option<PathBuf>,
}

impl Registration {
    /// `gpuslice-runtime` next to the running executable (see
    /// `staticbuild::sibling_candidates`), and the node's config when it is not the default.
    pub fn from_node(node: &NodeContext) -> Result<Registration, RegistrationError> {
        let exe = std::env::current_exe().map_err(RegistrationError::CurrentExe)?;
        let exe = exe.canonicalize().unwrap_or(exe);
        // Beside this binary; for the full build started by the static `gpuslice`, the
        // installed `<prefix>/bin/gpuslice-runtime`.
        let runtime = gpuslice_hook::staticbuild::find_sibling(&exe, RUNTIME_BINARY)
            .map_err(|path| RegistrationError::MissingRuntime { path })?;
        let config = (!node.loaded.is_default()).then(|| node.loaded.path.clone());
        Ok(Registration { runtime, config })
    }

    /// The program the engine runs: the wrapper at `wrapper` when the config is not the
    /// default, else `gpuslice-runtime`.
    pub fn binary(&self, wrapper: &Path) -> PathBuf {
        match self.config {
            Some(_) => wrapper.to_path_buf(),
            None => self.runtime.clone(),
        }
    }

    /// The wrapper script for `engine` (`None` with the default config).
    pub fn wrapper_script(&self, engine: &str) -> Option<String> {
        let config = self.config.as_ref()?;
        Some(format!(
            "#!/bin/sh\n{WRAPPER_MARKER} {engine}`: {engine} runs runtimes with runc's arguments only,\n\
             # so this names the gpuslice config for gpuslice-runtime. Removed by\n\
             # `gpuslice configure {engine} --remove`.\n\
             GPUSLICE_CONFIG={}\nexport GPUSLICE_CONFIG\nexec {} \"$@\"\n",
            shell_quote(&config.display().to_string()),
            shell_quote(&self.runtime.display().to_string()),
        ))
    }

    /// Plans writing the wrapper at `path` when one is needed, or removing a stale one of
    /// gpuslice's (the config became the default).
    pub fn plan_wrapper(
        &self,
        path: &Path,
        engine: &str,
        plan: &mut Plan,
    ) -> Result<(), RegistrationError> {
        check_ours(path)?;
        match self.wrapper_script(engine) {
            Some(text) => plan.write(path, text, 0o755),
            None => plan.remove(path),
        }
        Ok(())
    }
}

/// Plans removing the wrapper at `path` if it is gpuslice's.
pub fn plan_remove_wrapper(path: &Path, plan: &mut Plan) -> Result<(), RegistrationError> {
    check_ours(path)?;
    plan.remove(path);
    Ok(())
}

fn check_ours(path: &Path) -> Result<(), RegistrationError> {
    match read(path)?.text {
        Some(t) if !t.lines().nth(1).unwrap_or("").starts_with(WRAPPER_MARKER) => {
            Err(RegistrationError::ForeignWrapper {
                path: path.to_path_buf(),
            })
        }
        _ => Ok(()),
    }
}

/// `s` single-quoted for /bin/sh.
/// `name` in the directory of an engine's config file `config` (`/` when it has none).
pub fn beside(config: &Path, name: &str) -> PathBuf {
    config.parent().unwrap_or(Path::new("/")).join(name)
}

pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_needs_no_wrapper() {
        let r = Registration {
            runtime: "/usr/bin/gpuslice-runtime".into(),
            config: None,
        };
        assert_eq!(r.wrapper_script("containerd"), None);
        assert_eq!(
            r.binary(Path::new("/etc/containerd/gpuslice-runtime.sh")),
            Path::new("/usr/bin/gpuslice-runtime")
        );
    }

    #[test]
    fn wrapper_names_the_config_and_runs_the_runtime() {
        let d = tempfile::tempdir().unwrap();
        let runtime = d.path().join("fake-runtime");
        std::fs::write(
            &runtime,
            "#!/bin/sh\necho \"cfg=$GPUSLICE_CONFIG args=$*\"\n",
        )
        .unwrap();
        std::fs::set_permissions(
            &runtime,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let r = Registration {
            runtime: runtime.clone(),
            config: Some(d.path().join("it's a config.toml")),
        };
        let wrapper = d.path().join(WRAPPER_NAME);
        let mut plan = Plan::default();
        r.plan_wrapper(&wrapper, "containerd", &mut plan).unwrap();
        plan.apply(false).unwrap();
        let out = std::process::Command::new(&wrapper)
            .args(["create", "--bundle", "/b c", "id"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "cfg={} args=create --bundle /b c id\n",
                d.path().join("it's a config.toml").display()
            )
        );
        assert_eq!(r.binary(&wrapper), wrapper);
    }

    #[test]
    fn a_foreign_file_at_the_wrapper_path_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let wrapper = d.path().join(WRAPPER_NAME);
        std::fs::write(&wrapper, "#!/bin/sh\nexec runc \"$@\"\n").unwrap();
        let mut plan = Plan::default();
        assert!(matches!(
            plan_remove_wrapper(&wrapper, &mut plan),
            Err(RegistrationError::ForeignWrapper { .. })
        ));
    }
}
