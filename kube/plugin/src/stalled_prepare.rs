//! Waking the kubelet for a pod whose claims it was refused on the node authorizer's race.
//! A kubelet reads a pod's ResourceClaims as soon as it sees the pod bound to its node; the API
//! server's node authorizer learns of the binding from its own watch, sometimes a few
//! milliseconds later, and refuses the read ("no relationship found between node …"). The
//! kubelet records FailedPrepareDynamicResources and, as that failure is not reported as a
//! sync error (kubernetes/kubernetes#139836), retries only at its next resync, 60 to 90 s on.
//! A change of the pod's annotations makes it sync the pod at once: this plugin sets
//! [`ANNOTATION`] on such a pod of its node, a few times at most, each after a short pause.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuslice_dra::api::WatchClient;
use gpuslice_dra::slices::{is_dns_label, is_dns_subdomain, MAX_NAME};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Patch, PatchParams, WatchEvent, WatchParams};
use kube::Api;
use serde_json::json;

use crate::api_watch::{watch_forever, Seen};

/// The kubelet's event reason when it could not prepare a pod's claims.
pub const REASON: &str = "FailedPrepareDynamicResources";
/// What the node authorizer's refusal says (kubernetes plugin/pkg/auth/authorizer/node).
pub const AUTHORIZER_RACE: &str = "no relationship found between node";
/// The pod annotation whose change wakes the kubelet; its value counts the wakes.
pub const ANNOTATION: &str = "dra.gpuslice.io/prepare-retries";
/// The pause before each wake (the first, the second, the third); after the last the kubelet's
/// own resync takes over. The authorizer is behind by milliseconds, and the kubelet's event
/// has taken longer than that to arrive here, so the first is short: every millisecond of it
/// is a millisecond the pod starts later.
pub const PAUSES: [Duration; 3] = [
    Duration::from_millis(20),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// The pod an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The pod to wake for `event`: a kubelet's FailedPrepareDynamicResources of `node` on a pod,
/// refused by the node authorizer; `None` for any other event.
pub fn pod_to_wake(event: &Event, node: &str) -> Option<PodRef> {
    if event.reason.as_deref() != Some(REASON) {
        return None;
    }
    let host = event.source.as_ref().and_then(|s| s.host.as_deref());
    if host != Some(node) && event.reporting_instance.as_deref() != Some(node) {
        return None;
    }
    if !event
        .message
        .as_deref()
        .is_some_and(|m| m.contains(AUTHORIZER_RACE))
    {
        return None;
    }
    let o = &event.involved_object;
    if o.kind.as_deref() != Some("Pod") {
        return None;
    }
    // Anyone allowed to post events can write these: they become a request's path and a log
    // line only when they are names a pod can have (a namespace is a DNS label).
    let (namespace, name) = (o.namespace.clone()?, o.name.clone()?);
    if !is_dns_label(&namespace) || !is_dns_subdomain(&name, MAX_NAME) {
        return None;
    }
    Some(PodRef {
        namespace,
        name,
        uid: o.uid.clone()?,
    })
}

/// Why a pod is left alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("it is another pod of that name now (uid {0})")]
    Replaced(String),
    #[error("it is on node {0:?}, not this one")]
    OtherNode(Option<String>),
    #[error("it is being deleted")]
    Deleting,
    #[error("it is past starting (phase {0})")]
    Started(String),
    #[error(
        "it was woken {0} times already (annotation {ANNOTATION}); the kubelet's resync takes over"
    )]
    Enough(String),
}

/// The number of the next wake of `pod` (1 for the first), when it is still the pod `want`
/// names, on `node`, not being deleted, not yet running and woken fewer than [`PAUSES`] times.
pub fn next_wake(pod: &Pod, want: &PodRef, node: &str) -> Result<usize, Skip> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if uid != want.uid {
        return Err(Skip::Replaced(uid));
    }
    let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if on.as_deref() != Some(node) {
        return Err(Skip::OtherNode(on));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(Skip::Deleting);
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if !phase.is_empty() && phase != "Pending" {
        return Err(Skip::Started(phase));
    }
    let done = match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
    {
        None => 0,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n < PAUSES.len() => n,
            _ => return Err(Skip::Enough(v.clone())),
        },
    };
    Ok(done + 1)
}

/// The merge patch of wake `n`: the annotation, and the pod's uid, which the API server
/// refuses to change (so a pod of the same name made since is not touched).
pub fn wake_patch(uid: &str, n: usize) -> serde_json::Value {
    json!({"metadata": {"uid": uid, "annotations": {ANNOTATION: n.to_string()}}})
}

/// Watches the kubelet's FailedPrepareDynamicResources events until the task is aborted and
/// wakes the kubelet of `node` for each of its pods refused on the authorizer's race; a failed
/// watch is started again after `retry`. The pods are read and patched through `client`.
pub async fn wake_stalled_prepares(
    client: kube::Client,
    watches: WatchClient,
    node: String,
    retry: Duration,
) {
    let events: Api<Event> = Api::all(watches.client);
    let params = WatchParams::default().fields(&format!(
        "involvedObject.kind=Pod,reason={REASON},source=kubelet"
    ));
    let what = "the kubelet's FailedPrepareDynamicResources events".to_string();
    // The pods a wake is under way for (by uid): one at a time each.
    let waking: Arc<Mutex<HashSet<String>>> = Arc::default();
    watch_forever(events, watches.seconds, params, what, retry, |seen| {
        let (Seen::Event(WatchEvent::Added(e)) | Seen::Event(WatchEvent::Modified(e))) = seen
        else {
            return;
        };
        let Some(pod) = pod_to_wake(&e, &node) else {
            return;
        };
        let Ok(mut w) = waking.lock() else {
            return;
        };
        if !w.insert(pod.uid.clone()) {
            return;
        }
        drop(w);
        let (client, node, waking) = (client.clone(), node.clone(), waking.clone());
        tokio::spawn(async move {
            wake(client, &pod, &node).await;
            if let Ok(mut w) = waking.lock() {
                w.remove(&pod.uid);
            }
        });
    })
    .await;
}

/// One wake of `pod`, after its pause; what it did or why not is logged.
async fn wake(client: kube::Client, want: &PodRef, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client, &want.namespace);
    let name = format!("{}/{}", want.namespace, want.name);
    let log = |what: String| eprintln!("gpuslice kubelet-plugin: pod {name}: {what}");
    let Some(n) = due(&pods, want, node, &log).await else {
        return;
    };
    tokio::time::sleep(PAUSES[n - 1]).await;
    // Read again: the kubelet may have started the pod meanwhile.
    if due(&pods, want, node, &log).await != Some(n) {
        return;
    }
    match pods
        .patch(
            &want.name,
            &PatchParams::default(),
            &Patch::Merge(wake_patch(&want.uid, n)),
        )
        .await
    {
        Ok(_) => log(format!(
            "the node authorizer refused the kubelet its claims (a race with the binding); \
             {ANNOTATION}={n} makes the kubelet retry now rather than at its resync"
        )),
        Err(e) => log(format!("cannot set {ANNOTATION} to wake the kubelet: {e}")),
    }
}

/// The number of the wake `pod` is due (see [`next_wake`]), read from the API server; `None`
/// when none is (logged when it was woken enough, or cannot be read).
async fn due(pods: &Api<Pod>, want: &PodRef, node: &str, log: &impl Fn(String)) -> Option<usize> {
    match pods.get_opt(&want.name).await {
        Ok(Some(pod)) => match next_wake(&pod, want, node) {
            Ok(n) => Some(n),
            Err(e @ Skip::Enough(_)) => {
                log(format!("not woken: {e}"));
                None
            }
            Err(_) => None,
        },
        Ok(None) => None,
        Err(e) => {
            log(format!("cannot read it to wake the kubelet: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, host: &str, message: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "u1"},
            "reason": reason,
            "source": {"component": "kubelet", "host": host},
            "message": message,
        }))
        .unwrap()
    }

    const REFUSED: &str = "prepare dynamic resources: fetch ResourceClaim p-gpuslice-c0-x: resourceclaims.resource.k8s.io \"p-gpuslice-c0-x\" is forbidden: User \"system:node:n1\" cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"ns\": node: no relationship found between node 'n1' and this object";

    #[test]
    fn only_this_nodes_authorizer_refusals_wake_a_pod() {
        let want = PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u1".into(),
        };
        assert_eq!(pod_to_wake(&event(REASON, "n1", REFUSED), "n1"), Some(want));
        // Another node's kubelet.
        assert_eq!(pod_to_wake(&event(REASON, "n2", REFUSED), "n1"), None);
        // Another reason, another failure (the plugin's own refusal is not a race).
        assert_eq!(
            pod_to_wake(&event("FailedMount", "n1", REFUSED), "n1"),
            None
        );
        assert_eq!(
            pod_to_wake(
                &event(REASON, "n1", "NodePrepareResources: GPU-1 is unhealthy"),
                "n1"
            ),
            None
        );
        // Reported through the events API's reportingInstance instead of source.host.
        let mut e = event(REASON, "", REFUSED);
        e.source = None;
        e.reporting_instance = Some("n1".into());
        assert!(pod_to_wake(&e, "n1").is_some());
        // Not about a pod, or without its uid.
        let mut e = event(REASON, "n1", REFUSED);
        e.involved_object.kind = Some("Node".into());
        assert_eq!(pod_to_wake(&e, "n1"), None);
        let mut e = event(REASON, "n1", REFUSED);
        e.involved_object.uid = None;
        assert_eq!(pod_to_wake(&e, "n1"), None);
        // Names no pod can have (an event's are not checked by the API server) never become
        // a request path or a log line.
        for (ns, name) in [
            ("ns", "../secrets/x"),
            ("ns", "p?watch=1"),
            ("a.b", "p"),
            ("ns", "p\u{1b}[31m"),
        ] {
            let mut e = event(REASON, "n1", REFUSED);
            e.involved_object.namespace = Some(ns.into());
            e.involved_object.name = Some(name.into());
            assert_eq!(pod_to_wake(&e, "n1"), None, "{ns}/{name}");
        }
    }

    fn pod(uid: &str, node: &str, phase: &str, retries: Option<&str>) -> Pod {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        });
        if let Some(r) = retries {
            p["metadata"]["annotations"] = json!({ANNOTATION: r});
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn a_pod_is_woken_while_it_waits_on_this_node_and_at_most_three_times() {
        let want = PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u1".into(),
        };
        assert_eq!(
            next_wake(&pod("u1", "n1", "Pending", None), &want, "n1"),
            Ok(1)
        );
        assert_eq!(next_wake(&pod("u1", "n1", "", None), &want, "n1"), Ok(1));
        assert_eq!(
            next_wake(&pod("u1", "n1", "Pending", Some("2")), &want, "n1"),
            Ok(3)
        );
        assert_eq!(
            next_wake(&pod("u1", "n1", "Pending", Some("3")), &want, "n1"),
            Err(Skip::Enough("3".into()))
        );
        // A value someone else wrote is not counted on.
        assert_eq!(
            next_wake(&pod("u1", "n1", "Pending", Some("many")), &want, "n1"),
            Err(Skip::Enough("many".into()))
        );
        assert_eq!(
            next_wake(&pod("u2", "n1", "Pending", None), &want, "n1"),
            Err(Skip::Replaced("u2".into()))
        );
        assert_eq!(
            next_wake(&pod("u1", "n2", "Pending", None), &want, "n1"),
            Err(Skip::OtherNode(Some("n2".into())))
        );
        assert_eq!(
            next_wake(&pod("u1", "n1", "Running", None), &want, "n1"),
            Err(Skip::Started("Running".into()))
        );
        let mut deleting = pod("u1", "n1", "Pending", None);
        deleting.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-12-06T00:00:00Z")).unwrap());
        assert_eq!(next_wake(&deleting, &want, "n1"), Err(Skip::Deleting));
    }

    #[test]
    fn the_patch_sets_the_count_and_holds_the_uid() {
        assert_eq!(
            wake_patch("u1", 2),
            json!({"metadata": {"uid": "u1", "annotations": {"dra.gpuslice.io/prepare-retries": "2"}}})
        );
    }
}
