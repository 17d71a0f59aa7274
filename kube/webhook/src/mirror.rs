//! A copy of one kind of API object, kept by a list and then a watch, so that an admission
//! reads it without an API call: the webhook's own ResourceClaimTemplates, the cluster's
//! ResourceQuotas. The copy is trusted only while it is current: from a successful list, for
//! as long as its watch runs or resumes where it stopped (the API server ends each watch after
//! a few minutes); when a watch fails or its version has expired, the copy is listed anew after
//! a pause, and meanwhile readers are told to ask the API server (a copy that missed a change
//! must not admit past a budget). Objects are read through their views (crate::view): one that
//! cannot be read is named in the log once and left out of the copy, which stays current for
//! the others; the copy remembers which objects it left out, so that a reader that must see
//! every object of a namespace (its quotas) asks the API server for that namespace. Of each
//! object the copy keeps what its kind's [`Kept`] keeps: the quotas whole; of the templates
//! only the few facts of those the webhook may have written (crate::cluster::Written), any
//! other being ignored with one line in the log; a list is read a page at a time, each object
//! turned into what is kept of it as it is read (crate::view::list_page).

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kube::api::{ListParams, WatchParams};
use kube::Resource;

use crate::view::{list_page, Event, Page, ViewError, Viewed, Watch, PAGE};

/// How long one watch request lasts before it is renewed (the API server's own limit is 5 to
/// 10 minutes).
const WATCH_SECONDS: u32 = 290;
/// The pause after a watch or a list failed, before the next list; also the shortest a watch
/// must last to be resumed rather than taken for a failure.
pub(crate) const RETRY: Duration = Duration::from_secs(1);
/// An object's namespace and name: the copy's key.
pub type Key = (String, String);

/// The key of `o`.
pub fn key<K: Resource>(o: &K) -> Key {
    let meta = o.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The key of an object that could not be read, `None` when not even its name could be.
fn unread_key(e: &ViewError) -> Option<Key> {
    Some((
        e.object.namespace.clone().unwrap_or_default(),
        e.object.name.clone()?,
    ))
}

fn left_out(e: &ViewError) {
    eprintln!(
        "gpuslice webhook: left out of the watched copy (read from the API server instead): {e}"
    );
}

/// What a copy keeps of each object of kind `K` it reads.
pub trait Kept<K>: Sized {
    /// What is kept of `o`, or why it is ignored (not kept: the copy holds nothing of it).
    fn keep(o: K) -> Result<Self, String>;
}

/// An object kept whole.
impl<K> Kept<K> for K {
    fn keep(o: K) -> Result<K, String> {
        Ok(o)
    }
}

/// What is kept of `o`, `None` when it is ignored: the first object ignored (`noted` still
/// false) is named in the log.
fn kept<K: Viewed + Resource, S: Kept<K>>(o: K, noted: &AtomicBool) -> Option<S> {
    let named = key(&o);
    match S::keep(o) {
        Ok(s) => Some(s),
        Err(why) => {
            if !noted.swap(true, Ordering::SeqCst) {
                eprintln!(
                    "gpuslice webhook: {} {}/{} is ignored by the watched copy: {why}; any other \
                     ignored is not logged",
                    K::KIND,
                    named.0,
                    named.1
                );
            }
            None
        }
    }
}

/// The objects read by namespace and name, and the keys of those that could not be.
struct Held<K> {
    objects: BTreeMap<Key, K>,
    unread: BTreeSet<Key>,
}

impl<K> Default for Held<K> {
    fn default() -> Self {
        Held {
            objects: BTreeMap::new(),
            unread: BTreeSet::new(),
        }
    }
}

impl<S> Held<S> {
    /// Adds one page of a list (what is kept of each object, by its key), naming in the log
    /// each object left out that is not in `known` (those the copy it replaces left out
    /// already); false when an object of it cannot even be named (the copy cannot tell which
    /// object it left out).
    fn take_page(&mut self, page: Page<(Key, S)>, known: &BTreeSet<Key>) -> bool {
        self.objects.extend(page.objects);
        for e in page.unread {
            let Some(k) = unread_key(&e) else {
                left_out(&e);
                return false;
            };
            if !known.contains(&k) {
                left_out(&e);
            }
            self.unread.insert(k);
        }
        true
    }

    /// Applies one watch event of an object of kind `K`, keeping what `S` keeps of it (one
    /// ignored leaves the copy: [`kept`]): the resourceVersion it brings the copy to
    /// ([`reached`]), or `None` when it ends the watch (an error event, or an object that
    /// cannot even be named).
    fn apply<K>(&mut self, event: Event<K>, noted: &AtomicBool) -> Option<Option<String>>
    where
        K: Viewed + Resource,
        S: Kept<K>,
    {
        let version = reached(&event)?;
        match event {
            Event::Put(Ok(o)) => {
                let k = key(&o);
                self.unread.remove(&k);
                match kept::<K, S>(o, noted) {
                    Some(s) => self.objects.insert(k, s),
                    None => self.objects.remove(&k),
                };
            }
            Event::Deleted(Ok(o)) => {
                let k = key(&o);
                self.unread.remove(&k);
                self.objects.remove(&k);
            }
            Event::Put(Err(e)) => {
                let k = unread_key(&e)?;
                self.objects.remove(&k);
                if self.unread.insert(k) {
                    left_out(&e);
                }
            }
            Event::Deleted(Err(e)) => {
                let k = unread_key(&e)?;
                self.objects.remove(&k);
                self.unread.remove(&k);
            }
            Event::Bookmark(_) | Event::Error(_) => {}
        }
        Some(version)
    }
}

/// The resourceVersion a watch event brings its follower to: `Some(None)` when the version
/// stays (an object that cannot be read: the event is seen again if the next watch resumes
/// before it; a bookmark without a version, as a watch from "" would start anew), `None` when
/// the event ends the watch (an error event).
pub(crate) fn reached<K: Resource>(event: &Event<K>) -> Option<Option<String>> {
    let version = |o: &K| o.meta().resource_version.clone().filter(|v| !v.is_empty());
    match event {
        Event::Put(Ok(o)) | Event::Deleted(Ok(o)) => Some(version(o)),
        Event::Put(Err(_)) | Event::Deleted(Err(_)) => Some(None),
        Event::Bookmark(v) => Some(Some(v.clone()).filter(|v| !v.is_empty())),
        Event::Error(_) => None,
    }
}

/// The parameters of each watch: renewed after [`WATCH_SECONDS`]. Bookmarks (on by default)
/// keep the version moving while nothing changes, so that a resumed watch does not start from
/// one the API server has compacted away.
pub(crate) fn watch_params() -> WatchParams {
    WatchParams::default().timeout(WATCH_SECONDS)
}

/// How [`follow_from`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The version it named expired (410, as an ERROR event or an answer: the API server
    /// compacted the changes since): what changed since is lost, the follower lists anew.
    Expired(String),
    /// A watch failed (why): the next may resume from the version reached, after a pause.
    Failed(String),
    /// `apply` ended it.
    Stopped,
}

/// The code of a `Status` telling a watch its version expired (reason `Expired` or `Gone`).
const GONE: u16 = 410;

/// Follows the changes of the objects of kind `K` that `params` selects from resourceVersion
/// `version`, each watch resuming where the last one ended, until one fails or `apply` ends it
/// (then `version` is the one reached): `opened` is called each time a watch is open, `apply`
/// with each event but an error, returning the resourceVersion it brings the follower to
/// (`Some(None)`: the version stays; `None`: the watch ends).
pub(crate) async fn follow_from<K: Viewed + Resource<DynamicType = ()>>(
    client: &kube::Client,
    params: &WatchParams,
    version: &mut String,
    mut opened: impl FnMut(),
    mut apply: impl FnMut(Event<K>) -> Option<Option<String>>,
) -> Ended {
    loop {
        let began = Instant::now();
        let mut events = match Watch::start::<K>(client, params, version).await {
            Ok(events) => events,
            Err(kube::Error::Api(s)) if s.code == GONE => return Ended::Expired(s.message),
            Err(e) => return Ended::Failed(e.to_string()),
        };
        opened();
        while let Some(event) = events.next::<K>().await {
            let event = match event {
                Ok(Event::Error(s)) if s.code == GONE => return Ended::Expired(s.message),
                Ok(Event::Error(s)) => return Ended::Failed(s.message),
                Ok(event) => event,
                Err(e) => return Ended::Failed(format!("a line that is no watch event: {e}")),
            };
            match apply(event) {
                Some(Some(v)) => *version = v,
                Some(None) => {}
                None => return Ended::Stopped,
            }
        }
        // The API server ended the watch at its timeout: the follower is as current as the
        // version reached, and the next watch starts from it. One that ended at once is taken
        // for a failure (tried again after the pause), so no loop asks the API server without
        // a pause.
        if began.elapsed() < RETRY {
            return Ended::Failed(format!("the watch ended within {RETRY:?}"));
        }
    }
}

/// What is kept (`S`) of the objects of one kind (`K`) by namespace and name, and whether
/// it is current.
pub struct Mirror<K, S = K> {
    copy: RwLock<Held<S>>,
    current: AtomicBool,
    /// Whether an object ignored was named in the log ([`kept`]).
    noted: Arc<AtomicBool>,
    kind: PhantomData<fn() -> K>,
}

impl<K, S> Default for Mirror<K, S> {
    fn default() -> Self {
        Mirror {
            copy: RwLock::new(Held::default()),
            current: AtomicBool::new(false),
            noted: Arc::new(AtomicBool::new(false)),
            kind: PhantomData,
        }
    }
}

impl<K, S> Mirror<K, S>
where
    K: Viewed + Resource<DynamicType = ()> + Send + Sync + 'static,
    S: Kept<K> + Clone + Send + Sync + 'static,
{
    /// Starts following the objects of kind `K` in every namespace that carry `labels` (a label
    /// selector; `None`: all of them) in the background, for as long as the runtime runs.
    /// Needs a Tokio runtime.
    pub fn follow(client: kube::Client, labels: Option<String>) -> Arc<Mirror<K, S>> {
        let mirror = Arc::new(Mirror::default());
        let bg = Arc::clone(&mirror);
        tokio::spawn(async move {
            loop {
                bg.list_and_watch(&client, labels.as_deref()).await;
                bg.current.store(false, Ordering::SeqCst);
                tokio::time::sleep(RETRY).await;
            }
        });
        mirror
    }

    /// Lists the objects, then follows their changes, each watch resuming where the last one
    /// ended, until one fails.
    async fn list_and_watch(&self, client: &kube::Client, labels: Option<&str>) {
        let mut list = ListParams::default().limit(PAGE);
        let mut watch = watch_params();
        if let Some(labels) = labels {
            list = list.labels(labels);
            watch = watch.labels(labels);
        }
        let Some(mut version) = self.list(client, list).await else {
            return;
        };
        // However it ends, the copy is listed anew: it may have missed a change.
        let _ = follow_from::<K>(
            client,
            &watch,
            &mut version,
            || self.current.store(true, Ordering::SeqCst),
            |event| self.copy.write().ok()?.apply(event, &self.noted),
        )
        .await;
    }

    /// Lists the objects page by page into a new copy, which then replaces the old one: the
    /// list's resourceVersion, or `None` when the list failed.
    async fn list(&self, client: &kube::Client, mut params: ListParams) -> Option<String> {
        let known = self.copy.read().ok()?.unread.clone();
        let mut held = Held::default();
        loop {
            let noted = Arc::clone(&self.noted);
            let keep = move |o: K| Some((key(&o), kept::<K, S>(o, &noted)?));
            let page = list_page(client, None, &params, keep).await.ok()?;
            let (next, version) = (page.next.clone(), page.version.clone());
            if !held.take_page(page, &known) {
                return None;
            }
            match next {
                Some(c) => params = params.continue_token(&c),
                None => {
                    *self.copy.write().ok()? = held;
                    return Some(version.unwrap_or_default());
                }
            }
        }
    }

    /// What `f` finds in the copy, or `None` while it is not current (ask the API server). An
    /// object that could not be read is not in it.
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<Key, S>) -> R) -> Option<R> {
        if !self.current.load(Ordering::SeqCst) {
            return None;
        }
        let c = self.copy.read().ok()?;
        Some(f(&c.objects))
    }

    /// The objects of `namespace`, or `None` while the copy is not current or holds an object
    /// of that namespace it could not read (the namespace's objects must then be asked of the
    /// API server, which names the one that cannot be read).
    pub fn in_namespace(&self, namespace: &str) -> Option<Vec<S>> {
        if !self.current.load(Ordering::SeqCst) {
            return None;
        }
        let c = self.copy.read().ok()?;
        let from = (namespace.to_string(), String::new());
        if c.unread
            .range(from.clone()..)
            .next()
            .is_some_and(|(ns, _)| ns == namespace)
        {
            return None;
        }
        Some(
            c.objects
                .range(from..)
                .take_while(|((ns, _), _)| ns == namespace)
                .map(|(_, o)| o.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::tests::nested;
    use crate::view::{read_event, read_list};
    use k8s_openapi::api::core::v1::ResourceQuota;
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    use serde_json::json;

    fn quota(ns: &str, name: &str, rv: &str) -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {
            "namespace": ns, "name": name, "resourceVersion": rv}}))
        .unwrap()
    }

    fn names<K: Resource>(v: Option<Vec<K>>) -> Option<Vec<String>> {
        v.map(|v| {
            v.iter()
                .map(|q| {
                    let rv = q.meta().resource_version.clone().unwrap_or_default();
                    format!("{}@{rv}", key(q).1)
                })
                .collect()
        })
    }

    fn line(kind: &str, object: &str) -> Vec<u8> {
        format!(r#"{{"type": "{kind}", "object": {object}}}"#).into_bytes()
    }

    fn current<K>(copy: Held<K>) -> Mirror<K> {
        Mirror {
            copy: RwLock::new(copy),
            current: AtomicBool::new(true),
            ..Mirror::default()
        }
    }

    /// A page of objects kept whole, by key.
    fn keyed<K: Resource>(page: Page<K>) -> Page<(Key, K)> {
        Page {
            objects: page.objects.into_iter().map(|o| (key(&o), o)).collect(),
            unread: page.unread,
            next: page.next,
            version: page.version,
        }
    }

    /// The log-once flag of a copy built by hand.
    static NOTED: AtomicBool = AtomicBool::new(false);

    #[test]
    fn events_change_the_copy_and_a_namespace_reads_only_its_own() {
        let m = Mirror::<ResourceQuota>::default();
        {
            let mut c = m.copy.write().unwrap();
            for e in [
                Event::Put(Ok(quota("team-a", "gpu", "1"))),
                Event::Put(Ok(quota("team-a", "cpu", "2"))),
                Event::Put(Ok(quota("team-ab", "gpu", "3"))),
                Event::Put(Ok(quota("team", "gpu", "4"))),
                Event::Put(Ok(quota("team-a", "gpu", "5"))),
                Event::Deleted(Ok(quota("team", "gpu", "6"))),
            ] {
                assert!(c.apply(e, &NOTED).is_some());
            }
        }
        // Not current yet: the caller must ask the API server.
        assert_eq!(names(m.in_namespace("team-a")), None);
        m.current.store(true, Ordering::SeqCst);
        assert_eq!(
            names(m.in_namespace("team-a")),
            Some(vec!["cpu@2".into(), "gpu@5".into()])
        );
        assert_eq!(names(m.in_namespace("team-ab")), Some(vec!["gpu@3".into()]));
        assert_eq!(names(m.in_namespace("team")), Some(vec![]));
        assert_eq!(names(m.in_namespace("other")), Some(vec![]));
    }

    #[test]
    fn each_event_brings_the_version_the_next_watch_resumes_from() {
        let mut c = Held::<ResourceQuota>::default();
        let q = |rv: &str| serde_json::to_string(&quota("a", "q", rv)).unwrap();
        let mut apply = |l: Vec<u8>| c.apply(read_event::<ResourceQuota>(&l).unwrap(), &NOTED);
        assert_eq!(apply(line("ADDED", &q("7"))), Some(Some("7".into())));
        assert_eq!(apply(line("DELETED", &q("9"))), Some(Some("9".into())));
        // A bookmark moves the version on without changing the copy.
        let bookmark = r#"{"kind": "ResourceQuota", "apiVersion": "v1",
            "metadata": {"resourceVersion": "12"}}"#;
        assert_eq!(apply(line("BOOKMARK", bookmark)), Some(Some("12".into())));
        // One without a version moves nothing (a watch from "" would start anew).
        assert_eq!(apply(line("BOOKMARK", r#"{"metadata": {}}"#)), Some(None));
        // One that cannot be read leaves the version where it was.
        let odd = r#"{"metadata": {"namespace": "a", "name": "q"}, "spec": {"hard": 5}}"#;
        assert_eq!(apply(line("MODIFIED", odd)), Some(None));
        assert!(c.objects.is_empty());
    }

    #[test]
    fn an_error_event_or_one_naming_no_object_ends_the_watch() {
        let mut c = Held::<ResourceQuota>::default();
        let status = r#"{"kind": "Status", "status": "Failure", "code": 410,
            "reason": "Expired", "message": "too old"}"#;
        let e = read_event::<ResourceQuota>(&line("ERROR", status)).unwrap();
        assert!(
            matches!(&e, Event::Error(s) if s.message == "too old" && s.code == 410),
            "{e:?}"
        );
        assert_eq!(c.apply(e, &NOTED), None);
        // The copy cannot tell which object an unnamed one replaces.
        let e = read_event::<ResourceQuota>(&line("MODIFIED", r#"{"spec": 5}"#)).unwrap();
        assert_eq!(c.apply(e, &NOTED), None);
        // Nor is a line that is no event read as one.
        assert!(read_event::<ResourceQuota>(&line("RENAMED", "{}")).is_err());
        assert!(read_event::<ResourceQuota>(b"[1, 2]").is_err());
    }

    /// A template labelled as the webhook's: `config` its devices' configuration.
    fn template(name: &str, rv: &str, config: &str) -> String {
        format!(
            r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {{"namespace": "team", "name": "{name}", "resourceVersion": "{rv}",
                    "labels": {{"app.kubernetes.io/managed-by": "gpuslice-webhook"}}}},
                "spec": {{"spec": {{"devices": {{
                    "requests": [{{"name": "g", "exactly": {{"deviceClassName": "gpuslice.io"}}}}],
                    "config": {config}}}}}}}}}"#
        )
    }

    fn deep(name: &str, rv: &str) -> String {
        let other = format!(
            r#"[{{"opaque": {{"driver": "example.com", "parameters": {}}}}}]"#,
            nested(200)
        );
        template(name, rv, &other)
    }

    #[test]
    fn a_deep_template_in_a_list_page_and_in_a_watch_event_leaves_the_copy_current() {
        let unreadable = template("odd", "3", "5");
        let page = format!(
            r#"{{"kind": "ResourceClaimTemplateList", "metadata": {{"resourceVersion": "4"}},
                "items": [{}, {}, {unreadable}]}}"#,
            template("plain", "1", "[]"),
            deep("deep", "2"),
        );
        // kube's typed reading of the list (the copy's before) fails as a whole.
        assert!(
            serde_json::from_str::<kube::core::ObjectList<ResourceClaimTemplate>>(&page).is_err()
        );
        let page = read_list::<ResourceClaimTemplate>(&page).unwrap();
        assert_eq!(page.version.as_deref(), Some("4"));
        let mut c = Held::default();
        assert!(c.take_page(keyed(page), &BTreeSet::new()));
        let mut apply = |l: Vec<u8>| {
            let e = read_event::<ResourceClaimTemplate>(&l).unwrap();
            c.apply(e, &NOTED)
        };
        // So does its typed reading of an event.
        let added = line("ADDED", &deep("deeper", "5"));
        assert!(
            serde_json::from_slice::<kube::core::WatchEvent<ResourceClaimTemplate>>(&added)
                .is_err()
        );
        assert_eq!(apply(added), Some(Some("5".into())));
        // A template that becomes unreadable is left out, then back once readable again.
        assert_eq!(
            apply(line("MODIFIED", &template("plain", "6", "7"))),
            Some(None)
        );
        let m = current(c);
        let all = || m.read(|o| o.values().cloned().collect::<Vec<_>>());
        assert_eq!(names(all()), Some(vec!["deep@2".into(), "deeper@5".into()]));
        m.copy.write().unwrap().apply(
            Event::Put(ResourceClaimTemplate::read(&template("plain", "8", "[]"))),
            &NOTED,
        );
        assert_eq!(
            names(all()),
            Some(vec!["deep@2".into(), "deeper@5".into(), "plain@8".into()])
        );
        // The deep ones keep what a charge and the reuse check read.
        let deep = m
            .read(|o| o[&("team".into(), "deep".into())].clone())
            .unwrap();
        let devices = deep.spec.unwrap().spec.unwrap().devices.unwrap();
        assert_eq!(devices.requests.unwrap()[0].name, "g");
        assert_eq!(devices.config.unwrap().len(), 1);
    }

    #[test]
    fn a_namespace_holding_a_quota_that_cannot_be_read_is_asked_of_the_api_server() {
        let odd = r#"{"metadata": {"namespace": "team", "name": "odd", "resourceVersion": "2"},
            "spec": {"hard": 5}}"#;
        let text = format!(
            r#"{{"metadata": {{"resourceVersion": "3"}}, "items": [{}, {odd}, {}]}}"#,
            serde_json::to_string(&quota("team", "gpu", "1")).unwrap(),
            serde_json::to_string(&quota("other", "gpu", "1")).unwrap(),
        );
        let mut c = Held::default();
        assert!(c.take_page(
            keyed(read_list::<ResourceQuota>(&text).unwrap()),
            &BTreeSet::new()
        ));
        let m = current(c);
        // Its namespace's budgets would be read without it: the API server is asked.
        assert_eq!(names(m.in_namespace("team")), None);
        assert_eq!(names(m.in_namespace("other")), Some(vec!["gpu@1".into()]));
        // Once it is gone, the copy answers for its namespace again.
        let gone = read_event::<ResourceQuota>(&line("DELETED", odd)).unwrap();
        assert_eq!(m.copy.write().unwrap().apply(gone, &NOTED), Some(None));
        assert_eq!(names(m.in_namespace("team")), Some(vec!["gpu@1".into()]));
    }
}
