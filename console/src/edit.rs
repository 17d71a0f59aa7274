//! The allocate / release operation as pure functions: the request (`--memory`, `--cores`,
//! `--gpus`) checked and rounded as the scheduler rounds it, the ResourceClaimTemplate it
//! becomes, the pod template edit and its exact inverse, whether the replicas fit on the
//! GPUs' free room, and the diff `--dry-run` prints.

use std::collections::BTreeMap;

use gpuslice_config::quantity::{format_kube_quantity, parse_kube_quantity};
use gpuslice_kube::slices::{CAP_CORES, CAP_MEMORY, MEMORY_STEP};
use gpuslice_kube::DRIVER;
use k8s_openapi::api::core::v1::{PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::GpuView;
use crate::render::bytes;

/// The pod's claim entry (`spec.resourceClaims[].name`) the console adds.
pub const CLAIM_ENTRY: &str = "gpuslice";
/// The request name inside the ResourceClaimTemplate.
pub const REQUEST_NAME: &str = "gpu";
/// Label of every ResourceClaimTemplate the console made.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kubectl-gpuslice");
/// Annotation naming the workload a ResourceClaimTemplate of the console is for (`kind/name`).
pub const WORKLOAD_ANNOTATION: &str = "gpuslice.io/workload";

/// Bad input, or a workload the console does not edit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("`{0}` is not a workload; accepted: deployment/NAME, statefulset/NAME or daemonset/NAME (also deploy, sts, ds)")]
    Workload(String),
    #[error("--memory `{value}`: {detail}; accepted: a whole quantity of at least 1Mi such as 20Gi or 1536Mi")]
    Memory { value: String, detail: String },
    #[error("--cores `{0}` is not a whole percent of a GPU from 0 to 100")]
    Cores(String),
    #[error("--gpus {0}: accepted 1 to 128 GPUs per pod")]
    Gpus(u32),
    #[error("{workload}'s pod template already uses claim `{entry}` ({what}); the console edits only its own claim `gpuslice`: remove that claim first or edit the workload by hand")]
    OtherClaim {
        workload: String,
        entry: String,
        what: String,
    },
    #[error("{workload} has no container `{container}`; its containers: {known}")]
    Container {
        workload: String,
        container: String,
        known: String,
    },
    #[error("{workload} has no pod template spec")]
    NoPodSpec { workload: String },
}

/// The workload kinds the console edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "deployment",
            Kind::StatefulSet => "statefulset",
            Kind::DaemonSet => "daemonset",
        }
    }
}

/// `deployment/web` → (Deployment, "web").
pub fn parse_workload(s: &str) -> Result<(Kind, String), EditError> {
    let bad = || EditError::Workload(s.to_string());
    let (kind, name) = s.split_once('/').ok_or_else(bad)?;
    let kind = match kind.to_ascii_lowercase().as_str() {
        "deployment" | "deployments" | "deploy" | "deployment.apps" => Kind::Deployment,
        "statefulset" | "statefulsets" | "sts" | "statefulset.apps" => Kind::StatefulSet,
        "daemonset" | "daemonsets" | "ds" | "daemonset.apps" => Kind::DaemonSet,
        _ => return Err(bad()),
    };
    if !gpuslice_kube::slices::is_dns_subdomain(name, 253) {
        return Err(bad());
    }
    Ok((kind, name.to_string()))
}

/// What each pod gets: `gpus` GPUs, each with `memory` bytes (rounded up to the 1Mi step)
/// and `cores` percent (`None`: not throttled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub memory: u64,
    pub cores: Option<u64>,
    pub gpus: u32,
}

impl Request {
    /// Checks the flags' values.
    pub fn parse(memory: &str, cores: Option<&str>, gpus: u32) -> Result<Request, EditError> {
        let bytes = parse_kube_quantity(memory).map_err(|e| EditError::Memory {
            value: memory.to_string(),
            detail: e.detail.to_string(),
        })?;
        if bytes == 0 {
            return Err(EditError::Memory {
                value: memory.to_string(),
                detail: "zero".into(),
            });
        }
        let memory = bytes.div_ceil(MEMORY_STEP) * MEMORY_STEP;
        let cores = match cores {
            None => None,
            Some(c) => {
                let v: u64 = c
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| EditError::Cores(c.to_string()))?;
                if v > 100 || c.matches('%').count() > 1 {
                    return Err(EditError::Cores(c.to_string()));
                }
                Some(v)
            }
        };
        if !(1..=128).contains(&gpus) {
            return Err(EditError::Gpus(gpus));
        }
        Ok(Request {
            memory,
            cores,
            gpus,
        })
    }

    /// `1 GPU × 20Gi, 30 cores`.
    pub fn describe(&self) -> String {
        let gpus = if self.gpus == 1 {
            "1 GPU".to_string()
        } else {
            format!("{} GPUs", self.gpus)
        };
        match self.cores {
            Some(c) => format!("{gpus} × {} memory, {c} cores", bytes(self.memory)),
            None => format!("{gpus} × {} memory", bytes(self.memory)),
        }
    }
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The template's name: the workload's kind and name and a hash of the request (a template's
/// spec cannot change, so another request is another template, and the same one the same).
pub fn template_name(kind: Kind, name: &str, req: &Request) -> String {
    let hash = fnv(&format!(
        "{}/{}/{}",
        req.memory,
        req.cores.map_or("-".to_string(), |c| c.to_string()),
        req.gpus
    ));
    let suffix = format!("-{}-gpuslice-{hash:08x}", kind.as_str());
    let keep = 253 - suffix.len();
    let mut base = name[..name.len().min(keep)].to_string();
    while base.ends_with('.') || base.ends_with('-') {
        base.pop();
    }
    format!("{base}{suffix}")
}

/// The ResourceClaimTemplate of `req` for workload `kind/name` in `namespace`.
pub fn claim_template(
    namespace: &str,
    kind: Kind,
    name: &str,
    req: &Request,
) -> ResourceClaimTemplate {
    let mut requests = BTreeMap::new();
    requests.insert(
        CAP_MEMORY.to_string(),
        Quantity(format_kube_quantity(req.memory)),
    );
    if let Some(c) = req.cores {
        requests.insert(CAP_CORES.to_string(), Quantity(c.to_string()));
    }
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(template_name(kind, name, req)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                WORKLOAD_ANNOTATION.to_string(),
                format!("{}/{name}", kind.as_str()),
            )])),
            ..Default::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: REQUEST_NAME.to_string(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: DRIVER.to_string(),
                            count: Some(i64::from(req.gpus)),
                            capacity: Some(CapacityRequirements {
                                requests: Some(requests),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            }),
        }),
    }
}

/// Whether ResourceClaimTemplate `t` is the console's, for workload `kind/name`.
pub fn is_ours(t: &ResourceClaimTemplate, kind: Kind, name: &str) -> bool {
    let labelled = t
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1);
    let annotated = t
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WORKLOAD_ANNOTATION))
        .is_some_and(|v| *v == format!("{}/{name}", kind.as_str()));
    labelled && annotated
}

/// The template our claim entry names now, if the pod spec has one.
pub fn current_template(spec: &PodSpec) -> Option<String> {
    spec.resource_claims
        .iter()
        .flatten()
        .find(|c| c.name == CLAIM_ENTRY)
        .and_then(|c| c.resource_claim_template_name.clone())
}

/// Refuses a pod spec with a claim that is not the console's: any other entry, or an entry
/// `gpuslice` that does not name one of `ours` (the workload's templates of the console).
pub fn check_claims(workload: &str, spec: &PodSpec, ours: &[String]) -> Result<(), EditError> {
    for c in spec.resource_claims.iter().flatten() {
        let what = match (&c.resource_claim_name, &c.resource_claim_template_name) {
            (Some(n), _) => format!("ResourceClaim {n}"),
            (None, Some(t)) => format!("ResourceClaimTemplate {t}"),
            (None, None) => "no source".to_string(),
        };
        let mine = c.name == CLAIM_ENTRY
            && c.resource_claim_name.is_none()
            && c.resource_claim_template_name
                .as_ref()
                .is_some_and(|t| ours.contains(t));
        if !mine {
            return Err(EditError::OtherClaim {
                workload: workload.to_string(),
                entry: c.name.clone(),
                what,
            });
        }
    }
    Ok(())
}

/// Adds (or points at `template`) the claim entry and lists it in `containers` (all when
/// empty); other containers do not get it.
pub fn add_claim(
    workload: &str,
    spec: &mut PodSpec,
    template: &str,
    containers: &[String],
) -> Result<(), EditError> {
    for want in containers {
        if !spec.containers.iter().any(|c| &c.name == want) {
            return Err(EditError::Container {
                workload: workload.to_string(),
                container: want.clone(),
                known: spec
                    .containers
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let entries = spec.resource_claims.get_or_insert_with(Vec::new);
    match entries.iter_mut().find(|c| c.name == CLAIM_ENTRY) {
        Some(e) => e.resource_claim_template_name = Some(template.to_string()),
        None => entries.push(PodResourceClaim {
            name: CLAIM_ENTRY.to_string(),
            resource_claim_template_name: Some(template.to_string()),
            resource_claim_name: None,
        }),
    }
    for c in &mut spec.containers {
        let wanted = containers.is_empty() || containers.contains(&c.name);
        let resources = c.resources.get_or_insert_with(Default::default);
        let claims = resources.claims.get_or_insert_with(Vec::new);
        let has = claims.iter().any(|x| x.name == CLAIM_ENTRY);
        if wanted && !has {
            claims.push(ContainerClaim {
                name: CLAIM_ENTRY.to_string(),
                request: None,
            });
        } else if !wanted && has {
            claims.retain(|x| x.name != CLAIM_ENTRY);
        }
        if claims.is_empty() {
            resources.claims = None;
        }
    }
    Ok(())
}

/// Removes what [`add_claim`] added: the entry and each container's reference (a list left
/// empty is removed, as the API server never stores an empty one).
pub fn remove_claim(spec: &mut PodSpec) -> bool {
    let mut changed = false;
    if let Some(entries) = spec.resource_claims.as_mut() {
        let before = entries.len();
        entries.retain(|c| c.name != CLAIM_ENTRY);
        changed |= entries.len() != before;
        if entries.is_empty() {
            spec.resource_claims = None;
        }
    }
    for c in &mut spec.containers {
        if let Some(r) = c.resources.as_mut() {
            if let Some(claims) = r.claims.as_mut() {
                let before = claims.len();
                claims.retain(|x| x.name != CLAIM_ENTRY);
                changed |= claims.len() != before;
                if claims.is_empty() {
                    r.claims = None;
                }
            }
        }
    }
    changed
}

/// How many pods of `req` fit on each node's free room (per GPU: free memory and cores from
/// the slices minus the bookings), each pod on `req.gpus` distinct GPUs of one node.
/// Counting stops at `want` per node.
pub fn fit_per_node(gpus: &[GpuView], req: &Request, want: u64) -> BTreeMap<String, u64> {
    let mut per_node: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for g in gpus {
        let by_memory = g.memory.free / req.memory;
        let by_cores = match req.cores {
            Some(c) if c > 0 => g.cores.free / c,
            _ => u64::MAX,
        };
        per_node
            .entry(g.node.clone())
            .or_default()
            .push(by_memory.min(by_cores));
    }
    let n = u64::from(req.gpus);
    per_node
        .into_iter()
        .map(|(node, caps)| {
            // The most pods k such that the GPUs hold k × n copies with no GPU twice per pod.
            let mut k = 0;
            while k < want && caps.iter().map(|c| (*c).min(k + 1)).sum::<u64>() >= n * (k + 1) {
                k += 1;
            }
            (node, k)
        })
        .collect()
}

/// A line diff (longest common subsequence) of `old` and `new`, every line kept, `-`/`+`/` `
/// prefixed, under `--- label (before)` and `+++ label (after)`.
pub fn diff(label: &str, old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = format!("--- {label} (before)\n+++ {label} (after)\n");
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!(" {}\n", a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("-{}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+{}\n", b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::tests::{claims, slices};
    use crate::model::{build, Sources};

    const GIB: u64 = 1 << 30;

    #[test]
    fn requests_are_checked_and_rounded_as_the_scheduler_rounds() {
        let r = Request::parse("20Gi", Some("30"), 1).unwrap();
        assert_eq!((r.memory, r.cores, r.gpus), (20 * GIB, Some(30), 1));
        assert_eq!(r.describe(), "1 GPU × 20Gi memory, 30 cores");
        assert_eq!(
            Request::parse("1000000", None, 2).unwrap().memory,
            1 << 20,
            "up to the 1Mi step"
        );
        assert_eq!(
            Request::parse("1Gi", Some("25%"), 1).unwrap().cores,
            Some(25)
        );
        for (m, c, g, says) in [
            ("20GB", None, 1, "--memory `20GB`"),
            ("0", None, 1, "--memory `0`: zero"),
            ("1.5", None, 1, "--memory `1.5`"),
            ("-1Gi", None, 1, "negative"),
            ("1Gi", Some("101"), 1, "--cores `101`"),
            ("1Gi", Some("x"), 1, "--cores `x`"),
            ("1Gi", Some("5%%"), 1, "--cores `5%%`"),
            ("1Gi", None, 0, "--gpus 0"),
        ] {
            let e = Request::parse(m, c, g).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert!(e.contains("accepted") || e.contains("0 to 100"), "{e}");
        }
    }

    #[test]
    fn workloads_parse_like_kubectl_kinds() {
        assert_eq!(
            parse_workload("deploy/web").unwrap(),
            (Kind::Deployment, "web".into())
        );
        assert_eq!(
            parse_workload("StatefulSet/db").unwrap(),
            (Kind::StatefulSet, "db".into())
        );
        assert_eq!(
            parse_workload("ds/agent").unwrap(),
            (Kind::DaemonSet, "agent".into())
        );
        for bad in [
            "web",
            "pod/web",
            "deployment/",
            "deployment/Web",
            "deployment/a/b",
        ] {
            let e = parse_workload(bad).unwrap_err().to_string();
            assert!(e.contains("accepted: deployment/NAME"), "{e}");
        }
    }

    #[test]
    fn the_template_asks_the_device_class_for_capacity() {
        let r = Request::parse("20Gi", Some("30"), 2).unwrap();
        let t = claim_template("ml", Kind::Deployment, "web", &r);
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(
            v["spec"]["spec"]["devices"]["requests"],
            json!([{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 2,
                     "capacity": {"requests": {"cores": "30", "memory": "20Gi"}}}}])
        );
        let name = v["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-deployment-gpuslice-"), "{name}");
        assert!(is_ours(&t, Kind::Deployment, "web"));
        assert!(!is_ours(&t, Kind::StatefulSet, "web"));
        // The same request, the same name; another, another.
        assert_eq!(template_name(Kind::Deployment, "web", &r), name);
        let other = Request::parse("20Gi", None, 2).unwrap();
        assert_ne!(template_name(Kind::Deployment, "web", &other), name);
        let long = "a".repeat(253);
        assert!(template_name(Kind::Deployment, &long, &r).len() <= 253);
        // No cores: not throttled, no cores request.
        let v =
            serde_json::to_value(claim_template("ml", Kind::Deployment, "web", &other)).unwrap();
        assert_eq!(
            v["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"],
            json!({"memory": "20Gi"})
        );
    }

    fn pod_spec() -> PodSpec {
        serde_json::from_value(json!({"containers": [
            {"name": "main", "image": "i", "resources": {}},
            {"name": "sidecar", "image": "i", "resources": {"limits": {"cpu": "1"}}},
        ]}))
        .unwrap()
    }

    #[test]
    fn release_undoes_allocate_exactly() {
        let before = pod_spec();
        let mut spec = before.clone();
        add_claim("deployment/web", &mut spec, "t1", &[]).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            v["resourceClaims"],
            json!([{"name": "gpuslice", "resourceClaimTemplateName": "t1"}])
        );
        assert_eq!(
            v["containers"][0]["resources"]["claims"],
            json!([{"name": "gpuslice"}])
        );
        assert_eq!(
            v["containers"][1]["resources"]["claims"],
            json!([{"name": "gpuslice"}])
        );
        assert_eq!(current_template(&spec).as_deref(), Some("t1"));
        check_claims("deployment/web", &spec, &["t1".to_string()]).unwrap();
        // Edit: another template, only the main container.
        add_claim("deployment/web", &mut spec, "t2", &["main".to_string()]).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["resourceClaims"][0]["resourceClaimTemplateName"], "t2");
        assert_eq!(
            v["containers"][1]["resources"],
            json!({"limits": {"cpu": "1"}})
        );
        assert!(remove_claim(&mut spec));
        assert_eq!(spec, before);
        assert!(!remove_claim(&mut spec), "nothing left to remove");
        let e = add_claim("deployment/web", &mut spec, "t", &["nosuch".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "deployment/web has no container `nosuch`; its containers: main, sidecar"
        );
        assert_eq!(spec, before, "a refused edit changes nothing");
    }

    #[test]
    fn other_claims_are_refused() {
        let mut spec = pod_spec();
        spec.resource_claims = Some(vec![PodResourceClaim {
            name: "theirs".into(),
            resource_claim_name: Some("shared".into()),
            resource_claim_template_name: None,
        }]);
        let e = check_claims("deployment/web", &spec, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("already uses claim `theirs` (ResourceClaim shared)"),
            "{e}"
        );
        // An entry named like ours that names a template not ours.
        spec.resource_claims = Some(vec![PodResourceClaim {
            name: CLAIM_ENTRY.into(),
            resource_claim_name: None,
            resource_claim_template_name: Some("hand-made".into()),
        }]);
        let e = check_claims(
            "deployment/web",
            &spec,
            &["web-deployment-gpuslice-1".into()],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("ResourceClaimTemplate hand-made"),
            "{e}"
        );
    }

    #[test]
    fn fit_counts_pods_per_node_on_distinct_gpus() {
        let m = build(
            &Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage: Err(String::new()),
            },
            None,
        );
        // Free: node-a gpu-0 111Gi / 70 cores, gpu-1 90Gi / 75 cores; node-b nothing.
        let r = Request::parse("20Gi", Some("30"), 1).unwrap();
        assert_eq!(
            fit_per_node(&m.gpus, &r, 100),
            BTreeMap::from([("node-a".into(), 4), ("node-b".into(), 0)])
        );
        let r = Request::parse("20Gi", None, 1).unwrap();
        assert_eq!(fit_per_node(&m.gpus, &r, 100)["node-a"], 5 + 4);
        assert_eq!(
            fit_per_node(&m.gpus, &r, 3)["node-a"],
            3,
            "counting stops at what is wanted"
        );
        // Two GPUs a pod: at most as many pods as the scarcer GPU holds.
        let r = Request::parse("40Gi", None, 2).unwrap();
        assert_eq!(fit_per_node(&m.gpus, &r, 100)["node-a"], 2);
        let r = Request::parse("1Gi", None, 3).unwrap();
        assert_eq!(
            fit_per_node(&m.gpus, &r, 100)["node-a"],
            0,
            "node-a has two GPUs"
        );
        let r = Request::parse("200Gi", None, 1).unwrap();
        assert!(fit_per_node(&m.gpus, &r, 100).values().all(|k| *k == 0));
    }

    #[test]
    fn the_diff_keeps_context_and_marks_changes() {
        let d = diff("x", "a\nb\nc\n", "a\nB\nc\nd\n");
        assert_eq!(d, "--- x (before)\n+++ x (after)\n a\n-b\n+B\n c\n+d\n");
        assert_eq!(diff("y", "", "n\n"), "--- y (before)\n+++ y (after)\n+n\n");
    }
}
