//! The fake's objects and its answers to each request on them, as the API server answers:
//! one resourceVersion counter for every change (as etcd's revision), lists carrying it in
//! their `metadata.resourceVersion`, replaces, patches and deletes checked against the version
//! they name (409 when it is not the object's), a watch told of each change to what it
//! selects — from the resourceVersion it names (the changes since replayed), or, naming none
//! or `0`, from the objects as they are (each an ADDED first), or, naming a version older than
//! the changes kept since the last compaction, told `410 Expired` as an ERROR event — and every
//! refusal a `Status` body with the API server's code and reason.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::kinds::{target, Kind, Target};
use crate::select::Selector;

/// An answer: the HTTP status and its JSON body.
pub type Answer = (u16, String);

/// An open watch's sender and receiver of lines.
pub type Watch = (UnboundedSender<Bytes>, UnboundedReceiver<Bytes>);

/// One open watch.
struct Watcher {
    kind: &'static str,
    /// Its namespace; `None`: every namespace.
    namespace: Option<String>,
    selector: Selector,
    lines: UnboundedSender<Bytes>,
}

/// One list or watch of a kind across namespaces or in one, as the fake answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// When it was asked for.
    pub at: Instant,
    /// Its path (no query): `/api/v1/pods` across namespaces.
    pub path: String,
    /// A watch (else a list).
    pub watch: bool,
    /// The HTTP status answered; a watch told its version expired: 410 (the HTTP status is
    /// 200, the ERROR event says 410, as the API server answers).
    pub code: u16,
    /// The resourceVersion a watch named, or the one a list answered (empty for a refusal).
    pub version: String,
    /// The `limit` a list asked (none for a watch, or a list asking every item at once).
    pub limit: Option<u64>,
    /// Whether the list named a `continue` token (a page after the first).
    pub continued: bool,
}

/// One change of an object, as a watch is told of it.
struct Change {
    kind: &'static str,
    /// The resourceVersion the change gave.
    version: u64,
    event: &'static str,
    old: Option<Value>,
    new: Value,
}

/// What a watch with `selector` in `namespace` hears of a change of `kind` (`event`: ADDED,
/// MODIFIED, DELETED; `old` the object before, none for ADDED; `new` after, or as deleted):
/// `event` when it selected the object before and does now; DELETED when it no longer does,
/// ADDED when it did not before; nothing when it selects neither.
fn heard(
    w: &Watcher,
    kind: &str,
    event: &'static str,
    old: Option<&Value>,
    new: &Value,
) -> Option<Bytes> {
    let ns = meta(new, "namespace");
    if w.kind != kind || w.namespace.as_ref().is_some_and(|n| n != ns) {
        return None;
    }
    let (was, is) = (
        old.is_some_and(|o| w.selector.matches(o)),
        w.selector.matches(new),
    );
    let said = match (was, is) {
        (false, false) => return None,
        (true, false) => "DELETED",
        (false, true) if event == "MODIFIED" => "ADDED",
        _ => event,
    };
    Some(Bytes::from(format!(
        "{}\n",
        json!({"type": said, "object": new})
    )))
}

/// Everything the fake holds.
#[derive(Default)]
pub struct State {
    /// Each kind's objects (by resource), by namespace (empty for a cluster-scoped kind) and
    /// name.
    objects: BTreeMap<&'static str, BTreeMap<(String, String), Value>>,
    /// Bodies a get by name answers verbatim instead (a test's malformed object).
    verbatim: BTreeMap<(&'static str, String, String), String>,
    /// The last resourceVersion given.
    version: u64,
    /// Requests served: "METHOD path" (no query), "WATCH path" for a watch.
    pub requests: Vec<String>,
    /// Drop the consumable-capacity fields of slices, as an API server with
    /// `DRAConsumableCapacity` off does (Kubernetes 1.34/1.35).
    pub drops_consumable_capacity: bool,
    watchers: Vec<Watcher>,
    /// Every change, in order, for a watch that starts from an earlier resourceVersion (a
    /// test's store is small: nothing is compacted, no version is too old).
    history: Vec<Change>,
    /// When each watch was asked for, by resource.
    pub watch_starts: Vec<(&'static str, Instant)>,
    /// The changes up to this resourceVersion are forgotten (compacted, as etcd's): a watch
    /// naming an earlier one is told it expired.
    compacted: u64,
    /// The kinds (by resource) whose lists (`false`) or watches (`true`) are refused for now,
    /// as an API server whose storage does not answer (500: kube's client retries a 503 itself).
    pub refused: BTreeSet<(&'static str, bool)>,
    /// Each list and watch, by resource, in order.
    pub calls: Vec<(&'static str, Call)>,
    /// The lists served in pages, by the number in their `continue` tokens: the resourceVersion
    /// the first page answered and every item selected then, as etcd serves the later pages
    /// from the first page's revision (forgotten at a compaction past it).
    paged: BTreeMap<u64, (u64, Vec<Value>)>,
    /// The lists served in pages so far (the next one's number).
    pages_given: u64,
}

/// A `Status` body of a refusal.
fn status(code: u16, reason: &str, message: &str) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code})
        .to_string(),
    )
}

/// The `Status` body of an error the API server has no `Status` of (its storage's own): 500,
/// no reason, the error's message.
fn internal(message: &str) -> Answer {
    (
        500,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "code": 500})
        .to_string(),
    )
}

/// The `Status` body of a refusal about object `name` of `kind`.
fn status_of(code: u16, reason: &str, message: &str, kind: &Kind, name: &str) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
            "details": {"name": name, "group": kind.group, "kind": kind.plural}})
        .to_string(),
    )
}

fn not_found(kind: &Kind, name: &str) -> Answer {
    let message = format!("{} \"{name}\" not found", kind.resource());
    status_of(404, "NotFound", &message, kind, name)
}

fn conflict(kind: &Kind, name: &str, why: &str) -> Answer {
    let message = format!(
        "Operation cannot be fulfilled on {} \"{name}\": {why}",
        kind.resource()
    );
    status_of(409, "Conflict", &message, kind, name)
}

const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// What a write names: the object (a replace or patch), or its status subresource.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Object,
    Status,
}

/// Sets `field` of `to` to `from`'s, or removes it when `from` has none.
fn keep(to: &mut Value, from: &Value, field: &str) {
    match from.get(field) {
        Some(v) => to[field] = v.clone(),
        None => {
            if let Some(o) = to.as_object_mut() {
                o.remove(field);
            }
        }
    }
}

/// What a write of `part` of `old` stores of `object` ([`crate::kinds::StatusRules`]): for a kind with a
/// status subresource, a write of the object keeps the status stored (only the subresource
/// changes it), and a write of the status keeps the spec and the metadata fields the kind
/// names; a kind without one stores the object as sent.
fn keep_what_the_part_cannot_change(kind: &Kind, part: Part, old: &Value, object: &mut Value) {
    let Some(rules) = kind.status else {
        return;
    };
    match part {
        Part::Object => keep(object, old, "status"),
        Part::Status => {
            keep(object, old, "spec");
            for field in rules.status_keeps {
                keep(&mut object["metadata"], &old["metadata"], field);
            }
        }
    }
}

/// A request's body as an object whose `metadata`, if any, is an object.
fn parse_object(body: &str) -> Result<Value, Answer> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| status(400, "BadRequest", &e.to_string()))?;
    if !v.is_object() || !(v["metadata"].is_object() || v["metadata"].is_null()) {
        return Err(status(
            400,
            "BadRequest",
            "the body is no object with an object's metadata",
        ));
    }
    Ok(v)
}

/// `metadata.FIELD` of `o`, empty when it has none.
fn meta<'a>(o: &'a Value, field: &str) -> &'a str {
    o["metadata"][field].as_str().unwrap_or("")
}

/// What an API server without consumable capacity keeps of a slice.
fn drop_consumable_capacity(slice: &mut Value) {
    if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
        for d in devices {
            if let Some(d) = d.as_object_mut() {
                d.remove("allowMultipleAllocations");
            }
            if let Some(caps) = d["capacity"].as_object_mut() {
                for c in caps.values_mut() {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("requestPolicy");
                    }
                }
            }
        }
    }
}

/// Applies JSON merge patch `patch` to `target` (RFC 7386: objects merge, `null` removes, any
/// other value replaces).
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// A query's parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn of(url: &str) -> Query {
        let query = url.split_once('?').map_or("", |(_, q)| q);
        Query(
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    fn selector(&self, kind: &Kind) -> Result<Selector, Answer> {
        Selector::parse(kind, self.get("fieldSelector"), self.get("labelSelector"))
            .map_err(|e| status(400, "BadRequest", &e))
    }
}

/// Whether `url` asks for a watch (`watch=true` or `watch=1`).
pub fn is_watch(url: &str) -> bool {
    matches!(Query::of(url).get("watch"), Some("true" | "1"))
}

/// The `timeoutSeconds` of `url`, if it names one.
pub fn timeout_seconds(url: &str) -> Option<u64> {
    Query::of(url).get("timeoutSeconds")?.parse().ok()
}

impl State {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// The object `name` of `kind` in namespace `ns` (empty for a cluster-scoped kind).
    pub fn object(&self, kind: &Kind, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(kind.plural)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// `kind`'s objects by namespace and name.
    pub fn objects(&self, kind: &Kind) -> BTreeMap<(String, String), Value> {
        self.objects.get(kind.plural).cloned().unwrap_or_default()
    }

    /// Forgets the changes made so far, as etcd's compaction does: a watch naming an earlier
    /// version than the current one is told `410 Expired` (open watches go on).
    pub fn compact(&mut self) {
        self.compacted = self.version;
        let kept = self.compacted;
        self.history.retain(|c| c.version > kept);
        self.paged.retain(|_, (v, _)| *v >= kept);
    }

    /// Ends every open watch of `kind`, as the API server ends one at its timeout.
    pub fn end_watches(&mut self, kind: &Kind) {
        self.watchers.retain(|w| {
            if w.kind != kind.plural {
                return true;
            }
            let _ = w.lines.send(Bytes::new());
            false
        });
    }

    fn called(&mut self, kind: &'static Kind, path: &str, watch: bool, code: u16, version: String) {
        self.called_page(kind, path, watch, code, version, None, false);
    }

    #[allow(clippy::too_many_arguments)] // one record's fields
    fn called_page(
        &mut self,
        kind: &'static Kind,
        path: &str,
        watch: bool,
        code: u16,
        version: String,
        limit: Option<u64>,
        continued: bool,
    ) {
        self.calls.push((
            kind.plural,
            Call {
                at: Instant::now(),
                path: path.to_string(),
                watch,
                code,
                version,
                limit,
                continued,
            },
        ));
    }

    /// The refusal of a list or watch of `kind` while it is refused, recorded as a call.
    fn refusal(&mut self, kind: &'static Kind, path: &str, watch: bool) -> Option<Answer> {
        if !self.refused.contains(&(kind.plural, watch)) {
            return None;
        }
        self.called(kind, path, watch, 500, String::new());
        let what = if watch { "watches" } else { "lists" };
        Some(status(
            500,
            "InternalError",
            &format!(
                "the fake API server refuses {what} of {} for now",
                kind.plural
            ),
        ))
    }

    /// Records a change and tells each open watch what it hears of it ([`heard`]).
    fn emit(&mut self, kind: &'static Kind, event: &'static str, old: Option<&Value>, new: &Value) {
        self.watchers
            .retain(|w| match heard(w, kind.plural, event, old, new) {
                Some(line) => w.lines.send(line).is_ok(),
                None => true,
            });
        self.history.push(Change {
            kind: kind.plural,
            version: self.version,
            event,
            old: old.cloned(),
            new: new.clone(),
        });
    }

    /// Stores `object` as another writer would: a new resourceVersion, a uid if it has none,
    /// an ADDED or MODIFIED event; a verbatim body of its name is forgotten.
    pub fn put(&mut self, kind: &'static Kind, mut object: Value) {
        let key = (
            meta(&object, "namespace").to_string(),
            meta(&object, "name").to_string(),
        );
        self.verbatim
            .remove(&(kind.plural, key.0.clone(), key.1.clone()));
        let version = self.next_version();
        object["metadata"]["resourceVersion"] = json!(version);
        if meta(&object, "uid").is_empty() {
            object["metadata"]["uid"] = json!(format!("{}-uid-{version}", kind.plural));
        }
        let old = self
            .objects
            .entry(kind.plural)
            .or_default()
            .insert(key, object.clone());
        let event = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.emit(kind, event, old.as_ref(), &object);
    }

    /// Serves `body` verbatim to a get of object `name` of `kind` in `ns`.
    pub fn put_verbatim(&mut self, kind: &'static Kind, ns: &str, name: &str, body: String) {
        self.verbatim
            .insert((kind.plural, ns.to_string(), name.to_string()), body);
    }

    /// Removes object `name` of `kind` in `ns` (and a verbatim body of its name), with a
    /// DELETED event.
    pub fn remove(&mut self, kind: &'static Kind, ns: &str, name: &str) -> Option<Value> {
        self.verbatim
            .remove(&(kind.plural, ns.to_string(), name.to_string()));
        let mut gone = self
            .objects
            .get_mut(kind.plural)?
            .remove(&(ns.to_string(), name.to_string()))?;
        gone["metadata"]["resourceVersion"] = json!(self.next_version());
        self.emit(kind, "DELETED", None, &gone);
        Some(gone)
    }

    /// Opens a watch of what `url` names (and a sender of its lines, to end it with an empty
    /// one), or the refusal. As the API server: a watch naming a resourceVersion hears every
    /// change after it, then each as it comes; one naming none or `0` hears an ADDED of each
    /// object it selects as it is now, then each change (400 for a version that is not a
    /// number, as the API server refuses it); one naming a version older than the last
    /// compaction hears one ERROR event, a `Status` of code 410 and reason `Expired` (the HTTP
    /// status 200), and ends, as the API server's watch cache answers it.
    pub fn watch(&mut self, url: &str) -> Result<Watch, Answer> {
        let path = url.split('?').next().unwrap_or("");
        let Some(Target {
            kind,
            namespace,
            name: None,
            status: false,
        }) = target(path)
        else {
            self.requests.push(format!("GET {path}"));
            return Err(not_served("GET", path));
        };
        self.requests.push(format!("WATCH {path}"));
        if let Some(refused) = self.refusal(kind, path, true) {
            return Err(refused);
        }
        let query = Query::of(url);
        let selector = query.selector(kind)?;
        let since = match query.get("resourceVersion").unwrap_or("") {
            "" | "0" => None,
            v => Some(v.parse::<u64>().map_err(|_| {
                status(
                    400,
                    "BadRequest",
                    &format!("invalid resource version {v:?}: not a number"),
                )
            })?),
        };
        let (lines, rx) = tokio::sync::mpsc::unbounded_channel();
        let named = since.map(|v| v.to_string()).unwrap_or_default();
        if let Some(v) = since.filter(|v| *v < self.compacted) {
            let (_, gone) = status(
                410,
                "Expired",
                &format!("too old resource version: {v} ({})", self.compacted),
            );
            let gone: Value = serde_json::from_str(&gone).unwrap_or_default();
            let line = json!({"type": "ERROR", "object": gone});
            let _ = lines.send(Bytes::from(format!("{line}\n")));
            let _ = lines.send(Bytes::new());
            self.called(kind, path, true, 410, named);
            return Ok((lines, rx));
        }
        let watcher = Watcher {
            kind: kind.plural,
            namespace,
            selector,
            lines: lines.clone(),
        };
        // The receiver is alive here: a send cannot fail.
        let replay: Vec<Bytes> = match since {
            Some(v) => self
                .history
                .iter()
                .filter(|c| c.version > v)
                .filter_map(|c| heard(&watcher, c.kind, c.event, c.old.as_ref(), &c.new))
                .collect(),
            None => self
                .objects
                .get(kind.plural)
                .into_iter()
                .flat_map(|o| o.values())
                .filter_map(|o| heard(&watcher, kind.plural, "ADDED", None, o))
                .collect(),
        };
        for line in replay {
            let _ = lines.send(line);
        }
        self.watch_starts.push((kind.plural, Instant::now()));
        self.called(kind, path, true, 200, named);
        self.watchers.push(watcher);
        Ok((lines, rx))
    }

    /// Answers a request other than a watch.
    pub fn handle(&mut self, method: &str, url: &str, content_type: &str, body: &str) -> Answer {
        let path = url.split('?').next().unwrap_or("");
        self.requests.push(format!("{method} {path}"));
        let Some(t) = target(path) else {
            return not_served(method, path);
        };
        let query = Query::of(url);
        let answer = match (method, t.name.clone()) {
            ("PUT", Some(name)) if t.status => self.replace_status(&t, &name, &query, body),
            (_, Some(_)) if t.status && method != "GET" => Ok(status(
                405,
                "MethodNotAllowed",
                &format!("the fake API server serves GET and PUT of a status, not {method} {path}"),
            )),
            ("GET", Some(name)) => Ok(self.get(&t, &name)),
            ("GET", None) => match self.refusal(t.kind, path, false) {
                Some(refused) => Ok(refused),
                None => self.list(&t, path, &query),
            },
            ("POST", None) => self.create(&t, &query, body),
            ("PUT", Some(name)) => self.replace(&t, &name, &query, body),
            ("PATCH", Some(name)) => self.patch(&t, &name, &query, content_type, body),
            ("DELETE", Some(name)) => self.delete(&t, &name, &query, body),
            _ => Ok(status(
                405,
                "MethodNotAllowed",
                &format!("the fake API server does not serve {method} {path}"),
            )),
        };
        answer.unwrap_or_else(|refused| refused)
    }

    fn get(&self, t: &Target, name: &str) -> Answer {
        let ns = t.namespace_key();
        if let Some(body) = self
            .verbatim
            .get(&(t.kind.plural, ns.clone(), name.to_string()))
        {
            return (200, body.clone());
        }
        match self.object(t.kind, &ns, name) {
            Some(o) => (200, o.to_string()),
            None => not_found(t.kind, name),
        }
    }

    /// A list, as the API server answers one: every item selected, or with `limit` a page of
    /// at most that many, and a `metadata.continue` token while items remain (the last page
    /// has none); a `continue` token names the next page of the same list, answered from the
    /// items and resourceVersion of its first page (410 `Expired` once a compaction passed it,
    /// 400 for a token the fake did not give).
    fn list(&mut self, t: &Target, path: &str, query: &Query) -> Result<Answer, Answer> {
        let selector = query.selector(t.kind)?;
        let limit = match query.get("limit") {
            None | Some("" | "0") => None,
            Some(l) => Some(l.parse::<u64>().map_err(|_| {
                status(
                    400,
                    "BadRequest",
                    &format!("invalid limit {l:?}: not a number"),
                )
            })?),
        };
        let continued = query.get("continue").filter(|c| !c.is_empty());
        let (list, version, from, items) = match continued {
            None => {
                let items: Vec<Value> = self
                    .objects
                    .get(t.kind.plural)
                    .into_iter()
                    .flatten()
                    .filter(|((ns, _), o)| {
                        t.namespace.as_ref().is_none_or(|n| n == ns) && selector.matches(o)
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                (self.pages_given, self.version, 0, items)
            }
            Some(token) => {
                let bad = || {
                    status(
                        400,
                        "BadRequest",
                        &format!("continue key {token:?} is not valid"),
                    )
                };
                let (list, from) = token.split_once(':').ok_or_else(bad)?;
                let (list, from) = (
                    list.parse::<u64>().map_err(|_| bad())?,
                    from.parse::<usize>().map_err(|_| bad())?,
                );
                let Some((version, items)) = self.paged.get(&list).cloned() else {
                    self.called_page(t.kind, path, false, 410, String::new(), limit, true);
                    return Err(status(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                };
                (list, version, from, items)
            }
        };
        let to = limit.map_or(items.len(), |l| {
            from.saturating_add(usize::try_from(l).unwrap_or(usize::MAX))
                .min(items.len())
        });
        let page = items.get(from..to).unwrap_or_default();
        let mut metadata = json!({"resourceVersion": version.to_string()});
        if to < items.len() {
            metadata["continue"] = json!(format!("{list}:{to}"));
            metadata["remainingItemCount"] = json!(items.len() - to);
        }
        let body = json!({"apiVersion": t.kind.api_version(), "kind": t.kind.list_kind,
            "metadata": metadata, "items": page})
        .to_string();
        if to < items.len() && continued.is_none() {
            self.paged.insert(list, (version, items));
            self.pages_given += 1;
        }
        self.called_page(
            t.kind,
            path,
            false,
            200,
            version.to_string(),
            limit,
            continued.is_some(),
        );
        Ok((200, body))
    }

    /// `object`'s namespace made the request's: set when it names none, refused when it
    /// names another.
    fn in_namespace(t: &Target, object: &mut Value) -> Result<(), Answer> {
        let Some(ns) = &t.namespace else {
            return Ok(());
        };
        match meta(object, "namespace") {
            "" => {
                object["metadata"]["namespace"] = json!(ns);
                Ok(())
            }
            n if n == ns => Ok(()),
            _ => Err(status(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
        }
    }

    fn create(&mut self, t: &Target, query: &Query, body: &str) -> Result<Answer, Answer> {
        if t.kind.namespaced && t.namespace.is_none() {
            return Ok(status(
                405,
                "MethodNotAllowed",
                &format!("{} are created in a namespace", t.kind.resource()),
            ));
        }
        let mut object = parse_object(body)?;
        Self::in_namespace(t, &mut object)?;
        if meta(&object, "name").is_empty() {
            let prefix = meta(&object, "generateName");
            if prefix.is_empty() {
                return Err(status(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            let name = format!("{prefix}{:05x}", self.version + 1);
            object["metadata"]["name"] = json!(name);
        }
        if let Some(rules) = t.kind.status {
            object["status"] = (rules.created)();
        }
        if t.kind.plural == "resourceslices" && self.drops_consumable_capacity {
            drop_consumable_capacity(&mut object);
        }
        if query.dry_run() {
            // The API server's dry run does not reach the storage: neither the version nor
            // the name is checked.
            return Ok((201, object.to_string()));
        }
        // The storage refuses a create naming a resourceVersion (a number other than 0; one
        // that is no number goes unchecked and is replaced), before it looks for the name, with
        // an error of its own, which the API server answers as 500 with no reason.
        if meta(&object, "resourceVersion")
            .parse::<u64>()
            .is_ok_and(|v| v != 0)
        {
            return Err(internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = meta(&object, "name").to_string();
        if self.object(t.kind, &t.namespace_key(), &name).is_some() {
            let message = format!("{} \"{name}\" already exists", t.kind.resource());
            return Err(status_of(409, "AlreadyExists", &message, t.kind, &name));
        }
        self.put(t.kind, object);
        let stored = self.object(t.kind, &t.namespace_key(), &name);
        Ok((201, stored.map(Value::to_string).unwrap_or_default()))
    }

    /// Stores `object`, a write of `part` of `old` (object `name`), in place of `old`: refused
    /// when `object` names another name or namespace, or a resourceVersion other than `old`'s
    /// (none: unconditional); what `part` cannot change kept as stored
    /// ([`keep_what_the_part_cannot_change`]).
    fn update(
        &mut self,
        t: &Target,
        name: &str,
        old: &Value,
        mut object: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Answer, Answer> {
        match meta(&object, "name") {
            "" => object["metadata"]["name"] = json!(name),
            n if n == name => {}
            n => {
                let message = format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                );
                return Err(status(400, "BadRequest", &message));
            }
        }
        Self::in_namespace(t, &mut object)?;
        let version = meta(&object, "resourceVersion");
        if !version.is_empty() && version != meta(old, "resourceVersion") {
            return Err(conflict(t.kind, name, MODIFIED));
        }
        object["metadata"]["uid"] = old["metadata"]["uid"].clone();
        keep_what_the_part_cannot_change(t.kind, part, old, &mut object);
        if t.kind.plural == "resourceslices" && self.drops_consumable_capacity {
            drop_consumable_capacity(&mut object);
        }
        if dry_run {
            return Ok((200, object.to_string()));
        }
        self.put(t.kind, object);
        let stored = self.object(t.kind, &t.namespace_key(), name);
        Ok((200, stored.map(Value::to_string).unwrap_or_default()))
    }

    fn existing(&self, t: &Target, name: &str) -> Result<Value, Answer> {
        self.object(t.kind, &t.namespace_key(), name)
            .cloned()
            .ok_or_else(|| not_found(t.kind, name))
    }

    fn replace(
        &mut self,
        t: &Target,
        name: &str,
        query: &Query,
        body: &str,
    ) -> Result<Answer, Answer> {
        let object = parse_object(body)?;
        let old = self.existing(t, name)?;
        self.update(t, name, &old, object, Part::Object, query.dry_run())
    }

    /// A PUT of the status subresource: `body` with the spec stored and the metadata the kind
    /// keeps ([`crate::kinds::StatusRules`]), checked against the resourceVersion it names, as the API server
    /// does.
    fn replace_status(
        &mut self,
        t: &Target,
        name: &str,
        query: &Query,
        body: &str,
    ) -> Result<Answer, Answer> {
        let object = parse_object(body)?;
        let old = self.existing(t, name)?;
        self.update(t, name, &old, object, Part::Status, query.dry_run())
    }

    fn patch(
        &mut self,
        t: &Target,
        name: &str,
        query: &Query,
        content_type: &str,
        body: &str,
    ) -> Result<Answer, Answer> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        if media != "application/merge-patch+json" {
            return Err(status(
                415,
                "UnsupportedMediaType",
                &format!("the fake API server applies merge patches (application/merge-patch+json) only, not {content_type:?}"),
            ));
        }
        let patch: Value =
            serde_json::from_str(body).map_err(|e| status(400, "BadRequest", &e.to_string()))?;
        let old = self.existing(t, name)?;
        let mut object = old.clone();
        // The version the patch names, if any, is checked; none: the patch applies to the
        // object as it is.
        object["metadata"]["resourceVersion"] = json!("");
        merge_patch(&mut object, &patch);
        if !(object.is_object() && object["metadata"].is_object()) {
            return Err(status(
                400,
                "BadRequest",
                "the patch removes the object's metadata",
            ));
        }
        self.update(t, name, &old, object, Part::Object, query.dry_run())
    }

    fn delete(
        &mut self,
        t: &Target,
        name: &str,
        query: &Query,
        body: &str,
    ) -> Result<Answer, Answer> {
        let old = self.existing(t, name)?;
        let options: Value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).map_err(|e| status(400, "BadRequest", &e.to_string()))?
        };
        for (field, said) in [("resourceVersion", "ResourceVersion"), ("uid", "UID")] {
            let want = options["preconditions"][field].as_str().unwrap_or("");
            let have = meta(&old, field);
            if !want.is_empty() && want != have {
                let why = format!(
                    "Precondition failed: {said} in precondition: {want}, {said} in object meta: {have}"
                );
                return Err(conflict(t.kind, name, &why));
            }
        }
        if !query.dry_run() {
            self.remove(t.kind, &t.namespace_key(), name);
        }
        Ok((
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 200, "details": {"name": name, "group": t.kind.group,
                "kind": t.kind.plural, "uid": meta(&old, "uid")}})
            .to_string(),
        ))
    }
}

/// The answer to a request for what the fake does not serve.
pub fn not_served(method: &str, path: &str) -> Answer {
    status(
        404,
        "NotFound",
        &format!("the fake API server does not serve {method} {path}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATES: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates";
    const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

    fn answer(st: &mut State, method: &str, url: &str, body: &Value) -> (u16, Value) {
        let (code, out) = st.handle(
            method,
            url,
            "application/merge-patch+json",
            &body.to_string(),
        );
        (code, serde_json::from_str(&out).unwrap())
    }

    fn template(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": labels}, "spec": {}})
    }

    #[test]
    fn objects_are_got_listed_and_refused_as_the_api_server_does() {
        let mut st = State::default();
        let (code, made) = answer(
            &mut st,
            "POST",
            TEMPLATES,
            &template("a", json!({"app": "x"})),
        );
        assert_eq!(code, 201, "{made}");
        assert_eq!(made["metadata"]["namespace"], "team");
        let (code, again) = answer(&mut st, "POST", TEMPLATES, &template("a", json!({})));
        assert_eq!(
            (code, again["reason"].as_str()),
            (409, Some("AlreadyExists"))
        );
        let (code, missing) = answer(&mut st, "GET", &format!("{TEMPLATES}/b"), &json!(null));
        assert_eq!(code, 404);
        assert_eq!(missing["kind"], "Status");
        assert_eq!(missing["reason"], "NotFound");
        assert_eq!(
            missing["message"],
            "resourceclaimtemplates.resource.k8s.io \"b\" not found"
        );
        assert_eq!(missing["details"]["name"], "b");

        // Another namespace's template; lists by namespace, across them, by label.
        st.put(
            Kind::named("resourceclaimtemplates").unwrap(),
            json!({"metadata": {"name": "c", "namespace": "other"}}),
        );
        let all = "/apis/resource.k8s.io/v1/resourceclaimtemplates";
        for (url, want) in [
            (TEMPLATES.to_string(), vec!["a"]),
            // By namespace, then name, as the API server's storage keys order them.
            (all.to_string(), vec!["c", "a"]),
            (format!("{all}?labelSelector=app%3Dx"), vec!["a"]),
            (format!("{all}?labelSelector=app%21%3Dx"), vec!["c"]),
        ] {
            let (code, list) = answer(&mut st, "GET", &url, &json!(null));
            assert_eq!(code, 200, "{url}: {list}");
            assert_eq!(list["kind"], "ResourceClaimTemplateList");
            assert_eq!(list["metadata"]["resourceVersion"], "2", "{url}");
            let names: Vec<&str> = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, want, "{url}");
        }
        let (code, bad) = answer(
            &mut st,
            "GET",
            &format!("{all}?fieldSelector=spec.x%3Dy"),
            &json!(null),
        );
        assert_eq!((code, bad["reason"].as_str()), (400, Some("BadRequest")));
        let (code, _) = answer(
            &mut st,
            "GET",
            "/api/v1/namespaces/team/services",
            &json!(null),
        );
        assert_eq!(code, 404);
    }

    #[test]
    fn a_list_with_a_limit_is_paged_from_its_first_pages_version_as_the_api_server_pages_it() {
        let mut st = State::default();
        let kind = Kind::named("resourceclaimtemplates").unwrap();
        for name in ["a", "b", "c", "d", "e"] {
            st.put(
                kind,
                json!({"metadata": {"name": name, "namespace": "team"}}),
            );
        }
        let names = |list: &Value| -> Vec<String> {
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        let (code, first) = answer(
            &mut st,
            "GET",
            &format!("{TEMPLATES}?limit=2"),
            &json!(null),
        );
        assert_eq!(code, 200, "{first}");
        assert_eq!(names(&first), ["a", "b"]);
        assert_eq!(first["metadata"]["resourceVersion"], "5");
        assert_eq!(first["metadata"]["remainingItemCount"], 3);
        // Changes after the first page do not show in the later ones: they come from its version.
        st.remove(kind, "team", "c");
        st.put(
            kind,
            json!({"metadata": {"name": "f", "namespace": "team"}}),
        );
        let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
        let mut seen = names(&first);
        let mut pages = 1;
        loop {
            let url = format!("{TEMPLATES}?limit=2&continue={token}");
            let (code, page) = answer(&mut st, "GET", &url, &json!(null));
            assert_eq!(code, 200, "{page}");
            assert_eq!(page["metadata"]["resourceVersion"], "5");
            seen.extend(names(&page));
            pages += 1;
            match page["metadata"]["continue"].as_str() {
                Some(t) => token = t.to_string(),
                None => break,
            }
        }
        assert_eq!(seen, ["a", "b", "c", "d", "e"]);
        assert_eq!(pages, 3);
        // Without a limit (or 0), every item at once, without a token.
        let (_, all) = answer(
            &mut st,
            "GET",
            &format!("{TEMPLATES}?limit=0"),
            &json!(null),
        );
        assert_eq!(names(&all), ["a", "b", "d", "e", "f"]);
        assert!(all["metadata"].get("continue").is_none(), "{all}");
        // A compaction past the first page's version expires its token.
        st.compact();
        let url = format!("{TEMPLATES}?limit=2&continue={token}");
        let (code, gone) = answer(&mut st, "GET", &url, &json!(null));
        assert_eq!(
            (code, gone["reason"].as_str()),
            (410, Some("Expired")),
            "{gone}"
        );
        let (code, bad) = answer(
            &mut st,
            "GET",
            &format!("{TEMPLATES}?continue=x"),
            &json!(null),
        );
        assert_eq!(
            (code, bad["reason"].as_str()),
            (400, Some("BadRequest")),
            "{bad}"
        );
        let limits: Vec<(Option<u64>, bool)> = st
            .calls
            .iter()
            .map(|(_, c)| (c.limit, c.continued))
            .collect();
        assert_eq!(
            limits,
            [
                (Some(2), false),
                (Some(2), true),
                (Some(2), true),
                (None, false),
                (Some(2), true)
            ]
        );
    }

    #[test]
    fn a_status_write_replaces_the_status_only_checked_against_its_version() {
        let mut st = State::default();
        let quotas = "/api/v1/namespaces/team/resourcequotas";
        let q = json!({"metadata": {"name": "q"}, "spec": {"hard": {"a": "1"}}});
        let (_, made) = answer(&mut st, "POST", quotas, &q);
        let url = format!("{quotas}/q/status");

        // The spec it carries is ignored; the status is taken, and a quota's metadata.
        let mut write = made.clone();
        write["spec"] = json!({"hard": {"a": "9"}});
        write["status"] = json!({"used": {"a": "1"}});
        write["metadata"]["labels"] = json!({"l": "1"});
        let (code, stored) = answer(&mut st, "PUT", &url, &write);
        assert_eq!(code, 200, "{stored}");
        assert_eq!(stored["spec"], json!({"hard": {"a": "1"}}));
        assert_eq!(stored["status"], json!({"used": {"a": "1"}}));
        assert_eq!(stored["metadata"]["labels"], json!({"l": "1"}));
        // Its version is checked: the write above made `made`'s stale.
        let (code, refused) = answer(&mut st, "PUT", &url, &write);
        assert_eq!((code, refused["reason"].as_str()), (409, Some("Conflict")));
        // Read as the object; no other verb, nor a kind without a status.
        let (code, got) = answer(&mut st, "GET", &url, &json!(null));
        assert_eq!((code, &got["status"]), (200, &stored["status"]));
        let (code, _) = answer(&mut st, "PATCH", &url, &json!({"status": {}}));
        assert_eq!(code, 405);
        let (code, _) = answer(
            &mut st,
            "PUT",
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/t/status",
            &json!({}),
        );
        assert_eq!(code, 404);
    }

    #[test]
    fn a_status_write_keeps_the_metadata_its_kind_keeps() {
        let mut st = State::default();
        let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]);
        for (url, kept) in [
            (
                "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims",
                true,
            ),
            ("/api/v1/namespaces/team/pods", false),
        ] {
            let o = json!({"metadata": {"name": "o", "labels": {"l": "1"},
                "ownerReferences": owner}, "spec": {"x": "1"}});
            let (_, made) = answer(&mut st, "POST", url, &o);
            let mut write = made.clone();
            write["spec"] = json!({"x": "2"});
            write["status"] = json!({"s": "1"});
            write["metadata"]["labels"] = json!({"l": "2"});
            write["metadata"]["ownerReferences"] = json!([]);
            let (code, stored) = answer(&mut st, "PUT", &format!("{url}/o/status"), &write);
            assert_eq!(code, 200, "{url}: {stored}");
            assert_eq!(
                (&stored["spec"], &stored["status"]),
                (&json!({"x": "1"}), &json!({"s": "1"})),
                "{url}"
            );
            // A claim's labels are kept, a pod's taken; neither's owners change.
            let labels = if kept {
                json!({"l": "1"})
            } else {
                json!({"l": "2"})
            };
            assert_eq!(stored["metadata"]["labels"], labels, "{url}");
            assert_eq!(stored["metadata"]["ownerReferences"], owner, "{url}");
        }
    }

    #[test]
    fn a_write_of_the_object_keeps_the_status_stored_and_a_create_starts_it_afresh() {
        let mut st = State::default();
        let quotas = "/api/v1/namespaces/team/resourcequotas";
        let claims = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims";
        let pods = "/api/v1/namespaces/team/pods";
        // A create: the status sent is dropped, the kind's fresh one stored.
        let sent = json!({"used": {"a": "1"}});
        for (url, fresh) in [
            (quotas, json!({})),
            (claims, json!({})),
            (pods, json!({"phase": "Pending"})),
        ] {
            let o = json!({"metadata": {"name": "o"}, "spec": {"x": "1"}, "status": sent});
            let (code, made) = answer(&mut st, "POST", url, &o);
            assert_eq!((code, &made["status"]), (201, &fresh), "{url}: {made}");
        }
        // A kind without a status subresource stores what it is sent.
        let (_, t) = answer(
            &mut st,
            "POST",
            TEMPLATES,
            &json!({"metadata": {"name": "t"}, "spec": {}, "status": sent}),
        );
        assert_eq!(t["status"], sent);

        // The quota controller's status, then a replace and a patch of the object, each
        // changing the spec and the status: the spec is taken, the status kept.
        let kind = Kind::named("resourcequotas").unwrap();
        let mut q = st.object(kind, "team", "o").unwrap().clone();
        q["status"] = json!({"used": {"a": "2"}});
        st.put(kind, q);
        let booked = json!({"used": {"a": "2"}});
        let url = format!("{quotas}/o");
        let (_, mut q) = answer(&mut st, "GET", &url, &json!(null));
        q["spec"] = json!({"x": "2"});
        q["status"] = json!({"used": {"a": "9"}});
        let (code, replaced) = answer(&mut st, "PUT", &url, &q);
        assert_eq!(code, 200, "{replaced}");
        assert_eq!(
            (&replaced["spec"], &replaced["status"]),
            (&json!({"x": "2"}), &booked)
        );
        let (code, patched) = answer(
            &mut st,
            "PATCH",
            &url,
            &json!({"spec": {"x": "3"}, "status": null}),
        );
        assert_eq!(code, 200, "{patched}");
        assert_eq!(
            (&patched["spec"], &patched["status"]),
            (&json!({"x": "3"}), &booked)
        );
        assert_eq!(st.object(kind, "team", "o").unwrap()["status"], booked);
    }

    #[test]
    fn a_create_naming_a_resource_version_is_refused_as_the_api_servers_storage_refuses_it() {
        let mut st = State::default();
        let named = |rv: &str| json!({"metadata": {"name": format!("t{rv}"), "resourceVersion": rv}, "spec": {}});
        let (code, refused) = answer(&mut st, "POST", TEMPLATES, &named("7"));
        assert_eq!(code, 500, "{refused}");
        assert_eq!(
            refused["message"],
            "resourceVersion should not be set on objects to be created"
        );
        assert!(refused.get("reason").is_none(), "{refused}");
        assert!(st
            .objects(Kind::named("resourceclaimtemplates").unwrap())
            .is_empty());
        // Refused before the name is looked for: an existing name answers the same.
        let (_, made) = answer(&mut st, "POST", TEMPLATES, &named("0"));
        let mut again = made.clone();
        again["metadata"]["resourceVersion"] = json!("9");
        assert_eq!(answer(&mut st, "POST", TEMPLATES, &again).0, 500);
        // `0`, or a version that is no number, is not checked: the stored object gets its own.
        assert_eq!(made["metadata"]["resourceVersion"], "1");
        let (code, made) = answer(&mut st, "POST", TEMPLATES, &named("x"));
        assert_eq!(
            (code, &made["metadata"]["resourceVersion"]),
            (201, &json!("2"))
        );
        // A dry run does not reach the storage: not checked.
        let (code, _) = answer(
            &mut st,
            "POST",
            &format!("{TEMPLATES}?dryRun=All"),
            &named("7"),
        );
        assert_eq!(code, 201);
    }

    #[test]
    fn writes_are_checked_against_the_version_they_name() {
        let mut st = State::default();
        let slice = json!({"metadata": {"name": "s"}, "spec": {"nodeName": "n1"}});
        let (_, made) = answer(&mut st, "POST", SLICES, &slice);
        let v1 = made["metadata"]["resourceVersion"].clone();
        let url = format!("{SLICES}/s");

        let mut stale = made.clone();
        stale["metadata"]["resourceVersion"] = json!("0");
        let (code, refused) = answer(&mut st, "PUT", &url, &stale);
        assert_eq!((code, refused["reason"].as_str()), (409, Some("Conflict")));

        let (code, replaced) = answer(&mut st, "PUT", &url, &made);
        assert_eq!(code, 200, "{replaced}");
        assert_ne!(replaced["metadata"]["resourceVersion"], v1);
        assert_eq!(replaced["metadata"]["uid"], made["metadata"]["uid"]);

        // A merge patch: a null removes, the version named is checked.
        let (code, patched) = answer(
            &mut st,
            "PATCH",
            &url,
            &json!({"spec": {"nodeName": null, "driver": "d"}}),
        );
        assert_eq!(code, 200, "{patched}");
        assert_eq!(patched["spec"], json!({"driver": "d"}));
        let (code, _) = answer(
            &mut st,
            "PATCH",
            &url,
            &json!({"metadata": {"resourceVersion": v1}}),
        );
        assert_eq!(code, 409);

        let (code, _) = answer(
            &mut st,
            "DELETE",
            &url,
            &json!({"preconditions": {"resourceVersion": v1}}),
        );
        assert_eq!(code, 409);
        let (code, done) = answer(&mut st, "DELETE", &url, &json!({}));
        assert_eq!((code, done["status"].as_str()), (200, Some("Success")));
        let (code, _) = answer(&mut st, "DELETE", &url, &json!({}));
        assert_eq!(code, 404);
    }

    #[test]
    fn a_watch_hears_what_enters_and_leaves_its_selection() {
        let mut st = State::default();
        let (_, mut rx) = st
            .watch(&format!(
                "{SLICES}?watch=true&fieldSelector=spec.nodeName%3Dn1"
            ))
            .unwrap();
        let kind = Kind::named("resourceslices").unwrap();
        let on = |node: &str| json!({"metadata": {"name": "s"}, "spec": {"nodeName": node}});
        st.put(kind, on("n2"));
        st.put(kind, on("n1"));
        st.put(kind, on("n1"));
        st.put(kind, on("n2"));
        st.remove(kind, "", "s");
        let mut heard = Vec::new();
        while let Ok(line) = rx.try_recv() {
            let e: Value = serde_json::from_slice(&line).unwrap();
            heard.push(format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap()
            ));
        }
        assert_eq!(heard, ["ADDED 2", "MODIFIED 3", "DELETED 4"]);
        assert_eq!(st.requests, [format!("WATCH {SLICES}")]);
    }

    /// Each line `rx` holds now, as "TYPE name resourceVersion".
    fn lines(rx: &mut UnboundedReceiver<Bytes>) -> Vec<String> {
        let mut heard = Vec::new();
        while let Ok(line) = rx.try_recv() {
            let e: Value = serde_json::from_slice(&line).unwrap();
            heard.push(format!(
                "{} {} {}",
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap()
            ));
        }
        heard
    }

    #[test]
    fn a_watch_starts_where_it_says_as_the_api_server_starts_it() {
        let mut st = State::default();
        let kind = Kind::named("resourceslices").unwrap();
        let on = |name: &str, node: &str| json!({"metadata": {"name": name}, "spec": {"nodeName": node}});
        st.put(kind, on("a", "n1")); // 1
        st.put(kind, on("b", "n2")); // 2
        st.put(kind, on("a", "n1")); // 3
        st.put(kind, on("b", "n1")); // 4: b enters n1's selection
        st.remove(kind, "", "a"); // 5
        let n1 = "fieldSelector=spec.nodeName%3Dn1";
        // From a version: every change after it that the watch selects, then what comes.
        let (_, mut rx) = st
            .watch(&format!("{SLICES}?watch=true&{n1}&resourceVersion=2"))
            .unwrap();
        assert_eq!(lines(&mut rx), ["MODIFIED a 3", "ADDED b 4", "DELETED a 5"]);
        st.put(kind, on("b", "n2")); // 6: b leaves it
        assert_eq!(lines(&mut rx), ["DELETED b 6"]);
        // Naming none (or 0): the objects as they are, each an ADDED.
        for rv in ["", "&resourceVersion=0"] {
            let (_, mut rx) = st.watch(&format!("{SLICES}?watch=true{rv}")).unwrap();
            assert_eq!(lines(&mut rx), ["ADDED b 6"], "{rv}");
        }
        let refused = st
            .watch(&format!("{SLICES}?watch=true&resourceVersion=x"))
            .unwrap_err();
        assert_eq!(refused.0, 400, "{}", refused.1);
    }

    #[test]
    fn a_watch_from_a_compacted_version_is_told_it_expired_and_a_refused_kind_answers_500() {
        let mut st = State::default();
        let kind = Kind::named("resourceslices").unwrap();
        let slice = |name: &str| json!({"metadata": {"name": name}, "spec": {}});
        st.put(kind, slice("a")); // 1
        st.put(kind, slice("b")); // 2
        st.compact();
        st.put(kind, slice("c")); // 3
                                  // From the compaction's version or later: the changes after it.
        let (_, mut rx) = st
            .watch(&format!("{SLICES}?watch=true&resourceVersion=2"))
            .unwrap();
        assert_eq!(lines(&mut rx), ["ADDED c 3"]);
        // From before it: one ERROR event, a Status of code 410 reason Expired, then the end.
        let (_, mut rx) = st
            .watch(&format!("{SLICES}?watch=true&resourceVersion=1"))
            .unwrap();
        let error: Value = serde_json::from_slice(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(error["type"], "ERROR");
        assert_eq!(
            (&error["object"]["kind"], &error["object"]["code"]),
            (&json!("Status"), &json!(410))
        );
        assert_eq!(error["object"]["reason"], "Expired");
        assert_eq!(
            error["object"]["message"],
            "too old resource version: 1 (2)"
        );
        assert!(rx.try_recv().unwrap().is_empty(), "the watch ends");
        // Ending the open watches of a kind: an empty line, which ends each.
        let (_, mut open) = st
            .watch(&format!("{SLICES}?watch=true&resourceVersion=3"))
            .unwrap();
        st.end_watches(kind);
        assert!(open.try_recv().unwrap().is_empty());
        // Refused: lists and watches answer 500 until served again.
        st.refused
            .extend([(kind.plural, true), (kind.plural, false)]);
        assert_eq!(
            st.watch(&format!("{SLICES}?watch=true")).unwrap_err().0,
            500
        );
        assert_eq!(answer(&mut st, "GET", SLICES, &json!(null)).0, 500);
        st.refused.clear();
        let (code, list) = answer(&mut st, "GET", SLICES, &json!(null));
        assert_eq!(
            (code, &list["metadata"]["resourceVersion"]),
            (200, &json!("3"))
        );
        let calls: Vec<(bool, u16, &str)> = st
            .calls
            .iter()
            .map(|(_, c)| (c.watch, c.code, c.version.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                (true, 200, "2"),
                (true, 410, "1"),
                (true, 200, "3"),
                (true, 500, ""),
                (false, 500, ""),
                (false, 200, "3"),
            ]
        );
    }
}
