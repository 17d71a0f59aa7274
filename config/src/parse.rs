//! Strict reading of the TOML text into [`Config`]: every key known, every type and value
//! checked, each refusal one line naming the file, the key, the value and what is accepted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::model::{
    is_clean_absolute, is_gpu_uuid, is_model_text, simulated_uuid, ComputeAction, Config, DraMode,
    InventorySource, MemoryAction, Policy, SimulatedGpu, TaintEffect, DEFAULT_SIM_CONTEXT_MEMORY,
    DEFAULT_SIM_MEMORY, DEFAULT_SIM_MODEL, MAX_MODEL_CHARS, MAX_SLOTS_PER_GPU,
};
use crate::quantity::{format_bytes, parse_bytes, QuantityError, ACCEPTED_BYTES};

/// Most simulated GPUs a node may declare.
pub const MAX_SIMULATED_GPUS: usize = 16;

/// A config file refused. Every variant prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: invalid TOML at line {line}, column {column}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("config {path}: unknown key `{key}`; accepted here: {accepted}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        accepted: String,
    },
    #[error("config {path}: key `{key}`: value {value} is a {found}; expected {expected}")]
    WrongType {
        path: PathBuf,
        key: String,
        value: String,
        found: &'static str,
        expected: String,
    },
    #[error("config {path}: key `{key}`: value {value} is not accepted; expected {accepted}")]
    BadValue {
        path: PathBuf,
        key: String,
        value: String,
        accepted: String,
    },
    /// A value refused for a reason the parser of its kind gives (a quantity's unit).
    #[error(
        "config {path}: key `{key}`: value {value} is not accepted ({reason}); expected {accepted}"
    )]
    Refused {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
        accepted: String,
    },
}

impl ConfigError {
    /// The config file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Read { path, .. }
            | ConfigError::Syntax { path, .. }
            | ConfigError::UnknownKey { path, .. }
            | ConfigError::WrongType { path, .. }
            | ConfigError::BadValue { path, .. }
            | ConfigError::Refused { path, .. } => path,
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Integer(_) => "integer",
        Value::Float(_) => "float",
        Value::Boolean(_) => "boolean",
        Value::Datetime(_) => "datetime",
        Value::Array(_) => "array",
        Value::Table(_) => "table",
    }
}

/// Renders a value for an error line, shortened so the line stays readable.
fn show(v: &Value) -> String {
    let text = match v {
        Value::Table(_) => "{…}".to_string(),
        other => other.to_string(),
    };
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}…")
    } else {
        text
    }
}

struct Reader<'a> {
    path: &'a Path,
}

impl Reader<'_> {
    fn unknown(&self, key: String, accepted: &[&str]) -> ConfigError {
        ConfigError::UnknownKey {
            path: self.path.to_path_buf(),
            key,
            accepted: accepted.join(", "),
        }
    }

    fn wrong_type(&self, key: &str, v: &Value, expected: &str) -> ConfigError {
        ConfigError::WrongType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: show(v),
            found: type_name(v),
            expected: expected.to_string(),
        }
    }

    fn bad_value(&self, key: &str, v: &Value, accepted: impl Into<String>) -> ConfigError {
        ConfigError::BadValue {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: show(v),
            accepted: accepted.into(),
        }
    }

    /// A quantity refused by [`parse_bytes`], with its reason.
    fn bad_quantity(
        &self,
        key: &str,
        v: &Value,
        e: &QuantityError,
        accepted: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Refused {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: show(v),
            reason: e.reason(),
            accepted: accepted.into(),
        }
    }

    fn check_keys(
        &self,
        table: &Table,
        prefix: &str,
        accepted: &[&str],
    ) -> Result<(), ConfigError> {
        for key in table.keys() {
            if !accepted.contains(&key.as_str()) {
                let full = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                return Err(self.unknown(full, accepted));
            }
        }
        Ok(())
    }

    fn table<'t>(
        &self,
        parent: &'t Table,
        key: &str,
        full: &str,
    ) -> Result<Option<&'t Table>, ConfigError> {
        match parent.get(key) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(t)),
            Some(v) => Err(self.wrong_type(full, v, "a table")),
        }
    }

    fn string<'t>(
        &self,
        parent: &'t Table,
        key: &str,
        full: &str,
    ) -> Result<Option<(&'t str, &'t Value)>, ConfigError> {
        match parent.get(key) {
            None => Ok(None),
            Some(v @ Value::String(s)) => Ok(Some((s.as_str(), v))),
            Some(v) => Err(self.wrong_type(full, v, "a string")),
        }
    }

    fn abs_path(
        &self,
        parent: &Table,
        key: &str,
        full: &str,
    ) -> Result<Option<PathBuf>, ConfigError> {
        match self.string(parent, key, full)? {
            None => Ok(None),
            Some((s, v)) => {
                let p = PathBuf::from(s);
                if is_clean_absolute(&p) {
                    Ok(Some(p))
                } else {
                    Err(self.bad_value(full, v, "an absolute path without `..` or NUL"))
                }
            }
        }
    }
}

/// Parses config text. `path` names the file in error lines.
pub fn parse_config(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let root: Table = text.parse::<Table>().map_err(|e| {
        let (line, column) = e
            .span()
            .map(|span| line_col(text, span.start))
            .unwrap_or((1, 1));
        ConfigError::Syntax {
            path: path.to_path_buf(),
            line,
            column,
            message: e
                .message()
                .lines()
                .next()
                .unwrap_or("syntax error")
                .trim()
                .to_string(),
        }
    })?;
    let r = Reader { path };
    let mut cfg = Config::default();
    r.check_keys(
        &root,
        "",
        &[
            "state_dir",
            "inventory",
            "cdi",
            "placement",
            "shim",
            "runtime",
            "registry",
            "driver",
            "hook",
            "serve",
            "enforce",
            "dra",
            "health",
        ],
    )?;
    if let Some(p) = r.abs_path(&root, "state_dir", "state_dir")? {
        cfg.state_dir = p;
    }

    if let Some(inv) = r.table(&root, "inventory", "inventory")? {
        r.check_keys(inv, "inventory", &["source", "simulated"])?;
        if let Some((s, v)) = r.string(inv, "source", "inventory.source")? {
            cfg.inventory.source = match s {
                "nvml" => InventorySource::Nvml,
                "simulated" => InventorySource::Simulated,
                _ => return Err(r.bad_value("inventory.source", v, "`nvml` or `simulated`")),
            };
        }
        if let Some(v) = inv.get("simulated") {
            let list = match v {
                Value::Array(a) => a,
                other => {
                    return Err(r.wrong_type(
                        "inventory.simulated",
                        other,
                        "an array of tables ([[inventory.simulated]])",
                    ))
                }
            };
            if list.len() > MAX_SIMULATED_GPUS {
                return Err(r.bad_value(
                    "inventory.simulated",
                    v,
                    format!("at most {MAX_SIMULATED_GPUS} simulated GPUs"),
                ));
            }
            for (index, item) in list.iter().enumerate() {
                cfg.inventory
                    .simulated
                    .push(simulated_gpu(&r, index, item)?);
            }
        }
    }
    if cfg.inventory.source == InventorySource::Simulated && cfg.inventory.simulated.is_empty() {
        return Err(r.bad_value(
            "inventory.source",
            &Value::String("simulated".into()),
            "at least one [[inventory.simulated]] table when the source is `simulated`",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, g) in cfg.inventory.simulated.iter().enumerate() {
        if !seen.insert(g.uuid.to_ascii_lowercase()) {
            return Err(r.bad_value(
                &format!("inventory.simulated[{i}].uuid"),
                &Value::String(g.uuid.clone()),
                "a UUID not used by another simulated GPU",
            ));
        }
    }

    if let Some(t) = r.table(&root, "cdi", "cdi")? {
        r.check_keys(t, "cdi", &["spec_dir"])?;
        if let Some(p) = r.abs_path(t, "spec_dir", "cdi.spec_dir")? {
            cfg.cdi.spec_dir = p;
        }
    }

    if let Some(t) = r.table(&root, "placement", "placement")? {
        r.check_keys(
            t,
            "placement",
            &["policy", "memory_overcommit", "max_slices_per_gpu"],
        )?;
        if let Some((s, v)) = r.string(t, "policy", "placement.policy")? {
            cfg.placement.policy = Policy::parse(s)
                .ok_or_else(|| r.bad_value("placement.policy", v, Policy::ACCEPTED))?;
        }
        if let Some(v) = t.get("memory_overcommit") {
            let f = match v {
                Value::Float(f) => *f,
                Value::Integer(i) => *i as f64,
                other => {
                    return Err(r.wrong_type(
                        "placement.memory_overcommit",
                        other,
                        "a number from 1.0 to 16.0",
                    ))
                }
            };
            if !(1.0..=16.0).contains(&f) || !f.is_finite() {
                return Err(r.bad_value(
                    "placement.memory_overcommit",
                    v,
                    "a number from 1.0 to 16.0",
                ));
            }
            cfg.placement.memory_overcommit = f;
        }
        if let Some(v) = t.get("max_slices_per_gpu") {
            match v {
                Value::Integer(i) if (1..=1024).contains(i) => {
                    cfg.placement.max_slices_per_gpu = Some(*i as u32)
                }
                Value::Integer(_) => {
                    return Err(r.bad_value(
                        "placement.max_slices_per_gpu",
                        v,
                        "an integer from 1 to 1024",
                    ))
                }
                other => {
                    return Err(r.wrong_type(
                        "placement.max_slices_per_gpu",
                        other,
                        "an integer from 1 to 1024",
                    ))
                }
            }
        }
    }

    if let Some(t) = r.table(&root, "shim", "shim")? {
        r.check_keys(t, "shim", &["library"])?;
        if let Some(p) = r.abs_path(t, "library", "shim.library")? {
            cfg.shim.library = p;
        }
    }

    if let Some(t) = r.table(&root, "runtime", "runtime")? {
        r.check_keys(t, "runtime", &["path"])?;
        if let Some((s, v)) = r.string(t, "path", "runtime.path")? {
            if !crate::model::valid_runtime_path(s) {
                return Err(r.bad_value(
                    "runtime.path",
                    v,
                    "an absolute path or a program name found in PATH (e.g. `runc`), without NUL",
                ));
            }
            cfg.runtime.path = PathBuf::from(s);
        }
    }

    if let Some(t) = r.table(&root, "registry", "registry")? {
        r.check_keys(t, "registry", &["pending_timeout"])?;
        if let Some((s, v)) = r.string(t, "pending_timeout", "registry.pending_timeout")? {
            let accepted = "a duration from 1s to 1h such as `120s`, `2m` or `500ms`";
            let d = humantime::parse_duration(s)
                .map_err(|_| r.bad_value("registry.pending_timeout", v, accepted))?;
            if d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(3600) {
                return Err(r.bad_value("registry.pending_timeout", v, accepted));
            }
            cfg.registry.pending_timeout = d;
        }
    }

    if let Some(t) = r.table(&root, "driver", "driver")? {
        r.check_keys(t, "driver", &["root"])?;
        if let Some(p) = r.abs_path(t, "root", "driver.root")? {
            cfg.driver.root = p;
        }
    }

    if let Some(t) = r.table(&root, "hook", "hook")? {
        r.check_keys(t, "hook", &["path"])?;
        cfg.hook.path = r.abs_path(t, "path", "hook.path")?;
    }

    if let Some(t) = r.table(&root, "serve", "serve")? {
        r.check_keys(t, "serve", &["listen"])?;
        if let Some((s, v)) = r.string(t, "listen", "serve.listen")? {
            cfg.serve.listen = s.parse::<SocketAddr>().map_err(|_| {
                r.bad_value(
                    "serve.listen",
                    v,
                    "an address and port such as `127.0.0.1:9400` or `[::]:9400`",
                )
            })?;
        }
    }
    if let Some(t) = r.table(&root, "enforce", "enforce")? {
        enforce(&r, t, &mut cfg)?;
    }
    if let Some(t) = r.table(&root, "dra", "dra")? {
        dra(&r, t, &mut cfg)?;
    }
    if let Some(t) = r.table(&root, "health", "health")? {
        health(&r, t, &mut cfg)?;
    }
    Ok(cfg)
}

/// The `[health]` table.
fn health(r: &Reader<'_>, t: &Table, cfg: &mut Config) -> Result<(), ConfigError> {
    r.check_keys(t, "health", &["ignored_xids", "taint_effect"])?;
    if let Some(v) = t.get("ignored_xids") {
        let accepted =
            "an array of XIDs (integers from 1 to 65535), e.g. [13, 31, 43, 45, 68, 109]";
        let Value::Array(list) = v else {
            return Err(r.wrong_type("health.ignored_xids", v, accepted));
        };
        let mut xids = Vec::with_capacity(list.len());
        for item in list {
            match item {
                Value::Integer(i) if (1..=65535).contains(i) => xids.push(*i as u32),
                other => return Err(r.bad_value("health.ignored_xids", other, accepted)),
            }
        }
        cfg.health.ignored_xids = xids;
    }
    if let Some((s, v)) = r.string(t, "taint_effect", "health.taint_effect")? {
        cfg.health.taint_effect = TaintEffect::parse(s)
            .ok_or_else(|| r.bad_value("health.taint_effect", v, TaintEffect::ACCEPTED))?;
    }
    Ok(())
}

/// The `[dra]` table.
fn dra(r: &Reader<'_>, t: &Table, cfg: &mut Config) -> Result<(), ConfigError> {
    r.check_keys(t, "dra", &["mode", "slots_per_gpu"])?;
    if let Some((s, v)) = r.string(t, "mode", "dra.mode")? {
        cfg.dra.mode =
            DraMode::parse(s).ok_or_else(|| r.bad_value("dra.mode", v, DraMode::ACCEPTED))?;
    }
    if let Some(v) = t.get("slots_per_gpu") {
        let accepted = format!("an integer from 1 to {MAX_SLOTS_PER_GPU}");
        match v {
            Value::Integer(i) if (1..=i64::from(MAX_SLOTS_PER_GPU)).contains(i) => {
                cfg.dra.slots_per_gpu = *i as u32
            }
            Value::Integer(_) => return Err(r.bad_value("dra.slots_per_gpu", v, accepted)),
            other => return Err(r.wrong_type("dra.slots_per_gpu", other, &accepted)),
        }
    }
    Ok(())
}

/// The `[enforce]` table.
fn enforce(r: &Reader<'_>, t: &Table, cfg: &mut Config) -> Result<(), ConfigError> {
    use std::time::Duration;
    r.check_keys(
        t,
        "enforce",
        &["memory", "compute", "grace", "interval", "window"],
    )?;
    let e = &mut cfg.enforce;
    if let Some((s, v)) = r.string(t, "memory", "enforce.memory")? {
        e.memory = MemoryAction::parse(s)
            .ok_or_else(|| r.bad_value("enforce.memory", v, MemoryAction::ACCEPTED))?;
    }
    if let Some((s, v)) = r.string(t, "compute", "enforce.compute")? {
        e.compute = ComputeAction::parse(s)
            .ok_or_else(|| r.bad_value("enforce.compute", v, ComputeAction::ACCEPTED))?;
    }
    let duration = |key: &str, min: Duration, max: Duration, accepted: &str| {
        let full = format!("enforce.{key}");
        match r.string(t, key, &full)? {
            None => Ok(None),
            Some((s, v)) => match humantime::parse_duration(s) {
                Ok(d) if d >= min && d <= max => Ok(Some(d)),
                _ => Err(r.bad_value(&full, v, accepted)),
            },
        }
    };
    if let Some(d) = duration(
        "grace",
        Duration::ZERO,
        Duration::from_secs(600),
        "a duration from 0s to 10m such as `2s` or `500ms`",
    )? {
        e.grace = d;
    }
    if let Some(d) = duration(
        "interval",
        Duration::from_millis(50),
        Duration::from_secs(60),
        "a duration from 50ms to 60s such as `500ms` or `1s`",
    )? {
        e.interval = d;
    }
    if let Some(d) = duration(
        "window",
        Duration::from_secs(1),
        Duration::from_secs(3600),
        "a duration from 1s to 1h such as `5s` or `1m`",
    )? {
        e.window = d;
    }
    if e.window < e.interval {
        let shown = Value::String(humantime::format_duration(e.window).to_string());
        return Err(r.bad_value(
            "enforce.window",
            &shown,
            format!(
                "a window at least as long as enforce.interval ({})",
                humantime::format_duration(e.interval)
            ),
        ));
    }
    Ok(())
}

fn simulated_gpu(r: &Reader<'_>, index: usize, item: &Value) -> Result<SimulatedGpu, ConfigError> {
    let prefix = format!("inventory.simulated[{index}]");
    let t = match item {
        Value::Table(t) => t,
        other => {
            return Err(r.wrong_type(
                &prefix,
                other,
                "a table with `model`, `memory`, optional `uuid`, `context_memory` and `reserved_memory`",
            ))
        }
    };
    r.check_keys(
        t,
        &prefix,
        &[
            "model",
            "memory",
            "uuid",
            "context_memory",
            "reserved_memory",
        ],
    )?;
    // Keys are spelled out only for an error: this runs in every create-path process.
    let key = |k: &str| format!("{prefix}.{k}");
    let model = match t.get("model") {
        None => DEFAULT_SIM_MODEL.to_string(),
        Some(v @ Value::String(s)) => {
            if !is_model_text(s) {
                return Err(r.bad_value(
                    &key("model"),
                    v,
                    format!("a model name of 1 to {MAX_MODEL_CHARS} printable characters"),
                ));
            }
            s.to_string()
        }
        Some(v) => return Err(r.wrong_type(&key("model"), v, "a string")),
    };
    let memory = match t.get("memory") {
        None => DEFAULT_SIM_MEMORY,
        Some(v @ Value::String(s)) => {
            let b = parse_bytes(s)
                .map_err(|e| r.bad_quantity(&key("memory"), v, &e, ACCEPTED_BYTES))?;
            if b < (1 << 20) {
                return Err(r.bad_value(&key("memory"), v, "at least 1Mi"));
            }
            b
        }
        Some(v @ Value::Integer(i)) => {
            if *i < (1 << 20) {
                return Err(r.bad_value(&key("memory"), v, "at least 1Mi"));
            }
            *i as u64
        }
        Some(other) => {
            return Err(r.wrong_type(
                &key("memory"),
                other,
                &format!("a string of {ACCEPTED_BYTES}"),
            ))
        }
    };
    let uuid = match t.get("uuid") {
        None => simulated_uuid(index, &model),
        Some(v @ Value::String(s)) => {
            if !is_gpu_uuid(s) {
                return Err(r.bad_value(
                    &key("uuid"),
                    v,
                    "`GPU-` followed by a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                ));
            }
            s.to_string()
        }
        Some(v) => return Err(r.wrong_type(&key("uuid"), v, "a string")),
    };
    let context_memory = match t.get("context_memory") {
        None => DEFAULT_SIM_CONTEXT_MEMORY.min(memory / 4),
        Some(v) => {
            let accepted = || format!("{ACCEPTED_BYTES}, at most a quarter of `memory`");
            let b = byte_quantity(r, &key("context_memory"), v, accepted)?;
            if b > memory / 4 {
                return Err(r.bad_value(&key("context_memory"), v, accepted()));
            }
            b
        }
    };
    // What the driver sets aside can never be the whole GPU: something must be bookable.
    let reserved_memory = match t.get("reserved_memory") {
        None => 0,
        Some(v) => {
            let accepted = || {
                format!(
                    "{ACCEPTED_BYTES}, less than `memory` ({})",
                    format_bytes(memory)
                )
            };
            let b = byte_quantity(r, &key("reserved_memory"), v, accepted)?;
            if b >= memory {
                return Err(r.bad_value(&key("reserved_memory"), v, accepted()));
            }
            b
        }
    };
    Ok(SimulatedGpu {
        model,
        memory,
        uuid,
        context_memory,
        reserved_memory,
    })
}

/// A byte quantity of a simulated GPU's table (a string of [`parse_bytes`]'s grammar or a
/// non-negative integer), refused naming `key`, the value and `accepted`.
fn byte_quantity(
    r: &Reader<'_>,
    key: &str,
    v: &Value,
    accepted: impl Fn() -> String,
) -> Result<u64, ConfigError> {
    match v {
        Value::String(s) => parse_bytes(s).map_err(|e| r.bad_quantity(key, v, &e, accepted())),
        Value::Integer(i) => u64::try_from(*i).map_err(|_| r.bad_value(key, v, accepted())),
        other => Err(r.wrong_type(key, other, &format!("a string of {ACCEPTED_BYTES}"))),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, column)
}
