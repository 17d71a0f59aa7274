//! The events that call for a namespace's recount at once (crate::budget::Recount), events
//! arriving within [`COALESCE`] of each other making one: a Pod or ResourceClaim deleted, or a
//! Pod done (Succeeded or Failed), in a namespace that may have a budget, frees its share, as
//! Kubernetes' own quota controller replenishes on a deletion; and a ResourceQuota naming a
//! budget whose `status.used` lacks one of its names (a new quota, a name added to `hard`)
//! refuses every charge until it is counted, as Kubernetes' own quota controller counts a new
//! quota at once. The Pods, ResourceClaims and ResourceQuotas of every namespace are watched as
//! a stream, nothing of them kept: a list of one object gives the version to start from, and
//! each watch resumes where the last one ended (crate::mirror::follow_from), after a pause when
//! one failed, so that an event while no watch ran is heard when one does. When the version
//! expired (410: the API server no longer holds the changes since), what changed meanwhile
//! cannot be told: after a pause the kind is listed anew for a version, and every namespace
//! with a budget recounted (docs/quotas.md, "Freeing").

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuslice_dra::quota::Budget;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::Resource;
use tokio::sync::Notify;

use crate::budget::{terminal, Ledger, Recount};
use crate::mirror::{follow_from, reached, watch_params, Ended, RETRY};
use crate::view::{list_page, Event, Viewed};

/// How long a triggered recount waits for more events, so that a burst of deletions (a job's
/// pods, a pod and its claims) makes one recount.
pub const COALESCE: Duration = Duration::from_millis(100);

/// A kind whose events may call for a recount of their namespace.
trait Recounted: Viewed + Resource<DynamicType = ()> + Send + Sync + 'static {
    /// What its events do, for the log: while its watch runs ...
    const AT_ONCE: &'static str;
    /// ... while it cannot be listed ...
    const UNLISTED: &'static str;
    /// ... and of the events while no watch runs.
    const MEANWHILE: &'static str;
    /// The namespace `event` calls for a recount of, if any (`ledger`: what the webhook
    /// watches of the quotas).
    fn due(event: &Event<Self>, ledger: &Ledger) -> Option<String>;
}

impl Recounted for Pod {
    const AT_ONCE: &'static str = "deletions free budgets at once";
    const UNLISTED: &'static str =
        "deletions are freed by the periodic budget recount until it can";
    const MEANWHILE: &'static str = "what is deleted meanwhile is freed once a watch resumes";
    fn due(event: &Event<Pod>, ledger: &Ledger) -> Option<String> {
        in_budget(frees(event, terminal), ledger)
    }
}

impl Recounted for ResourceClaim {
    const AT_ONCE: &'static str = "deletions free budgets at once";
    const UNLISTED: &'static str =
        "deletions are freed by the periodic budget recount until it can";
    const MEANWHILE: &'static str = "what is deleted meanwhile is freed once a watch resumes";
    /// A claim is never done while it exists.
    fn due(event: &Event<ResourceClaim>, ledger: &Ledger) -> Option<String> {
        in_budget(frees(event, |_| false), ledger)
    }
}

impl Recounted for ResourceQuota {
    const AT_ONCE: &'static str = "new quotas are counted at once";
    const UNLISTED: &'static str =
        "new quotas are counted by the periodic budget recount until it can";
    const MEANWHILE: &'static str = "a quota created meanwhile is counted once a watch resumes";
    /// The event itself shows the budget: no need to ask the watched copy, which may not have
    /// had it yet.
    fn due(event: &Event<ResourceQuota>, ledger: &Ledger) -> Option<String> {
        match event {
            Event::Put(Ok(q)) if uncounted(q, ledger.hami_compat()) => q.metadata.namespace.clone(),
            _ => None,
        }
    }
}

/// Whether quota `q` names a budget whose `status.used` lacks one of its names: admissions
/// refuse to book on it until a recount writes them (gpuslice_dra::quota::Line::counted).
/// `hami_compat`: the webhook counts HAMi's names (where its namespace is labelled; a quota of
/// HAMi's names elsewhere is recounted for nothing, and written nothing).
fn uncounted(q: &ResourceQuota, hami_compat: bool) -> bool {
    Budget::read(q, hami_compat)
        .ok()
        .flatten()
        .is_some_and(|b| !b.counted())
}

/// `ns` where its namespace may have a budget; `None` also when not even the namespace of the
/// object could be read (left to the periodic recount).
fn in_budget(ns: Option<Option<String>>, ledger: &Ledger) -> Option<String> {
    ns.flatten().filter(|ns| ledger.may_have_budget(ns))
}

/// The recounts due: of every namespace with a budget, or of some.
#[derive(Default, Debug, PartialEq, Eq)]
struct Pending {
    /// Every namespace with a budget (events were missed: their namespaces are unknown).
    every: bool,
    namespaces: BTreeSet<String>,
}

/// The recounts due, and the wake-up of the task that runs them.
#[derive(Default)]
struct Due {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl Due {
    fn push(&self, ns: String) {
        if let Ok(mut p) = self.pending.lock() {
            p.namespaces.insert(ns);
        }
        self.wake.notify_one();
    }

    fn push_every(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.every = true;
        }
        self.wake.notify_one();
    }

    fn take(&self) -> Pending {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }
}

/// The namespace an event may free a budget in, if it may: a deletion, or an object put that
/// is `done` (holds nothing any more though it exists) or cannot be read (what it holds is
/// unknown).
fn frees<K: Resource>(event: &Event<K>, done: impl Fn(&K) -> bool) -> Option<Option<String>> {
    match event {
        Event::Deleted(Ok(o)) => Some(o.meta().namespace.clone()),
        Event::Put(Ok(o)) if done(o) => Some(o.meta().namespace.clone()),
        Event::Deleted(Err(e)) | Event::Put(Err(e)) => Some(e.object.namespace.clone()),
        _ => None,
    }
}

/// Follows the deletions and the quotas of every namespace and recounts, for as long as the
/// runtime runs, each namespace they call for a recount of (while `recount` leads:
/// crate::budget::Recount).
pub async fn follow(recount: Arc<Recount>) {
    let due = Arc::new(Due::default());
    let ledger = recount.ledger().clone();
    tokio::spawn(watch::<Pod>(ledger.clone(), Arc::clone(&due)));
    tokio::spawn(watch::<ResourceClaim>(ledger.clone(), Arc::clone(&due)));
    tokio::spawn(watch::<ResourceQuota>(ledger, Arc::clone(&due)));
    loop {
        due.wake.notified().await;
        tokio::time::sleep(COALESCE).await;
        let pending = due.take();
        if pending.every {
            // Each namespace's recount is part of it.
            if let Err(e) = recount.every_now().await {
                eprintln!("gpuslice webhook: budget recount: {e}");
            }
            continue;
        }
        for ns in pending.namespaces {
            if let Err(e) = recount.namespace_now(&ns).await {
                eprintln!("gpuslice webhook: budget recount of namespace {ns}: {e}");
            }
        }
    }
}

/// What the log says when the watch of the `kind`s from `version` ended as `ended`, and what
/// follows (`meanwhile`: what becomes of the events while no watch runs).
fn ended_line(kind: &str, version: &str, ended: &Ended, meanwhile: &str) -> String {
    match ended {
        Ended::Expired(why) => format!(
            "gpuslice webhook: the watch of the {kind}s from version {version:?} expired ({why}): \
             listing them again in {RETRY:?}, then recounting every namespace with a budget"
        ),
        Ended::Failed(why) => format!(
            "gpuslice webhook: cannot watch the {kind}s from version {version:?} ({why}): \
             trying again every {RETRY:?}; {meanwhile}"
        ),
        Ended::Stopped => format!(
            "gpuslice webhook: the watch of the {kind}s from version {version:?} ended: \
             trying again in {RETRY:?}"
        ),
    }
}

/// Watches the objects of kind `K` in every namespace, pushing onto `due` each namespace an
/// event calls for a recount of ([`Recounted::due`]). A watch that fails is resumed from the
/// version reached after a pause; one whose version expired is followed, after a pause, by a list for a version (each
/// list that fails by another pause) and a recount of every namespace with a budget. The first
/// failure after a watch opened (or of the first list) is logged, and the watch's return.
async fn watch<K: Recounted>(ledger: Ledger, due: Arc<Due>) {
    let client = ledger.cluster().client();
    // Where the next watch resumes: `None` at the start and once the version expired.
    let mut resume: Option<String> = None;
    // Whether a list gave a version before: a later one follows a watch that expired.
    let mut listed = false;
    let mut failing = false;
    loop {
        let mut version = match resume.take() {
            Some(v) => v,
            // One object is enough: the list's version is where the watch starts.
            None => {
                match list_page::<K, ()>(&client, None, &ListParams::default().limit(1), |_| None)
                    .await
                {
                    Ok(page) => {
                        if listed {
                            // The events between the version that expired and this one are lost:
                            // every namespace they may have called for is recounted.
                            due.push_every();
                        }
                        listed = true;
                        page.version.unwrap_or_default()
                    }
                    Err(e) => {
                        if !failing {
                            eprintln!(
                            "gpuslice webhook: cannot list the {}s to watch them ({e}): trying again every {RETRY:?}; {}",
                            K::KIND,
                            K::UNLISTED
                        );
                            failing = true;
                        }
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
        };
        let from = version.clone();
        let ended = follow_from::<K>(
            &client,
            &watch_params(),
            &mut version,
            || {
                if failing {
                    eprintln!(
                        "gpuslice webhook: watching the {}s again: {}",
                        K::KIND,
                        K::AT_ONCE
                    );
                }
                failing = false;
            },
            |event| {
                if let Some(ns) = K::due(&event, &ledger) {
                    due.push(ns);
                }
                reached(&event)
            },
        )
        .await;
        if !failing {
            let at = if version.is_empty() {
                from
            } else {
                version.clone()
            };
            eprintln!("{}", ended_line(K::KIND, &at, &ended, K::MEANWHILE));
            failing = true;
        }
        if !matches!(ended, Ended::Expired(_)) {
            resume = Some(version);
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::read_event;

    fn line(kind: &str, object: serde_json::Value) -> Vec<u8> {
        serde_json::json!({"type": kind, "object": object})
            .to_string()
            .into_bytes()
    }

    fn pod(phase: &str, rv: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "team", "name": "p", "resourceVersion": rv},
            "spec": {"containers": []}, "status": {"phase": phase}})
    }

    #[test]
    fn a_deletion_or_a_pod_done_frees_its_namespace_and_nothing_else_does() {
        let heard = |kind: &str, o: serde_json::Value| {
            let e = read_event::<Pod>(&line(kind, o)).unwrap();
            (frees(&e, terminal), reached(&e))
        };
        let team = Some(Some("team".to_string()));
        assert_eq!(
            heard("DELETED", pod("Running", "5")),
            (team.clone(), Some(Some("5".into())))
        );
        assert_eq!(
            heard("MODIFIED", pod("Succeeded", "6")),
            (team.clone(), Some(Some("6".into())))
        );
        assert_eq!(heard("MODIFIED", pod("Failed", "7")).0, team.clone());
        assert_eq!(
            heard("MODIFIED", pod("Running", "8")),
            (None, Some(Some("8".into())))
        );
        assert_eq!(heard("ADDED", pod("Pending", "9")).0, None);
        // A pod that cannot be read: what it holds is unknown; the version stays.
        let odd = serde_json::json!({"metadata": {"namespace": "team", "name": "p"},
            "spec": {"resourceClaims": 5}});
        assert_eq!(heard("MODIFIED", odd), (team.clone(), Some(None)));
        // A claim is never done while it exists.
        let claim = serde_json::json!({"metadata": {"namespace": "team", "name": "c",
            "resourceVersion": "3"}, "spec": {}});
        let e = read_event::<ResourceClaim>(&line("MODIFIED", claim.clone())).unwrap();
        assert_eq!(frees(&e, |_| false), None);
        let e = read_event::<ResourceClaim>(&line("DELETED", claim)).unwrap();
        assert_eq!(frees(&e, |_| false), team);
        // An error ends the watch (listed anew).
        let status = serde_json::json!({"kind": "Status", "code": 410, "message": "too old"});
        assert_eq!(heard("ERROR", status), (None, None));
    }

    #[test]
    fn a_quota_not_yet_counted_is_due_and_one_counted_is_not() {
        let quota = |used: serde_json::Value| -> ResourceQuota {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "team", "name": "gpu", "resourceVersion": "4"},
                "spec": {"hard": {"limits.gpuslice.io/memory": "80Gi", "pods": "10"}},
                "status": {"used": used}}))
            .unwrap()
        };
        // New: nothing in used; the API server's own names counted but not gpuslice's.
        assert!(uncounted(&quota(serde_json::json!({})), false));
        assert!(uncounted(&quota(serde_json::json!({"pods": "3"})), false));
        // Counted, 0 included.
        let counted = quota(serde_json::json!({"limits.gpuslice.io/memory": "0"}));
        assert!(!uncounted(&counted, false));
        // HAMi's names are not counted by a webhook without --hami-compat: nothing to wait for.
        let hami: ResourceQuota = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "team", "name": "hami"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "10240"}}}))
        .unwrap();
        assert!(!uncounted(&hami, false));
        assert!(uncounted(&hami, true));
    }

    #[test]
    fn namespaces_due_are_taken_once_each() {
        let due = Due::default();
        for ns in ["b", "a", "b"] {
            due.push(ns.to_string());
        }
        let p = due.take();
        assert_eq!(p.namespaces.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(!p.every);
        assert_eq!(due.take(), Pending::default());
        due.push_every();
        assert!(due.take().every);
        assert_eq!(due.take(), Pending::default());
    }

    #[test]
    fn the_log_names_how_the_watch_ended_where_and_the_pause() {
        let expired = ended_line(
            "Pod",
            "41",
            &Ended::Expired("too old resource version: 41 (57)".into()),
            Pod::MEANWHILE,
        );
        assert_eq!(
            expired,
            "gpuslice webhook: the watch of the Pods from version \"41\" expired (too old resource \
             version: 41 (57)): listing them again in 1s, then recounting every namespace with a \
             budget"
        );
        let failed = ended_line(
            "ResourceClaim",
            "7",
            &Ended::Failed("connection refused".into()),
            ResourceClaim::MEANWHILE,
        );
        assert!(
            failed.contains("ResourceClaims from version \"7\" (connection refused)")
                && failed.contains("trying again every 1s")
                && failed.ends_with("what is deleted meanwhile is freed once a watch resumes"),
            "{failed}"
        );
    }
}
