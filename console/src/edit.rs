//! The allocate / release operation as pure functions: the request (`--memory`, `--cores`,
//! `--gpus`) checked and rounded as the scheduler rounds it, the ResourceClaimTemplate it
//! becomes, the pod template edit and its exact inverse, whether the replicas fit on the
//! GPUs' free room.

use std::collections::BTreeMap;

use gpuslice_config::quantity::{format_kube_quantity, parse_kube_quantity};
use gpuslice_dra::claim_shape::{
    claim_spec, slot_count, template_by, Mode, Shape, ShapeError, SlotSize, Writer,
    HAMI_LIMIT_PREFIX, LIMIT_CORES, LIMIT_GPUS, LIMIT_MEMORY,
};
use gpuslice_dra::slices::{max_request, round_up_request};
use gpuslice_registry::MAX_GPUS;
use k8s_openapi::api::core::v1::{
    Container, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim,
};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::GpuView;
use crate::render::bytes;

/// The pod's claim entry (`spec.resourceClaims[].name`) the console adds.
pub const CLAIM_ENTRY: &str = "gpuslice";
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
    #[error("--gpus {0}: accepted 1 to {max} GPUs per pod", max = MAX_GPUS)]
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
    #[error("{0}")]
    Shape(#[from] ShapeError),
    #[error("{workload} asks HAMi's GPU limits ({limits}); the console leaves them as they are (the webhook's HAMi compatibility turns them into a slice): remove them from the workload by hand before allocating or releasing with the console")]
    Hami { workload: String, limits: String },
    #[error("--form `{0}`: accepted: limits or claim")]
    Form(String),
}

/// How a workload's pod template asks for its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `gpuslice.io/{gpus,memory,cores}` in the containers' limits; the webhook turns them
    /// into a claim for each pod.
    Limits,
    /// A ResourceClaimTemplate of the console and the pod's claim naming it.
    Claim,
}

impl Form {
    pub fn parse(s: &str) -> Result<Form, EditError> {
        match s {
            "limits" => Ok(Form::Limits),
            "claim" => Ok(Form::Claim),
            other => Err(EditError::Form(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Form::Limits => "limits",
            Form::Claim => "claim",
        }
    }
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
    if !gpuslice_dra::slices::is_dns_subdomain(name, 253) {
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
        // Rounded up to the step as the scheduler rounds it.
        let memory = round_up_request(bytes).ok_or_else(|| EditError::Memory {
            value: memory.to_string(),
            detail: format!(
                "above {}, the largest whole number of 1Mi steps",
                max_request()
            ),
        })?;
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
        if !(1..=MAX_GPUS).contains(&gpus) {
            return Err(EditError::Gpus(gpus));
        }
        Ok(Request {
            memory,
            cores,
            gpus,
        })
    }

    /// The ask as the claim builder takes it.
    pub fn shape(&self) -> Shape {
        Shape {
            gpus: self.gpus,
            memory: Some(self.memory),
            cores: self
                .cores
                .and_then(|c| u32::try_from(c).ok())
                .filter(|c| *c > 0),
            selectors: Vec::new(),
        }
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

/// The [`Writer`] of workload `kind/name`'s templates: labelled [`MANAGED_BY`], annotated
/// [`WORKLOAD_ANNOTATION`], named `<name>-<kind>-gpuslice-<hash of the claim spec>`; the claim
/// inside is the one [`claim_spec`] writes for the webhook too.
pub fn writer(kind: Kind, name: &str) -> Writer {
    Writer {
        manager: MANAGED_BY.1.to_string(),
        prefix: format!("{name}-{}-gpuslice-", kind.as_str()),
        annotations: BTreeMap::from([(
            WORKLOAD_ANNOTATION.to_string(),
            format!("{}/{name}", kind.as_str()),
        )]),
    }
}

/// The ResourceClaimTemplate of `req` for workload `kind/name` in `namespace`, in the
/// cluster's publication `mode`, and what was rounded on the way (one line each).
pub fn claim_template(
    namespace: &str,
    kind: Kind,
    name: &str,
    req: &Request,
    mode: &Mode,
) -> Result<(ResourceClaimTemplate, Vec<String>), EditError> {
    let (spec, warnings) = claim_spec(mode, &req.shape(), "--memory/--cores/--gpus")?;
    Ok((template_by(&writer(kind, name), namespace, spec), warnings))
}

/// The slice limits of the webhook (`gpuslice.io/gpus`, `memory`, `cores`) for `req`.
pub fn limits_of(req: &Request) -> BTreeMap<String, Quantity> {
    let mut m = BTreeMap::from([
        (LIMIT_GPUS.to_string(), Quantity(req.gpus.to_string())),
        (
            LIMIT_MEMORY.to_string(),
            Quantity(format_kube_quantity(req.memory)),
        ),
    ]);
    if let Some(c) = req.cores.filter(|c| *c > 0) {
        m.insert(LIMIT_CORES.to_string(), Quantity(c.to_string()));
    }
    m
}

const LIMITS: [&str; 3] = [LIMIT_GPUS, LIMIT_MEMORY, LIMIT_CORES];

/// The request a container's gpuslice limits ask, when it has them.
fn container_request(c: &Container) -> Option<Request> {
    let limits = c.resources.as_ref()?.limits.as_ref()?;
    if !LIMITS.iter().any(|k| limits.contains_key(*k)) {
        return None;
    }
    let q = |k: &str| limits.get(k).and_then(|q| parse_kube_quantity(&q.0).ok());
    Some(Request {
        memory: q(LIMIT_MEMORY).unwrap_or(0),
        cores: q(LIMIT_CORES),
        gpus: q(LIMIT_GPUS)
            .and_then(|g| u32::try_from(g).ok())
            .unwrap_or(1),
    })
}

/// The request the pod spec's gpuslice limits ask (the first container with them).
pub fn current_limits(spec: &PodSpec) -> Option<Request> {
    spec.containers.iter().find_map(container_request)
}

/// How many of the pod spec's containers carry gpuslice limits (each is a slice of its own
/// where the webhook gives a claim per container).
pub fn limited_containers(spec: &PodSpec) -> usize {
    spec.containers
        .iter()
        .filter(|c| container_request(c).is_some())
        .count()
}

/// HAMi's limits (`nvidia.com/gpu…`) the pod spec holds, as `container: name=value, …`.
pub fn hami_limits(spec: &PodSpec) -> Option<String> {
    let found: Vec<String> = spec
        .containers
        .iter()
        .filter_map(|c| {
            let limits = c.resources.as_ref()?.limits.as_ref()?;
            let names: Vec<String> = limits
                .iter()
                .filter(|(k, _)| k.starts_with(HAMI_LIMIT_PREFIX))
                .map(|(k, v)| format!("{k}={}", v.0))
                .collect();
            (!names.is_empty()).then(|| format!("{}: {}", c.name, names.join(", ")))
        })
        .collect();
    (!found.is_empty()).then(|| found.join("; "))
}

fn check_containers(
    workload: &str,
    spec: &PodSpec,
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
    Ok(())
}

/// Writes `req` as the webhook's limits into `containers` (all when empty; in capacity mode
/// each gets its own slice, as the webhook makes one claim per container, in slot mode they
/// share one of their summed ask) and removes them from the others.
pub fn set_limits(
    workload: &str,
    spec: &mut PodSpec,
    req: &Request,
    containers: &[String],
) -> Result<(), EditError> {
    check_containers(workload, spec, containers)?;
    let want = limits_of(req);
    for c in &mut spec.containers {
        let wanted = containers.is_empty() || containers.contains(&c.name);
        strip_limits(c);
        if wanted {
            let r = c.resources.get_or_insert_with(Default::default);
            r.limits
                .get_or_insert_with(BTreeMap::new)
                .extend(want.clone());
        }
    }
    Ok(())
}

/// Removes the gpuslice limits (and requests) from one container; true when it had some.
fn strip_limits(c: &mut Container) -> bool {
    let Some(r) = c.resources.as_mut() else {
        return false;
    };
    let mut changed = false;
    for m in [&mut r.limits, &mut r.requests] {
        if let Some(map) = m.as_mut() {
            for k in LIMITS {
                changed |= map.remove(k).is_some();
            }
            if map.is_empty() {
                *m = None;
            }
        }
    }
    changed
}

/// Removes what [`set_limits`] wrote from every container.
pub fn remove_limits(spec: &mut PodSpec) -> bool {
    spec.containers
        .iter_mut()
        .fold(false, |changed, c| strip_limits(c) | changed)
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
    check_containers(workload, spec, containers)?;
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

/// What one GPU has left while pods are placed on it: free bytes and cores, its whole
/// capacity (what a whole-GPU ask takes), and in slot mode its slot size and free slots.
#[derive(Debug, Clone, Copy)]
struct Room {
    memory: u64,
    cores: u64,
    whole: u64,
    slots: Option<(SlotSize, u64)>,
}

impl Room {
    fn of(g: &GpuView, mode: &Mode) -> Room {
        let slots = match (mode, g.slots) {
            (Mode::Slots(sizes), Some(s)) => Some((
                sizes
                    .iter()
                    .find(|z| z.memory == s.size)
                    .copied()
                    .unwrap_or(SlotSize {
                        memory: s.size,
                        cores: None,
                        per_gpu: u32::try_from(s.published).unwrap_or(u32::MAX),
                    }),
                s.published.saturating_sub(s.allocated),
            )),
            _ => None,
        };
        Room {
            memory: g.memory.free,
            cores: g.cores.free,
            whole: g.memory.capacity,
            slots,
        }
    }

    /// What one GPU's part of a claim of `shape` takes of this GPU, in its unit (slots, or
    /// bytes and cores), `None` where it cannot take it at all.
    fn need(&self, shape: &Shape, mode: &Mode) -> Option<(u64, u64)> {
        match (mode, self.slots) {
            // The claim asks, of each GPU, the slots of that GPU's size.
            (Mode::Slots(_), Some((size, _))) => {
                let k = slot_count(&size, shape).max(1);
                (k <= u64::from(size.per_gpu)).then_some((k, 0))
            }
            // A GPU of capacity mode: no slot to give a slot claim.
            (Mode::Slots(_), None) => None,
            (Mode::Capacity, _) => Some((
                shape.memory.unwrap_or(self.whole).max(1),
                u64::from(shape.cores.unwrap_or(0)),
            )),
        }
    }

    /// How many more claims of `shape` (one GPU's part each) this GPU holds.
    fn holds(&self, shape: &Shape, mode: &Mode) -> u64 {
        match (self.need(shape, mode), self.slots) {
            (None, _) => 0,
            (Some((k, _)), Some((_, free))) => free / k,
            (Some((memory, cores)), None) => {
                // No share asked: not bounded by cores.
                let by_cores = self.cores.checked_div(cores).unwrap_or(u64::MAX);
                (self.memory / memory).min(by_cores)
            }
        }
    }

    fn take(&mut self, shape: &Shape, mode: &Mode) {
        match (self.need(shape, mode), self.slots.as_mut()) {
            (None, _) => {}
            (Some((k, _)), Some((_, free))) => *free = free.saturating_sub(k),
            (Some((memory, cores)), None) => {
                self.memory = self.memory.saturating_sub(memory);
                self.cores = self.cores.saturating_sub(cores);
            }
        }
    }
}

/// How many pods fit on each node's free room (per GPU: free memory and cores from the
/// slices minus the bookings), each pod holding the claims of `pod` (their shapes: in
/// capacity mode a claim per container with limits, in slot mode one of the pod's summed
/// ask, the claim form's one), all on one node, each claim on its `gpus` distinct GPUs
/// (claims of one pod may share a GPU). Counting stops at `want` per node.
/// In slot mode a claim takes whole slots of each GPU, and its share is bounded by them.
pub fn fit_per_node(
    gpus: &[GpuView],
    pod: &[Shape],
    want: u64,
    mode: &Mode,
) -> BTreeMap<String, u64> {
    let mut per_node: BTreeMap<String, Vec<Room>> = BTreeMap::new();
    for g in gpus {
        per_node
            .entry(g.node.clone())
            .or_default()
            .push(Room::of(g, mode));
    }
    // The claims of a pod, those of the most GPUs first.
    let mut claims: Vec<&Shape> = pod.iter().collect();
    claims.sort_by_key(|s| std::cmp::Reverse(s.gpus));
    per_node
        .into_iter()
        .map(|(node, mut rooms)| {
            // Pod after pod, each claim on the GPUs that hold the most more of it: for claims
            // of one shape the most that fit (a pod that does not fit ends the count, so a
            // claim placed before it needs no undoing).
            let mut k = 0;
            'pods: while k < want && !claims.is_empty() {
                for shape in &claims {
                    let n = shape.gpus.max(1) as usize;
                    let mut order: Vec<(u64, usize)> = rooms
                        .iter()
                        .enumerate()
                        .map(|(i, r)| (r.holds(shape, mode), i))
                        .filter(|(c, _)| *c > 0)
                        .collect();
                    if order.len() < n {
                        break 'pods;
                    }
                    order.sort_by_key(|(c, i)| (std::cmp::Reverse(*c), *i));
                    for (_, i) in &order[..n] {
                        rooms[*i].take(shape, mode);
                    }
                }
                k += 1;
            }
            (node, k)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::tests::{claims, slices};
    use crate::model::{build, Sources};

    const GIB: u64 = 1 << 30;
    const MEBI: u64 = 1 << 20;

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
        assert_eq!(Request::parse("1Gi", None, MAX_GPUS).unwrap().gpus, 16);
        // The largest value that rounds: exactly the last whole step below 2^64.
        assert_eq!(
            Request::parse("17592186044415Mi", None, 1).unwrap().memory,
            u64::MAX / MEBI * MEBI
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
            (
                "1Gi",
                None,
                MAX_GPUS + 1,
                "--gpus 17: accepted 1 to 16 GPUs",
            ),
            ("1Gi", None, 128, "--gpus 128: accepted 1 to 16 GPUs"),
            // No multiple of 1Mi at or above it fits in 64 bits: refused, not wrapped to 0.
            (
                "18446744073709551615",
                None,
                1,
                "--memory `18446744073709551615`: above 17592186044415Mi",
            ),
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
    fn the_template_holds_the_claim_the_webhook_writes_for_the_same_ask() {
        let r = Request::parse("20Gi", Some("30"), 2).unwrap();
        let (t, w) = claim_template("ml", Kind::Deployment, "web", &r, &Mode::Capacity).unwrap();
        assert!(w.is_empty(), "{w:?}");
        let v = serde_json::to_value(&t).unwrap();
        let cap = json!({"requests": {"cores": "30", "memory": "20Gi"}});
        assert_eq!(
            v["spec"]["spec"]["devices"],
            json!({"requests": [
                {"name": "gpu-0", "exactly": {"deviceClassName": "gpuslice.io", "count": 1, "capacity": cap}},
                {"name": "gpu-1", "exactly": {"deviceClassName": "gpuslice.io", "count": 1, "capacity": cap}}],
              "constraints": [{"requests": ["gpu-0", "gpu-1"], "distinctAttribute": "gpuslice.io/uuid"}]})
        );
        let webhook = gpuslice_dra::claim_shape::template(
            "ml",
            claim_spec(&Mode::Capacity, &r.shape(), "f").unwrap().0,
        );
        assert_eq!(
            t.spec, webhook.spec,
            "one claim shape below both front ends"
        );
        let name = v["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-deployment-gpuslice-"), "{name}");
        assert!(gpuslice_dra::claim_shape::written_by(
            &t,
            &writer(Kind::Deployment, "web")
        ));
        assert!(!gpuslice_dra::claim_shape::written_by(
            &t,
            &writer(Kind::StatefulSet, "web")
        ));
        assert!(!gpuslice_dra::claim_shape::written_by(
            &webhook,
            &writer(Kind::Deployment, "web")
        ));
        // The same request, the same name; another, another.
        let again = claim_template("ml", Kind::Deployment, "web", &r, &Mode::Capacity)
            .unwrap()
            .0;
        assert_eq!(again.metadata.name, t.metadata.name);
        let other = Request::parse("20Gi", None, 2).unwrap();
        let o = claim_template("ml", Kind::Deployment, "web", &other, &Mode::Capacity)
            .unwrap()
            .0;
        assert_ne!(o.metadata.name, t.metadata.name);
        let long = "a".repeat(253);
        let l = claim_template("ml", Kind::Deployment, &long, &r, &Mode::Capacity)
            .unwrap()
            .0;
        assert!(l.metadata.name.unwrap().len() <= 253);
        // Slot mode: k slots of one GPU per GPU, the share as opaque parameters.
        let slot = gpuslice_dra::claim_shape::SlotSize {
            memory: 8 << 30,
            cores: Some(16),
            per_gpu: 6,
        };
        let one = Request::parse("20Gi", Some("30"), 1).unwrap();
        let (t, w) = claim_template(
            "ml",
            Kind::Deployment,
            "web",
            &one,
            &Mode::Slots(vec![slot]),
        )
        .unwrap();
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(
            v["spec"]["spec"]["devices"]["requests"],
            json!([{"name": "gpu", "exactly": {"deviceClassName": "slots.gpuslice.io", "count": 3}}])
        );
        assert_eq!(
            v["spec"]["spec"]["devices"]["constraints"],
            json!([{"requests": ["gpu"], "matchAttribute": "gpuslice.io/uuid"}])
        );
        assert_eq!(w.len(), 1, "20Gi is not whole slots of 8Gi: {w:?}");
        let big = Request::parse("100Gi", None, 1).unwrap();
        let e = claim_template(
            "ml",
            Kind::Deployment,
            "web",
            &big,
            &Mode::Slots(vec![slot]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("at most 6 slots"), "{e}");
    }

    #[test]
    fn the_limits_form_writes_the_webhooks_limits_and_release_removes_them_exactly() {
        let before = pod_spec();
        let mut spec = before.clone();
        let r = Request::parse("20Gi", Some("30"), 2).unwrap();
        set_limits("deployment/web", &mut spec, &r, &["main".to_string()]).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            v["containers"][0]["resources"],
            json!({"limits": {"gpuslice.io/cores": "30", "gpuslice.io/gpus": "2", "gpuslice.io/memory": "20Gi"}})
        );
        assert_eq!(
            v["containers"][1]["resources"],
            json!({"limits": {"cpu": "1"}})
        );
        assert_eq!(current_limits(&spec), Some(r));
        // Edit in place: another size, no share.
        let r2 = Request::parse("8Gi", None, 1).unwrap();
        set_limits("deployment/web", &mut spec, &r2, &[]).unwrap();
        assert_eq!(current_limits(&spec), Some(r2));
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            v["containers"][1]["resources"]["limits"],
            json!({"cpu": "1", "gpuslice.io/gpus": "1", "gpuslice.io/memory": "8Gi"})
        );
        assert!(remove_limits(&mut spec));
        assert_eq!(spec, before);
        assert!(!remove_limits(&mut spec));
        assert_eq!(current_limits(&spec), None);
        // HAMi's limits are seen, not ours.
        let mut hami = before.clone();
        hami.containers[0].resources = serde_json::from_value(
            json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}}),
        )
        .unwrap();
        assert_eq!(
            hami_limits(&hami).as_deref(),
            Some("main: nvidia.com/gpu=1, nvidia.com/gpumem=3000")
        );
        assert_eq!(current_limits(&hami), None);
        assert_eq!(hami_limits(&before), None);
        assert_eq!(Form::parse("limits").unwrap(), Form::Limits);
        assert!(Form::parse("x")
            .unwrap_err()
            .to_string()
            .contains("accepted: limits or claim"));
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
            fit_per_node(&m.gpus, &[r.shape()], 100, &Mode::Capacity),
            BTreeMap::from([("node-a".into(), 4), ("node-b".into(), 0)])
        );
        let r = Request::parse("20Gi", None, 1).unwrap();
        assert_eq!(
            fit_per_node(&m.gpus, &[r.shape()], 100, &Mode::Capacity)["node-a"],
            5 + 4
        );
        assert_eq!(
            fit_per_node(&m.gpus, &[r.shape()], 3, &Mode::Capacity)["node-a"],
            3,
            "counting stops at what is wanted"
        );
        // Two claims a pod (two containers with limits): 9 claims of 20Gi, 4 pods.
        assert_eq!(
            fit_per_node(&m.gpus, &[r.shape(), r.shape()], 100, &Mode::Capacity)["node-a"],
            4
        );
        // Two GPUs a pod: at most as many pods as the scarcer GPU holds.
        let r = Request::parse("40Gi", None, 2).unwrap();
        assert_eq!(
            fit_per_node(&m.gpus, &[r.shape()], 100, &Mode::Capacity)["node-a"],
            2
        );
        let r = Request::parse("1Gi", None, 3).unwrap();
        assert_eq!(
            fit_per_node(&m.gpus, &[r.shape()], 100, &Mode::Capacity)["node-a"],
            0,
            "node-a has two GPUs"
        );
        let r = Request::parse("200Gi", None, 1).unwrap();
        assert!(fit_per_node(&m.gpus, &[r.shape()], 100, &Mode::Capacity)
            .values()
            .all(|k| *k == 0));
    }

    #[test]
    fn fit_in_slot_mode_counts_free_slots_not_free_memory() {
        use crate::model::SlotsView;
        let m = build(
            &Sources {
                slices: slices(),
                claims: claims(),
                pods: vec![],
                usage: Err(String::new()),
            },
            None,
        );
        // node-a's GPUs as slots: gpu-0 of 4Gi slots (2 of 6 held), gpu-1 of 24Gi slots; the
        // claim asks of each GPU the slots of its size (8Gi: 2 of 4Gi, 1 of 24Gi).
        let mut gpus = m.gpus.clone();
        for g in gpus.iter_mut().filter(|g| g.node == "node-a") {
            g.slots = Some(if g.device == "gpu-0" {
                SlotsView {
                    size: 4 << 30,
                    published: 6,
                    allocated: 2,
                }
            } else {
                SlotsView {
                    size: 24 << 30,
                    published: 6,
                    allocated: 0,
                }
            });
        }
        let size = |memory: u64| gpuslice_dra::claim_shape::SlotSize {
            memory,
            cores: None,
            per_gpu: 6,
        };
        let mode = Mode::Slots(vec![size(4 << 30), size(24 << 30)]);
        let r = Request::parse("8Gi", None, 1).unwrap();
        assert_eq!(
            fit_per_node(&gpus, &[r.shape()], 100, &mode),
            BTreeMap::from([("node-a".into(), 2 + 6), ("node-b".into(), 0)]),
            "4 free 4Gi slots / 2 and 6 free 24Gi slots / 1; node-b publishes no slots"
        );
        // 30Gi is above 6 × 4Gi: only gpu-1, 2 of its slots per pod.
        let r = Request::parse("30Gi", None, 1).unwrap();
        assert_eq!(
            fit_per_node(&gpus, &[r.shape()], 100, &mode),
            BTreeMap::from([("node-a".into(), 3), ("node-b".into(), 0)]),
        );
    }
}
