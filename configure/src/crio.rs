//! `gpuslice configure crio`: the runtime handler `gpuslice` for CRI-O, as the drop-in
//! `crio.conf.d/99-gpuslice.conf` next to the main config. CRI-O reads its drop-ins in
//! lexical order and merges them key by key, so the operator's files are never edited.
//!
//! No `allowed_annotations` entry is written: CRI-O copies every pod and container annotation
//! into the OCI spec anyway, and `allowed_annotations` only accepts CRI-O's own annotation
//! names (it refuses to start with `invalid allowed_annotation: gpuslice.io/...`). The
//! handler keeps its own runc state root (`--root`), so a default runtime of a different
//! kind (crun) never meets runc's state files.

use std::path::{Path, PathBuf};

use toml_edit::{value, DocumentMut, Item, Table};

use crate::files::{read, FileError, Op, Plan};
use crate::registration::{
    beside, plan_remove_wrapper, Registration, RegistrationError, WRAPPER_NAME,
};
use crate::tomldoc::{self, Malformed};
use crate::Engine;

/// CRI-O's standard config file.
pub const DEFAULT_CONFIG: &str = "/etc/crio/crio.conf";
/// The drop-in directory, relative to the main config's directory.
pub const DROP_IN_DIR: &str = "crio.conf.d";
/// The drop-in's file name (late in lexical order).
pub const DROP_IN_NAME: &str = "99-gpuslice.conf";
/// The runtime handler name (the RuntimeClass `handler`).
pub const HANDLER: &str = "gpuslice";
/// The runc state root of the handler.
pub const RUNTIME_ROOT: &str = "/run/runc-gpuslice";
/// First line of the drop-in.
pub const MARKER: &str = "# Written by `gpuslice configure crio`";
/// The drop-in's permission bits when none of the files it copies from is stricter.
const DROP_IN_MODE: u32 = 0o644;

/// Handler keys never inherited from the default runtime: they name its binary and state.
const NOT_INHERITED: &[&str] = &[
    "runtime_path",
    "runtime_type",
    "runtime_root",
    "runtime_config_path",
    "platform_runtime_paths",
];

/// CRI-O could not be registered with or cleaned of gpuslice; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum CrioError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    #[error("{path} is not valid TOML ({message}, line {line}); CRI-O would refuse it too; fix it and run again (nothing was changed)")]
    Malformed {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path} exists and was not written by gpuslice; move it away, then run again")]
    Foreign { path: PathBuf },
    #[error("{path} defines [crio.runtime.runtimes.{handler}] already, unlike the handler gpuslice writes to its drop-in; CRI-O would lay one over the other; remove that table or rename that handler, then run again (nothing was changed)")]
    Defined {
        path: PathBuf,
        handler: &'static str,
    },
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("refusing to write {path}: {reason} (a gpuslice bug; nothing was changed)")]
    Verify { path: PathBuf, reason: String },
}

/// Which CRI-O config to register with.
#[derive(Debug, Clone)]
pub struct Target {
    /// The main config file (it may be absent: CRI-O then runs on defaults and drop-ins).
    pub config: PathBuf,
}

impl Target {
    pub fn new(config: Option<&Path>) -> Target {
        Target {
            config: config.unwrap_or(Path::new(DEFAULT_CONFIG)).to_path_buf(),
        }
    }

    /// `crio.conf.d/99-gpuslice.conf` next to the main config.
    pub fn drop_in(&self) -> PathBuf {
        beside(&self.config, DROP_IN_DIR).join(DROP_IN_NAME)
    }

    /// The runtime wrapper used with a non-default gpuslice config.
    pub fn wrapper(&self) -> PathBuf {
        beside(&self.config, WRAPPER_NAME)
    }
}

const RESTART: &str =
    "CRI-O reads runtime handlers when it starts: restart it to apply (`systemctl restart crio`)";

impl Engine for Target {
    type Error = CrioError;

    fn plan_add(&self, reg: &Registration) -> Result<Plan, CrioError> {
        plan_add(self, reg)
    }

    fn plan_remove(&self) -> Result<Plan, CrioError> {
        plan_remove(self)
    }
}

/// The changes that register gpuslice.
pub fn plan_add(target: &Target, reg: &Registration) -> Result<Plan, CrioError> {
    let drop_in = target.drop_in();
    check_ours(&drop_in)?;
    let docs = sources(target, &drop_in)?;
    let default_name = docs
        .iter()
        .rev()
        .find_map(|d| tomldoc::get(d.doc.as_item(), &["crio", "runtime", "default_runtime"]))
        .and_then(Item::as_str)
        .map(str::to_string);
    let mut inherited = Table::new();
    // The copied runtime settings are readable by no one the files they come from are not
    // readable by.
    let mut mode = DROP_IN_MODE;
    if let Some(name) = &default_name {
        for d in &docs {
            if let Some(t) = tomldoc::get(d.doc.as_item(), &["crio", "runtime", "runtimes", name])
                .and_then(Item::as_table_like)
            {
                tomldoc::merge(&mut inherited, t);
                mode &= d.mode & 0o777;
            }
        }
    }
    let wrapper = target.wrapper();
    let binary = reg.binary(&wrapper);
    let text = drop_in_text(&inherited, &binary);
    verify(&text, &binary, &drop_in)?;
    // A `gpuslice` handler the operator's files define already: CRI-O lays the drop-in's
    // keys over it, so its other keys would survive onto gpuslice's handler (or the drop-in
    // would silently replace the operator's). Not ours to decide: refused, unless it is
    // exactly the handler gpuslice writes.
    let ours = tomldoc::parse(&text)
        .ok()
        .and_then(|d| {
            tomldoc::get(d.as_item(), &["crio", "runtime", "runtimes", HANDLER])
                .map(tomldoc::item_value)
        })
        .and_then(Result::ok);
    for d in &docs {
        if let Some(theirs) =
            tomldoc::get(d.doc.as_item(), &["crio", "runtime", "runtimes", HANDLER])
        {
            if ours.is_none() || tomldoc::item_value(theirs).ok() != ours {
                return Err(CrioError::Defined {
                    path: d.path.clone(),
                    handler: HANDLER,
                });
            }
        }
    }
    let mut plan = Plan::default();
    reg.plan_wrapper(&wrapper, "crio", &mut plan)?;
    plan.write(&drop_in, text, mode);
    plan.after_change(RESTART);
    plan.after_change(format!(
        "Kubernetes: pods select it with a RuntimeClass whose handler is `{HANDLER}`"
    ));
    Ok(plan)
}

/// The changes that unregister gpuslice: the drop-in and the wrapper.
pub fn plan_remove(target: &Target) -> Result<Plan, CrioError> {
    let drop_in = target.drop_in();
    check_ours(&drop_in)?;
    let mut plan = Plan::default();
    plan.remove(&drop_in);
    // The drop-in directory and the config directory, when gpuslice's files were all
    // they held.
    for dir in [drop_in.parent(), target.config.parent()]
        .into_iter()
        .flatten()
    {
        plan.ops.push(Op::RemoveEmptyDir {
            path: dir.to_path_buf(),
        });
    }
    plan_remove_wrapper(&target.wrapper(), &mut plan)?;
    plan.after_change(RESTART);
    Ok(plan)
}

fn check_ours(path: &Path) -> Result<(), CrioError> {
    match read(path)?.text {
        Some(t) if !t.starts_with(MARKER) => Err(CrioError::Foreign {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// One file of CRI-O's config, parsed.
struct Source {
    path: PathBuf,
    doc: DocumentMut,
    /// Its permission bits.
    mode: u32,
}

/// The main config and the other drop-ins, parsed, in CRI-O's order; a malformed one is
/// refused.
fn sources(target: &Target, drop_in: &Path) -> Result<Vec<Source>, CrioError> {
    let mut paths = vec![target.config.clone()];
    let dir = beside(&target.config, DROP_IN_DIR);
    match std::fs::read_dir(&dir) {
        Ok(rd) => {
            let mut found: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file() && p != drop_in)
                .collect();
            found.sort();
            paths.extend(found);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(CrioError::List { path: dir, source }),
    }
    let mut docs = Vec::new();
    for path in paths {
        let file = read(&path)?;
        if let Some(text) = file.text {
            let doc = tomldoc::parse(&text).map_err(|Malformed { line, message }| {
                CrioError::Malformed {
                    path: path.clone(),
                    line,
                    message,
                }
            })?;
            docs.push(Source {
                path,
                doc,
                mode: file.mode,
            });
        }
    }
    Ok(docs)
}

/// The drop-in: the default runtime's settings (`inherited`, its binary and state left
/// out), this handler's binary, type and state root.
pub fn drop_in_text(inherited: &Table, binary: &Path) -> String {
    let mut doc = DocumentMut::new();
    let mut rt = Table::new();
    rt.insert("runtime_path", value(binary.display().to_string()));
    rt.insert("runtime_type", value("oci"));
    rt.insert("runtime_root", value(RUNTIME_ROOT));
    for (k, v) in inherited.iter() {
        if !NOT_INHERITED.contains(&k) {
            let mut v = v.clone();
            if let Some(val) = v.as_value_mut() {
                val.decor_mut().clear();
            }
            rt.insert(k, v);
        }
    }
    if let Ok(runtimes) = tomldoc::table_mut(doc.as_table_mut(), &["crio", "runtime", "runtimes"]) {
        runtimes.insert(HANDLER, Item::Table(rt));
    }
    format!(
        "{MARKER}; `gpuslice configure crio --remove` deletes it.\n\
         # CRI-O passes pod and container annotations (gpuslice.io/*) into the OCI spec itself:\n\
         # no allowed_annotations are needed (CRI-O accepts only its own names there).\n{doc}"
    )
}

fn verify(text: &str, binary: &Path, path: &Path) -> Result<(), CrioError> {
    let fail = |reason: String| CrioError::Verify {
        path: path.to_path_buf(),
        reason,
    };
    let v = tomldoc::values(text).map_err(|e| fail(format!("it does not parse: {e}")))?;
    let rt = v
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("runtimes"))
        .and_then(|r| r.get(HANDLER))
        .ok_or_else(|| fail("the gpuslice handler is missing".into()))?;
    if rt.get("runtime_path").and_then(toml::Value::as_str) != Some(&binary.display().to_string()) {
        return Err(fail("runtime_path is not the gpuslice runtime".into()));
    }
    Ok(())
}
