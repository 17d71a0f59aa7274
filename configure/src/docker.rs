//! `gpuslice configure docker`: the runtime `gpuslice` in docker's `daemon.json`
//! (`runtimes.gpuslice.path`), for `docker run --runtime gpuslice --annotation
//! gpuslice.io/memory=4Gi ...`. Every other key keeps its value and order, the file keeps
//! its indentation, the original is backed up before the first change and restored on
//! `--remove`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::files::{self, read, Edit, FileError, Plan};
use crate::registration::{
    beside, plan_remove_wrapper, Registration, RegistrationError, WRAPPER_NAME,
};
use crate::Engine;

/// docker's standard daemon config.
pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";
/// The runtime name (`docker run --runtime gpuslice`).
pub const RUNTIME: &str = "gpuslice";

/// daemon.json could not be registered with or cleaned of gpuslice; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    #[error("{path} is not valid JSON ({message}); dockerd would refuse it too; fix it and run again (nothing was changed)")]
    Malformed { path: PathBuf, message: String },
    #[error("{path}: `{key}` must be a JSON object (nothing was changed)")]
    Shape { path: PathBuf, key: &'static str },
    #[error("refusing to write {path}: {reason} (a gpuslice bug; nothing was changed)")]
    Verify { path: PathBuf, reason: String },
}

/// Which daemon.json to register with.
#[derive(Debug, Clone)]
pub struct Target {
    pub config: PathBuf,
}

impl Target {
    pub fn new(config: Option<&Path>) -> Target {
        Target {
            config: config.unwrap_or(Path::new(DEFAULT_CONFIG)).to_path_buf(),
        }
    }

    /// The runtime wrapper used with a non-default gpuslice config.
    pub fn wrapper(&self) -> PathBuf {
        beside(&self.config, WRAPPER_NAME)
    }
}

const RELOAD: &str = "dockerd reloads `runtimes` on SIGHUP: `systemctl reload docker` (or `kill -HUP $(pidof dockerd)`)";

impl Engine for Target {
    type Error = DockerError;

    fn plan_add(&self, reg: &Registration) -> Result<Plan, DockerError> {
        plan_add(self, reg)
    }

    fn plan_remove(&self) -> Result<Plan, DockerError> {
        plan_remove(self)
    }
}

/// The changes that register gpuslice.
pub fn plan_add(target: &Target, reg: &Registration) -> Result<Plan, DockerError> {
    let file = read(&target.config)?;
    let wrapper = target.wrapper();
    let edit = DaemonJson {
        path: target.config.clone(),
        binary: reg.binary(&wrapper),
    };
    let mut plan = Plan::default();
    reg.plan_wrapper(&wrapper, "docker", &mut plan)?;
    files::plan_add(&file, &edit, &mut plan)?;
    plan.after_change(RELOAD);
    plan.after_change(
        "then: `docker run --runtime gpuslice --annotation gpuslice.io/memory=4Gi ...` (docker 24 or later passes --annotation)",
    );
    Ok(plan)
}

/// The changes that unregister gpuslice.
pub fn plan_remove(target: &Target) -> Result<Plan, DockerError> {
    let file = read(&target.config)?;
    let mut edit = DaemonJson {
        path: target.config.clone(),
        binary: PathBuf::new(),
    };
    // What `add` wrote is recognised by the path it registered.
    if let Some(text) = &file.text {
        let m = edit.parse(text)?;
        if let Some(p) = m
            .get("runtimes")
            .and_then(|r| r.get(RUNTIME))
            .and_then(|g| g.get("path"))
            .and_then(Value::as_str)
        {
            edit.binary = PathBuf::from(p);
        }
    }
    let mut plan = Plan::default();
    files::plan_strip(&file, &edit, &mut plan)?;
    plan_remove_wrapper(&target.wrapper(), &mut plan)?;
    plan.after_change(RELOAD);
    Ok(plan)
}

/// daemon.json with `runtimes.gpuslice.path` = `binary`.
struct DaemonJson {
    path: PathBuf,
    binary: PathBuf,
}

impl DaemonJson {
    fn parse(&self, text: &str) -> Result<Map<String, Value>, DockerError> {
        if text.trim().is_empty() {
            return Ok(Map::new());
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(DockerError::Shape {
                path: self.path.clone(),
                key: "(the whole file)",
            }),
            Err(e) => Err(DockerError::Malformed {
                path: self.path.clone(),
                message: e.to_string(),
            }),
        }
    }

    fn entry(&self) -> Value {
        serde_json::json!({ "path": self.binary.display().to_string() })
    }

    /// `m` without the gpuslice runtime (and without `runtimes` if that leaves it empty).
    fn without_ours(mut m: Map<String, Value>) -> Map<String, Value> {
        if let Some(Value::Object(r)) = m.get_mut("runtimes") {
            r.shift_remove(RUNTIME);
            if r.is_empty() {
                m.shift_remove("runtimes");
            }
        }
        m
    }
}

impl Edit for DaemonJson {
    type Error = DockerError;

    fn add(&self, text: &str) -> Result<String, DockerError> {
        let mut m = self.parse(text)?;
        let runtimes = m
            .entry("runtimes")
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(r) = runtimes else {
            return Err(DockerError::Shape {
                path: self.path.clone(),
                key: "runtimes",
            });
        };
        if r.get(RUNTIME) == Some(&self.entry()) {
            return Ok(text.to_string());
        }
        r.insert(RUNTIME.to_string(), self.entry());
        let new = render(
            &m,
            indent_of(text),
            !text.is_empty() && !text.ends_with('\n'),
        );
        // What it means: the same settings plus the runtime.
        let back = self.parse(&new).map_err(|e| DockerError::Verify {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        if DaemonJson::without_ours(back) != DaemonJson::without_ours(self.parse(text)?) {
            return Err(DockerError::Verify {
                path: self.path.clone(),
                reason: "the result changes more than runtimes.gpuslice".into(),
            });
        }
        Ok(new)
    }

    fn strip(&self, text: &str) -> Result<String, DockerError> {
        let m = self.parse(text)?;
        let has = matches!(m.get("runtimes"), Some(Value::Object(r)) if r.contains_key(RUNTIME));
        if !has {
            return Ok(text.to_string());
        }
        Ok(render(
            &DaemonJson::without_ours(m),
            indent_of(text),
            !text.ends_with('\n'),
        ))
    }

    fn create(&self) -> Result<String, DockerError> {
        let mut m = Map::new();
        m.insert(
            "runtimes".to_string(),
            serde_json::json!({ RUNTIME: self.entry() }),
        );
        Ok(render(&m, "  ".to_string(), false))
    }
}

/// The indentation of the file's first indented line (two spaces when there is none).
fn indent_of(text: &str) -> String {
    text.lines()
        .find_map(|l| {
            let ws: String = l.chars().take_while(|c| *c == ' ' || *c == '\t').collect();
            (!ws.is_empty() && ws.len() < l.len()).then_some(ws)
        })
        .unwrap_or_else(|| "  ".to_string())
}

fn render(m: &Map<String, Value>, indent: String, no_newline: bool) -> String {
    use serde::Serialize;
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    // A map of JSON values always serializes.
    let _ = m.serialize(&mut ser);
    let mut s = String::from_utf8_lossy(&buf).into_owned();
    if !no_newline {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit() -> DaemonJson {
        DaemonJson {
            path: "/etc/docker/daemon.json".into(),
            binary: "/usr/bin/gpuslice-runtime".into(),
        }
    }

    #[test]
    fn keeps_order_and_indent_and_round_trips() {
        let text = "{\n    \"log-driver\": \"journald\",\n    \"runtimes\": {\n        \"nvidia\": {\n            \"path\": \"nvidia-container-runtime\"\n        }\n    },\n    \"data-root\": \"/srv/docker\"\n}\n";
        let new = edit().add(text).unwrap();
        assert!(new.starts_with("{\n    \"log-driver\""), "{new}");
        let keys: Vec<_> = serde_json::from_str::<Map<String, Value>>(&new)
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ["log-driver", "runtimes", "data-root"]);
        assert_eq!(edit().add(&new).unwrap(), new);
        assert_eq!(edit().strip(&new).unwrap(), text);
    }

    #[test]
    fn refuses_malformed_and_wrong_shapes() {
        assert!(matches!(
            edit().add("{\"a\": 1,}"),
            Err(DockerError::Malformed { .. })
        ));
        assert!(matches!(edit().add("[1]"), Err(DockerError::Shape { .. })));
        assert!(matches!(
            edit().add("{\"runtimes\": 3}"),
            Err(DockerError::Shape {
                key: "runtimes",
                ..
            })
        ));
    }
}
