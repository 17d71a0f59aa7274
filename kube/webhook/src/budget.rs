//! Namespace budgets at admission: a pod or ResourceClaim that would take gpuslice devices is
//! charged against every ResourceQuota of its namespace that names gpuslice's (or, in
//! HAMi-compat namespaces, HAMi's) `limits.*` resources. The quota's `status.used` is the
//! ledger: a charge is booked by updating the status subresource conditionally on the
//! resourceVersion read (a 409 Conflict re-reads and re-checks), as the API server's own quota
//! admission does, so concurrent admissions, on any replica, never book past the hard value.
//! A recount from the live pods and claims frees what deleted objects held, but never what was
//! booked within the last window (the recount interval), so that a charge booked but not yet
//! stored (its admission still running) is never freed (docs/quotas.md). It runs every
//! interval, and for one namespace as soon as one of its pods or claims is deleted or a pod is
//! done (crate::deletions). Nothing but the recount lowers a used value: a charge is never
//! given back by amount, which a recount between the booking and the refund would already
//! have counted.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, ResourceQuota};
use k8s_openapi::api::resource::v1::{
    ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::Api;

use gpuslice_config::Quantity as ConfigQuantity;
use gpuslice_dra::claim_shape::{Mode, PublishedGpus, Shape};
use gpuslice_dra::quota::{
    claim_charge, format_value, shape_charge, whole_gpu, Budget, Charge, Charged, QuotaError, NAMES,
};

use crate::cluster::Cluster;
use crate::mirror::Mirror;
use crate::placement::node_slice;
use crate::review::ScopedPod;
use crate::view::{get_opt, list_all, list_kept, Viewed};

/// The annotation the resource claim controller puts on a claim it makes from a pod's
/// template: the pod's entry the claim is for.
pub const POD_CLAIM_NAME: &str = "resource.kubernetes.io/pod-claim-name";
/// How often the ledger is recounted by default, and the window a booking is kept for: a
/// deleted object's share is freed by the recount its deletion triggers (or, that missed, by
/// the next periodic one), a refused admission's booking once a window has passed since a
/// recount first saw it.
pub const DEFAULT_RECOUNT: Duration = Duration::from_secs(15);
/// Conflicting updates a booking retries before it gives up.
const MAX_TRIES: usize = 64;
/// The distinct ResourceClaims a rank's admission reads to tell whether the pod asks
/// gpuslice's devices ([`Ledger::names_gpuslice_claims`]). Kubernetes bounds a pod's
/// `spec.resourceClaims` by nothing but the request's size, and the webhook's review by 256
/// entries (crate::review): without this, one pod would make its admission read 256 claims.
pub const MAX_NAMED_CLAIM_READS: usize = 32;

/// What the claims a pod names by `resourceClaimName` say of it
/// ([`Ledger::names_gpuslice_claims`]).
#[derive(Debug, Default)]
pub struct NamedClaims {
    /// One of them is known to ask gpuslice's devices.
    pub asks: bool,
    /// When none is: the entries whose claim could not be read (entry name, why).
    pub unread: Vec<(String, String)>,
    /// When none is: the distinct claims named past the first [`MAX_NAMED_CLAIM_READS`],
    /// not read.
    pub not_read: usize,
}

/// A budget could not be read or booked: one line.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(transparent)]
    Quota(#[from] QuotaError),
    #[error("cannot read {what}: {detail}")]
    Read { what: String, detail: String },
    #[error("cannot book ResourceQuota {quota}: {detail}")]
    Write { quota: String, detail: String },
    #[error(
        "ResourceQuota {quota} changed {MAX_TRIES} times while it was being booked; try again"
    )]
    Contended { quota: String },
    #[error("{field}: names ResourceClaimTemplate {namespace}/{name}, which does not exist; accepted: a template that exists when the pod is created (the namespace's budget charges what it asks)")]
    NoTemplate {
        field: String,
        namespace: String,
        name: String,
    },
    #[error(transparent)]
    Plan(#[from] crate::mutate::MutateError),
    #[error("annotations {annotations}: the node books the GPU slices they ask, which the budget of namespace {namespace} (ResourceQuota {quotas}) cannot charge; accepted: the same ask as container limits (resources.limits: {{gpuslice.io/memory: 4Gi}}) or a ResourceClaim of gpuslice's device classes (docs/quotas.md, \"What counts\")")]
    ByAnnotation {
        namespace: String,
        annotations: String,
        quotas: String,
    },
}

fn read_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BudgetError {
    let what = what.into();
    move |e| BudgetError::Read {
        what,
        detail: e.to_string(),
    }
}

/// Whether `q` names any of gpuslice's or HAMi's budget names.
fn names_any(q: &ResourceQuota, hami: bool) -> bool {
    q.spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .is_some_and(|h| {
            NAMES
                .iter()
                .any(|n| n.hami == hami && h.contains_key(n.name))
        })
}

/// The budgets of one namespace, as read for one admission.
pub struct Budgets {
    namespace: String,
    hami: bool,
    quotas: Vec<ResourceQuota>,
}

/// The admission side of the ledger: reads a namespace's budgets and books charges.
#[derive(Clone)]
pub struct Ledger {
    cluster: Cluster,
    hami_compat: bool,
    /// The ResourceQuotas as watched (admissions read them here, as the API server's quota
    /// admission reads its informer's), while current (crate::mirror); `None`: read on each
    /// admission.
    watched: Option<Arc<Mirror<ResourceQuota>>>,
}

impl Budgets {
    /// The budgets that count what `c` charges ([`Budget::applies_to`]: a quota's scopes),
    /// `None` when none does.
    pub fn counting(self, c: Charged) -> Result<Option<Budgets>, BudgetError> {
        let mut quotas = Vec::new();
        for q in self.quotas {
            if Budget::read(&q, self.hami)?.is_some_and(|b| b.applies_to(c)) {
                quotas.push(q);
            }
        }
        Ok((!quotas.is_empty()).then(|| Budgets {
            namespace: self.namespace,
            hami: self.hami,
            quotas,
        }))
    }

    /// The refusal of a pod asking the node for slices by `annotations`: the node books them,
    /// so no budget of the namespace could charge them.
    pub fn refuse_annotations(&self, annotations: &[&str]) -> BudgetError {
        let quotas: Vec<String> = self
            .quotas
            .iter()
            .map(|q| {
                let name = q.metadata.name.as_deref().unwrap_or_default();
                format!("{}/{name}", self.namespace)
            })
            .collect();
        BudgetError::ByAnnotation {
            namespace: self.namespace.clone(),
            annotations: annotations.join(", "),
            quotas: quotas.join(", "),
        }
    }

    /// Whether `charge` fits every budget as read (a dry run's check; nothing is booked).
    pub fn check(&self, charge: &Charge) -> Result<(), BudgetError> {
        for q in &self.quotas {
            if let Some(b) = Budget::read(q, self.hami)? {
                b.book(charge)?;
            }
        }
        Ok(())
    }
}

impl Ledger {
    /// A ledger that reads the quotas on each use (the recount's).
    pub fn new(cluster: Cluster, hami_compat: bool) -> Ledger {
        Ledger {
            cluster,
            hami_compat,
            watched: None,
        }
    }

    /// A ledger that watches the quotas (the admissions'): a namespace without a budget costs
    /// an admission no API call, and a booking starts from the version watched (a stale one
    /// conflicts and is read again). Needs a Tokio runtime.
    pub fn watching(cluster: Cluster, hami_compat: bool) -> Ledger {
        let watched = Mirror::follow(cluster.client(), None);
        Ledger {
            cluster,
            hami_compat,
            watched: Some(watched),
        }
    }

    /// The API server client and the inventory.
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Whether the webhook runs with `--hami-compat`.
    pub(crate) fn hami_compat(&self) -> bool {
        self.hami_compat
    }

    /// Whether `namespace` may have a budget: one of its quotas as watched names one, or the
    /// watched copy cannot tell (not current, not watching, a quota of it unread).
    pub(crate) fn may_have_budget(&self, namespace: &str) -> bool {
        self.watched
            .as_ref()
            .and_then(|w| w.in_namespace(namespace))
            .is_none_or(|qs| qs.iter().any(|q| names_any(q, false) || names_any(q, true)))
    }

    /// Whether `namespace` counts HAMi's names: the webhook runs with `--hami-compat` and
    /// the namespace is labelled (looked up only when one of `quotas` names them).
    async fn hami(&self, namespace: &str, quotas: &[ResourceQuota]) -> Result<bool, BudgetError> {
        if !self.hami_compat || !quotas.iter().any(|q| names_any(q, true)) {
            return Ok(false);
        }
        self.cluster
            .hami_namespace(namespace)
            .await
            .map_err(|e| BudgetError::Read {
                what: format!("namespace {namespace}"),
                detail: e.to_string(),
            })
    }

    /// The budgets of `namespace`, `None` when no quota of it names one; a malformed quota is
    /// an error naming it (nothing is admitted against a budget that cannot be read).
    pub async fn budgets(&self, namespace: &str) -> Result<Option<Budgets>, BudgetError> {
        let items = match self
            .watched
            .as_ref()
            .and_then(|w| w.in_namespace(namespace))
        {
            Some(items) => items,
            None => {
                let api: Api<ResourceQuota> = Api::namespaced(self.cluster.client(), namespace);
                list_all(&api, ListParams::default())
                    .await
                    .map_err(read_err(format!(
                        "the ResourceQuotas of namespace {namespace}"
                    )))?
            }
        };
        let hami = self.hami(namespace, &items).await?;
        let mut quotas = Vec::new();
        for q in items {
            if Budget::read(&q, hami)?.is_some() {
                quotas.push(q);
            }
        }
        Ok((!quotas.is_empty()).then(|| Budgets {
            namespace: namespace.to_string(),
            hami,
            quotas,
        }))
    }

    /// Books `charge` against every budget of `b`; refused (naming the quota, the name, hard,
    /// used and asked) when one would pass its hard value as read, and then nothing is booked.
    /// A quota that changed since it was read may still refuse after others booked: what they
    /// booked is left to the recount, which frees it as any charge whose object was never
    /// stored (docs/quotas.md, "Freeing").
    pub async fn book(&self, b: Budgets, charge: &Charge) -> Result<(), BudgetError> {
        if charge.is_zero() {
            return Ok(());
        }
        b.check(charge)?;
        let api: Api<ResourceQuota> = Api::namespaced(self.cluster.client(), &b.namespace);
        for q in b.quotas {
            update(&api, q, b.hami, |budget| budget.book(charge)).await?;
        }
        Ok(())
    }

    /// What the pod's claim template entries charge: `planned` are the templates the webhook
    /// writes for it (by name); the others named are read. `field` names the pod.
    pub async fn pod_charge(
        &self,
        namespace: &str,
        entries: &[(String, String)],
        planned: &[ResourceClaimTemplate],
        inventory: &PublishedGpus,
    ) -> Result<Charge, BudgetError> {
        let client = self.cluster.client();
        let mut templates = planned.to_vec();
        // Each template is read once, however many entries name it (one missing included).
        let mut tried = HashSet::new();
        for (_, name) in entries {
            if !tried.insert(name.as_str())
                || templates
                    .iter()
                    .any(|t| t.metadata.name.as_deref() == Some(name.as_str()))
            {
                continue;
            }
            // Read through its view (crate::view): other drivers' parameters, however deep,
            // do not hide what it asks.
            let read = get_opt::<ResourceClaimTemplate>(&client, namespace, name).await;
            if let Some(t) = read.map_err(|e| BudgetError::Read {
                what: format!("ResourceClaimTemplate {namespace}/{name}"),
                detail: e.to_string(),
            })? {
                templates.push(t);
            }
        }
        entries_charge(namespace, entries, &templates, inventory)
    }

    /// Whether the templates the pod's entries name ask gpuslice's devices at all, without
    /// charging them (a pod in a namespace without a budget): `planned` are the templates the
    /// webhook writes for it; the others are read, and one missing or unreadable counts as
    /// asking. Never an error.
    pub async fn names_gpuslice_devices(
        &self,
        namespace: &str,
        entries: &[(String, String)],
        planned: &[ResourceClaimTemplate],
    ) -> bool {
        let client = self.cluster.client();
        let mut seen = HashSet::new();
        for (_, name) in entries {
            // Each template is read once, however many entries name it.
            if !seen.insert(name.as_str()) {
                continue;
            }
            let read;
            let t = match planned
                .iter()
                .find(|t| t.metadata.name.as_deref() == Some(name.as_str()))
            {
                Some(t) => Some(t),
                None => {
                    read = get_opt::<ResourceClaimTemplate>(&client, namespace, name).await;
                    match &read {
                        Ok(Some(t)) => Some(t),
                        _ => None,
                    }
                }
            };
            if t.is_none_or(|t| asks_gpuslice_devices(&template_spec(t))) {
                return true;
            }
        }
        false
    }

    /// Whether a claim the pod's entries name (`claims`: entry name, claim name) is known to
    /// ask gpuslice's devices, read from the API server through its view, and, when none is,
    /// the entries whose claim could not be read (entry name, why: missing yet, or the error).
    /// Each claim is read once however many entries name it, and at most
    /// [`MAX_NAMED_CLAIM_READS`] distinct claims are read, in the order the entries name
    /// them, so that no pod makes one admission read more: [`NamedClaims::not_read`] counts
    /// the claims past them (the admission refuses such a rank,
    /// [`crate::placement::PlacementError::TooManyClaims`]). Never an error: a pod is not
    /// charged for the claims it names (each was, when created).
    pub async fn names_gpuslice_claims(
        &self,
        namespace: &str,
        claims: &[(String, String)],
    ) -> NamedClaims {
        let client = self.cluster.client();
        let mut read: HashMap<&str, Option<String>> = HashMap::new();
        let mut out = NamedClaims::default();
        for (entry, name) in claims {
            let unread = match read.get(name.as_str()) {
                Some(unread) => unread.clone(),
                None if read.len() == MAX_NAMED_CLAIM_READS => {
                    let distinct: HashSet<&str> = claims.iter().map(|(_, n)| n.as_str()).collect();
                    out.not_read = distinct.len() - MAX_NAMED_CLAIM_READS;
                    break;
                }
                None => {
                    let unread = match get_opt::<ResourceClaim>(&client, namespace, name).await {
                        Ok(Some(c)) if asks_gpuslice_devices(&claim_spec(&c)) => {
                            return NamedClaims {
                                asks: true,
                                ..NamedClaims::default()
                            }
                        }
                        Ok(Some(_)) => None,
                        Ok(None) => Some(format!(
                            "ResourceClaim {namespace}/{name} does not exist yet"
                        )),
                        Err(e) => {
                            Some(format!("cannot read ResourceClaim {namespace}/{name}: {e}"))
                        }
                    };
                    read.insert(name, unread.clone());
                    unread
                }
            };
            if let Some(detail) = unread {
                out.unread.push((entry.clone(), detail));
            }
        }
        out
    }

    /// What a claim created in `namespace` charges: nothing when the resource claim controller
    /// makes it from the template of a live pod's entry (the pod was charged for it), else
    /// what its spec asks. `by_claim_controller`: whether the review's user is the controller
    /// ([`crate::review::CLAIM_CONTROLLER_USERS`]).
    pub async fn claim_charge(
        &self,
        namespace: &str,
        claim: &ResourceClaim,
        by_claim_controller: bool,
        inventory: &PublishedGpus,
    ) -> Result<Charge, BudgetError> {
        if by_claim_controller && self.made_for_pod(namespace, claim).await? {
            return Ok(Charge::default());
        }
        let field = format!(
            "ResourceClaim {namespace}/{}",
            claim
                .metadata
                .name
                .as_deref()
                .or(claim.metadata.generate_name.as_deref())
                .unwrap_or_default()
        );
        Ok(claim_charge(&claim_spec(claim), inventory, &field)?)
    }

    /// Whether `claim`, created by the resource claim controller's user, is the one it makes
    /// for a pod's template entry: made from an entry ([`made_from_entry`]) of a live pod
    /// that has no claim for that entry yet. The registration does not send the claims the
    /// controller creates under its own user (scripts/lib/cluster-webhook.sh, docs/quotas.md);
    /// this answers for those sent all the same (a registration without that condition). The
    /// same claim from any other user is charged as it asks: its owner reference and
    /// annotation are metadata a tenant writes.
    async fn made_for_pod(
        &self,
        namespace: &str,
        claim: &ResourceClaim,
    ) -> Result<bool, BudgetError> {
        let Some(owner) = pod_owner(claim) else {
            return Ok(false);
        };
        let api: Api<Pod> = Api::namespaced(self.cluster.client(), namespace);
        let Some(pod) = api
            .get_opt(&owner.name)
            .await
            .map_err(read_err(format!("pod {namespace}/{}", owner.name)))?
        else {
            return Ok(false);
        };
        let Some(entry) = made_from_entry(claim, &pod) else {
            return Ok(false);
        };
        let resolved = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .is_some_and(|l| {
                l.iter()
                    .any(|s| s.name == entry.name && s.resource_claim_name.is_some())
            });
        Ok(!terminal(&pod) && !resolved)
    }
}

/// The owner reference that makes `c` a pod's claim for the resource claim controller: the
/// controller reference, to an `apiVersion: v1` Pod (the controller takes no other owner for
/// a pod's).
fn pod_owner(c: &ResourceClaim) -> Option<&OwnerReference> {
    c.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.api_version == "v1" && o.kind == "Pod" && o.controller == Some(true))
}

/// The entry of `pod` (`spec.resourceClaims[]`) that `c` is the claim made from the template
/// of, as the resource claim controller finds a pod's claims: owned by the pod
/// ([`pod_owner`], of the pod's uid) and annotated [`POD_CLAIM_NAME`] with the name of one of
/// the pod's entries, an entry naming a template. Both are metadata any writer of the claim
/// sets: what the entry says is only as good as who made the claim (the controller, or a
/// tenant passing one off as its).
fn made_from_entry<'a>(c: &ResourceClaim, pod: &'a Pod) -> Option<&'a PodResourceClaim> {
    let uid = pod.metadata.uid.as_deref()?;
    pod_owner(c).filter(|o| o.uid == uid)?;
    let entry = c.metadata.annotations.as_ref()?.get(POD_CLAIM_NAME)?;
    pod.spec
        .as_ref()?
        .resource_claims
        .as_ref()?
        .iter()
        .find(|e| &e.name == entry && e.resource_claim_template_name.is_some())
}

/// Every claim template entry (entry name, template name) `pod` will have once admitted with
/// `plan`: those it names and those the patch adds.
pub fn template_entries(
    pod: &serde_json::Value,
    plan: &crate::mutate::Plan,
) -> Vec<(String, String)> {
    let mut entries = entries_naming(pod, "resourceClaimTemplateName");
    entries.extend(plan.entries.iter().cloned());
    entries
}

/// Every entry of `pod` naming a claim (entry name, claim name): a claim written by hand,
/// charged when it was created, not with the pod.
pub fn claim_entries(pod: &serde_json::Value) -> Vec<(String, String)> {
    entries_naming(pod, "resourceClaimName")
}

/// The entries of `pod`'s `spec.resourceClaims` whose `field` names an object: (entry name,
/// that name).
fn entries_naming(pod: &serde_json::Value, field: &str) -> Vec<(String, String)> {
    pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e[field].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// A pod of a workload's pod template, as the webhook will be sent it: the template's
/// `labels` and `annotations` (`meta`: what makes the pod a rank of a job, and what it asks
/// the node; the rest of a pod's metadata the plan does not read) and `spec`. For tools that
/// plan an edit of a pod template before writing it (the console's allocate).
pub fn template_pod(
    meta: Option<&ObjectMeta>,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Result<serde_json::Value, BudgetError> {
    let read = |e: serde_json::Error| BudgetError::Read {
        what: "the pod template".into(),
        detail: e.to_string(),
    };
    let mut metadata = serde_json::Map::new();
    if let Some(m) = meta {
        for (field, v) in [("labels", &m.labels), ("annotations", &m.annotations)] {
            if let Some(v) = v {
                metadata.insert(field.into(), serde_json::to_value(v).map_err(read)?);
            }
        }
    }
    Ok(serde_json::json!({
        "metadata": metadata,
        "spec": serde_json::to_value(spec).map_err(read)?,
    }))
}

/// What one pod of the template `meta`, `spec` ([`template_pod`]) in `namespace` would be
/// charged at admission, without asking the API server: the webhook's plan of its gpuslice
/// limits (refused as the webhook refuses it: a rank of a job by its labels included) and
/// the claim templates it names (`named`, with the templates the plan writes added). For
/// tools that check an edit of a pod template before writing it (the console's allocate).
pub fn pod_spec_charge(
    meta: Option<&ObjectMeta>,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    namespace: &str,
    named: &[ResourceClaimTemplate],
    inventory: &PublishedGpus,
) -> Result<Charge, BudgetError> {
    let pod = template_pod(meta, spec)?;
    let plan = crate::mutate::plan(&pod, namespace, false, inventory)?;
    let entries = template_entries(&pod, &plan);
    let mut templates = plan.templates;
    templates.extend(named.iter().cloned());
    entries_charge(namespace, &entries, &templates, inventory)
}

/// What a pod's claim template entries (entry name, template name) charge, `templates` holding
/// the templates they name: the one sum the ledger books at admission and the console checks
/// an allocation against.
pub fn entries_charge(
    namespace: &str,
    entries: &[(String, String)],
    templates: &[ResourceClaimTemplate],
    inventory: &PublishedGpus,
) -> Result<Charge, BudgetError> {
    let mut total = Charge::default();
    for (entry, name) in entries {
        let field = format!("spec.resourceClaims[{entry}]");
        let t = templates
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| BudgetError::NoTemplate {
                field: field.clone(),
                namespace: namespace.to_string(),
                name: name.clone(),
            })?;
        total = total.checked_add(&claim_charge(&template_spec(t), inventory, &field)?, &field)?;
    }
    Ok(total)
}

/// Whether a claim of `spec` asks any of gpuslice's device classes, however (a request or a
/// prioritized list's alternative, chargeable or not).
pub fn asks_gpuslice_devices(spec: &ResourceClaimSpec) -> bool {
    let ours = |class: &str| class == gpuslice_dra::DRIVER || class == gpuslice_dra::SLOTS_CLASS;
    spec.devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .any(|r| {
            r.exactly
                .as_ref()
                .is_some_and(|e| ours(&e.device_class_name))
                || r.first_available
                    .iter()
                    .flatten()
                    .any(|s| ours(&s.device_class_name))
        })
}

/// What a template's claims ask (nothing when it has no spec).
fn template_spec(t: &ResourceClaimTemplate) -> ResourceClaimSpec {
    t.spec
        .as_ref()
        .and_then(|s| s.spec.clone())
        .unwrap_or_default()
}

/// What a claim asks (nothing when it has no spec).
fn claim_spec(c: &ResourceClaim) -> ResourceClaimSpec {
    c.spec.clone().unwrap_or_default()
}

/// Writes the used values `next` computes from `q`'s budget into its status, conditionally on
/// the version read; on a conflict reads it again and recomputes.
async fn update(
    api: &Api<ResourceQuota>,
    mut q: ResourceQuota,
    hami: bool,
    next: impl Fn(&Budget) -> Result<Vec<(&'static gpuslice_dra::quota::Name, u64)>, QuotaError>,
) -> Result<(), BudgetError> {
    let name = q.metadata.name.clone().unwrap_or_default();
    let quota = format!(
        "{}/{name}",
        q.metadata.namespace.as_deref().unwrap_or_default()
    );
    for _ in 0..MAX_TRIES {
        // A quota that no longer names a budget has nothing to book.
        let Some(budget) = Budget::read(&q, hami)? else {
            return Ok(());
        };
        let values = next(&budget)?;
        if !write_used(&mut q, &values) {
            return Ok(());
        }
        match api.replace_status(&name, &PostParams::default(), &q).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                q = api
                    .get(&name)
                    .await
                    .map_err(read_err(format!("ResourceQuota {quota}")))?;
            }
            Err(e) => {
                return Err(BudgetError::Write {
                    quota,
                    detail: e.to_string(),
                })
            }
        }
    }
    Err(BudgetError::Contended { quota })
}

/// Sets `values` as `q`'s used (and its hard as the spec says, as the quota controller
/// does); whether anything changed.
fn write_used(q: &mut ResourceQuota, values: &[(&'static gpuslice_dra::quota::Name, u64)]) -> bool {
    let hard = q
        .spec
        .as_ref()
        .and_then(|s| s.hard.clone())
        .unwrap_or_default();
    let status = q.status.get_or_insert_with(Default::default);
    let used = status.used.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (name, v) in values {
        let want = Quantity(format_value(name, *v));
        if used.get(name.name) != Some(&want) {
            used.insert(name.name.to_string(), want);
            changed = true;
        }
    }
    let status_hard = status.hard.get_or_insert_with(BTreeMap::new);
    for (name, _) in values {
        if let Some(h) = hard.get(name.name) {
            if status_hard.get(name.name) != Some(h) {
                status_hard.insert(name.name.to_string(), h.clone());
                changed = true;
            }
        }
    }
    changed
}

/// A pod whose containers are done: it holds no device.
pub(crate) fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// What the live objects of one namespace charge (see [`live_charge`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub charge: Charge,
    /// The first object whose charge could not be priced (a whole GPU while no GPU is
    /// published, a sum past 64 bits), and why: what it holds is unknown, so nothing may be
    /// freed against it.
    pub unpriced: Option<String>,
}

/// What the live objects of one namespace that `counts` (a quota's scopes,
/// [`Budget::applies_to`]) charge: every pod that is not done, for the claims its template
/// entries make (the claim made when there is one, else the template), and every other claim
/// of gpuslice's classes (written by hand, or owned by no live pod), but the claims made for
/// pods that are done and held by no other pod ([`done_with_its_pod`]). A claim made for a pod
/// is the pod's, counted or not with it.
pub fn live_charge(
    pods: &[Pod],
    claims: &[ResourceClaim],
    templates: &[ResourceClaimTemplate],
    inventory: &PublishedGpus,
    counts: impl Fn(Charged) -> bool,
) -> Live {
    let mut unpriced: Option<String> = None;
    let charge = |spec: ResourceClaimSpec, what: String, unpriced: &mut Option<String>| {
        claim_charge(&spec, inventory, &what).unwrap_or_else(|e| {
            unpriced.get_or_insert_with(|| e.to_string());
            Charge::default()
        })
    };
    let mut total = Charge::default();
    let mut counted: HashSet<&str> = HashSet::new();
    let by_name: HashMap<&str, &ResourceClaim> = claims
        .iter()
        .filter_map(|c| c.metadata.name.as_deref().map(|n| (n, c)))
        .collect();
    for p in pods {
        if terminal(p) {
            continue;
        }
        let counted_here = counts(Charged::Pod(p));
        if counted_here {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            let c = annotation_charge(p, inventory, &format!("Pod {name}")).unwrap_or_else(|e| {
                unpriced.get_or_insert_with(|| e.to_string());
                Charge::default()
            });
            total = add(total, &c, &mut unpriced);
        }
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        for e in p
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(template) = e.resource_claim_template_name.as_deref() else {
                continue;
            };
            let made = statuses
                .and_then(|l| l.iter().find(|s| s.name == e.name))
                .and_then(|s| s.resource_claim_name.as_deref())
                .and_then(|n| by_name.get(n).copied())
                .or_else(|| {
                    claims
                        .iter()
                        .find(|c| made_from_entry(c, p).is_some_and(|m| m.name == e.name))
                });
            if !counted_here {
                if let Some(c) = made {
                    counted.insert(c.metadata.name.as_deref().unwrap_or_default());
                }
                continue;
            }
            let c = match made {
                Some(c) => {
                    let name = c.metadata.name.as_deref().unwrap_or_default();
                    counted.insert(name);
                    charge(
                        claim_spec(c),
                        format!("ResourceClaim {name}"),
                        &mut unpriced,
                    )
                }
                None => templates
                    .iter()
                    .find(|t| t.metadata.name.as_deref() == Some(template))
                    .map(|t| {
                        let what = format!("ResourceClaimTemplate {template}");
                        charge(template_spec(t), what, &mut unpriced)
                    })
                    .unwrap_or_default(),
            };
            total = add(total, &c, &mut unpriced);
        }
    }
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p)))
        .collect();
    let claims_counted = counts(Charged::Claim);
    for c in claims {
        let name = c.metadata.name.as_deref().unwrap_or_default();
        if !claims_counted || counted.contains(name) || done_with_its_pod(c, &by_uid) {
            continue;
        }
        let c = charge(
            claim_spec(c),
            format!("ResourceClaim {name}"),
            &mut unpriced,
        );
        total = add(total, &c, &mut unpriced);
    }
    Live {
        charge: total,
        unpriced,
    }
}

/// What the node books for pod `p` asking by annotation (docs/annotations.md: the request
/// keys, [`gpuslice_registry::annotations::request_key`]; with one, the recount keeps every
/// `gpuslice.io/*` annotation, [`ScopedPod`]): for each of its containers, init and
/// ephemeral containers included (the runtime gives every container of the pod the pod's
/// annotations, and the node books a slice for each that asks one), what the node reads as
/// that container's request ([`node_slice`], the node's own reading), each charged as a
/// slice of that shape (a percentage of memory, and a whole GPU, of the largest GPU
/// published). A container whose annotations the node refuses (a value, a key it does not
/// know, a reservation the pod sets itself) charges nothing (it is not created). Such a pod
/// is refused where a budget holds (the node books its slices past any budget); this counts
/// the ones admitted before, so that `used` holds what they hold. Every init container
/// counts, as if all held their slices at once: more than the node may hold at a time, never
/// less.
pub fn annotation_charge(
    p: &Pod,
    inventory: &PublishedGpus,
    field: &str,
) -> Result<Charge, QuotaError> {
    let Some(asks) = p.metadata.annotations.as_ref().filter(|a| !a.is_empty()) else {
        return Ok(Charge::default());
    };
    let Some(spec) = p.spec.as_ref() else {
        return Ok(Charge::default());
    };
    let whole = whole_gpu(inventory);
    let mut total = Charge::default();
    let names = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| &c.name)
        .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name));
    for name in names {
        let Some(req) = node_slice(asks, name) else {
            continue;
        };
        let memory = match req.memory {
            None => None,
            Some(q @ ConfigQuantity::Percent(_)) => whole.map(|w| q.resolve(w)),
            Some(ConfigQuantity::Bytes(b)) => Some(b),
        };
        let shape = Shape {
            gpus: req.gpus,
            memory,
            cores: Some(u32::from(req.cores)),
            selectors: Vec::new(),
        };
        let field = format!("{field}, container {name}");
        total = total.checked_add(&shape_charge(&shape, whole, &field)?, &field)?;
    }
    Ok(total)
}

/// `total` + `c`, or `total` with the overflow noted in `unpriced`.
fn add(total: Charge, c: &Charge, unpriced: &mut Option<String>) -> Charge {
    total
        .checked_add(c, "the live objects")
        .unwrap_or_else(|e| {
            unpriced.get_or_insert_with(|| e.to_string());
            total
        })
}

/// Whether claim `c` holds nothing now: it is the claim made from a template entry
/// ([`made_from_entry`]) of a pod that is done (the pod was charged for it; the resource claim
/// controller deletes it), and no other pod holds it: every consumer its `status.reservedFor`
/// names is a pod of `pods` (by uid) that is done. A consumer that is not a pod, or a pod not
/// listed (the pods are listed before the claims: one created in between may already have
/// reserved it), holds it; so does a pod listed that is not done (a pod may use a pod's claim
/// by name), and the claim is charged as it asks.
fn done_with_its_pod(c: &ResourceClaim, pods: &HashMap<&str, &Pod>) -> bool {
    let done = |uid: &str| pods.get(uid).is_some_and(|p| terminal(p));
    let Some(owner) = pod_owner(c) else {
        return false;
    };
    let Some(pod) = pods.get(owner.uid.as_str()) else {
        return false;
    };
    terminal(pod)
        && made_from_entry(c, pod).is_some()
        && c.status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .all(|r| {
                r.api_group.as_deref().unwrap_or_default().is_empty()
                    && r.resource == "pods"
                    && done(&r.uid)
            })
}

/// The recount's decision for one line of a quota: the used value to write. `used` is what
/// the ledger says, `live` what the live objects charge, `pending` what may have been booked
/// by admissions still running ([`Line::pending`]).
///
/// What the live objects do not account for is either what deleted objects held or a charge
/// booked whose object the API server has not stored yet (its admission still running). The
/// second are all within `pending`; so everything past the live objects and those bookings is
/// freed at once, and those bookings are kept. More live than booked (objects admitted before
/// the budget, or charged more since) is written with those bookings on top, as they may be in
/// flight too: the value written never falls below what the live objects and the admissions
/// in flight hold.
pub fn settle(used: u64, live: u64, pending: u64) -> u64 {
    let held = live.saturating_add(pending);
    if live > used {
        held
    } else {
        used.min(held)
    }
}

/// The used value the recount writes for line `name` of a quota (`used` as read), from the
/// live objects: [`settle`], except that while one of them cannot be priced nothing is freed
/// (what it holds is unknown), only raised.
fn line_used(used: u64, live: &Live, name: &gpuslice_dra::quota::Name, pending: u64) -> u64 {
    let settled = settle(used, live.charge.in_unit(name), pending);
    if live.unpriced.is_some() {
        settled.max(used)
    } else {
        settled
    }
}

/// What the recount knows of one line of one quota since its first look there: the value it
/// last wrote (or found unchanged), and what each of its recent recounts saw booked since the
/// one before.
///
/// An admission ends (its object stored, or refused) within the window `W` of its booking
/// (docs/quotas.md). A booking made at time t lies between two successful recounts k−1 and k
/// of the line: after k−1 wrote (or found its value), at or before k read the quota; none
/// lies between k's read and its write, which would have made that write fail (and a failed
/// write starts the line again from a first look, whose entry holds every booking before it).
/// Entry k, `used` as k read it less what k−1 wrote, holds it, stamped when k completed, at or
/// after t. So a booking that may still be in flight (now − t < W) is either booked since the
/// last write (`used − written`) or in an entry younger than W: [`Line::pending`] counts both,
/// however close together the recounts ran.
#[derive(Debug, Default, Clone)]
struct Line {
    /// The value the last successful recount wrote or found; `None`: a first look.
    written: Option<u64>,
    /// (when, booked): what each successful recount of the last window saw booked since the
    /// one before it (on a first look, all of `used`), oldest first.
    booked: VecDeque<(Instant, u64)>,
}

impl Line {
    /// What of `used` (as read at `now`) may be held by admissions still running: booked since
    /// the last write, and every entry younger than `window` (older ones are dropped).
    fn pending(&mut self, used: u64, now: Instant, window: Duration) -> u64 {
        while self
            .booked
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= window)
        {
            self.booked.pop_front();
        }
        let since = self.written.map_or(used, |w| used.saturating_sub(w));
        self.booked
            .iter()
            .fold(since, |sum, (_, b)| sum.saturating_add(*b))
    }

    /// A recount that read `read` wrote `value` (or found it there) by `at`.
    fn wrote(&mut self, read: u64, value: u64, at: Instant) {
        let booked = self.written.map_or(read, |w| read.saturating_sub(w));
        if booked > 0 {
            self.booked.push_back((at, booked));
        }
        self.written = Some(value);
    }
}

/// How long a GPU or slot size the cluster published keeps pricing live objects after it was
/// last seen.
pub const SIZES_KEPT: Duration = Duration::from_secs(600);

/// `now` with every GPU and slot size of `recent` (inventories read a little earlier) added:
/// a whole GPU and a slot request of no size are charged the largest size published, so a size
/// whose ResourceSlices went missing for a while (its nodes' kubelet plugin restarting) would
/// lower what running pods are charged and free it. A size that leaves for good stops counting
/// after [`SIZES_KEPT`]. With nothing published now, the latest inventory that had GPUs stands
/// for it.
pub fn widest<'a>(
    now: &PublishedGpus,
    recent: impl DoubleEndedIterator<Item = &'a PublishedGpus>,
) -> PublishedGpus {
    let recent: Vec<&PublishedGpus> = recent.rev().collect();
    let mut w = if now.gpu_memory.is_empty() {
        recent
            .iter()
            .find(|i| !i.gpu_memory.is_empty())
            .map_or_else(|| now.clone(), |i| (*i).clone())
    } else {
        now.clone()
    };
    for r in recent {
        w.gpu_memory.extend(&r.gpu_memory);
        if let (Mode::Slots(into), Mode::Slots(from)) = (&mut w.mode, &r.mode) {
            into.extend(from.iter().copied());
        }
        w.max_gpus_per_node = w.max_gpus_per_node.max(r.max_gpus_per_node);
    }
    w.gpu_memory.sort_unstable();
    w.gpu_memory.dedup();
    if let Mode::Slots(sizes) = &mut w.mode {
        sizes.sort_by_key(|s| (s.memory, s.cores, s.per_gpu));
        sizes.dedup();
    }
    w
}

/// The recount: every interval, for each namespace with a budget, the live charge against
/// what its quotas say; and for one namespace whenever one of its objects is deleted or done
/// (crate::deletions) (docs/quotas.md, "Freeing").
pub struct Recount {
    ledger: Ledger,
    every: Duration,
    /// How long a booking may take to be stored or refused ([`Line`]): `every` unless set.
    window: Duration,
    lease: Option<(String, String)>,
    identity: String,
    /// What the recounts know of each line, by (quota uid, name).
    lines: Mutex<HashMap<(String, &'static str), Line>>,
    /// The inventories read by the recounts of the last [`SIZES_KEPT`] (crate::budget::widest).
    recent: Mutex<VecDeque<(Instant, Arc<PublishedGpus>)>>,
    /// Held by each recount: one at a time, periodic or triggered, so that the lines' state
    /// follows the writes in order.
    one: tokio::sync::Mutex<()>,
    /// When this replica last took or renewed the lease (with one named): it leads for two
    /// intervals after (the lease lasts three).
    renewed: Mutex<Option<Instant>>,
    /// Another replica's lease as this replica last read it (its resourceVersion) and when it
    /// first read that version: the lease has expired once it has stayed so for its term, by
    /// this replica's clock alone ([`lease_expired`]).
    seen: Mutex<Option<(String, Instant)>>,
}

impl Recount {
    pub fn new(ledger: Ledger, every: Duration, lease: Option<(String, String)>) -> Recount {
        let identity = format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "gpuslice-webhook".into()),
            std::process::id()
        );
        Recount {
            ledger,
            every,
            window: every,
            lease,
            identity,
            lines: Mutex::default(),
            recent: Mutex::default(),
            one: tokio::sync::Mutex::new(()),
            renewed: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    /// The same recount keeping each booking for `window` rather than an interval (tests that
    /// let only the triggered recounts free).
    pub fn with_window(self, window: Duration) -> Recount {
        Recount { window, ..self }
    }

    /// The ledger it recounts.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Recounts at once and then every interval, forever, and follows the deletions that
    /// trigger a recount of one namespace (crate::deletions); while this replica holds the
    /// lease, when one is named: one replica frees at a time, so that the value it wrote last
    /// is the one others booked on since.
    pub async fn run(self) {
        let this = Arc::new(self);
        tokio::spawn(crate::deletions::follow(Arc::clone(&this)));
        let mut last_error = String::new();
        loop {
            let asked = Instant::now();
            let lead = match &this.lease {
                None => true,
                Some((ns, name)) => match this.hold_lease(ns, name).await {
                    Ok(held) => {
                        last_error.clear();
                        held
                    }
                    Err(e) => {
                        // Said once, not every interval: no replica frees while it lasts.
                        let e = format!("cannot take or renew the budget lease {ns}/{name}: {e}; budgets are not recounted while it lasts");
                        if e != last_error {
                            eprintln!("gpuslice webhook: {e}");
                            last_error = e;
                        }
                        false
                    }
                },
            };
            {
                let _one = this.one.lock().await;
                // When this replica last took or renewed the lease, before this turn.
                let held_at = this
                    .renewed
                    .lock()
                    .map(|mut r| std::mem::replace(&mut *r, lead.then_some(asked)))
                    .unwrap_or(None);
                // Held without a break only if renewed before it could expire.
                let continued =
                    held_at.is_some_and(|t| asked.duration_since(t) < this.lease_lasts());
                if !lead || !continued {
                    // A new leader starts from a first look: what another replica freed
                    // meanwhile is not in its lines.
                    if let Ok(mut l) = this.lines.lock() {
                        l.clear();
                    }
                }
            }
            if lead {
                if let Err(e) = this.once().await {
                    eprintln!("gpuslice webhook: budget recount: {e}");
                }
            }
            tokio::time::sleep(this.every).await;
        }
    }

    /// Whether this replica recounts now: no lease is named, or it took or renewed the lease
    /// within the last two intervals (the lease lasts three, so no other replica holds it).
    fn leads(&self) -> bool {
        self.lease.is_none()
            || self
                .renewed
                .lock()
                .ok()
                .and_then(|r| *r)
                .is_some_and(|at| at.elapsed() < self.every.saturating_mul(2))
    }

    /// How long the lease lasts unrenewed: three intervals, at least 3 s.
    fn lease_lasts(&self) -> Duration {
        Duration::from_secs(self.every.as_secs().saturating_mul(3).max(3))
    }

    /// Takes or renews the lease `ns/name`; whether this replica holds it (`false` too when
    /// another replica took it first), or why the API server could not say.
    async fn hold_lease(&self, ns: &str, name: &str) -> Result<bool, kube::Error> {
        let api: Api<Lease> = Api::namespaced(self.ledger.cluster.client(), ns);
        let now = Timestamp::now();
        let duration = i32::try_from(self.lease_lasts().as_secs()).unwrap_or(i32::MAX);
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        };
        // Another replica's write between the read and ours: it holds the lease.
        let lost = |r: Result<Lease, kube::Error>| match r {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
        match api.get_opt(name).await? {
            None => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some(ns.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                lost(api.create(&PostParams::default(), &l).await)
            }
            Some(mut l) => {
                let held = l.spec.as_ref();
                let holder = held
                    .and_then(|s| s.holder_identity.as_deref())
                    .filter(|h| !h.is_empty());
                if holder.is_some_and(|h| h != self.identity) {
                    let version = l.metadata.resource_version.clone().unwrap_or_default();
                    let unchanged_for = self.unchanged_for(version);
                    if !lease_expired(unchanged_for, held.and_then(|s| s.lease_duration_seconds)) {
                        return Ok(false);
                    }
                }
                l.spec = Some(spec);
                lost(api.replace(name, &PostParams::default(), &l).await)
            }
        }
    }

    /// How long another replica's lease has stayed at `version` as this replica reads it: from
    /// the first read of that version (zero at a new one).
    fn unchanged_for(&self, version: String) -> Duration {
        let Ok(mut seen) = self.seen.lock() else {
            return Duration::ZERO;
        };
        match &*seen {
            Some((v, since)) if *v == version => since.elapsed(),
            _ => {
                *seen = Some((version, Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// The inventory this recount prices the live objects with: [`widest`] of `now` and the
    /// inventories of the recounts of the last [`SIZES_KEPT`], which keeps `now` among them
    /// (an inventory the same as the last one kept renews it, so that recounts close together
    /// keep one).
    fn priced_with(&self, now: Arc<PublishedGpus>) -> PublishedGpus {
        let Ok(mut recent) = self.recent.lock() else {
            return (*now).clone();
        };
        let at = Instant::now();
        recent.retain(|(t, _)| at.duration_since(*t) < SIZES_KEPT);
        let priced = widest(&now, recent.iter().map(|(_, i)| i.as_ref()));
        match recent.back_mut() {
            Some(last) if *last.1 == *now => last.0 = at,
            _ => recent.push_back((at, now)),
        }
        priced
    }

    /// One recount of every namespace with a budget.
    pub async fn once(&self) -> Result<(), BudgetError> {
        self.recount(None, false).await
    }

    /// One recount of namespace `ns`, if this replica recounts now ([`Recount::leads`]).
    pub(crate) async fn namespace_now(&self, ns: &str) -> Result<(), BudgetError> {
        self.recount(Some(ns), true).await
    }

    /// One recount of every namespace with a budget, if this replica recounts now (the
    /// deletions a watch missed: crate::deletions).
    pub(crate) async fn every_now(&self) -> Result<(), BudgetError> {
        self.recount(None, true).await
    }

    /// One recount of the namespaces with a budget: every one (`scope` `None`), or `scope`'s;
    /// one `triggered` (not the periodic one) only while this replica recounts
    /// ([`Recount::leads`]).
    async fn recount(&self, scope: Option<&str>, triggered: bool) -> Result<(), BudgetError> {
        let _one = self.one.lock().await;
        if triggered && !self.leads() {
            return Ok(());
        }
        let client = self.ledger.cluster.client();
        let inventory = self
            .ledger
            .cluster
            .inventory()
            .map_err(|e| BudgetError::Read {
                what: "the inventory".into(),
                detail: e.to_string(),
            })?;
        let inventory = self.priced_with(inventory);
        // Quotas are read before the objects, so that a charge booked after this read makes
        // the write below conflict, and one booked before it is either among the objects or
        // pending (kept).
        let quotas = match scope {
            None => list_all(
                &Api::<ResourceQuota>::all(client.clone()),
                ListParams::default(),
            )
            .await
            .map_err(read_err("the ResourceQuotas"))?,
            Some(ns) => list_all(
                &Api::<ResourceQuota>::namespaced(client.clone(), ns),
                ListParams::default(),
            )
            .await
            .map_err(read_err(format!("the ResourceQuotas of namespace {ns}")))?,
        };
        let mut by_ns: BTreeMap<String, Vec<ResourceQuota>> = BTreeMap::new();
        for q in quotas {
            if names_any(&q, false) || names_any(&q, true) {
                let ns = q.metadata.namespace.clone().unwrap_or_default();
                by_ns.entry(ns).or_default().push(q);
            }
        }
        let mut seen = HashSet::new();
        for (ns, qs) in by_ns {
            // One namespace that cannot be recounted (its quotas' lines start again from a
            // first look) does not hold up the others.
            if let Err(e) = self.namespace(&ns, qs, &inventory, &mut seen).await {
                eprintln!("gpuslice webhook: budget recount of namespace {ns}: {e}");
            }
        }
        if scope.is_none() {
            // The lines of quotas gone, or of namespaces not recounted, are forgotten.
            if let Ok(mut lines) = self.lines.lock() {
                lines.retain(|k, _| seen.contains(k));
            }
        }
        Ok(())
    }

    /// The recount of one namespace's quotas `qs`; `seen` gathers the lines it keeps.
    async fn namespace(
        &self,
        ns: &str,
        qs: Vec<ResourceQuota>,
        inventory: &PublishedGpus,
        seen: &mut HashSet<(String, &'static str)>,
    ) -> Result<(), BudgetError> {
        let client = self.ledger.cluster.client();
        let hami = self.ledger.hami(ns, &qs).await?;
        let pods: Vec<Pod> = list_viewed(&client, ns, |p: ScopedPod| Some(p.0)).await?;
        let claims: Vec<ResourceClaim> = list_viewed(&client, ns, charged_claim).await?;
        let templates: Vec<ResourceClaimTemplate> =
            list_viewed(&client, ns, charged_template).await?;
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        let mut unpriced_said = false;
        for mut q in qs {
            // A malformed quota is left as it is (admissions against it are refused).
            let Ok(Some(budget)) = Budget::read(&q, hami) else {
                continue;
            };
            // What this quota counts: the objects its scopes hold for, as admissions book.
            let live = live_charge(&pods, &claims, &templates, inventory, |c| {
                budget.applies_to(c)
            });
            if let (Some(why), false) = (&live.unpriced, unpriced_said) {
                eprintln!(
                    "gpuslice webhook: budget recount of namespace {ns}: nothing freed: {why}"
                );
                unpriced_said = true;
            }
            let uid = q.metadata.uid.clone().unwrap_or_default();
            let mut next = Vec::new();
            let mut keys = Vec::new();
            {
                let mut lines = self.lines.lock().map_err(|_| BudgetError::Read {
                    what: "the recount's lines".into(),
                    detail: "lock poisoned".into(),
                })?;
                let now = Instant::now();
                for l in &budget.lines {
                    let key = (uid.clone(), l.name.name);
                    let line = lines.entry(key.clone()).or_default();
                    let pending = line.pending(l.used, now, self.window);
                    let used = line_used(l.used, &live, l.name, pending);
                    next.push((l.name, used));
                    keys.push((key, l.used, used));
                }
            }
            let name = q.metadata.name.clone().unwrap_or_default();
            // A recount that outlived this replica's turn on the lease writes nothing: another
            // replica may be booking on the value it last wrote.
            let wrote = if !self.leads() {
                false
            } else if write_used(&mut q, &next) {
                api.replace_status(&name, &PostParams::default(), &q)
                    .await
                    .is_ok()
            } else {
                true
            };
            let at = Instant::now();
            if let Ok(mut lines) = self.lines.lock() {
                for (key, read, used) in keys {
                    seen.insert(key.clone());
                    if wrote {
                        lines.entry(key).or_default().wrote(read, used, at);
                    } else {
                        // Not written (a booking came between): next time is a first look.
                        lines.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The longest term a lease is taken to have: a longer one written is cut to it, so that no
/// written term keeps every other replica from the lease for good.
const LONGEST_TERM: Duration = Duration::from_secs(3600);

/// Whether another replica's lease, unchanged for `unchanged_for` as this replica has read it,
/// has expired: its holder has not renewed it for its term (`None` or not positive: it has).
/// Measured by this replica's clock alone from its own reads, as Kubernetes' leader election
/// does, so that replicas whose clocks disagree (the written `renewTime` is the holder's clock)
/// neither take a lease still renewed nor wait on one long gone.
fn lease_expired(unchanged_for: Duration, term: Option<i32>) -> bool {
    let Some(term) = term.and_then(|t| u64::try_from(t).ok()).filter(|t| *t > 0) else {
        return true;
    };
    unchanged_for >= Duration::from_secs(term).min(LONGEST_TERM)
}

/// The objects of kind `K` in namespace `ns`, a page at a time, each read through its view
/// (crate::view) and kept as `keep` keeps it (`None`: not kept) as it is read: one that cannot
/// be read is named in the log and skipped, so that it holds up neither its namespace's
/// recount nor the others'.
async fn list_viewed<K, S>(
    client: &kube::Client,
    ns: &str,
    keep: fn(K) -> Option<S>,
) -> Result<Vec<S>, BudgetError>
where
    K: Viewed + kube::Resource<DynamicType = ()> + 'static,
    S: Send + 'static,
{
    list_kept(client, Some(ns), ListParams::default(), keep, |e| {
        eprintln!("gpuslice webhook: budget recount: skipped: {e}");
    })
    .await
    .map_err(|e| BudgetError::Read {
        what: format!("the {}s of {ns}", K::KIND),
        detail: e.to_string(),
    })
}

/// What the recount keeps of claim `c`: nothing when it asks none of gpuslice's devices (it
/// charges nothing, [`live_charge`]); else its spec, who holds it, and of its metadata what
/// names it, owns it and says which pod's entry it was made for.
fn charged_claim(c: ResourceClaim) -> Option<ResourceClaim> {
    if !c.spec.as_ref().is_some_and(asks_gpuslice_devices) {
        return None;
    }
    let m = c.metadata;
    let annotations = m.annotations.and_then(|a| {
        let entry: BTreeMap<String, String> =
            a.into_iter().filter(|(k, _)| k == POD_CLAIM_NAME).collect();
        (!entry.is_empty()).then_some(entry)
    });
    Some(ResourceClaim {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            owner_references: m.owner_references,
            annotations,
            ..ObjectMeta::default()
        },
        ..c
    })
}

/// What the recount keeps of template `t`: nothing when it asks none of gpuslice's devices (a
/// pod's entry naming it charges nothing, [`live_charge`]); else its name and spec.
fn charged_template(t: ResourceClaimTemplate) -> Option<ResourceClaimTemplate> {
    let spec = template_spec(&t);
    asks_gpuslice_devices(&spec).then(|| ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: t.metadata.name,
            namespace: t.metadata.namespace,
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(spec),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_lease_expires_once_unchanged_for_its_term_and_no_written_term_holds_it_for_good() {
        let s = Duration::from_secs;
        assert!(!lease_expired(s(44), Some(45)));
        assert!(lease_expired(s(45), Some(45)));
        // No term, or one not positive: nothing holds it.
        assert!(lease_expired(Duration::ZERO, None));
        assert!(lease_expired(Duration::ZERO, Some(0)));
        assert!(lease_expired(Duration::ZERO, Some(-5)));
        // A term past the longest is cut to it.
        assert!(!lease_expired(s(3599), Some(i32::MAX)));
        assert!(lease_expired(LONGEST_TERM, Some(i32::MAX)));
    }

    /// The window of these tests.
    const W: Duration = DEFAULT_RECOUNT;

    /// Runs consecutive recounts of one line from a first look, each of which wrote, over
    /// `(milliseconds since the first, used, live)`: the used values written.
    fn recounts(looks: &[(u64, u64, u64)]) -> Vec<u64> {
        let t0 = Instant::now();
        let mut line = Line::default();
        looks
            .iter()
            .map(|&(ms, used, live)| {
                let at = t0 + Duration::from_millis(ms);
                let written = settle(used, live, line.pending(used, at, W));
                line.wrote(used, written, at);
                written
            })
            .collect()
    }

    #[test]
    fn what_deleted_objects_held_is_freed_once_nothing_booked_may_be_in_flight() {
        // First look: nothing is known to be stored, nothing freed; nor within the window.
        assert_eq!(recounts(&[(0, 10, 6)]), [10]);
        assert_eq!(recounts(&[(0, 10, 6), (1_000, 10, 6)]), [10, 10]);
        // A window after the first look: freed.
        assert_eq!(recounts(&[(0, 10, 6), (15_000, 10, 6)]), [10, 6]);
        // Deleted long after its booking: freed by a recount 100 ms after the previous one.
        assert_eq!(
            recounts(&[(0, 10, 10), (20_000, 10, 10), (20_100, 10, 4)]),
            [10, 10, 4]
        );
        // A charge booked but not stored yet (2 past the live objects) is kept for a window
        // from the recount that first saw it, however many recounts run meanwhile.
        assert_eq!(
            recounts(&[
                (0, 10, 10),
                (20_000, 10, 10),
                (21_000, 12, 10),
                (21_050, 12, 10),
                (35_999, 12, 10),
                (36_000, 12, 10),
            ]),
            [10, 10, 12, 12, 12, 10]
        );
    }

    #[test]
    fn two_recounts_in_quick_succession_do_not_free_a_booking_still_in_flight() {
        // Hard 8: P1 (4) stored long ago; P2 (4) booked at 20.0 s, its admission still
        // running at the recounts of 20.05 s and 20.1 s (the second triggered by a deletion
        // elsewhere in the namespace). The first sees 4 booked since the last write and keeps
        // it; the second sees nothing booked since the first wrote 8, but the first's entry,
        // younger than the window, still holds the 4: kept, so P3 (4) is refused (8 + 4 > 8).
        // The rule this replaces ("keep what was booked since the previous recount wrote")
        // would have freed it at the second: used 8, live 4, booked since the write 0: 4
        // written, P3 admitted, and P2 stored on top: 12 held against a hard 8.
        assert_eq!(
            recounts(&[(0, 4, 4), (16_000, 4, 4), (20_050, 8, 4), (20_100, 8, 4)]),
            [4, 4, 8, 8]
        );
        // P2's object never stored (a later admission plugin refused it): freed a window after
        // the recount that first saw its booking.
        assert_eq!(
            recounts(&[
                (0, 4, 4),
                (16_000, 4, 4),
                (20_050, 8, 4),
                (20_100, 8, 4),
                (35_050, 8, 4)
            ]),
            [4, 4, 8, 8, 4]
        );
    }

    #[test]
    fn more_live_than_booked_keeps_the_bookings_that_may_be_in_flight() {
        // A quota made over 6 running: written at once.
        assert_eq!(recounts(&[(0, 0, 6)]), [6]);
        // 6 admitted before the budget, 4 booked and in flight at the first look: 6 + 4, as
        // the 4's object may not be stored (it is freed once it is known stored: 6 + 4 live).
        assert_eq!(recounts(&[(0, 4, 6), (1_000, 10, 10)]), [10, 10]);
        // The 4 was stored by the first look: 14 written, the 4 counted twice for a window.
        assert_eq!(
            recounts(&[(0, 4, 10), (1_000, 14, 10), (15_000, 14, 10)]),
            [14, 14, 10]
        );
    }

    /// A small deterministic generator for the ledger's simulation.
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    #[test]
    fn the_ledger_never_holds_less_than_the_live_objects_and_the_admissions_in_flight() {
        // Admissions (booked, then stored or refused), deletions, objects the budget never
        // booked, and recounts at random times (most far closer together than the window, some
        // farther apart), whose write a booking may make fail, in random orders. Each
        // admission ends before a window has passed since its booking, as docs/quotas.md
        // assumes. An object never booked (admitted before the budget) is held short until a
        // recount sees more live than booked, never more than it.
        const W_MS: u64 = 1_000;
        let window = Duration::from_millis(W_MS);
        for seed in 0..200u64 {
            let mut rng = Lcg(seed);
            let t0 = Instant::now();
            let (mut now, mut used, mut line) = (0u64, 0u64, Line::default());
            let mut live: Vec<u64> = Vec::new();
            let mut never_booked: Vec<u64> = Vec::new();
            // In flight: (charge, the time it ends by, before its booking's time + W).
            let mut flight: Vec<(u64, u64)> = Vec::new();
            let recount = |now: u64,
                           used: &mut u64,
                           line: &mut Line,
                           live: &[u64],
                           never_booked: &[u64],
                           flight: &mut Vec<(u64, u64)>,
                           rng: &mut Lcg| {
                let at = t0 + Duration::from_millis(now);
                let booked: u64 = live.iter().sum();
                let unbooked: u64 = never_booked.iter().sum();
                let read = *used;
                let written = settle(read, booked + unbooked, line.pending(read, at, window));
                let in_flight: u64 = flight.iter().map(|f| f.0).sum();
                assert!(
                    written >= booked + in_flight,
                    "seed {seed} at {now} ms: wrote {written}, live {booked} + {unbooked} \
                     never booked, in flight {in_flight}"
                );
                if rng.below(4) == 0 {
                    // A booking came between the read and the write: not written.
                    let c = 1 + rng.below(4);
                    *used += c;
                    flight.push((c, now + rng.below(W_MS)));
                    *line = Line::default();
                } else {
                    *used = written;
                    line.wrote(read, written, at);
                }
            };
            for _ in 0..400 {
                now += match rng.below(10) {
                    0 => rng.below(3 * W_MS),
                    1..=3 => rng.below(W_MS / 4),
                    _ => rng.below(5),
                };
                // Admissions whose time is up have ended: stored, or refused.
                let mut i = 0;
                while i < flight.len() {
                    if flight[i].1 <= now {
                        let (c, _) = flight.remove(i);
                        if rng.below(5) > 0 {
                            live.push(c);
                        }
                    } else {
                        i += 1;
                    }
                }
                match rng.below(7) {
                    0 | 1 => {
                        let c = 1 + rng.below(4);
                        used += c;
                        flight.push((c, now + rng.below(W_MS)));
                    }
                    2 if !flight.is_empty() => {
                        let (c, _) = flight.remove(rng.below(flight.len() as u64) as usize);
                        if rng.below(5) > 0 {
                            live.push(c);
                        }
                    }
                    3 if !live.is_empty() => {
                        live.remove(rng.below(live.len() as u64) as usize);
                    }
                    3 if !never_booked.is_empty() => {
                        never_booked.pop();
                    }
                    4 if rng.below(10) == 0 => never_booked.push(1 + rng.below(4)),
                    _ => recount(
                        now,
                        &mut used,
                        &mut line,
                        &live,
                        &never_booked,
                        &mut flight,
                        &mut rng,
                    ),
                }
            }
            // Quiet: every admission ends; two recounts a window apart that write leave
            // nothing over.
            live.extend(flight.drain(..).map(|(c, _)| c));
            let total: u64 = live.iter().chain(&never_booked).sum();
            for _ in 0..2 {
                now += W_MS;
                let at = t0 + Duration::from_millis(now);
                let read = used;
                used = settle(read, total, line.pending(read, at, window));
                line.wrote(read, used, at);
            }
            assert_eq!(used, total, "seed {seed}");
        }
    }

    fn pod(name: &str, uid: &str, phase: &str, entries: Value2, statuses: Value2) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"containers": [], "resourceClaims": entries},
            "status": {"phase": phase, "resourceClaimStatuses": statuses},
        }))
        .unwrap()
    }
    type Value2 = serde_json::Value;

    fn spec(mem: &str) -> Value2 {
        json!({"devices": {"requests": [{"name": "gpu-0", "exactly": {
            "deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": mem}}}}]}})
    }

    fn claim(name: &str, owner: Option<(&str, &str)>, mem: &str) -> ResourceClaim {
        let mut c = json!({"metadata": {"name": name}, "spec": spec(mem)});
        if let Some((uid, entry)) = owner {
            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                "name": "p", "uid": uid, "controller": true}]);
            c["metadata"]["annotations"] = json!({POD_CLAIM_NAME: entry});
        }
        serde_json::from_value(c).unwrap()
    }

    #[test]
    fn a_live_claim_that_cannot_be_priced_is_named() {
        // A whole GPU (no memory asked) while no GPU is published: its size is unknown.
        let whole: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "whole"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpuslice.io"}}]}}}))
        .unwrap();
        let live = live_charge(
            &[],
            &[claim("sized", None, "2Gi"), whole],
            &[],
            &PublishedGpus::default(),
            |_| true,
        );
        assert_eq!(live.charge.memory_bytes, 2 << 30);
        let why = live.unpriced.clone().expect("the whole GPU is unpriced");
        assert!(why.contains("ResourceClaim whole"), "{why}");
        // Nothing freed against it (10 booked, 2 priced, nothing pending), only raised.
        let memory = NAMES
            .iter()
            .find(|n| n.name == "limits.gpuslice.io/memory")
            .unwrap();
        assert_eq!(line_used(10 << 30, &live, memory, 0), 10 << 30);
        assert_eq!(line_used(1 << 30, &live, memory, 0), 2 << 30);
        let priced = Live {
            unpriced: None,
            ..live
        };
        assert_eq!(line_used(10 << 30, &priced, memory, 0), 2 << 30);
    }

    #[test]
    fn a_pod_asking_by_annotation_charges_what_the_node_books_per_container() {
        const GI: u64 = 1 << 30;
        let inventory = PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(2),
            gpu_memory: vec![40 * GI, 80 * GI],
        };
        let pod = |asks: &[(&str, &str)], containers: &[&str], init: &[&str]| {
            let named = |n: &[&str]| -> Vec<k8s_openapi::api::core::v1::Container> {
                n.iter()
                    .map(|n| k8s_openapi::api::core::v1::Container {
                        name: n.to_string(),
                        ..Default::default()
                    })
                    .collect()
            };
            Pod {
                metadata: ObjectMeta {
                    annotations: Some(
                        asks.iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: named(containers),
                    init_containers: Some(named(init)),
                    ..Default::default()
                }),
                status: None,
            }
        };
        let charge = |p: &Pod| annotation_charge(p, &inventory, "Pod p").unwrap();
        // A percentage and a whole GPU are of the largest GPU published; cores omitted count
        // 100 per GPU; each container of the pod, init containers included, has its slice.
        assert_eq!(
            charge(&pod(&[("gpuslice.io/memory", "25%")], &["a", "b"], &["i"])),
            Charge {
                memory_bytes: 60 * GI,
                cores: 300,
                gpus: 3
            }
        );
        assert_eq!(
            charge(&pod(
                &[("gpuslice.io/gpus", "2"), ("gpuslice.io/cores", "30")],
                &["a"],
                &[]
            )),
            Charge {
                memory_bytes: 160 * GI,
                cores: 60,
                gpus: 2
            }
        );
        // A container's own key, and one opted out.
        assert_eq!(
            charge(&pod(
                &[
                    ("gpuslice.io/memory.a", "4Gi"),
                    ("gpuslice.io/gpus.b", "0"),
                    ("gpuslice.io/cores", "50")
                ],
                &["a", "b", "c"],
                &[]
            )),
            Charge {
                memory_bytes: 84 * GI,
                cores: 100,
                gpus: 2
            }
        );
        // No request key (as the recount keeps a pod: none), or a value the node refuses.
        assert!(charge(&pod(&[], &["a"], &[])).is_zero());
        assert!(charge(&pod(&[("gpuslice.io/memory", "4GB")], &["a"], &[])).is_zero());
        // Whole GPUs while none is published: not priced.
        let e = annotation_charge(
            &pod(&[("gpuslice.io/gpus", "1")], &["a"], &[]),
            &PublishedGpus::default(),
            "Pod p",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Pod p, container a: asks whole GPUs"),
            "{e}"
        );
    }

    /// A pod as the recount reads it from the API server's JSON ([`ScopedPod`]).
    fn recounted(pod: serde_json::Value) -> Pod {
        <ScopedPod as Viewed>::read(&pod.to_string()).unwrap().0
    }

    #[test]
    fn the_recount_charges_an_ephemeral_container_the_node_books_a_slice_for() {
        const GI: u64 = 1 << 30;
        let inventory = PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(1),
            gpu_memory: vec![80 * GI],
        };
        let named = |n: &[&str]| -> serde_json::Value {
            n.iter().map(|n| serde_json::json!({"name": n})).collect()
        };
        let pod = |annotations: serde_json::Value| {
            recounted(serde_json::json!({
                "metadata": {"name": "p", "namespace": "team", "annotations": annotations},
                "spec": {
                    "containers": named(&["a"]),
                    "initContainers": named(&["i"]),
                    "ephemeralContainers": named(&["debug"]),
                },
            }))
        };
        let charge = |p: &Pod| annotation_charge(p, &inventory, "Pod p").unwrap();
        // The pod-wide ask: the app, init and ephemeral containers each have a slice.
        assert_eq!(
            charge(&pod(serde_json::json!({"gpuslice.io/memory": "4Gi"}))),
            Charge {
                memory_bytes: 12 * GI,
                cores: 300,
                gpus: 3
            }
        );
        // The ephemeral container's own key alone.
        assert_eq!(
            charge(&pod(serde_json::json!({"gpuslice.io/memory.debug": "2Gi"}))),
            Charge {
                memory_bytes: 2 * GI,
                cores: 100,
                gpus: 1
            }
        );
        // The names are kept within the view's bound: a list past the entries an admission
        // reads makes the pod unreadable (named), not a larger view.
        let many: Vec<String> = (0..300).map(|i| format!("d{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = <ScopedPod as Viewed>::read(
            &serde_json::json!({
                "metadata": {"name": "p", "namespace": "team",
                             "annotations": {"gpuslice.io/memory": "4Gi"}},
                "spec": {"containers": named(&["a"]), "ephemeralContainers": named(&many)},
            })
            .to_string(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("Pod team/p cannot be read: spec.ephemeralContainers has 300 entries"),
            "{e}"
        );
    }

    #[test]
    fn the_recount_charges_nothing_for_a_pod_whose_annotations_the_node_refuses() {
        const GI: u64 = 1 << 30;
        let inventory = PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(1),
            gpu_memory: vec![80 * GI],
        };
        let charge = |annotations: serde_json::Value| {
            let p = recounted(serde_json::json!({
                "metadata": {"name": "p", "namespace": "team", "annotations": annotations},
                "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            }));
            annotation_charge(&p, &inventory, "Pod p").unwrap()
        };
        let asked = Charge {
            memory_bytes: 8 * GI,
            cores: 200,
            gpus: 2,
        };
        assert_eq!(
            charge(serde_json::json!({"gpuslice.io/memory": "4Gi"})),
            asked
        );
        // Other domains' keys are not the node's.
        assert_eq!(
            charge(serde_json::json!({"gpuslice.io/memory": "4Gi", "example.com/typo": "x"})),
            asked
        );
        // A key the node does not know fails every container; a reservation set by the pod
        // is refused as forged: the node books nothing, and nothing is charged.
        for other in [
            ("gpuslice.io/typo", "x"),
            ("gpuslice.io/memory.", "1Gi"),
            ("gpuslice.io/reservation", "3f9a0c1d2e4b5a69"),
        ] {
            let mut ann = serde_json::json!({"gpuslice.io/memory": "4Gi"});
            ann[other.0] = serde_json::json!(other.1);
            assert!(charge(ann).is_zero(), "{other:?}");
        }
        // Without a request key, other `gpuslice.io/*` annotations ask nothing.
        assert!(charge(serde_json::json!({"gpuslice.io/typo": "x"})).is_zero());
    }

    #[test]
    fn sizes_published_a_little_earlier_still_price_the_live_objects() {
        const GI: u64 = 1 << 30;
        let capacity = |sizes: &[u64]| PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(2),
            gpu_memory: sizes.iter().map(|s| s * GI).collect(),
        };
        let slots = |memory: &[u64]| PublishedGpus {
            mode: Mode::Slots(
                memory
                    .iter()
                    .map(|m| gpuslice_dra::claim_shape::SlotSize {
                        memory: m * GI,
                        cores: None,
                        per_gpu: 6,
                    })
                    .collect(),
            ),
            max_gpus_per_node: Some(2),
            gpu_memory: memory.iter().map(|m| m * 6 * GI).collect(),
        };
        // The 80Gi GPUs' slices went missing: a whole GPU is still charged 80Gi.
        let w = widest(&capacity(&[40]), [&capacity(&[40, 80])].into_iter());
        assert_eq!(w.gpu_memory, [40 * GI, 80 * GI]);
        assert_eq!(gpuslice_dra::quota::whole_gpu(&w), Some(80 * GI));
        // Nothing published now: the latest inventory that had GPUs, its mode included.
        let w = widest(
            &PublishedGpus::default(),
            [&slots(&[4]), &slots(&[8])].into_iter(),
        );
        let Mode::Slots(sizes) = &w.mode else {
            panic!("{w:?}")
        };
        assert_eq!(
            sizes.iter().map(|s| s.memory / GI).collect::<Vec<_>>(),
            [4, 8]
        );
        // Nothing earlier: as published.
        assert_eq!(widest(&capacity(&[40]), [].into_iter()), capacity(&[40]));
    }

    #[test]
    fn a_template_asks_gpuslice_devices_whether_or_not_it_can_be_charged() {
        let asks = |devices: Value2| {
            asks_gpuslice_devices(&serde_json::from_value(json!({ "devices": devices })).unwrap())
        };
        // allocationMode All cannot be charged, but asks gpuslice's GPUs.
        assert!(asks(json!({"requests": [{"name": "a", "exactly": {
            "deviceClassName": "gpuslice.io", "allocationMode": "All"}}]})));
        assert!(asks(json!({"requests": [{"name": "a", "firstAvailable": [
            {"name": "x", "deviceClassName": "other.example.com"},
            {"name": "y", "deviceClassName": "slots.gpuslice.io"}]}]})));
        assert!(!asks(json!({"requests": [{"name": "a", "exactly": {
            "deviceClassName": "other.example.com"}}]})));
        assert!(!asks(json!({})));
    }

    #[test]
    fn live_objects_charge_once_each() {
        let inv = PublishedGpus::default();
        let t: ResourceClaimTemplate = serde_json::from_value(json!({
            "metadata": {"name": "t2"}, "spec": {"spec": spec("2Gi")}}))
        .unwrap();
        let pods = vec![
            // Its claim made and named in its status.
            pod(
                "a",
                "ua",
                "Running",
                json!([{"name": "e", "resourceClaimTemplateName": "t2"}]),
                json!([{"name": "e", "resourceClaimName": "a-e"}]),
            ),
            // Its claim not made yet: the template.
            pod(
                "b",
                "ub",
                "Pending",
                json!([{"name": "e", "resourceClaimTemplateName": "t2"}]),
                json!([]),
            ),
            // Made, not yet in its status: found by owner and entry.
            pod(
                "c",
                "uc",
                "Pending",
                json!([{"name": "e", "resourceClaimTemplateName": "t2"}]),
                json!([]),
            ),
            // Done: nothing, nor its claim.
            pod(
                "d",
                "ud",
                "Succeeded",
                json!([{"name": "e", "resourceClaimTemplateName": "t2"}]),
                json!([{"name": "e", "resourceClaimName": "d-e"}]),
            ),
            // A claim by name: charged as the claim.
            pod(
                "e",
                "ue",
                "Running",
                json!([{"name": "x", "resourceClaimName": "hand"}]),
                json!([]),
            ),
        ];
        let claims = vec![
            claim("a-e", Some(("ua", "e")), "2Gi"),
            claim("c-e", Some(("uc", "e")), "2Gi"),
            claim("d-e", Some(("ud", "e")), "2Gi"),
            claim("hand", None, "4Gi"),
        ];
        let live = live_charge(&pods, &claims, &[t], &inv, |_| true);
        assert_eq!(live.unpriced, None);
        assert_eq!(live.charge.memory_bytes, (2 + 2 + 2 + 4) << 30);
        assert_eq!(live.charge.gpus, 4);
    }

    #[test]
    fn a_quota_counts_its_pods_and_their_claims_and_no_other_pods_claim() {
        let inv = PublishedGpus::default();
        let t: ResourceClaimTemplate = serde_json::from_value(json!({
            "metadata": {"name": "t2"}, "spec": {"spec": spec("2Gi")}}))
        .unwrap();
        let entry = || json!([{"name": "e", "resourceClaimTemplateName": "t2"}]);
        let pods = vec![
            pod(
                "a",
                "ua",
                "Running",
                entry(),
                json!([{"name": "e", "resourceClaimName": "a-e"}]),
            ),
            pod(
                "b",
                "ub",
                "Running",
                entry(),
                json!([{"name": "e", "resourceClaimName": "b-e"}]),
            ),
            // Its claim made, not yet in its status.
            pod("c", "uc", "Pending", entry(), json!([])),
        ];
        let claims = vec![
            claim("a-e", Some(("ua", "e")), "2Gi"),
            claim("b-e", Some(("ub", "e")), "8Gi"),
            claim("c-e", Some(("uc", "e")), "8Gi"),
            claim("hand", None, "4Gi"),
        ];
        let memory = |counts: &dyn Fn(Charged) -> bool| {
            live_charge(&pods, &claims, std::slice::from_ref(&t), &inv, counts)
                .charge
                .memory_bytes
                >> 30
        };
        // Pod a's scope: a's claim alone; b's and c's are theirs, not claims on their own.
        let only_a =
            |c: Charged| matches!(c, Charged::Pod(p) if p.metadata.name.as_deref() == Some("a"));
        assert_eq!(memory(&only_a), 2);
        // A scope no claim is in, but every pod: the pods' claims, not the one by hand.
        assert_eq!(memory(&|c| matches!(c, Charged::Pod(_))), 2 + 8 + 8);
        assert_eq!(memory(&|_| true), 2 + 8 + 8 + 4);
    }

    /// Eight GPUs of 80Gi published on one node: a whole GPU is priced.
    fn eight_gpus() -> PublishedGpus {
        PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(8),
            gpu_memory: vec![80 << 30],
        }
    }

    /// Claim `name` asking `count` whole GPUs, owned as controller by the pod of `uid` with
    /// owner `api_version`, annotated for entry `entry` when given, reserved for the pods of
    /// `reserved` (uids).
    fn gpus_claim(
        name: &str,
        count: u32,
        (api_version, uid): (&str, &str),
        entry: Option<&str>,
        reserved: &[&str],
    ) -> ResourceClaim {
        let mut c = json!({"metadata": {"name": name,
            "ownerReferences": [{"apiVersion": api_version, "kind": "Pod", "name": "d",
                "uid": uid, "controller": true}]},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                "deviceClassName": "gpuslice.io", "count": count}}]}},
            "status": {"reservedFor": reserved.iter()
                .map(|u| json!({"resource": "pods", "name": u, "uid": u}))
                .collect::<Vec<_>>()}});
        if let Some(entry) = entry {
            c["metadata"]["annotations"] = json!({ POD_CLAIM_NAME: entry });
        }
        serde_json::from_value(c).unwrap()
    }

    /// Pod `d` (uid `ud`), done, whose entry `e` names template `t`; pod `q` (uid `uq`),
    /// running, using claim `big` by name.
    fn done_and_running() -> Vec<Pod> {
        vec![
            pod(
                "d",
                "ud",
                "Succeeded",
                json!([{"name": "e", "resourceClaimTemplateName": "t"}]),
                json!([{"name": "e", "resourceClaimName": "d-e"}]),
            ),
            pod(
                "q",
                "uq",
                "Running",
                json!([{"name": "x", "resourceClaimName": "big"}]),
                json!([]),
            ),
        ]
    }

    #[test]
    fn a_claim_passed_off_as_a_done_pods_is_charged() {
        let pods = done_and_running();
        let gpus = |c: ResourceClaim| {
            let live = live_charge(&pods, &[c], &[], &eight_gpus(), |_| true);
            assert_eq!(live.unpriced, None);
            live.charge.gpus
        };
        // Owned by the done pod under an owner apiVersion the resource claim controller does
        // not take for a pod's (nor the garbage collector resolves: it stays), used by a
        // running pod.
        assert_eq!(gpus(gpus_claim("big", 8, ("v2", "ud"), None, &["uq"])), 8);
        assert_eq!(gpus(gpus_claim("big", 8, ("v2", "ud"), Some("e"), &[])), 8);
        // A v1 owner, but not made from one of the pod's entries: no annotation, or one
        // naming an entry the pod does not have.
        assert_eq!(gpus(gpus_claim("big", 8, ("v1", "ud"), None, &[])), 8);
        assert_eq!(
            gpus(gpus_claim("big", 8, ("v1", "ud"), Some("other"), &[])),
            8
        );
        // Made as the pod's own (v1 owner, its entry), but reserved for a running pod: held.
        assert_eq!(
            gpus(gpus_claim("big", 8, ("v1", "ud"), Some("e"), &["ud", "uq"])),
            8
        );
        // ... or for a pod not listed (created after the pods were listed).
        assert_eq!(
            gpus(gpus_claim("big", 8, ("v1", "ud"), Some("e"), &["unlisted"])),
            8
        );
    }

    #[test]
    fn a_done_pods_own_claim_is_freed() {
        let mut pods = done_and_running();
        pods.push(pod("f", "uf", "Failed", json!([]), json!([])));
        let gpus = |c: ResourceClaim| {
            let live = live_charge(&pods, &[c], &[], &eight_gpus(), |_| true);
            assert_eq!(live.unpriced, None);
            live.charge.gpus
        };
        // The claim the resource claim controller made for the done pod's entry: reserved for
        // nobody (the controller has removed its pod), for that pod, or for done pods only.
        for reserved in [&[][..], &["ud"], &["ud", "uf"]] {
            assert_eq!(
                gpus(gpus_claim("d-e", 8, ("v1", "ud"), Some("e"), reserved)),
                0,
                "{reserved:?}"
            );
        }
        // Owned by a running pod: charged (through the claim, being none of its entries').
        assert_eq!(gpus(gpus_claim("d-e", 8, ("v1", "uq"), Some("e"), &[])), 8);
    }
}
