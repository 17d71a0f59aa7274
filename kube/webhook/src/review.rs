//! The AdmissionReview exchange (`admission.k8s.io/v1`): the request fields the webhook reads
//! and the response it writes (a JSON Patch, warnings, or a refusal with one line). A review
//! is read in place from its body, and of the pod only what the webhook reads is kept (see
//! [`parse`]), so that reading one costs its body plus a bounded remainder, whatever a
//! hostile pod holds (docs/webhook.md, "Bounds").

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use k8s_openapi::api::core::v1::{
    Affinity, Container, EphemeralContainer, Pod, PodAffinity, PodAffinityTerm, PodSpec,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::placement::{node_reads, request_key, JOB_LABELS};

/// The users the resource claim controller creates claims as: its own service account, or the
/// controller manager's user where that runs without per-controller credentials. The
/// registration's `not-a-pods-claim-from-the-claim-controller` condition names the same
/// (packaging/helm/gpuslice/templates/webhook.yaml, scripts/lib/cluster-webhook.sh).
pub const CLAIM_CONTROLLER_USERS: [&str; 2] = [
    "system:serviceaccount:kube-system:resource-claim-controller",
    "system:kube-controller-manager",
];
/// Entries read of each of the pod's lists (`spec.containers`, `spec.initContainers`,
/// `spec.resourceClaims`); a pod with more is refused.
pub const MAX_LIST: usize = 256;
/// Bytes of the pod the webhook keeps: the `resources` of containers naming `gpuslice.io/*`
/// or `nvidia.com/*` resources, the `nvidia.com/*`, `hami.io/*` and `gpuslice.io/*`
/// annotations (with a request key, the containers' names), the job
/// labels, the required pod anti-affinity terms, the claim entries and what quota scopes read
/// (the priority class, the `cpu` and `memory` asked); a pod with more is refused.
pub const MAX_KEPT: usize = 64 << 10;
/// The longest `uid`, `namespace` or `operation` read (a UID is 36 characters, a namespace
/// at most 63).
pub const MAX_FIELD: usize = 253;

/// A review that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("request.{field} is {len} bytes long; accepted: at most {MAX_FIELD}")]
    Field { field: &'static str, len: usize },
}

/// An object the webhook cannot read: refused. A pod larger than the webhook reads (the API
/// server's pods are far smaller), or a claim whose view cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error(transparent)]
    Claim(#[from] crate::view::ViewError),
    #[error("{list} has {len} entries; accepted: at most {MAX_LIST} (gpuslice-webhook reads no longer list)")]
    List { list: &'static str, len: usize },
    #[error("the pod's GPU resources, nvidia.com/*, hami.io/* and gpuslice.io/* annotations, containers' names (of a pod asking the node by annotation), job labels, required pod anti-affinity terms, claim entries, priority class and cpu and memory asked take more than {MAX_KEPT} bytes; accepted: at most {MAX_KEPT}")]
    Kept,
}

/// The parts of an AdmissionRequest the webhook reads.
#[derive(Debug, Clone)]
pub struct Request {
    pub uid: String,
    pub namespace: String,
    pub operation: String,
    /// The object's kind (`Pod`, `ResourceClaim`); empty when the review names none.
    pub kind: String,
    pub dry_run: bool,
    /// Whether the review's user (`userInfo.username`) is the resource claim controller's
    /// ([`CLAIM_CONTROLLER_USERS`]): only a claim it creates may be taken for
    /// the claim of a pod's template entry (charged nothing). Kept as this answer, not the
    /// name, so that what a review leaves behind stays bounded however long the name.
    pub by_claim_controller: bool,
    /// What [`parse`] keeps of the pod or ResourceClaim (`Null` when the review carries none),
    /// or why it is refused unread.
    pub object: Result<Value, PodError>,
    /// Of a pod, what a quota's scopes read (see `scope`); empty for anything else.
    pub scope: Pod,
}

/// A string borrowed from the body, copied only when it holds escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
struct RawReview<'a> {
    #[serde(borrow)]
    request: Option<RawRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest<'a> {
    #[serde(borrow)]
    uid: Text<'a>,
    #[serde(default, borrow)]
    namespace: Option<Text<'a>>,
    #[serde(default, borrow)]
    operation: Option<Text<'a>>,
    #[serde(default, borrow)]
    kind: Option<KindView<'a>>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default, borrow)]
    user_info: Option<UserView<'a>>,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
}

/// Of `request.userInfo`, only the user's name (the groups and extras are skipped unbuilt).
#[derive(Deserialize)]
struct UserView<'a> {
    #[serde(default, borrow)]
    username: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct KindView<'a> {
    #[serde(default, borrow)]
    kind: Option<Text<'a>>,
}

/// A list of which the first [`MAX_LIST`] entries are kept, unparsed, and the rest counted.
struct Listed<'a> {
    items: Vec<&'a RawValue>,
    len: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Listed<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Listed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut l = Listed {
                    items: Vec::new(),
                    len: 0,
                };
                while l.len < MAX_LIST {
                    match seq.next_element::<&'de RawValue>()? {
                        Some(x) => l.items.push(x),
                        None => return Ok(l),
                    }
                    l.len += 1;
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    l.len += 1;
                }
                Ok(l)
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct PodView<'a> {
    #[serde(default, borrow)]
    metadata: Option<MetaView<'a>>,
    #[serde(default, borrow)]
    spec: Option<SpecView<'a>>,
}

#[derive(Deserialize)]
struct MetaView<'a> {
    #[serde(default, borrow)]
    labels: Option<&'a RawValue>,
    #[serde(default, borrow)]
    annotations: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffinityView<'a> {
    #[serde(default, borrow)]
    pod_anti_affinity: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct AntiAffinityView<'a> {
    #[serde(
        default,
        borrow,
        rename = "requiredDuringSchedulingIgnoredDuringExecution"
    )]
    required: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView<'a> {
    #[serde(default, borrow)]
    containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    init_containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    resource_claims: Option<Listed<'a>>,
    #[serde(default, borrow)]
    affinity: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerView<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    resources: Option<&'a RawValue>,
    /// `Always` makes an init container a sidecar, which runs beside the app containers.
    #[serde(default, borrow)]
    restart_policy: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct ResourcesView<'a> {
    #[serde(default, borrow)]
    limits: Option<&'a RawValue>,
    #[serde(default, borrow)]
    requests: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimView<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    resource_claim_template_name: Option<Text<'a>>,
    #[serde(default, borrow)]
    resource_claim_name: Option<Text<'a>>,
}

/// The resource and annotation names the webhook acts on.
fn gpu_name(name: &str) -> bool {
    name.starts_with("gpuslice.io/")
        || name.starts_with("nvidia.com/")
        || gpuslice_dra::IMPLICIT_EXTENDED_RESOURCES.contains(&name)
}

/// The annotations the webhook reads: HAMi's (selection and policy) and the `gpuslice.io/*`
/// ones a node reads on the annotation path, of which only a request key asks a slice (refused
/// where a budget holds; it makes a pod of a job a rank to keep apart, whose containers the
/// node gives slices are read by its reading of all of them).
fn read_annotation(name: &str) -> bool {
    name.starts_with("nvidia.com/") || name.starts_with("hami.io/") || node_reads(name)
}

/// The entries of a JSON object whose names pass `keep`, values unparsed; anything but an
/// object has none.
struct Entries<'a, F> {
    kept: Vec<(Cow<'a, str>, &'a RawValue)>,
    keep: F,
}

impl<'de, F: Fn(&str) -> bool> Entries<'de, F> {
    fn of(raw: &'de RawValue, keep: F) -> Vec<(Cow<'de, str>, &'de RawValue)> {
        let mut d = serde_json::Deserializer::from_str(raw.get());
        let mut e = Entries {
            kept: Vec::new(),
            keep,
        };
        match Deserializer::deserialize_map(&mut d, &mut e) {
            Ok(()) => e.kept,
            Err(_) => Vec::new(),
        }
    }
}

impl<'de, F: Fn(&str) -> bool> Visitor<'de> for &mut Entries<'de, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(Text(k)) = map.next_key::<Text<'de>>()? {
            if (self.keep)(&k) {
                self.kept.push((k, map.next_value::<&'de RawValue>()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// What the webhook keeps of a pod, charged against [`MAX_KEPT`].
struct Kept {
    bytes: usize,
}

impl Kept {
    /// Charges `bytes` kept: past [`MAX_KEPT`] in all, the pod is refused.
    fn take(&mut self, bytes: usize) -> Result<(), PodError> {
        self.bytes += bytes;
        if self.bytes > MAX_KEPT {
            return Err(PodError::Kept);
        }
        Ok(())
    }

    fn value(&mut self, raw: &RawValue, extra: usize) -> Result<Value, PodError> {
        self.take(raw.get().len() + extra)?;
        // A RawValue is valid JSON, so this parses; a failure keeps nothing.
        Ok(serde_json::from_str(raw.get()).unwrap_or(Value::Null))
    }
}

/// A container as the webhook reads it: its `resources` if they name a GPU resource, and,
/// in a pod asking the node for slices by annotation (`named`), its `name` (by which the node
/// reads the annotations); with either, whether it restarts `Always` (what makes an init
/// container a sidecar); else nothing (`Null`: no limits to turn into a claim).
fn container(raw: &RawValue, named: bool, kept: &mut Kept) -> Result<Value, PodError> {
    let Some(view) = serde_json::from_str::<ContainerView>(raw.get()).ok() else {
        return Ok(Value::Null);
    };
    let mut c = Map::new();
    if let Some(res) = view.resources.filter(|res| {
        serde_json::from_str::<ResourcesView>(res.get())
            .ok()
            .is_some_and(|r| {
                [r.limits, r.requests]
                    .into_iter()
                    .flatten()
                    .any(|m| !Entries::of(m, gpu_name).is_empty())
            })
    }) {
        c.insert("resources".into(), kept.value(res, 0)?);
    }
    if let Some(Text(name)) = view.name.filter(|_| named) {
        kept.take(name.len())?;
        c.insert("name".into(), Value::String(name.into_owned()));
    }
    if c.is_empty() {
        return Ok(Value::Null);
    }
    if view.restart_policy.is_some_and(|p| p.0 == "Always") {
        c.insert("restartPolicy".into(), json!("Always"));
    }
    Ok(Value::Object(c))
}

/// The pod as the webhook reads it: `metadata.labels` (the job labels of
/// [`JOB_LABELS`]), `metadata.annotations` (those of `nvidia.com/*` and `hami.io/*`, and of
/// `gpuslice.io/*` when one is a request key; an empty map when it has others only),
/// `spec.affinity` (whether it and its `podAntiAffinity` exist, and the latter's required
/// terms), `spec.containers[*]` and `spec.initContainers[*]` (the `resources` of those naming
/// `gpuslice.io/*` or `nvidia.com/*` resources or a gpuslice device class's extended resource,
/// and, when a `gpuslice.io/*` annotation is a
/// request key, every container's `name`; with either, `restartPolicy: Always`; others
/// `null`, indices unchanged) and
/// `spec.resourceClaims[*]` (their `name`, `resourceClaimTemplateName` and
/// `resourceClaimName`; the list is there when the pod has one). This is all `mutate::plan`,
/// `mutate::mentions_hami`, `placement` and the budget's charge read: a field they come to read must be
/// kept here too. With it, what the quotas' scopes read of the pod (`scope`).
fn pod(raw: &RawValue) -> Result<(Value, Pod), PodError> {
    let Ok(view) = serde_json::from_str::<PodView>(raw.get()) else {
        // Not a pod (not an object, or its fields of the wrong kinds): nothing to act on.
        return Ok((Value::Null, Pod::default()));
    };
    let mut kept = Kept { bytes: 0 };
    let scope = scope(raw, &mut kept)?;
    let mut out = Map::new();
    let mut meta = Map::new();
    let mut asks_node = false;
    if let Some(m) = view.metadata {
        if let Some(labels) = m.labels {
            let mut l = Map::new();
            for (k, v) in Entries::of(labels, |k| JOB_LABELS.contains(&k)) {
                let v = kept.value(v, k.len())?;
                l.insert(k.into_owned(), v);
            }
            meta.insert("labels".into(), Value::Object(l));
        }
        // Kept, if only empty, when the pod has annotations: the patch adds to them.
        if let Some(ann) = m.annotations {
            let read = Entries::of(ann, read_annotation);
            // The node's other `gpuslice.io/*` annotations only beside a request key: what
            // it reads of the pod then ([`node_reads`]), by its containers' names.
            asks_node = read.iter().any(|(k, _)| request_key(k).is_some());
            let mut a = Map::new();
            for (k, v) in read {
                if !asks_node && node_reads(&k) {
                    continue;
                }
                let v = kept.value(v, k.len())?;
                a.insert(k.into_owned(), v);
            }
            meta.insert("annotations".into(), Value::Object(a));
        }
    }
    if !meta.is_empty() {
        out.insert("metadata".into(), Value::Object(meta));
    }
    let mut spec = Map::new();
    if let Some(s) = view.spec {
        // Of the affinity, which levels exist and the required anti-affinity terms: the
        // job's term is added beside the pod's own.
        if let Some(a) = s.affinity {
            let mut affinity = Map::new();
            if let Some(anti) = serde_json::from_str::<AffinityView>(a.get())
                .ok()
                .and_then(|v| v.pod_anti_affinity)
            {
                let mut pa = Map::new();
                if let Some(req) = serde_json::from_str::<AntiAffinityView>(anti.get())
                    .ok()
                    .and_then(|v| v.required)
                {
                    pa.insert(
                        "requiredDuringSchedulingIgnoredDuringExecution".into(),
                        kept.value(req, 0)?,
                    );
                }
                affinity.insert("podAntiAffinity".into(), Value::Object(pa));
            }
            spec.insert("affinity".into(), Value::Object(affinity));
        }
        for (name, field, list) in [
            ("spec.containers", "containers", s.containers),
            ("spec.initContainers", "initContainers", s.init_containers),
        ] {
            let Some(l) = list else { continue };
            if l.len > MAX_LIST {
                return Err(PodError::List {
                    list: name,
                    len: l.len,
                });
            }
            let items = l
                .items
                .iter()
                .map(|c| container(c, asks_node, &mut kept))
                .collect::<Result<Vec<_>, _>>()?;
            spec.insert(field.into(), Value::Array(items));
        }
        if let Some(l) = s.resource_claims {
            if l.len > MAX_LIST {
                return Err(PodError::List {
                    list: "spec.resourceClaims",
                    len: l.len,
                });
            }
            let mut entries = Vec::new();
            for e in l.items {
                let Ok(c) = serde_json::from_str::<ClaimView>(e.get()) else {
                    continue;
                };
                let mut entry = Map::new();
                for (key, v) in [
                    ("name", c.name),
                    ("resourceClaimTemplateName", c.resource_claim_template_name),
                    ("resourceClaimName", c.resource_claim_name),
                ] {
                    if let Some(Text(v)) = v {
                        kept.bytes += key.len() + v.len();
                        if kept.bytes > MAX_KEPT {
                            return Err(PodError::Kept);
                        }
                        entry.insert(key.into(), Value::String(v.into_owned()));
                    }
                }
                if !entry.is_empty() {
                    entries.push(Value::Object(entry));
                }
            }
            spec.insert("resourceClaims".into(), Value::Array(entries));
        }
    }
    out.insert("spec".into(), Value::Object(spec));
    Ok((Value::Object(out), scope))
}

#[derive(Deserialize)]
struct ScopePodView<'a> {
    #[serde(default, borrow)]
    spec: Option<ScopeSpecView<'a>>,
}

/// Of a pod's spec, the fields a quota's scopes read, each read on its own.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopeSpecView<'a> {
    #[serde(default, borrow)]
    priority_class_name: Option<&'a RawValue>,
    #[serde(default, borrow)]
    active_deadline_seconds: Option<&'a RawValue>,
    #[serde(default, borrow)]
    resources: Option<&'a RawValue>,
    #[serde(default, borrow)]
    containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    init_containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    affinity: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopeAffinityView {
    #[serde(default)]
    pod_affinity: Option<TermsView>,
    #[serde(default)]
    pod_anti_affinity: Option<TermsView>,
}

/// The terms of a pod affinity or anti-affinity: whether any names other namespaces.
#[derive(Deserialize)]
struct TermsView {
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    required: Option<Crossing<TermView>>,
    #[serde(default, rename = "preferredDuringSchedulingIgnoredDuringExecution")]
    preferred: Option<Crossing<WeightedTermView>>,
}

/// A term's `namespaces` (whether it lists any) and whether it has a `namespaceSelector`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TermView {
    #[serde(default)]
    namespaces: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    namespace_selector: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WeightedTermView {
    #[serde(default)]
    pod_affinity_term: Option<TermView>,
}

/// A term that may name other namespaces.
trait Crosses {
    fn term(&self) -> Option<&TermView>;
}

impl Crosses for TermView {
    fn term(&self) -> Option<&TermView> {
        Some(self)
    }
}

impl Crosses for WeightedTermView {
    fn term(&self) -> Option<&TermView> {
        self.pod_affinity_term.as_ref()
    }
}

/// A list of terms read one at a time, however many, keeping only whether one names other
/// namespaces (its `namespaces` not empty, or a `namespaceSelector`, even an empty one).
struct Crossing<T>(bool, std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de> + Crosses> Deserialize<'de> for Crossing<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Crosses> Visitor<'de> for V<T> {
            type Value = Crossing<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of terms")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut crosses = false;
                while let Some(t) = seq.next_element::<T>()? {
                    crosses |= t.term().is_some_and(|t| {
                        t.namespaces.as_ref().is_some_and(|n| !n.is_empty())
                            || t.namespace_selector.is_some()
                    });
                }
                Ok(Crossing(crosses, std::marker::PhantomData))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// The `names` entries of a `requests` or `limits` map, as quantities (a value that is no
/// string is left out), charged against [`MAX_KEPT`].
fn quantities(
    raw: Option<&RawValue>,
    names: impl Fn(&str) -> bool,
    kept: &mut Kept,
) -> Result<Option<std::collections::BTreeMap<String, Quantity>>, PodError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in Entries::of(raw, names) {
        if let Value::String(q) = kept.value(v, k.len())? {
            out.insert(k.into_owned(), Quantity(q));
        }
    }
    Ok((!out.is_empty()).then_some(out))
}

/// The `names` requests and limits of `resources`.
fn requirements(
    resources: Option<&RawValue>,
    names: impl Fn(&str) -> bool + Copy,
    kept: &mut Kept,
) -> Result<Option<ResourceRequirements>, PodError> {
    let Some(r) = resources.and_then(|r| serde_json::from_str::<ResourcesView>(r.get()).ok())
    else {
        return Ok(None);
    };
    Ok(Some(ResourceRequirements {
        limits: quantities(r.limits, names, kept)?,
        requests: quantities(r.requests, names, kept)?,
        ..ResourceRequirements::default()
    }))
}

/// Of a pod, what a quota's scopes read (gpuslice_dra::quota::Scope::holds_for_pod), as a Pod
/// holding only that: `spec.priorityClassName` (`PriorityClass`),
/// `spec.activeDeadlineSeconds` (`Terminating`), the `cpu` and `memory` requests and limits
/// of each container and init container and the pod-level `resources` of the names the
/// kubelet manages at the pod level (`BestEffort`), and, standing for the pod affinity and
/// anti-affinity terms, one term with a `namespaceSelector` when one of them names other
/// namespaces (`CrossNamespacePodAffinity`). What is kept is charged against [`MAX_KEPT`];
/// a field that cannot be read is left out.
fn scope(raw: &RawValue, kept: &mut Kept) -> Result<Pod, PodError> {
    let Some(s) = serde_json::from_str::<ScopePodView>(raw.get())
        .ok()
        .and_then(|v| v.spec)
    else {
        return Ok(Pod::default());
    };
    let cpu_or_memory = |k: &str| k == "cpu" || k == "memory";
    let mut spec = PodSpec {
        active_deadline_seconds: s
            .active_deadline_seconds
            .and_then(|r| serde_json::from_str(r.get()).ok()),
        resources: requirements(
            s.resources,
            |k| cpu_or_memory(k) || k.starts_with("hugepages-"),
            kept,
        )?,
        ..PodSpec::default()
    };
    if let Some(r) = s.priority_class_name {
        if let Value::String(c) = kept.value(r, 0)? {
            spec.priority_class_name = Some(c);
        }
    }
    for (list, into) in [
        (s.containers, &mut spec.containers),
        (
            s.init_containers,
            spec.init_containers.get_or_insert_with(Vec::new),
        ),
    ] {
        for c in list.iter().flat_map(|l| &l.items) {
            let resources = serde_json::from_str::<ContainerView>(c.get())
                .ok()
                .and_then(|v| v.resources);
            into.push(Container {
                resources: requirements(resources, cpu_or_memory, kept)?,
                ..Container::default()
            });
        }
    }
    let crosses = |t: Option<TermsView>| {
        t.is_some_and(|t| t.required.is_some_and(|c| c.0) || t.preferred.is_some_and(|c| c.0))
    };
    if s.affinity
        .and_then(|a| serde_json::from_str::<ScopeAffinityView>(a.get()).ok())
        .is_some_and(|a| crosses(a.pod_affinity) || crosses(a.pod_anti_affinity))
    {
        spec.affinity = Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                    namespace_selector: Some(LabelSelector::default()),
                    ..PodAffinityTerm::default()
                }]),
                ..PodAffinity::default()
            }),
            ..Affinity::default()
        });
    }
    Ok(Pod {
        spec: Some(spec),
        ..Pod::default()
    })
}

/// A pod as the budget recount reads it: its view ([`crate::view`]: claim entries, phase,
/// claim statuses) with what the quotas' scopes read of it, read as an admission reads it
/// ([`scope`]), so that a recount and an admission match a scoped quota alike; and, when it
/// asks the node for slices by annotation, its `gpuslice.io/*` annotations and the names of its
/// containers, init and ephemeral containers (what the node reads of it,
/// [`crate::budget::annotation_charge`]). All of it is kept within [`MAX_KEPT`] and
/// [`MAX_LIST`] entries a list, as an admission keeps a pod; a pod past them cannot be read.
#[derive(Debug, Clone)]
pub struct ScopedPod(pub Pod);

/// Of a pod, what the node reads as a slice request: its annotations (kept: the
/// `gpuslice.io/*` ones, when one is a request key) and its containers' names, each list read as [`Listed`] (unparsed, bounded).
#[derive(Deserialize)]
struct AskView<'a> {
    #[serde(default, borrow)]
    metadata: Option<AskMetaView<'a>>,
    #[serde(default, borrow)]
    spec: Option<AskSpecView<'a>>,
}

#[derive(Deserialize)]
struct AskMetaView<'a> {
    #[serde(default, borrow)]
    annotations: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AskSpecView<'a> {
    #[serde(default, borrow)]
    containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    init_containers: Option<Listed<'a>>,
    #[serde(default, borrow)]
    ephemeral_containers: Option<Listed<'a>>,
}

#[derive(Deserialize)]
struct NamedView<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
}

/// The names of the containers of list `list` (at `field`), charged to `kept`: a list
/// longer than [`MAX_LIST`] is refused, as an admission refuses it; a name that cannot be
/// read is empty.
fn names(
    list: Option<Listed>,
    field: &'static str,
    kept: &mut Kept,
) -> Result<Vec<String>, PodError> {
    let Some(l) = list else {
        return Ok(Vec::new());
    };
    if l.len > MAX_LIST {
        return Err(PodError::List {
            list: field,
            len: l.len,
        });
    }
    l.items
        .iter()
        .map(|c| {
            let name = serde_json::from_str::<NamedView>(c.get())
                .ok()
                .and_then(|n| n.name)
                .map(|Text(n)| n.into_owned())
                .unwrap_or_default();
            kept.take(name.len())?;
            Ok(name)
        })
        .collect()
}

/// Sets on `pod` (as [`ScopedPod`] keeps it), when `raw` has a request annotation, its
/// `gpuslice.io/*` annotations ([`node_reads`]) and the names of its containers, init and ephemeral containers (the node books a
/// slice for each container the annotations ask one for), charged to `kept`; nothing when
/// `raw` cannot be read so (a pod the API server stored always can).
fn keep_asks(raw: &str, pod: &mut Pod, kept: &mut Kept) -> Result<(), PodError> {
    let Ok(v) = serde_json::from_str::<AskView>(raw) else {
        return Ok(());
    };
    let read = v
        .metadata
        .and_then(|m| m.annotations)
        .map(|a| Entries::of(a, node_reads))
        .unwrap_or_default();
    // What the node reads once a request key is there: every `gpuslice.io/*` annotation, so
    // that one it refuses the pod for is seen as it sees it.
    if !read.iter().any(|(k, _)| request_key(k).is_some()) {
        return Ok(());
    }
    let mut asks: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in read {
        if let Ok(v) = serde_json::from_str::<String>(v.get()) {
            kept.take(k.len() + v.len())?;
            asks.insert(k.into_owned(), v);
        }
    }
    let (Some(spec), Some(s), false) = (pod.spec.as_mut(), v.spec, asks.is_empty()) else {
        return Ok(());
    };
    pod.metadata.annotations = Some(asks);
    for (named, into) in [
        (
            names(s.containers, "spec.containers", kept)?,
            &mut spec.containers,
        ),
        (
            names(s.init_containers, "spec.initContainers", kept)?,
            spec.init_containers.get_or_insert_with(Vec::new),
        ),
    ] {
        into.resize_with(named.len().max(into.len()), Container::default);
        for (c, n) in into.iter_mut().zip(named) {
            c.name = n;
        }
    }
    let ephemeral = names(s.ephemeral_containers, "spec.ephemeralContainers", kept)?;
    if !ephemeral.is_empty() {
        spec.ephemeral_containers = Some(
            ephemeral
                .into_iter()
                .map(|name| EphemeralContainer {
                    name,
                    ..EphemeralContainer::default()
                })
                .collect(),
        );
    }
    Ok(())
}

impl crate::view::Viewed for ScopedPod {
    const KIND: &'static str = "Pod";

    fn read(json: &str) -> Result<Self, crate::view::ViewError> {
        let mut pod = <Pod as crate::view::Viewed>::read(json)?;
        let failed = |detail: String| crate::view::ViewError {
            kind: Self::KIND,
            object: crate::view::named(json),
            detail,
        };
        // What the scopes read and what the node reads are kept within one bound, as an
        // admission keeps them.
        let mut kept = Kept { bytes: 0 };
        let scoped = serde_json::from_str::<&RawValue>(json)
            .map_err(|e| e.to_string())
            .and_then(|raw| scope(raw, &mut kept).map_err(|e| e.to_string()))
            .map_err(failed)?;
        if let (Some(spec), Some(s)) = (pod.spec.as_mut(), scoped.spec) {
            spec.priority_class_name = s.priority_class_name;
            spec.active_deadline_seconds = s.active_deadline_seconds;
            spec.resources = s.resources;
            spec.containers = s.containers;
            spec.init_containers = s.init_containers;
            spec.affinity = s.affinity;
        }
        keep_asks(json, &mut pod, &mut kept).map_err(|e| failed(e.to_string()))?;
        Ok(ScopedPod(pod))
    }
}

/// Listed as pods: [`ScopedPod`] is how a pod's list is read, not a kind of its own.
impl kube::Resource for ScopedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.0.metadata
    }
}

/// The lists of a claim's spec the API server bounds (`resource.k8s.io/v1` validation), so
/// that a review's claim is refused before it is built when one holds more: built, a
/// 3 MiB claim of tiny entries takes tens of megabytes, and a charge compares every
/// constraint's names with every request.
mod claim_lengths {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
    use serde::Deserialize;

    /// One bounded list: where it is and the API server's limit.
    pub trait Limit {
        const FIELD: &'static str;
        const MAX: usize;
    }

    /// A list read element by element, refused at its limit's next element.
    pub struct Bounded<T, L>(PhantomData<(T, L)>);

    impl<'de, T: Deserialize<'de>, L: Limit> Deserialize<'de> for Bounded<T, L> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T, L>(PhantomData<(T, L)>);
            impl<'de, T: Deserialize<'de>, L: Limit> Visitor<'de> for V<T, L> {
                type Value = Bounded<T, L>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    write!(f, "{} as a list", L::FIELD)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    let mut n = 0usize;
                    while seq.next_element::<T>()?.is_some() {
                        n += 1;
                        if n > L::MAX {
                            return Err(de::Error::custom(format_args!(
                                "{} has more than {max} entries; accepted: at most {max} (the API server's limit)",
                                L::FIELD,
                                max = L::MAX
                            )));
                        }
                    }
                    Ok(Bounded(PhantomData))
                }
            }
            d.deserialize_seq(V(PhantomData))
        }
    }

    macro_rules! limits {
        ($($name:ident = $field:literal, $max:expr;)*) => {$(
            pub enum $name {}
            impl Limit for $name {
                const FIELD: &'static str = $field;
                const MAX: usize = $max;
            }
        )*};
    }
    limits! {
        Requests = "spec.devices.requests", 32;
        SubRequests = "spec.devices.requests[].firstAvailable", 8;
        Selectors = "spec.devices.requests[].selectors", 32;
        Constraints = "spec.devices.constraints", 32;
        ConstraintRequests = "spec.devices.constraints[].requests", 32;
        Configs = "spec.devices.config", 32;
        ConfigRequests = "spec.devices.config[].requests", 32;
    }

    #[derive(Deserialize)]
    pub struct Claim {
        #[serde(default, rename = "spec")]
        _spec: Option<Spec>,
    }
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default, rename = "devices")]
        _devices: Option<Devices>,
    }
    #[derive(Deserialize)]
    struct Devices {
        #[serde(default, rename = "requests")]
        _requests: Option<Bounded<Request, Requests>>,
        #[serde(default, rename = "constraints")]
        _constraints: Option<Bounded<Named<ConstraintRequests>, Constraints>>,
        #[serde(default, rename = "config")]
        _config: Option<Bounded<Named<ConfigRequests>, Configs>>,
    }
    #[derive(Deserialize)]
    struct Request {
        #[serde(default, rename = "exactly")]
        _exactly: Option<Selected>,
        #[serde(default, rename = "firstAvailable")]
        _first_available: Option<Bounded<Selected, SubRequests>>,
    }
    #[derive(Deserialize)]
    struct Selected {
        #[serde(default, rename = "selectors")]
        _selectors: Option<Bounded<IgnoredAny, Selectors>>,
    }
    /// A constraint or a configuration: the requests it names.
    #[derive(Deserialize)]
    #[serde(bound = "")]
    struct Named<L: Limit> {
        #[serde(default, rename = "requests")]
        _requests: Option<Bounded<IgnoredAny, L>>,
    }
}

/// A claim as the webhook reads it (see [`crate::view`]), refused unbuilt when a list of its
/// spec is longer than the API server allows.
fn claim(raw: &RawValue) -> Result<Value, PodError> {
    use crate::view::{ViewError, Viewed};
    serde_json::from_str::<claim_lengths::Claim>(raw.get()).map_err(|e| {
        PodError::Claim(ViewError {
            kind: "ResourceClaim",
            object: crate::view::named(raw.get()),
            detail: e.to_string(),
        })
    })?;
    let c = k8s_openapi::api::resource::v1::ResourceClaim::read(raw.get())?;
    serde_json::to_value(&c).map_err(|e| {
        PodError::Claim(ViewError {
            kind: "ResourceClaim",
            object: crate::view::named(raw.get()),
            detail: e.to_string(),
        })
    })
}

fn field(name: &'static str, t: Option<Text>) -> Result<String, ReviewError> {
    let s = t.map(|t| t.0).unwrap_or_default();
    if s.len() > MAX_FIELD {
        return Err(ReviewError::Field {
            field: name,
            len: s.len(),
        });
    }
    Ok(s.into_owned())
}

/// Reads the request of a review from its body in place: the body is not copied, parts of
/// the review the webhook does not read are skipped unbuilt, and of the pod only what
/// `mutate` reads is kept (see `pod`).
pub fn parse(body: &[u8]) -> Result<Request, ReviewError> {
    let r = serde_json::from_slice::<RawReview>(body)?
        .request
        .ok_or(ReviewError::NoRequest)?;
    let kind = field("kind", r.kind.and_then(|k| k.kind))?;
    let (object, scope) = match r.object {
        None => (Ok(Value::Null), Pod::default()),
        // A claim is read through its view (the body's bound bounds it): its spec is what it
        // charges; one that cannot be read is refused, never admitted uncharged.
        Some(raw) if kind == "ResourceClaim" => (claim(raw), Pod::default()),
        Some(raw) => match pod(raw) {
            Ok((p, scope)) => (Ok(p), scope),
            Err(e) => (Err(e), Pod::default()),
        },
    };
    Ok(Request {
        uid: field("uid", Some(r.uid))?,
        namespace: field("namespace", r.namespace)?,
        operation: field("operation", r.operation)?,
        kind,
        dry_run: r.dry_run,
        by_claim_controller: r
            .user_info
            .and_then(|u| u.username)
            .is_some_and(|n| CLAIM_CONTROLLER_USERS.contains(&n.0.as_ref())),
        object,
        scope,
    })
}

fn review(response: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// Admits, with `patch` (JSON Patch operations; none: unchanged) and `warnings`.
pub fn allow(uid: &str, patch: &[Value], warnings: &[String]) -> Value {
    let mut r = json!({"uid": uid, "allowed": true});
    if !patch.is_empty() {
        let bytes = serde_json::to_vec(patch).unwrap_or_default();
        r["patchType"] = json!("JSONPatch");
        r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    if !warnings.is_empty() {
        r["warnings"] = json!(warnings);
    }
    review(r)
}

/// Refuses with `message` (one line) and HTTP-like `code` (400: the request; 500: the webhook
/// could not do its part).
pub fn deny(uid: &str, code: u16, message: &str) -> Value {
    review(json!({
        "uid": uid,
        "allowed": false,
        "status": {"code": code, "message": message},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::{mentions_hami, plan};
    use gpuslice_dra::claim_shape::PublishedGpus;

    fn review_of(pod: &Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "namespace": "ns", "operation": "CREATE",
                        "userInfo": {"username": "x", "groups": ["a", "b"]},
                        "object": pod, "oldObject": null, "dryRun": false},
        }))
        .unwrap()
    }

    #[test]
    fn the_scope_of_a_pod_keeps_what_quota_scopes_read_and_matches_as_the_whole_pod() {
        use gpuslice_dra::quota::Scope;
        let far = json!({"topologyKey": "kubernetes.io/hostname", "namespaces": ["other"]});
        let near = json!({"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"a": "b"}}});
        // The one term naming another namespace lies past the entries a list is read for.
        let mut preferred = vec![json!({"weight": 1, "podAffinityTerm": near}); 2 * MAX_LIST];
        preferred.push(json!({"weight": 1, "podAffinityTerm": far}));
        let whole = json!({"metadata": {"name": "p"}, "spec": {
            "priorityClassName": "high",
            "activeDeadlineSeconds": 30,
            "containers": [
                {"name": "a", "image": "x", "env": [{"name": "E", "value": "v"}], "resources": {
                    "limits": {"gpuslice.io/memory": "10Gi"}}},
                {"name": "b", "image": "x", "resources": {"requests": {"cpu": "100m",
                    "ephemeral-storage": "1Gi"}}}],
            "initContainers": [{"name": "i", "image": "x"}],
            "affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [near],
                "preferredDuringSchedulingIgnoredDuringExecution": preferred}},
        }});
        let kept = parse(&review_of(&whole)).unwrap().scope;
        let spec = kept.spec.as_ref().unwrap();
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(spec.active_deadline_seconds, Some(30));
        // Of the containers, cpu and memory only.
        assert_eq!(spec.containers.len(), 2);
        let b = spec.containers[1].resources.as_ref().unwrap();
        assert_eq!(
            b.requests.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["cpu"]
        );
        let pod: Pod = serde_json::from_value(whole.clone()).unwrap();
        // Every scope decides the kept pod as it decides the whole one.
        for name in [
            "Terminating",
            "NotTerminating",
            "BestEffort",
            "NotBestEffort",
            "CrossNamespacePodAffinity",
        ] {
            let s = Scope {
                name: name.into(),
                operator: "Exists".into(),
                values: vec![],
            };
            assert_eq!(s.holds_for_pod(&kept), s.holds_for_pod(&pod), "{name}");
        }
        let cross = Scope {
            name: "CrossNamespacePodAffinity".into(),
            operator: "Exists".into(),
            values: vec![],
        };
        assert!(cross.holds_for_pod(&kept));
        // A pod of no scope field: an empty spec's scopes.
        let plain = parse(&review_of(&json!({"spec": {"containers": [
            {"name": "a", "image": "x"}]}})))
        .unwrap()
        .scope;
        assert!(!cross.holds_for_pod(&plain));
        assert_eq!(plain.spec.unwrap().priority_class_name, None);
    }

    fn full_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b", "training.kubeflow.org/job-name": "j"}, "annotations": {
                "nvidia.com/use-gputype": "A100", "hami.io/gpu-scheduler-policy": "spread",
                "other/x": "y"}},
            "spec": {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}]}},
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [],
                        "requiredDuringSchedulingIgnoredDuringExecution": [{
                            "labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}]},
                },
                "resourceClaims": [{"name": "mine", "resourceClaimName": "c"}],
                "initContainers": [{"name": "i", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                    "resources": {"limits": {"gpuslice.io/memory": "10Gi"}}}],
                "containers": [
                    {"name": "side", "image": "x", "env": [{"name": "A", "value": "1"}],
                     "resources": {"limits": {"cpu": "1"}}},
                    {"name": "app", "image": "x", "command": ["sh"],
                     "resources": {"limits": {"gpuslice.io/memory": "20Gi", "cpu": "2"},
                                   "requests": {"cpu": "1"}, "claims": [{"name": "mine"}]}},
                    {"name": "hami", "image": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000"}}},
                ],
            },
        })
    }

    #[test]
    fn the_kept_pod_plans_as_the_whole_pod_does() {
        let full = full_pod();
        let r = parse(&review_of(&full)).unwrap();
        assert_eq!((r.uid.as_str(), r.namespace.as_str()), ("u1", "ns"));
        assert_eq!(r.operation, "CREATE");
        let kept = r.object.unwrap();
        assert_eq!(mentions_hami(&kept), mentions_hami(&full));
        let slots = PublishedGpus {
            mode: gpuslice_dra::claim_shape::Mode::Slots(vec![
                gpuslice_dra::claim_shape::SlotSize {
                    memory: 8 << 30,
                    cores: None,
                    per_gpu: 10,
                },
            ]),
            max_gpus_per_node: Some(8),
            gpu_memory: vec![80 << 30],
        };
        // The pod as a rank of its job (refused: its sidecar and app run together on slices)
        // and as a pod of no job (admitted).
        let mut of_no_job = full.clone();
        of_no_job["metadata"]["labels"] = json!({"a": "b"});
        let kept_of_no_job = parse(&review_of(&of_no_job)).unwrap().object.unwrap();
        for (full, kept) in [(&full, &kept), (&of_no_job, &kept_of_no_job)] {
            for inv in [PublishedGpus::default(), slots.clone()] {
                for hami in [false, true] {
                    let a = plan(full, "ns", hami, &inv).map(|p| (p.patch, p.warnings));
                    let b = plan(kept, "ns", hami, &inv).map(|p| (p.patch, p.warnings));
                    assert_eq!(
                        format!("{a:?}"),
                        format!("{b:?}"),
                        "hami {hami}, {:?}: kept {kept}",
                        inv.mode
                    );
                }
            }
        }
        assert!(plan(&kept_of_no_job, "ns", true, &PublishedGpus::default()).is_ok());
        let inv = PublishedGpus::default();
        // The sidecar keeps its own claim beside the app's: it runs beside the app, each on a
        // slice of its own, which in a rank of a job is refused, as the whole pod is.
        assert_eq!(kept["spec"]["initContainers"][1]["restartPolicy"], "Always");
        assert!(matches!(
            plan(&kept, "ns", false, &inv),
            Err(crate::mutate::MutateError::RankContainers { .. })
        ));
        // The job's term appended to the pod's own (a rank whose sidecar asks no slice).
        let mut one = full.clone();
        one["spec"]["initContainers"][1]["resources"] = json!({});
        let kept_one = parse(&review_of(&one)).unwrap().object.unwrap();
        let patch = plan(&kept_one, "ns", false, &inv).unwrap().patch;
        assert!(
            patch.iter().any(|op| {
                op["path"]
                == "/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution/-"
            }),
            "{patch:?}"
        );
        // Only what the plan reads.
        assert_eq!(kept["spec"]["containers"][0], Value::Null);
        assert_eq!(
            kept["metadata"]["labels"],
            json!({"training.kubeflow.org/job-name": "j"})
        );
        assert_eq!(
            kept["spec"]["affinity"],
            json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}]}})
        );
        assert_eq!(
            kept["metadata"]["annotations"],
            json!({"nvidia.com/use-gputype": "A100", "hami.io/gpu-scheduler-policy": "spread"})
        );
        assert_eq!(
            kept["spec"]["resourceClaims"],
            json!([{"name": "mine", "resourceClaimName": "c"}])
        );
    }

    #[test]
    fn an_escaped_name_is_read_as_its_text() {
        // "gpuslice.io\/memory" is the same name in JSON.
        let body = br#"{"request":{"uid":"u","operation":"CREATE","object":{"spec":{"containers":[
            {"name":"a","resources":{"limits":{"gpuslice.io\/memory":"1Gi"}}}]}}}}"#;
        let kept = parse(body).unwrap().object.unwrap();
        assert_eq!(
            kept["spec"]["containers"][0]["resources"]["limits"]["gpuslice.io/memory"],
            "1Gi"
        );
    }

    #[test]
    fn a_pod_beyond_the_bounds_is_refused_naming_the_bound() {
        let mut p = full_pod();
        p["spec"]["containers"] = Value::Array(vec![json!(0); MAX_LIST + 5]);
        let e = parse(&review_of(&p)).unwrap().object.unwrap_err();
        assert_eq!(
            e,
            PodError::List {
                list: "spec.containers",
                len: MAX_LIST + 5
            }
        );
        assert!(e.to_string().contains("at most 256"), "{e}");
        // Exactly MAX_LIST is read.
        p["spec"]["containers"] = Value::Array(vec![json!(0); MAX_LIST]);
        assert!(parse(&review_of(&p)).unwrap().object.is_ok());

        let mut p = full_pod();
        p["spec"]["containers"][1]["resources"]["junk"] = json!("x".repeat(MAX_KEPT));
        let e = parse(&review_of(&p)).unwrap().object.unwrap_err();
        assert_eq!(e, PodError::Kept);
        // The same bytes where the webhook does not read are skipped unkept.
        let mut p = full_pod();
        p["spec"]["containers"][0]["env"] = json!([{"name": "J", "value": "x".repeat(MAX_KEPT)}]);
        p["metadata"]["annotations"]["other/big"] = json!("x".repeat(MAX_KEPT));
        assert!(parse(&review_of(&p)).unwrap().object.is_ok());
    }

    fn claim_review(claim: &str) -> Vec<u8> {
        format!(
            r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{
                "uid": "u1", "namespace": "team", "operation": "CREATE",
                "kind": {{"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}},
                "object": {claim}}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_claim_nested_past_the_parsers_limit_is_charged_as_its_devices_ask() {
        let deep = format!("{}1{}", r#"{"a":"#.repeat(200), "}".repeat(200));
        let claim = format!(
            r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {{"name": "free", "namespace": "team"}},
                "spec": {{"devices": {{
                    "requests": [{{"name": "g", "exactly": {{"deviceClassName": "gpuslice.io", "count": 8}}}}],
                    "config": [{{"opaque": {{"driver": "example.com", "parameters": {deep}}}}}]}}}}}}"#
        );
        let r = parse(&claim_review(&claim)).unwrap();
        assert_eq!(r.kind, "ResourceClaim");
        let c: k8s_openapi::api::resource::v1::ResourceClaim =
            serde_json::from_value(r.object.unwrap()).unwrap();
        let inv = PublishedGpus {
            gpu_memory: vec![80 << 30],
            ..PublishedGpus::default()
        };
        let charged =
            gpuslice_dra::quota::claim_charge(&c.spec.unwrap(), &inv, "ResourceClaim team/free")
                .unwrap();
        assert_eq!(charged.gpus, 8);
        assert_eq!(charged.memory_bytes, 8 * (80 << 30));
    }

    /// A claim's lists are refused past the API server's limits before anything is built:
    /// a hostile review of tiny entries can neither fill the webhook's memory nor keep it
    /// comparing every constraint's names with every request.
    #[test]
    fn a_claim_with_more_entries_than_the_api_server_allows_is_refused_unbuilt() {
        let request = |i: usize| {
            json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpuslice.io",
                "selectors": [{"cel": {"expression": "true"}}]}})
        };
        let claim = |devices: Value| {
            json!({"metadata": {"name": "many", "namespace": "team"}, "spec": {"devices": devices}})
                .to_string()
        };
        let names = |n: usize| (0..n).map(|i| format!("r{i}")).collect::<Vec<_>>();
        // At the limits: read.
        let at = json!({
            "requests": (0..32).map(request).collect::<Vec<_>>(),
            "constraints": vec![json!({"requests": names(32), "matchAttribute": "gpuslice.io/uuid"}); 32],
            "config": vec![json!({"requests": names(32), "opaque": {"driver": "x.io", "parameters": {}}}); 32],
        });
        assert!(parse(&claim_review(&claim(at.clone())))
            .unwrap()
            .object
            .is_ok());
        let sub = json!({"name": "s", "deviceClassName": "gpuslice.io",
            "selectors": vec![json!({"cel": {"expression": "true"}}); 32]});
        let first = json!({"requests": [{"name": "g", "firstAvailable": vec![sub.clone(); 8]}]});
        assert!(parse(&claim_review(&claim(first))).unwrap().object.is_ok());
        // One past any of them: refused, naming the list and what is accepted.
        let mut past: Vec<(Value, &str, usize)> = Vec::new();
        let mut v = at.clone();
        v["requests"].as_array_mut().unwrap().push(request(32));
        past.push((v, "spec.devices.requests", 32));
        let mut v = at.clone();
        v["constraints"][3]["requests"] = json!(names(33));
        past.push((v, "spec.devices.constraints[].requests", 32));
        let mut v = at.clone();
        v["constraints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"requests": ["r0"]}));
        past.push((v, "spec.devices.constraints", 32));
        let mut v = at.clone();
        v["config"][0]["requests"] = json!(names(33));
        past.push((v, "spec.devices.config[].requests", 32));
        let mut v = at.clone();
        v["requests"][5]["exactly"]["selectors"] =
            json!(vec![json!({"cel": {"expression": "true"}}); 33]);
        past.push((v, "spec.devices.requests[].selectors", 32));
        past.push((
            json!({"requests": [{"name": "g", "firstAvailable": vec![sub; 9]}]}),
            "spec.devices.requests[].firstAvailable",
            8,
        ));
        // Far past: a constraint naming 400,000 requests.
        past.push((
            json!({"constraints": [{"requests": vec!["x"; 400_000]}]}),
            "spec.devices.constraints[].requests",
            32,
        ));
        for (devices, field, max) in past {
            let e = parse(&claim_review(&claim(devices)))
                .unwrap()
                .object
                .unwrap_err()
                .to_string();
            let says = format!("ResourceClaim team/many cannot be read: {field} has more than {max} entries; accepted: at most {max} (the API server's limit)");
            assert!(e.starts_with(&says), "{e}");
        }
    }

    #[test]
    fn a_claim_that_cannot_be_read_is_refused_naming_it() {
        let claim = r#"{"metadata": {"name": "odd", "namespace": "team"},
            "spec": {"devices": {"requests": "all of them"}}}"#;
        let e = parse(&claim_review(claim)).unwrap().object.unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("ResourceClaim team/odd cannot be read: ") && m.contains("accepted: "),
            "{m}"
        );
        // Nor is anything but an object a claim.
        assert!(parse(&claim_review("[1, 2]")).unwrap().object.is_err());
    }

    #[test]
    fn unread_fields_and_odd_objects_pass() {
        let r = parse(br#"{"request":{"uid":"u","operation":"DELETE","object":null}}"#).unwrap();
        assert_eq!(r.object, Ok(Value::Null));
        let r = parse(br#"{"request":{"uid":"u","operation":"CREATE","object":[1,2]}}"#).unwrap();
        assert_eq!(r.object, Ok(Value::Null));
        assert!(matches!(
            parse(br#"{"kind":"AdmissionReview"}"#),
            Err(ReviewError::NoRequest)
        ));
        let long = format!(r#"{{"request":{{"uid":"{}"}}}}"#, "u".repeat(MAX_FIELD + 1));
        let e = parse(long.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("request.uid is 254 bytes"), "{e}");
    }

    #[test]
    fn only_the_claim_controllers_user_is_taken_for_it() {
        let by = |user_info: &str| {
            let body = format!(
                r#"{{"request":{{"uid":"u","operation":"CREATE","userInfo":{user_info},"object":null}}}}"#
            );
            parse(body.as_bytes()).map(|r| r.by_claim_controller)
        };
        for name in CLAIM_CONTROLLER_USERS {
            let r = by(&format!(
                r#"{{"username":"{name}","groups":["system:authenticated"]}}"#
            ));
            assert!(r.unwrap(), "{name}");
        }
        // Escapes spell the same name.
        assert!(by(r#"{"username":"system:kube-controller-\u006danager"}"#).unwrap());
        // Lookalikes, a group naming it, no user, and a name past every bound read: not it,
        // and the review is still read.
        for other in [
            r#"{"username":"system:serviceaccount:kube-system:resource-claim-controller "}"#,
            r#"{"username":"system:serviceaccount:team:resource-claim-controller"}"#,
            r#"{"username":"System:Kube-Controller-Manager"}"#,
            r#"{"username":"alice","groups":["system:kube-controller-manager"]}"#,
            r#"{"username":null}"#,
            r#"{}"#,
            r#"null"#,
        ] {
            assert!(!by(other).unwrap(), "{other}");
        }
        let long = format!(r#"{{"username":"{}"}}"#, "system:".repeat(10_000));
        assert!(!by(&long).unwrap());
        // No userInfo at all.
        let r = parse(br#"{"request":{"uid":"u","operation":"CREATE"}}"#).unwrap();
        assert!(!r.by_claim_controller);
        // A name that is not a string: the review is not one the API server sends.
        assert!(by(r#"{"username":["system:kube-controller-manager"]}"#).is_err());
    }
}
