//! `gpuslice configure containerd`: the runtime handler `gpuslice` for containerd's CRI
//! plugin (Kubernetes RuntimeClass `handler: gpuslice`, `nerdctl --runtime`), written to a
//! drop-in (`conf.d/gpuslice.toml` next to the main config) that the main config imports.
//!
//! How containerd merges imported files decides what the drop-in must hold:
//! - config version 2 (containerd 1.x) replaces a plugin's **whole** section with the one of
//!   the last file that has it (containerd issue 5837). A drop-in holding only the runtime
//!   would silently drop every CRI setting of the main config (sandbox image, CNI dirs,
//!   registry mirrors, even the `runc` runtime). So the version-2 drop-in carries a copy of
//!   the effective CRI section (main config and earlier imports, in containerd's order) plus
//!   the runtime, and every run regenerates it from the current sources, so re-running after
//!   an edit of the main config refreshes the copy.
//! - config version 3 (containerd 2.x) merges imported files key by key, so the drop-in
//!   holds only the runtime.
//!
//! The runtime inherits the default runtime's settings and options (`SystemdCgroup`, `Root`,
//! `base_runtime_spec`, ...) with `BinaryName` set to `gpuslice-runtime` (or its wrapper,
//! see [`crate::registration`]), and passes `gpuslice.io/*` pod and container
//! annotations into the OCI spec.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use toml_edit::{value, Array, DocumentMut, Item, Table, TableLike, Value};

use crate::files::{self, read, Edit, FileError, Op, Plan};
use crate::registration::{
    beside, plan_remove_wrapper, Registration, RegistrationError, WRAPPER_NAME,
};
use crate::tomldoc::{self, Malformed};
use crate::Engine;

/// containerd's standard config file.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// The drop-in, relative to the main config's directory.
pub const DROP_IN: &str = "conf.d/gpuslice.toml";
/// The runtime handler name (the RuntimeClass `handler`).
pub const HANDLER: &str = "gpuslice";
/// The shim containerd starts for the handler.
pub const RUNTIME_TYPE: &str = "io.containerd.runc.v2";
/// Annotations containerd passes from pods and containers into the OCI spec.
pub const ANNOTATION_PATTERN: &str = "gpuslice.io/*";
/// First line of every file gpuslice writes for containerd.
pub const MARKER: &str = "# Written by `gpuslice configure containerd`";
/// The drop-in's permission bits when none of the files it copies from is stricter.
const DROP_IN_MODE: u32 = 0o644;

/// Runtime keys never inherited from the default runtime: they name *its* shim or binary.
const NOT_INHERITED: &[&str] = &[
    "runtime_type",
    "runtime_path",
    "runtime_engine",
    "runtime_root",
    "pod_annotations",
    "container_annotations",
    "options",
];

/// The config could not be registered with or cleaned of gpuslice; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    #[error("{path} is not valid TOML ({message}, line {line}); containerd would refuse it too; fix it and run again (nothing was changed)")]
    Malformed {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: containerd config version {version} is not supported; accepted: `version = 2` (containerd 1.x) or `version = 3` (containerd 2.x); convert it with `containerd config migrate` (nothing was changed)")]
    Version { path: PathBuf, version: String },
    #[error("{path}: `{key}` must be {expected} (nothing was changed)")]
    Shape {
        path: PathBuf,
        key: String,
        expected: &'static str,
    },
    #[error("{path} exists and was not written by gpuslice; move it away, then run again")]
    Foreign { path: PathBuf },
    #[error("{path} is imported after {drop_in} and has a CRI plugin section, which containerd 1.x (config version 2) takes whole from the last file that has one: it would hide the gpuslice runtime; accepted: CRI settings in the main config or in files imported before the drop-in; merge that section into the main config or import the file earlier (in the same directory: a name sorting before {}), then run again (nothing was changed)", .drop_in.file_name().unwrap_or_default().display())]
    Hidden { path: PathBuf, drop_in: PathBuf },
    #[error("refusing to write {path}: {reason} (a gpuslice bug; nothing was changed)")]
    Verify { path: PathBuf, reason: String },
}

/// containerd config schema version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// containerd 1.x: CRI plugin `io.containerd.grpc.v1.cri`, sections replaced on import.
    V2,
    /// containerd 2.x: CRI runtime plugin `io.containerd.cri.v1.runtime`, deep merge.
    V3,
}

impl Version {
    pub fn number(self) -> i64 {
        match self {
            Version::V2 => 2,
            Version::V3 => 3,
        }
    }

    /// The plugin holding `containerd.runtimes`.
    pub fn cri_plugin(self) -> &'static str {
        match self {
            Version::V2 => "io.containerd.grpc.v1.cri",
            Version::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// The config version a containerd writes by default, from `containerd --version`
    /// (`containerd github.com/containerd/containerd 1.6.20~ds1 ...`, `... v2.0.0 ...`).
    pub fn from_containerd_version(output: &str) -> Option<Version> {
        let v = output.split_whitespace().nth(2)?;
        let major: u32 = v.trim_start_matches('v').split('.').next()?.parse().ok()?;
        Some(if major >= 2 { Version::V3 } else { Version::V2 })
    }

    /// Asks the installed containerd (`None` when there is none).
    pub fn of_installed_containerd() -> Option<Version> {
        let out = std::process::Command::new("containerd")
            .arg("--version")
            .output()
            .ok()?;
        Version::from_containerd_version(&String::from_utf8_lossy(&out.stdout))
    }
}

/// Which containerd config to register with.
#[derive(Debug, Clone)]
pub struct Target {
    /// The main config file.
    pub config: PathBuf,
    /// The version to write when the main config does not say (absent or empty).
    pub fallback_version: Version,
}

impl Target {
    /// `config` (default [`DEFAULT_CONFIG`]); the fallback version from the installed
    /// containerd, else 2.
    pub fn new(config: Option<&Path>) -> Target {
        Target {
            config: config.unwrap_or(Path::new(DEFAULT_CONFIG)).to_path_buf(),
            fallback_version: Version::of_installed_containerd().unwrap_or(Version::V2),
        }
    }

    /// The drop-in: `conf.d/gpuslice.toml` next to the main config.
    pub fn drop_in(&self) -> PathBuf {
        beside(&self.config, DROP_IN)
    }

    /// The runtime wrapper used with a non-default gpuslice config.
    pub fn wrapper(&self) -> PathBuf {
        beside(&self.config, WRAPPER_NAME)
    }
}

impl Engine for Target {
    type Error = ContainerdError;

    fn plan_add(&self, reg: &Registration) -> Result<Plan, ContainerdError> {
        plan_add(self, reg)
    }

    fn plan_remove(&self) -> Result<Plan, ContainerdError> {
        plan_remove(self)
    }
}

const RESTART: &str = "containerd reads its config only when it starts: restart it to apply (`systemctl restart containerd`); running containers keep running";

/// The changes that register gpuslice.
pub fn plan_add(target: &Target, reg: &Registration) -> Result<Plan, ContainerdError> {
    let main = read(&target.config)?;
    let main_doc = match &main.text {
        Some(t) => Some(parse(&target.config, t)?),
        None => None,
    };
    let version = match &main_doc {
        Some(doc) => version_of(&target.config, doc)?.unwrap_or(target.fallback_version),
        None => target.fallback_version,
    };
    let drop_in = target.drop_in();
    check_ours(&drop_in)?;
    let main_imports = match &main_doc {
        Some(doc) => imports_of(&target.config, doc)?,
        None => Vec::new(),
    };
    let order = import_order(&target.config, main_doc, main.mode, &main_imports, &drop_in)?;
    let wrapper = target.wrapper();
    let binary = reg.binary(&wrapper);
    let mut plan = Plan::default();
    let DropIn { text, mode } = drop_in_text(version, &order, &binary, &drop_in, &mut plan)?;

    reg.plan_wrapper(&wrapper, "containerd", &mut plan)?;
    plan.write(&drop_in, text, mode);
    let edit = MainEdit {
        config: target.config.clone(),
        drop_in: drop_in.clone(),
        version,
    };
    files::plan_add(&main, &edit, &mut plan)?;
    plan.after_change(RESTART);
    plan.after_change(format!(
        "Kubernetes: pods select it with a RuntimeClass whose handler is `{HANDLER}`; nerdctl: `--runtime {}`",
        binary.display()
    ));
    Ok(plan)
}

/// The changes that unregister gpuslice: the imports line (or the original file restored),
/// the drop-in, the wrapper.
pub fn plan_remove(target: &Target) -> Result<Plan, ContainerdError> {
    let main = read(&target.config)?;
    let drop_in = target.drop_in();
    let drop_in_exists = check_ours(&drop_in)?;
    let mut plan = Plan::default();
    if let Some(text) = &main.text {
        let mut edit = MainEdit {
            config: target.config.clone(),
            drop_in: drop_in.clone(),
            version: target.fallback_version,
        };
        // The main config is parsed (and its version needed) only when gpuslice may have
        // left something there to take out (its backup, the `imports` entry, the file it
        // created, or a drop-in that a glob imports): where gpuslice was never registered,
        // `--remove` is a no-op whatever the config's version (none: version 1) or shape.
        // The text search over-matches on purpose (a comment naming the drop-in counts): it
        // only ever makes the config be read.
        let ours = drop_in_exists
            || text.contains(&edit.entry())
            || read(&files::backup_path(&main.path))?.text.is_some();
        if ours {
            if let Some(v) = version_of(&target.config, &parse(&target.config, text)?)? {
                edit.version = v;
            }
            files::plan_strip(&main, &edit, &mut plan)?;
        }
    }
    plan.remove(&drop_in);
    if let Some(dir) = drop_in.parent() {
        plan.ops.push(Op::RemoveEmptyDir {
            path: dir.to_path_buf(),
        });
    }
    plan_remove_wrapper(&target.wrapper(), &mut plan)?;
    plan.after_change(RESTART);
    Ok(plan)
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut, ContainerdError> {
    tomldoc::parse(text).map_err(|Malformed { line, message }| ContainerdError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    })
}

/// Refuses a file at `path` that gpuslice did not write; `true` when gpuslice's is there.
fn check_ours(path: &Path) -> Result<bool, ContainerdError> {
    match read(path)?.text {
        Some(t) if !t.starts_with(MARKER) => Err(ContainerdError::Foreign {
            path: path.to_path_buf(),
        }),
        text => Ok(text.is_some()),
    }
}

/// The config's version: `None` when it has no settings at all (so any version fits).
fn version_of(path: &Path, doc: &DocumentMut) -> Result<Option<Version>, ContainerdError> {
    match doc.get("version") {
        Some(item) => match item.as_integer() {
            Some(2) => Ok(Some(Version::V2)),
            Some(3) => Ok(Some(Version::V3)),
            _ => Err(ContainerdError::Version {
                path: path.to_path_buf(),
                version: item.to_string().trim().to_string(),
            }),
        },
        None if doc.as_table().is_empty() => Ok(None),
        None => Err(ContainerdError::Version {
            path: path.to_path_buf(),
            version: "1 (the file has no `version` key)".to_string(),
        }),
    }
}

fn imports_of(path: &Path, doc: &DocumentMut) -> Result<Vec<String>, ContainerdError> {
    match doc.get("imports") {
        None => Ok(Vec::new()),
        Some(item) => tomldoc::strings(item).ok_or_else(|| ContainerdError::Shape {
            path: path.to_path_buf(),
            key: "imports".to_string(),
            expected: "an array of file paths",
        }),
    }
}

/// An import entry resolved like containerd does: relative to the importing file's directory.
fn resolve(parent: &Path, entry: &str) -> PathBuf {
    let p = Path::new(entry);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        parent
            .parent()
            .map(|d| d.join(p))
            .unwrap_or_else(|| p.to_path_buf())
    }
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Whether import `entry` of `parent` names `target` (literally or through a glob).
fn covers(parent: &Path, entry: &str, target: &Path) -> bool {
    let resolved = resolve(parent, entry);
    if is_glob(entry) {
        let opts = glob::MatchOptions {
            require_literal_separator: true,
            ..Default::default()
        };
        glob::Pattern::new(&resolved.to_string_lossy())
            .map(|p| p.matches_path_with(target, opts))
            .unwrap_or(false)
    } else {
        resolved == target
    }
}

/// One file of the config as containerd loads it.
struct Source {
    path: PathBuf,
    /// `None` for the drop-in (its place in the order only).
    doc: Option<DocumentMut>,
    /// Its permission bits (what a copy of its settings may be readable by).
    mode: u32,
}

/// The files containerd loads, in its order (the main config, then imports breadth-first,
/// globs expanded in lexical order, each file once), with the drop-in at the place it has
/// once registered (added last to the main config's imports unless an entry covers it).
fn import_order(
    main: &Path,
    main_doc: Option<DocumentMut>,
    main_mode: u32,
    main_imports: &[String],
    drop_in: &Path,
) -> Result<Vec<Source>, ContainerdError> {
    let mut imports = main_imports.to_vec();
    if !imports.iter().any(|e| covers(main, e, drop_in)) {
        imports.push(drop_in.display().to_string());
    }
    let mut out = vec![Source {
        path: main.to_path_buf(),
        doc: main_doc,
        mode: main_mode,
    }];
    let mut seen: BTreeSet<PathBuf> = BTreeSet::from([main.to_path_buf()]);
    let mut queue: VecDeque<(PathBuf, Vec<String>)> =
        VecDeque::from([(main.to_path_buf(), imports)]);
    while let Some((parent, entries)) = queue.pop_front() {
        for entry in entries {
            for path in expand(&parent, &entry, drop_in) {
                if !seen.insert(path.clone()) {
                    continue;
                }
                if path == drop_in {
                    out.push(Source {
                        path,
                        doc: None,
                        mode: DROP_IN_MODE,
                    });
                    continue;
                }
                let file = read(&path)?;
                let Some(text) = file.text else {
                    continue;
                };
                let doc = parse(&path, &text)?;
                queue.push_back((path.clone(), imports_of(&path, &doc)?));
                out.push(Source {
                    path,
                    doc: Some(doc),
                    mode: file.mode,
                });
            }
        }
    }
    Ok(out)
}

fn expand(parent: &Path, entry: &str, drop_in: &Path) -> Vec<PathBuf> {
    let resolved = resolve(parent, entry);
    if !is_glob(entry) {
        return vec![resolved];
    }
    let mut found: Vec<PathBuf> = glob::glob(&resolved.to_string_lossy())
        .map(|g| g.filter_map(Result::ok).collect())
        .unwrap_or_default();
    if covers(parent, entry, drop_in) && !found.iter().any(|p| p == drop_in) {
        found.push(drop_in.to_path_buf());
    }
    found.sort();
    found
}

/// The drop-in's text and permission bits.
struct DropIn {
    text: String,
    mode: u32,
}

/// The drop-in's text for `version`, given the config files in containerd's order, and its
/// mode: the copied settings may hold registry credentials (`registry.configs.*.auth`), so
/// the drop-in is never readable by anyone a file it copies from is not readable by.
fn drop_in_text(
    version: Version,
    order: &[Source],
    binary: &Path,
    drop_in: &Path,
    plan: &mut Plan,
) -> Result<DropIn, ContainerdError> {
    let cri = version.cri_plugin();
    let cri_of = |s: &Source| {
        s.doc
            .as_ref()
            .and_then(|d| tomldoc::get(d.as_item(), &["plugins", cri]))
            .cloned()
    };
    // containerd 1.x takes the CRI section whole from the last file that has one: a file
    // loaded after the drop-in with one would hide the gpuslice runtime. Refused, not warned
    // about: a run that exits 0 would tell installers the runtime is there.
    if version == Version::V2 {
        let mut later = order.iter().skip_while(|s| s.path != drop_in).skip(1);
        if let Some(hiding) = later.find(|s| cri_of(s).is_some()) {
            return Err(ContainerdError::Hidden {
                path: hiding.path.clone(),
                drop_in: drop_in.to_path_buf(),
            });
        }
    }
    // The CRI section containerd would use without gpuslice, and the files it comes from.
    let (effective, from): (Option<Item>, Vec<&Source>) = match version {
        Version::V2 => match order.iter().rev().find_map(|s| cri_of(s).map(|c| (c, s))) {
            Some((c, s)) => (Some(c), vec![s]),
            None => (None, Vec::new()),
        },
        Version::V3 => {
            let mut acc = Table::new();
            let mut from = Vec::new();
            for (s, t) in order.iter().filter_map(|s| cri_of(s).map(|c| (s, c))) {
                if let Some(tl) = t.as_table_like() {
                    tomldoc::merge(&mut acc, tl);
                    from.push(s);
                }
            }
            (Some(Item::Table(acc)), from)
        }
    };
    let mode = from.iter().fold(DROP_IN_MODE, |m, s| m & s.mode & 0o777);
    let default_name = effective
        .as_ref()
        .and_then(|e| tomldoc::get(e, &["containerd", "default_runtime_name"]))
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_string();
    let default_runtime = effective
        .as_ref()
        .and_then(|e| tomldoc::get(e, &["containerd", "runtimes", &default_name]))
        .and_then(Item::as_table_like);
    let runtime = runtime_table(default_runtime, &default_name, binary, plan);
    // A `gpuslice` runtime the operator's files define already: containerd 2.x merges it key
    // by key with the drop-in's (so its other keys, `privileged_without_host_devices`,
    // `options.ConfigPath`, would survive onto gpuslice's runc runtime), and on containerd
    // 1.x the drop-in would silently replace it. Either way not ours to decide: refused,
    // unless it is exactly the runtime gpuslice writes.
    let ours = tomldoc::item_value(&Item::Table(runtime.clone())).ok();
    for s in &from {
        let theirs = s.doc.as_ref().and_then(|d| {
            tomldoc::get(
                d.as_item(),
                &["plugins", cri, "containerd", "runtimes", HANDLER],
            )
        });
        if let Some(theirs) = theirs {
            if ours.is_none() || tomldoc::item_value(theirs).ok() != ours {
                return Err(ContainerdError::Shape {
                    path: s.path.clone(),
                    key: format!(
                        "plugins.{}.containerd.runtimes.{HANDLER}",
                        Value::from(cri)
                    ),
                    expected: "absent: it is the runtime gpuslice writes to its drop-in, and containerd would merge the two (2.x key by key) or drop this one (1.x); remove the table or rename that runtime, then run again",
                });
            }
        }
    }

    let mut doc = DocumentMut::new();
    let plugins =
        tomldoc::table_mut(doc.as_table_mut(), &["plugins"]).map_err(|k| shape(drop_in, &k))?;
    if version == Version::V2 {
        if let Some(section) = effective.clone() {
            let section = section.into_table().map(Item::Table).unwrap_or_else(|i| i);
            plugins.insert(cri, section);
        }
    }
    let runtimes = tomldoc::table_mut(plugins, &[cri, "containerd", "runtimes"])
        .map_err(|k| shape(drop_in, &format!("plugins.{k}")))?;
    runtimes.remove(HANDLER);
    let add_runc =
        version == Version::V2 && default_name == "runc" && !runtimes.contains_key("runc");
    if add_runc {
        // The copy replaces containerd's built-in runtimes map: keep its default runtime.
        runtimes.insert("runc", Item::Table(last(builtin_runc(), 0)));
    }
    runtimes.insert(HANDLER, Item::Table(last(runtime, 2)));
    let body = doc.to_string();
    let copy_note = match version {
        Version::V2 => "# containerd 1.x (config version 2) replaces a plugin's whole section with the\n\
                        # last imported one, so this file repeats the CRI section of the config it\n\
                        # extends and adds the gpuslice runtime. Re-run `gpuslice configure containerd`\n\
                        # after changing that section; `--remove` deletes this file.\n",
        Version::V3 => "# containerd 2.x merges imported files key by key; `--remove` deletes this file.\n",
    };
    let text = format!(
        "{MARKER}; it is regenerated on every run.\n{copy_note}version = {}\n\n{}",
        version.number(),
        body.trim_start_matches(['\n', ' '])
    );
    verify_drop_in(
        version,
        &text,
        binary,
        effective.as_ref(),
        add_runc,
        drop_in,
    )?;
    Ok(DropIn { text, mode })
}

/// `t` (and its `options`) placed after every copied table when printed.
fn last(mut t: Table, slot: usize) -> Table {
    const END: usize = usize::MAX / 2;
    t.set_position(END + slot);
    if let Some(o) = t.get_mut("options").and_then(Item::as_table_mut) {
        o.set_position(END + slot + 1);
    }
    t
}

/// containerd 1.x's built-in `runc` runtime (`containerd config default`), exactly.
fn builtin_runc() -> Table {
    let mut runc = Table::new();
    runc.insert("runtime_type", value(RUNTIME_TYPE));
    let mut o = Table::new();
    for k in ["BinaryName", "CriuImagePath", "CriuPath", "CriuWorkPath"] {
        o.insert(k, value(""));
    }
    o.insert("IoGid", value(0));
    o.insert("IoUid", value(0));
    o.insert("NoNewKeyring", value(false));
    o.insert("NoPivotRoot", value(false));
    o.insert("Root", value(""));
    o.insert("ShimCgroup", value(""));
    o.insert("SystemdCgroup", value(false));
    runc.insert("options", Item::Table(o));
    runc
}

fn shape(path: &Path, key: &str) -> ContainerdError {
    ContainerdError::Shape {
        path: path.to_path_buf(),
        key: key.to_string(),
        expected: "a table",
    }
}

/// The `gpuslice` runtime: the default runtime's settings and options (when it is a runc
/// shim), `BinaryName` = `binary`, and the gpuslice annotations passed through.
fn runtime_table(
    default: Option<&dyn TableLike>,
    default_name: &str,
    binary: &Path,
    plan: &mut Plan,
) -> Table {
    let mut t = Table::new();
    t.insert("runtime_type", value(RUNTIME_TYPE));
    let inherit = match default {
        Some(d) => match d.get("runtime_type").and_then(Item::as_str) {
            None | Some(RUNTIME_TYPE) => Some(d),
            Some(other) => {
                plan.note(format!(
                    "note: the default runtime `{default_name}` is of type {other}, not {RUNTIME_TYPE}; the gpuslice runtime inherits none of its settings"
                ));
                None
            }
        },
        None => None,
    };
    let mut options = Table::new();
    let mut pod = vec![ANNOTATION_PATTERN.to_string()];
    let mut ctr = vec![ANNOTATION_PATTERN.to_string()];
    if let Some(d) = inherit {
        for (k, v) in d.iter() {
            if !NOT_INHERITED.contains(&k) {
                t.insert(k, plain(v));
            }
        }
        for (key, list) in [
            ("pod_annotations", &mut pod),
            ("container_annotations", &mut ctr),
        ] {
            for a in d.get(key).and_then(tomldoc::strings).unwrap_or_default() {
                if !list.contains(&a) {
                    list.push(a);
                }
            }
        }
        if let Some(o) = d.get("options").and_then(Item::as_table_like) {
            for (k, v) in o.iter() {
                if k != "BinaryName" {
                    options.insert(k, plain(v));
                }
            }
        }
    }
    t.insert("pod_annotations", value(Array::from_iter(pod)));
    t.insert("container_annotations", value(Array::from_iter(ctr)));
    options.insert("BinaryName", value(binary.display().to_string()));
    t.insert("options", Item::Table(options));
    t
}

/// A copied item without the source's comments and spacing.
fn plain(item: &Item) -> Item {
    let mut item = item.clone();
    if let Some(v) = item.as_value_mut() {
        v.decor_mut().clear();
    }
    item
}

/// Parses what is about to be written and checks it says what it must: the runtime with
/// its binary, and (version 2) the CRI section it copies, unchanged.
fn verify_drop_in(
    version: Version,
    text: &str,
    binary: &Path,
    effective: Option<&Item>,
    added_runc: bool,
    path: &Path,
) -> Result<(), ContainerdError> {
    let fail = |reason: String| ContainerdError::Verify {
        path: path.to_path_buf(),
        reason,
    };
    let v = tomldoc::values(text).map_err(|e| fail(format!("it does not parse: {e}")))?;
    let cri = v
        .get("plugins")
        .and_then(|p| p.get(version.cri_plugin()))
        .ok_or_else(|| fail("the CRI plugin section is missing".into()))?;
    let rt = cri
        .get("containerd")
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(HANDLER))
        .ok_or_else(|| fail("the gpuslice runtime is missing".into()))?;
    let bin = rt.get("options").and_then(|o| o.get("BinaryName"));
    if bin.and_then(toml::Value::as_str) != Some(&binary.display().to_string()) {
        return Err(fail(format!("BinaryName is {bin:?}")));
    }
    if version == Version::V2 {
        let mut copy = cri.clone();
        if let Some(r) = copy
            .get_mut("containerd")
            .and_then(|c| c.get_mut("runtimes"))
            .and_then(toml::Value::as_table_mut)
        {
            r.remove(HANDLER);
            if added_runc {
                r.remove("runc");
            }
        }
        let original = match effective {
            Some(e) => tomldoc::item_value(e)
                .map_err(|e| fail(format!("the copied section does not parse: {e}")))?,
            None => toml::Value::Table(toml::Table::new()),
        };
        if strip_empty(copy) != strip_empty(original) {
            return Err(fail(
                "the copied CRI section differs from its source".into(),
            ));
        }
    }
    Ok(())
}

/// `v` without empty tables (the copy may gain empty parent tables on the way to runtimes).
fn strip_empty(v: toml::Value) -> toml::Value {
    match v {
        toml::Value::Table(t) => toml::Value::Table(
            t.into_iter()
                .map(|(k, v)| (k, strip_empty(v)))
                .filter(|(_, v)| !matches!(v, toml::Value::Table(t) if t.is_empty()))
                .collect(),
        ),
        other => other,
    }
}

/// The main config's part: the `imports` entry of the drop-in (and `version` in a file that
/// had no settings).
struct MainEdit {
    config: PathBuf,
    drop_in: PathBuf,
    version: Version,
}

impl MainEdit {
    fn entry(&self) -> String {
        self.drop_in.display().to_string()
    }

    fn verify(&self, old: &str, new: &str) -> Result<(), ContainerdError> {
        let fail = |reason: String| ContainerdError::Verify {
            path: self.config.clone(),
            reason,
        };
        let mut a = tomldoc::values(old).map_err(|e| fail(format!("it does not parse: {e}")))?;
        let mut b =
            tomldoc::values(new).map_err(|e| fail(format!("the result does not parse: {e}")))?;
        let imports = b.remove("imports");
        let listed = imports
            .as_ref()
            .and_then(toml::Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(toml::Value::as_str)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if !listed
            .iter()
            .any(|e| covers(&self.config, e, &self.drop_in))
        {
            return Err(fail("the result does not import the drop-in".into()));
        }
        a.remove("imports");
        if !a.contains_key("version") {
            b.remove("version");
        }
        if a != b {
            return Err(fail("the result changes more than `imports`".into()));
        }
        Ok(())
    }
}

impl Edit for MainEdit {
    type Error = ContainerdError;

    fn add(&self, text: &str) -> Result<String, ContainerdError> {
        let mut doc = parse(&self.config, text)?;
        if version_of(&self.config, &doc)?.is_none() {
            // Only comments: keep them on top, settings below.
            let mut new = text.to_string();
            if !new.is_empty() && !new.ends_with('\n') {
                new.push('\n');
            }
            new.push_str(&format!(
                "version = {}\nimports = [{}]\n",
                self.version.number(),
                Value::from(self.entry())
            ));
            self.verify(text, &new)?;
            return Ok(new);
        }
        let imports = imports_of(&self.config, &doc)?;
        if imports
            .iter()
            .any(|e| covers(&self.config, e, &self.drop_in))
        {
            return Ok(text.to_string());
        }
        match doc.get_mut("imports").and_then(Item::as_array_mut) {
            Some(arr) => {
                let mut v = Value::from(self.entry());
                if let Some(last) = arr.iter().last() {
                    let prefix = last.decor().prefix().and_then(|p| p.as_str()).unwrap_or("");
                    let prefix = if prefix.is_empty() { " " } else { prefix };
                    v.decor_mut().set_prefix(prefix.to_string());
                    v.decor_mut().set_suffix(
                        last.decor()
                            .suffix()
                            .and_then(|s| s.as_str())
                            .unwrap_or("")
                            .to_string(),
                    );
                }
                arr.push_formatted(v);
            }
            None => {
                doc.insert("imports", value(Array::from_iter([self.entry()])));
            }
        }
        let new = doc.to_string();
        self.verify(text, &new)?;
        Ok(new)
    }

    fn strip(&self, text: &str) -> Result<String, ContainerdError> {
        let mut doc = parse(&self.config, text)?;
        let entry = self.entry();
        if let Some(arr) = doc.get_mut("imports").and_then(Item::as_array_mut) {
            arr.retain(|v| v.as_str() != Some(entry.as_str()));
        }
        Ok(doc.to_string())
    }

    fn create(&self) -> Result<String, ContainerdError> {
        Ok(format!(
            "{MARKER}: there was no config file.\n# `gpuslice configure containerd --remove` deletes it.\nversion = {}\nimports = [{}]\n",
            self.version.number(),
            Value::from(self.entry())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_containerd_output() {
        assert_eq!(
            Version::from_containerd_version(
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n"
            ),
            Some(Version::V2)
        );
        assert_eq!(
            Version::from_containerd_version(
                "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7\n"
            ),
            Some(Version::V3)
        );
        assert_eq!(Version::from_containerd_version(""), None);
    }

    #[test]
    fn globs_cover_the_drop_in_like_containerd() {
        let main = Path::new("/etc/containerd/config.toml");
        let d = Path::new("/etc/containerd/conf.d/gpuslice.toml");
        assert!(covers(main, "/etc/containerd/conf.d/*.toml", d));
        assert!(covers(main, "conf.d/*.toml", d));
        assert!(covers(main, "conf.d/gpuslice.toml", d));
        assert!(!covers(main, "/etc/containerd/*.toml", d));
        assert!(!covers(main, "/etc/containerd/conf.d/*.conf", d));
    }
}
