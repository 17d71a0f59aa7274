//! Tells the pods already on a GPU that became unhealthy: a Warning event `GPUUnhealthy` on
//! each pod a claim booked on that GPU is reserved for, naming the GPU, the XID, its time and
//! what happens to the pod (docs/troubleshooting.md, "GPU health and XIDs"). gpuslice itself
//! stops nothing: under `NoSchedule` the pod keeps running, under `NoExecute` Kubernetes
//! evicts it.

use gpuslice_config::TaintEffect;
use gpuslice_driver::health::Unhealthy;
use gpuslice_registry::{Owner, Reservation};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PostParams;
use kube::Api;

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

/// The (namespace, claim name) of the claims booked on GPU `uuid`.
pub fn claims_on(reservations: &[Reservation], uuid: &str) -> Vec<(String, String)> {
    reservations
        .iter()
        .filter(|r| r.gpus.iter().any(|b| b.uuid.eq_ignore_ascii_case(uuid)))
        .filter_map(|r| match &r.owner {
            Owner::DraClaim {
                namespace, name, ..
            } => Some((namespace.clone(), name.clone())),
            _ => None,
        })
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
    for (ns, name) in claims_on(reservations, &u.uuid) {
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
        let claim = match claims.get_opt(&name).await {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                failures.push(format!("cannot read ResourceClaim {ns}/{name}: {e}"));
                continue;
            }
        };
        let pods = claim
            .status
            .and_then(|s| s.reserved_for)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty());
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
    use gpuslice_registry::{Booking, ReservationState};

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
            }],
            created_ms: 0,
            deadline_ms: None,
            bound_ms: None,
            reserved_by: None,
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
        assert_eq!(
            claims_on(&list, "gpu-1"),
            [("team".to_string(), "on-1".to_string())]
        );
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
}
