//! Tells the pods already on a GPU that became unhealthy: a Warning event `GPUUnhealthy` on
//! each pod a claim booked on that GPU is reserved for, naming the GPU, the XID, its time and
//! what happens to the pod (docs/troubleshooting.md, "GPU health and XIDs"). gpuslice itself
//! stops nothing: under `NoSchedule` the pod keeps running, under `NoExecute` Kubernetes
//! evicts it. Only the claim booked (same uid, still allocated on this node) has its pods
//! told: a claim of the same name made since is someone else's.

use gpuslice_config::TaintEffect;
use gpuslice_dra::DRIVER;
use gpuslice_driver::health::Unhealthy;
use gpuslice_registry::{Owner, Reservation};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PostParams;
use kube::Api;

use crate::booking::held_by;
use crate::claim::ClaimRef;

/// The reason of the event.
pub const REASON: &str = "GPUUnhealthy";

/// The event's message for a pod on `u`.
pub fn message(u: &Unhealthy, effect: TaintEffect) -> String {
    let then = match effect {
        TaintEffect::NoSchedule => "the pod keeps running; its CUDA calls may fail",
        TaintEffect::NoExecute => "Kubernetes evicts the pod (taint effect NoExecute)",
    };
    format!("{u}; no new claim gets it; {then}")
}

/// The claims booked on GPU `uuid` whose claim is still in the API server (a booking kept
/// after its claim left has no pods the API server can name).
pub fn claims_on(reservations: &[Reservation], uuid: &str) -> Vec<ClaimRef> {
    reservations
        .iter()
        .filter(|r| r.gpus.iter().any(|b| b.uuid.eq_ignore_ascii_case(uuid)))
        .filter(|r| matches!(&r.owner, Owner::DraClaim { gone: None, .. }))
        .filter_map(held_by)
        .collect()
}

/// The pods `claim` (as the API server holds it) is reserved for, when it is the claim `want`
/// booked (same uid) and still allocated a device of this driver in pool `node`; none else.
pub fn pods_of(
    claim: &ResourceClaim,
    want: &ClaimRef,
    node: &str,
) -> Vec<ResourceClaimConsumerReference> {
    if claim.metadata.uid.as_deref() != Some(want.uid.as_str()) {
        return Vec::new();
    }
    let Some(status) = &claim.status else {
        return Vec::new();
    };
    let here = status
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|rs| rs.iter().any(|r| r.driver == DRIVER && r.pool == node));
    if !here {
        return Vec::new();
    }
    status
        .reserved_for
        .iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .cloned()
        .collect()
}

/// Posts the event on every pod the claims on `u` are reserved for; returns one line per
/// failure (logged by the caller, never retried: the taint is what keeps new work away).
pub async fn tell_pods(
    client: &kube::Client,
    node: &str,
    reservations: &[Reservation],
    u: &Unhealthy,
    effect: TaintEffect,
) -> Vec<String> {
    let mut failures = Vec::new();
    for want in claims_on(reservations, &u.uuid) {
        let ns = want.namespace.clone();
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
        let claim = match claims.get_opt(&want.name).await {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                failures.push(format!("cannot read {want}: {e}"));
                continue;
            }
        };
        let pods = pods_of(&claim, &want, node);
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        for pod in pods {
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let event = Event {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{}.gpuslice-", pod.name)),
                    namespace: Some(ns.clone()),
                    ..Default::default()
                },
                involved_object: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    namespace: Some(ns.clone()),
                    uid: Some(pod.uid.clone()),
                    ..Default::default()
                },
                reason: Some(REASON.into()),
                message: Some(message(u, effect)),
                type_: Some("Warning".into()),
                source: Some(EventSource {
                    component: Some("gpuslice-kubelet-plugin".into()),
                    host: Some(node.to_string()),
                }),
                first_timestamp: Some(now.clone()),
                last_timestamp: Some(now),
                count: Some(1),
                reporting_component: Some("gpuslice.io/kubelet-plugin".into()),
                reporting_instance: Some(node.to_string()),
                ..Default::default()
            };
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                failures.push(format!(
                    "cannot post event {REASON} on pod {ns}/{}: {e}",
                    pod.name
                ));
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_registry::{Booking, ClaimGone, ReservationState};

    fn reservation(owner: Owner, uuid: &str) -> Reservation {
        Reservation {
            id: "0123456789abcdef".into(),
            state: ReservationState::Bound,
            owner,
            whole_gpu: false,
            gpus: vec![Booking {
                index: 1,
                uuid: uuid.into(),
                memory: 1 << 30,
                cores: 0,
                unknown: Default::default(),
            }],
            created_ms: 0,
            deadline_ms: None,
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        }
    }

    #[test]
    fn the_claims_on_the_gpu_and_the_message() {
        let claim = |name: &str| Owner::DraClaim {
            claim_uid: format!("uid-{name}"),
            namespace: "team".into(),
            name: name.into(),
            members: Vec::new(),
            gone: None,
        };
        let list = vec![
            reservation(claim("on-1"), "GPU-1"),
            reservation(claim("on-0"), "GPU-0"),
            reservation(Owner::container(), "GPU-1"),
        ];
        let on_1 = ClaimRef {
            namespace: "team".into(),
            name: "on-1".into(),
            uid: "uid-on-1".into(),
        };
        assert_eq!(claims_on(&list, "gpu-1"), [on_1]);
        // A booking kept after its claim left: the API server cannot name its pods.
        let mut gone = claim("on-1");
        if let Owner::DraClaim { gone: g, .. } = &mut gone {
            *g = Some(ClaimGone {
                since_ms: 1,
                why: "the claim no longer exists".into(),
            });
        }
        assert_eq!(claims_on(&[reservation(gone, "GPU-1")], "GPU-1"), []);
        let u = Unhealthy {
            index: 1,
            uuid: "GPU-1".into(),
            xid: 79,
            since_ms: 1_796_000_000_000,
            recovery_seen: false,
        };
        let m = message(&u, TaintEffect::NoSchedule);
        assert!(
            m.starts_with(
                "GPU 1 (GPU-1) is unhealthy: the driver reported XID 79 at 2026-11-30T00:53:20Z"
            ) && m.ends_with("the pod keeps running; its CUDA calls may fail"),
            "{m}"
        );
        assert!(message(&u, TaintEffect::NoExecute).contains("evicts"));
    }

    fn api_claim(uid: &str, pool: &str) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "team", "uid": uid},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-1"}
                ]}},
                "reservedFor": [
                    {"resource": "pods", "name": "p", "uid": "pod-uid"},
                    {"resource": "jobs", "apiGroup": "batch", "name": "j", "uid": "job-uid"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_the_pods_of_the_claim_booked_here_are_told() {
        let want = ClaimRef {
            namespace: "team".into(),
            name: "c".into(),
            uid: "u1".into(),
        };
        let names = |c: &ResourceClaim| -> Vec<String> {
            pods_of(c, &want, "node-a")
                .into_iter()
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(names(&api_claim("u1", "node-a")), ["p"]);
        // Deleted and re-created under the same name, now on another node's pool.
        assert!(names(&api_claim("u2", "node-b")).is_empty());
        // Re-created and allocated on this node again: still not the claim booked.
        assert!(names(&api_claim("u2", "node-a")).is_empty());
        // The same claim, deallocated and allocated on another node.
        assert!(names(&api_claim("u1", "node-b")).is_empty());
    }
}
