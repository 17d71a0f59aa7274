//! A copy of one kind of API object, kept by a list and then a watch, so that an admission
//! reads it without an API call: the webhook's own ResourceClaimTemplates, the cluster's
//! ResourceQuotas. The copy is trusted only while it is current: from a successful list, for
//! as long as its watch runs or resumes where it stopped (the API server ends each watch after
//! a few minutes); when a watch fails or its version has expired, the copy is listed anew after
//! a pause, and meanwhile readers are told to ask the API server (a copy that missed a change
//! must not admit past a budget).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

/// How long one watch request lasts before it is renewed (the API server's own limit is 5 to
/// 10 minutes).
const WATCH_SECONDS: u32 = 290;
/// The pause after a watch or a list failed, before the next list; also the shortest a watch
/// must last to be resumed rather than taken for a failure.
const RETRY: Duration = Duration::from_secs(1);

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

/// The objects of one kind by namespace and name, and whether they are current.
pub struct Mirror<K> {
    objects: RwLock<BTreeMap<Key, K>>,
    current: AtomicBool,
}

impl<K> Default for Mirror<K> {
    fn default() -> Self {
        Mirror {
            objects: RwLock::new(BTreeMap::new()),
            current: AtomicBool::new(false),
        }
    }
}

impl<K> Mirror<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts following the objects of `api` that carry `labels` (a label selector; `None`:
    /// all of them) in the background, for as long as the runtime runs. Needs a Tokio runtime.
    pub fn follow(api: Api<K>, labels: Option<String>) -> Arc<Mirror<K>> {
        let mirror = Arc::new(Mirror::default());
        let bg = Arc::clone(&mirror);
        tokio::spawn(async move {
            loop {
                bg.list_and_watch(&api, labels.as_deref()).await;
                bg.current.store(false, Ordering::SeqCst);
                tokio::time::sleep(RETRY).await;
            }
        });
        mirror
    }

    /// Lists the objects, then follows their changes, each watch resuming where the last one
    /// ended, until one fails.
    async fn list_and_watch(&self, api: &Api<K>, labels: Option<&str>) {
        let mut list = ListParams::default();
        // Bookmarks (on by default) keep the version moving while nothing changes, so that a
        // resumed watch does not start from one the API server has compacted away.
        let mut watch = WatchParams::default().timeout(WATCH_SECONDS);
        if let Some(labels) = labels {
            list = list.labels(labels);
            watch = watch.labels(labels);
        }
        let Ok(listed) = api.list(&list).await else {
            return;
        };
        let mut version = listed.metadata.resource_version.clone().unwrap_or_default();
        if let Ok(mut m) = self.objects.write() {
            *m = listed.items.into_iter().map(|o| (key(&o), o)).collect();
        }
        loop {
            let began = Instant::now();
            let Ok(stream) = api.watch(&watch, &version).await else {
                return;
            };
            self.current.store(true, Ordering::SeqCst);
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else {
                    return;
                };
                let Ok(mut m) = self.objects.write() else {
                    return;
                };
                match apply(&mut m, event) {
                    Some(v) => version = v,
                    None => return,
                }
            }
            // The API server ended the watch at its timeout: the copy is as current as the
            // version reached, and the next watch starts from it. One that ended at once is
            // taken for a failure (listed anew after the pause), so no loop asks the API server
            // without a pause.
            if began.elapsed() < RETRY {
                return;
            }
        }
    }

    /// What `f` finds in the copy, or `None` while it is not current (ask the API server).
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<Key, K>) -> R) -> Option<R> {
        if !self.current.load(Ordering::SeqCst) {
            return None;
        }
        let m = self.objects.read().ok()?;
        Some(f(&m))
    }

    /// The objects of `namespace`, or `None` while the copy is not current.
    pub fn in_namespace(&self, namespace: &str) -> Option<Vec<K>> {
        self.read(|m| {
            m.range((namespace.to_string(), String::new())..)
                .take_while(|((ns, _), _)| ns == namespace)
                .map(|(_, o)| o.clone())
                .collect()
        })
    }
}

/// Applies one watch event to `objects`: the resourceVersion it brings the copy to, or
/// `None` when it ends the watch (an error event: a failure, or a version that expired).
fn apply<K: Resource>(objects: &mut BTreeMap<Key, K>, event: WatchEvent<K>) -> Option<String> {
    let version = |o: &K| o.meta().resource_version.clone().unwrap_or_default();
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => {
            let v = version(&o);
            objects.insert(key(&o), o);
            Some(v)
        }
        WatchEvent::Deleted(o) => {
            objects.remove(&key(&o));
            Some(version(&o))
        }
        WatchEvent::Bookmark(b) => Some(b.metadata.resource_version),
        WatchEvent::Error(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceQuota;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn quota(ns: &str, name: &str, rv: &str) -> ResourceQuota {
        ResourceQuota {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(v: Option<Vec<ResourceQuota>>) -> Option<Vec<String>> {
        v.map(|v| {
            v.iter()
                .map(|q| {
                    format!(
                        "{}@{}",
                        key(q).1,
                        q.metadata.resource_version.clone().unwrap()
                    )
                })
                .collect()
        })
    }

    #[test]
    fn events_change_the_copy_and_a_namespace_reads_only_its_own() {
        let m = Mirror::<ResourceQuota>::default();
        {
            let mut o = m.objects.write().unwrap();
            for e in [
                WatchEvent::Added(quota("team-a", "gpu", "1")),
                WatchEvent::Added(quota("team-a", "cpu", "2")),
                WatchEvent::Added(quota("team-ab", "gpu", "3")),
                WatchEvent::Added(quota("team", "gpu", "4")),
                WatchEvent::Modified(quota("team-a", "gpu", "5")),
                WatchEvent::Deleted(quota("team", "gpu", "6")),
            ] {
                assert!(apply(&mut o, e).is_some());
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
        let mut o = BTreeMap::new();
        assert_eq!(
            apply(&mut o, WatchEvent::Added(quota("a", "q", "7"))),
            Some("7".into())
        );
        assert_eq!(
            apply(&mut o, WatchEvent::Deleted(quota("a", "q", "9"))),
            Some("9".into())
        );
        assert!(o.is_empty());
        // A bookmark moves the version on without changing the copy.
        let bookmark: WatchEvent<ResourceQuota> = serde_json::from_value(serde_json::json!({
            "type": "BOOKMARK",
            "object": {"kind": "ResourceQuota", "apiVersion": "v1",
                       "metadata": {"resourceVersion": "12"}}
        }))
        .unwrap();
        assert_eq!(apply(&mut o, bookmark), Some("12".into()));
        assert!(o.is_empty());
    }

    #[test]
    fn an_error_event_ends_the_watch() {
        let mut o = BTreeMap::new();
        let s: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 410, "reason": "Expired", "message": "too old"
        }))
        .unwrap();
        assert_eq!(
            apply::<ResourceQuota>(&mut o, WatchEvent::Error(Box::new(s))),
            None
        );
    }
}
