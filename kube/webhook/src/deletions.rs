//! The events that free a namespace's budget at once, as Kubernetes' own quota controller
//! replenishes on a deletion: a Pod or ResourceClaim deleted, or a Pod done (Succeeded or
//! Failed), in a namespace that may have a budget, triggers a recount of that namespace alone
//! (crate::budget::Recount), events arriving within [`COALESCE`] of each other making one. The
//! Pods and ResourceClaims of every namespace are watched as a stream, nothing of them kept: a
//! list of one object gives the version to start from, and each watch resumes where the last one
//! ended (crate::mirror::follow_from); a watch that fails, or whose version expired, starts
//! again from a new list after a pause, and meanwhile, as for any event it missed, the periodic
//! recount frees what was deleted (docs/quotas.md, "Freeing").

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::Resource;
use tokio::sync::Notify;

use crate::budget::{terminal, Ledger, Recount};
use crate::mirror::{follow_from, reached, watch_params, RETRY};
use crate::view::{list_page, Event, Viewed};

/// How long a triggered recount waits for more events, so that a burst of deletions (a job's
/// pods, a pod and its claims) makes one recount.
pub const COALESCE: Duration = Duration::from_millis(100);

/// A kind whose events may free a budget.
trait Frees: Viewed + Resource<DynamicType = ()> + Send + Sync + 'static {
    /// Whether the object, as it is now, holds nothing any more though it exists.
    fn done(&self) -> bool;
}

impl Frees for Pod {
    fn done(&self) -> bool {
        terminal(self)
    }
}

impl Frees for ResourceClaim {
    fn done(&self) -> bool {
        false
    }
}

/// The namespaces whose recount is due, and the wake-up of the task that recounts them.
#[derive(Default)]
struct Due {
    namespaces: Mutex<BTreeSet<String>>,
    wake: Notify,
}

impl Due {
    fn push(&self, ns: String) {
        if let Ok(mut n) = self.namespaces.lock() {
            n.insert(ns);
        }
        self.wake.notify_one();
    }

    fn take(&self) -> BTreeSet<String> {
        self.namespaces
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default()
    }
}

/// The namespace an event may free a budget in, if it may: a deletion, or an object put that
/// is done or cannot be read (what it holds is unknown).
fn frees<K: Frees>(event: &Event<K>) -> Option<Option<String>> {
    match event {
        Event::Deleted(Ok(o)) => Some(o.meta().namespace.clone()),
        Event::Put(Ok(o)) if o.done() => Some(o.meta().namespace.clone()),
        Event::Deleted(Err(e)) | Event::Put(Err(e)) => Some(e.object.namespace.clone()),
        _ => None,
    }
}

/// Follows the deletions of every namespace and recounts, for as long as the runtime runs,
/// each namespace they may free a budget in (while `recount` leads: crate::budget::Recount).
pub async fn follow(recount: Arc<Recount>) {
    let due = Arc::new(Due::default());
    let ledger = recount.ledger().clone();
    tokio::spawn(watch::<Pod>(ledger.clone(), Arc::clone(&due)));
    tokio::spawn(watch::<ResourceClaim>(ledger, Arc::clone(&due)));
    loop {
        due.wake.notified().await;
        tokio::time::sleep(COALESCE).await;
        for ns in due.take() {
            if let Err(e) = recount.namespace_now(&ns).await {
                eprintln!("gpuslice webhook: budget recount of namespace {ns}: {e}");
            }
        }
    }
}

/// Watches the objects of kind `K` in every namespace, pushing onto `due` each namespace an
/// event may free a budget in; lists anew after a pause when a watch fails. The first failure
/// after a watch ran (or of the first list) is logged, and the watch's return.
async fn watch<K: Frees>(ledger: Ledger, due: Arc<Due>) {
    let client = ledger.cluster().client();
    let mut failing = false;
    loop {
        // One object is enough: the list's version is where the watch starts.
        let listed = list_page::<K>(&client, None, &ListParams::default().limit(1)).await;
        match listed {
            Ok(page) => {
                let mut opened = false;
                follow_from::<K>(
                    &client,
                    &watch_params(),
                    page.version.unwrap_or_default(),
                    || {
                        if failing {
                            eprintln!(
                                "gpuslice webhook: watching the {}s again: deletions free budgets at once",
                                K::KIND
                            );
                        }
                        failing = false;
                        opened = true;
                    },
                    |event| {
                        if let Some(ns) = frees(&event) {
                            match ns {
                                Some(ns) if ledger.may_have_budget(&ns) => due.push(ns),
                                Some(_) => {}
                                // Not even its namespace could be read: left to the periodic
                                // recount.
                                None => {}
                            }
                        }
                        reached(&event)
                    },
                )
                .await;
                if !failing && !opened {
                    eprintln!(
                        "gpuslice webhook: cannot watch the {}s: deletions are freed by the periodic budget recount until it can",
                        K::KIND
                    );
                    failing = true;
                }
            }
            Err(e) => {
                if !failing {
                    eprintln!(
                        "gpuslice webhook: cannot list the {}s to watch them ({e}): deletions are freed by the periodic budget recount until it can",
                        K::KIND
                    );
                    failing = true;
                }
            }
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
            (frees(&e), reached(&e))
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
            "spec": {"containers": 5}});
        assert_eq!(heard("MODIFIED", odd), (team.clone(), Some(None)));
        // A claim is never done while it exists.
        let claim = serde_json::json!({"metadata": {"namespace": "team", "name": "c",
            "resourceVersion": "3"}, "spec": {}});
        let e = read_event::<ResourceClaim>(&line("MODIFIED", claim.clone())).unwrap();
        assert_eq!(frees(&e), None);
        let e = read_event::<ResourceClaim>(&line("DELETED", claim)).unwrap();
        assert_eq!(frees(&e), team);
        // An error ends the watch (listed anew).
        let status = serde_json::json!({"kind": "Status", "code": 410, "message": "too old"});
        assert_eq!(heard("ERROR", status), (None, None));
    }

    #[test]
    fn namespaces_due_are_taken_once_each() {
        let due = Due::default();
        for ns in ["b", "a", "b"] {
            due.push(ns.to_string());
        }
        assert_eq!(due.take().into_iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(due.take().is_empty());
    }
}
