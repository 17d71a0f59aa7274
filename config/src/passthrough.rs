//! `runtime.path` alone, for the calls of `gpuslice-runtime` that only pass through to the
//! runtime (`start`, `kill`, `delete`, `state` …): they run for every container, need no
//! other key, and must keep working — to clean containers up — when the rest of the config
//! is broken. Reading the whole config was most of the code such a call ran.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::load::config_path;
use crate::model::{valid_runtime_path, DEFAULT_RUNTIME};

/// `runtime.path` of config text when it has a valid one; `None` when the text is not TOML
/// or the key is absent, not a string or not a valid path (the caller then uses the default).
/// Text that cannot name the key — neither the word `runtime` nor an escape, which a quoted
/// key could spell it with — is not parsed at all.
pub fn runtime_path_of(text: &str) -> Option<PathBuf> {
    if !text.contains("runtime") && !text.contains('\\') {
        return None;
    }
    let root: Table = text.parse().ok()?;
    match root.get("runtime")?.as_table()?.get("path")? {
        Value::String(s) if valid_runtime_path(s) => Some(PathBuf::from(s)),
        _ => None,
    }
}

/// The runtime a pass-through call execs: `runtime.path` of the config that `flag`, else
/// `env` (`GPUSLICE_CONFIG`), else the default path names, when it has a valid one; else
/// the default (`runc`), also when the file is absent, unreadable or broken.
pub fn passthrough_runtime(flag: Option<&Path>, env: Option<&OsStr>) -> PathBuf {
    let (path, _) = config_path(flag, env);
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| runtime_path_of(&text))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_config;

    /// For every config the strict reader accepts, the runtime is the one it reads.
    #[test]
    fn agrees_with_the_whole_config_on_valid_files() {
        let texts = [
            "",
            "state_dir = \"/run/gpuslice\"\n",
            "[runtime]\npath = \"/usr/local/sbin/runc\"\n",
            "[runtime]\npath = \"crun\"\n",
            "runtime.path = \"/opt/runc\"\n",
            "runtime = { path = \"/opt/runc\" }\n",
            "[\"runtime\"]\n'path' = \"/opt/r\"\n",
            "[\"\\u0072untime\"]\npath = \"/opt/escaped\"\n",
            "[runtime]\n# path = \"/not/this\"\n",
            "# runtime\n[registry]\npending_timeout = \"2m\"\n",
            "[hook]\npath = \"/usr/bin/gpuslice\"\n[runtime]\n",
        ];
        for text in texts {
            let cfg = parse_config(text, Path::new("/c.toml"))
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let fast = runtime_path_of(text).unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME));
            assert_eq!(fast, cfg.runtime.path, "{text:?}");
        }
        assert_eq!(
            runtime_path_of("[\"\\u0072untime\"]\npath = \"/opt/escaped\"\n"),
            Some(PathBuf::from("/opt/escaped")),
            "a key spelt with an escape is still found"
        );
    }

    /// A broken file, or one whose `runtime.path` the strict reader refuses, gives no path;
    /// a valid `runtime.path` beside a bad key elsewhere is still used.
    #[test]
    fn broken_or_refused_paths_give_none() {
        for text in [
            "[runtime\npath = \"/opt/runc\"\n",
            "[runtime]\npath = 3\n",
            "[runtime]\npath = \"\"\n",
            "[runtime]\npath = \"bin/runc\"\n",
            "[runtime]\npath = \"/opt/../runc\"\n",
            "runtime = \"runc\"\n",
        ] {
            assert_eq!(runtime_path_of(text), None, "{text:?}");
            if let Ok(cfg) = parse_config(text, Path::new("/c.toml")) {
                panic!("{text:?} accepted by the strict reader: {cfg:?}");
            }
        }
        let text = "bogus_key = 1\n[runtime]\npath = \"/opt/runc\"\n";
        assert!(parse_config(text, Path::new("/c.toml")).is_err());
        assert_eq!(runtime_path_of(text), Some(PathBuf::from("/opt/runc")));
    }

    #[test]
    fn reads_the_file_the_flag_or_env_names() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a = dir.path().join("a.toml");
        let b = dir.path().join("b.toml");
        std::fs::write(&a, "[runtime]\npath = \"/opt/a\"\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&b, "[runtime]\npath = \"/opt/b\"\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            passthrough_runtime(Some(&a), Some(b.as_os_str())),
            PathBuf::from("/opt/a")
        );
        assert_eq!(
            passthrough_runtime(None, Some(b.as_os_str())),
            PathBuf::from("/opt/b")
        );
        let missing = dir.path().join("missing.toml");
        assert_eq!(
            passthrough_runtime(None, Some(missing.as_os_str())),
            PathBuf::from(DEFAULT_RUNTIME)
        );
    }
}
