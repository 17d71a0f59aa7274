//! Budgets: what each namespace's ResourceQuotas allow of gpuslice's resources (GPU memory,
//! cores, GPUs) and what the admission ledger, the quota's `status.used`, says is taken; and,
//! where Kueue is installed, what its ClusterQueues allow and charge of `gpuslice.io/memory`
//! (docs/quotas.md). Read for `kubectl gpuslice quota`, the web console's Budgets page and
//! the allocate check, which says before anything is written when an allocation would take
//! more than a namespace's budget has left.

use std::collections::BTreeSet;

use gpuslice_config::quantity::parse_kube_quantity;
use k8s_openapi::api::core::v1::{Namespace, Pod, PodSpec, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::Api;
use serde::Serialize;
use serde_json::Value;

use gpuslice_dra::claim_shape::PublishedGpus;
use gpuslice_dra::quota::{self, Budget, Charge, Charged, Line, Name, QuotaError, Resource, Unit};
use gpuslice_webhook::budget::pod_spec_charge;

use crate::edit::Request;
use crate::fetch::FetchError;
use crate::render::bytes;

/// The label of the namespaces where HAMi's quota names count (docs/quotas.md).
pub use gpuslice_dra::quota::HAMI_COMPAT_LABEL as HAMI_COMPAT;
/// The Kueue resource a ClusterQueue charges for a workload's GPU memory (bytes).
pub const QUEUE_MEMORY: &str = "gpuslice.io/memory";
/// Kueue's API group and the versions tried, newest first (Kueue 0.19 serves both).
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const KUEUE_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// The three resources a budget counts, in the order the views show them.
pub const RESOURCES: [Resource; 3] = [Resource::Memory, Resource::Cores, Resource::Gpus];

/// A figure of `what` as the views show it: memory in the tables' byte spelling (`10Gi`),
/// cores (percent of a GPU) and GPUs as numbers.
pub fn show(what: Resource, v: u64) -> String {
    match what {
        Resource::Memory => bytes(v),
        Resource::Cores | Resource::Gpus => v.to_string(),
    }
}

/// A value of quota name `name` in the views' units (HAMi's MiB as bytes).
fn common(name: &Name, v: u64) -> u64 {
    match name.unit {
        Unit::Mebibytes => v.saturating_mul(1 << 20),
        Unit::Bytes | Unit::Count => v,
    }
}

/// A value of quota name `name` as the views show it.
pub fn show_value(name: &Name, v: u64) -> String {
    show(name.resource, common(name, v))
}

/// One resource of a budget in the views' units: the hard value (`None`: the quota does
/// not name it) and the ledger's used value (0 while nothing is booked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limit {
    pub hard: Option<u64>,
    pub used: u64,
}

/// One ResourceQuota's budget of gpuslice's resources: memory in bytes (HAMi's MiB
/// converted), cores in percent of a GPU, GPUs; where it names a resource in both name sets,
/// the tighter hard and the larger used value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceBudget {
    pub namespace: String,
    pub quota: String,
    /// The quota names that count here, as the quota spells them.
    pub names: Vec<&'static str>,
    pub memory: Limit,
    pub cores: Limit,
    pub gpus: Limit,
    /// The quota's lines, as the webhook books against them.
    #[serde(skip)]
    pub budget: Budget,
}

impl NamespaceBudget {
    /// From a budget read with [`Budget::read`].
    pub fn new(namespace: &str, quota: &str, budget: Budget) -> NamespaceBudget {
        let (hard, used) = (budget.hard(), budget.used());
        let limit = |h: Option<u64>, u: Option<u64>| Limit {
            hard: h,
            used: u.unwrap_or(0),
        };
        NamespaceBudget {
            namespace: namespace.to_string(),
            quota: quota.to_string(),
            names: budget.lines.iter().map(|l| l.name.name).collect(),
            memory: limit(hard.memory_bytes, used.memory_bytes),
            cores: limit(hard.cores, used.cores),
            gpus: limit(hard.gpus, used.gpus),
            budget,
        }
    }

    /// Whether the quota counts `pod`, one of a workload's pods as admitted
    /// ([`admitted_pod`]): every scope of the quota holds for it, decided as the webhook books
    /// and recounts ([`Budget::applies_to`]).
    pub fn counts(&self, pod: &Pod) -> bool {
        self.budget.applies_to(Charged::Pod(pod))
    }

    pub fn limit(&self, what: Resource) -> &Limit {
        match what {
            Resource::Memory => &self.memory,
            Resource::Cores => &self.cores,
            Resource::Gpus => &self.gpus,
        }
    }

    /// The name sets it uses: `gpuslice.io`, `nvidia.com` or both.
    pub fn name_sets(&self) -> String {
        let lines = &self.budget.lines;
        let mut sets = Vec::new();
        if lines.iter().any(|l| !l.name.hami) {
            sets.push("gpuslice.io");
        }
        if lines.iter().any(|l| l.name.hami) {
            sets.push("nvidia.com");
        }
        sets.join("+")
    }
}

/// A Kueue ClusterQueue's quota of `gpuslice.io/memory`, summed over its flavors, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueBudget {
    pub name: String,
    /// The cohort it borrows from and lends to (`None`: none).
    pub cohort: Option<String>,
    pub nominal: u64,
    /// The most it may borrow (`None`: no limit but what its cohort has unused; 0 without a
    /// cohort).
    pub borrowing_limit: Option<u64>,
    /// Charged to admitted workloads (`status.flavorsUsage`), borrowed part included.
    pub used: u64,
    /// The part of `used` borrowed from the cohort.
    pub borrowed: u64,
    /// Reserved by workloads, admitted or waiting on admission checks
    /// (`status.flavorsReservation`).
    pub reserved: u64,
}

/// What `kubectl gpuslice quota` and the Budgets page show.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Budgets {
    pub namespaces: Vec<NamespaceBudget>,
    /// The ClusterQueues charging `gpuslice.io/memory`; `None` when Kueue is not installed
    /// (or could not be read: [`Budgets::queues_unavailable`] says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<QueueBudget>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues_unavailable: Option<String>,
    /// Quotas that name gpuslice's resources and do not count as written (a malformed value,
    /// HAMi's names outside a HAMi-compat namespace): one line each.
    pub warnings: Vec<String>,
}

/// Which namespaces to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Namespace(String),
    All,
}

/// One pod of a workload's template `spec` as the quotas' scopes read it once admitted: in a
/// pod that names no PriorityClass the API server's Priority admission names the cluster's
/// default class (`default_class`, [`default_class_for`]) before the webhook sees the pod.
pub fn admitted_pod(mut spec: PodSpec, default_class: Option<&str>) -> Pod {
    if spec
        .priority_class_name
        .as_deref()
        .is_none_or(str::is_empty)
    {
        spec.priority_class_name = default_class.map(str::to_string);
    }
    Pod {
        spec: Some(spec),
        ..Pod::default()
    }
}

/// The PriorityClass the API server's Priority admission names in a pod that names none: the
/// one marked `globalDefault` (of several, the one of the lowest value, the first listed
/// among equals, as it picks); `None` when none is.
pub fn default_class(classes: &[PriorityClass]) -> Option<String> {
    classes
        .iter()
        .filter(|c| c.global_default == Some(true))
        .min_by_key(|c| c.value)
        .and_then(|c| c.metadata.name.clone())
}

/// The cluster's default PriorityClass ([`default_class`]) where it decides what `budgets`
/// count: read only when one of them has a `PriorityClass` scope (`Ok(None)` without a call
/// otherwise).
pub async fn default_class_for(
    client: &kube::Client,
    budgets: &[NamespaceBudget],
) -> Result<Option<String>, FetchError> {
    let reads_class = budgets
        .iter()
        .any(|b| b.budget.scopes.iter().any(|s| s.name == "PriorityClass"));
    if !reads_class {
        return Ok(None);
    }
    let api: Api<PriorityClass> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|source| FetchError {
            what: "priorityclasses",
            source,
        })?;
    Ok(default_class(&list.items))
}

/// What an allocation asks in all: `pods` pods, each charged `per_pod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub pods: u64,
    /// What one pod is charged, as the webhook charges it at admission.
    pub per_pod: Charge,
    /// What one pod gets, for messages (`1 GPU × 4Gi memory`).
    pub what: String,
}

impl Ask {
    /// `pods` pods of one claim of `req` each.
    pub fn of_request(pods: u64, req: &Request) -> Result<Ask, QuotaError> {
        let what = req.describe();
        Ok(Ask {
            pods,
            per_pod: quota::shape_charge(&req.shape(), None, &what)?,
            what,
        })
    }

    /// `pods` pods of the template `meta`, `spec` in `namespace`, each charged as the webhook
    /// charges such a pod (`gpuslice_webhook::budget::pod_spec_charge`: its plan of the
    /// limits, refused where the webhook refuses it, a rank of a job by its labels included,
    /// and the claim templates named, found in `named`).
    pub fn of_pod_spec(
        pods: u64,
        meta: Option<&ObjectMeta>,
        spec: &PodSpec,
        namespace: &str,
        named: &[ResourceClaimTemplate],
        inventory: &PublishedGpus,
        what: String,
    ) -> Result<Ask, BudgetError> {
        let per_pod = pod_spec_charge(meta, spec, namespace, named, inventory)
            .map_err(|e| BudgetError::Pod(e.to_string()))?;
        Ok(Ask {
            pods,
            per_pod,
            what,
        })
    }

    /// What the pods charge in all; `field` names the workload for the message of an
    /// overflow.
    pub fn charge(&self, field: &str) -> Result<Charge, QuotaError> {
        times(&self.per_pod, self.pods, field)
    }

    /// `3 pod(s) of 1 GPU × 4Gi memory`.
    pub fn describe(&self) -> String {
        format!("{} pod(s) of {}", self.pods, self.what)
    }
}

/// What `pods` pods of `one` charge; `field` names the workload for the message of an
/// overflow.
fn times(one: &Charge, pods: u64, field: &str) -> Result<Charge, QuotaError> {
    let over = |what: &str, unit| QuotaError::Overflow {
        field: field.to_string(),
        detail: format!("{what} of {pods} pods"),
        unit,
    };
    Ok(Charge {
        memory_bytes: one
            .memory_bytes
            .checked_mul(pods)
            .ok_or_else(|| over("the GPU memory", "bytes"))?,
        cores: one
            .cores
            .checked_mul(pods)
            .ok_or_else(|| over("the compute shares", "percent"))?,
        gpus: one
            .gpus
            .checked_mul(pods)
            .ok_or_else(|| over("the GPUs", "GPUs"))?,
    })
}

/// How a workload's controller replaces its pods once their template changes, as far as the
/// budget sees it: old pods are freed only as they go, so the namespace must hold, at the
/// rollout's worst point, the old pods still running beside the new ones started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// Pods the rollout replaces.
    pub replaced: u64,
    /// Pods it leaves on the old template (a StatefulSet's `partition`).
    pub kept: u64,
    /// Pods it may run beyond `replaced` (maxSurge, resolved as Kubernetes resolves it).
    pub surge: u64,
    /// Old pods it may remove before new ones are ready (maxUnavailable, resolved).
    pub unavailable: u64,
    /// The strategy as the messages name it (`RollingUpdate, maxSurge 1, maxUnavailable 0`).
    pub strategy: String,
    /// How the workload would have its old pods removed before new ones start, for the
    /// refusal's suggestion (`None`: it does so already).
    pub remove_first: Option<&'static str>,
}

/// A point of a rollout: how many pods of the old template and of the new run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    pub old: u64,
    pub new: u64,
}

impl Rollout {
    /// `pods` pods, every old one removed before a new one starts (a Deployment's Recreate; a
    /// StatefulSet replaces one pod at a time, old first, which charges no more at any point).
    pub fn remove_first(pods: u64, strategy: &str) -> Rollout {
        Rollout {
            replaced: pods,
            kept: 0,
            surge: 0,
            unavailable: pods,
            strategy: strategy.to_string(),
            remove_first: None,
        }
    }

    /// `pods` pods replaced by a RollingUpdate of `surge` pods beyond them and `unavailable`
    /// old ones removed early (both resolved); `remove_first` says how the workload would
    /// remove its old pods first instead.
    pub fn rolling(pods: u64, surge: u64, unavailable: u64, remove_first: &'static str) -> Rollout {
        Rollout {
            replaced: pods,
            kept: 0,
            surge,
            unavailable,
            strategy: format!("RollingUpdate, maxSurge {surge}, maxUnavailable {unavailable}"),
            remove_first: Some(remove_first),
        }
    }

    /// The points where the rollout runs the most of either template, its end included. With
    /// `m` new pods ready the controller keeps `replaced - unavailable - m` old ones (never
    /// fewer than 0) and starts new ones up to `replaced + surge` pods in all (never more
    /// than `replaced` new): the charge is linear in `m` between these points, so its largest
    /// value is at one of them.
    pub fn points(&self) -> Vec<Point> {
        let r = self.replaced;
        let u = self.unavailable.min(r);
        let at = |m: u64| {
            let old = r.saturating_sub(u).saturating_sub(m);
            Point {
                old: self.kept + old,
                new: r.min(r.saturating_add(self.surge).saturating_sub(old)),
            }
        };
        let mut ms = vec![0, r.saturating_sub(self.surge.saturating_add(u)), r - u, r];
        ms.sort_unstable();
        let mut points: Vec<Point> = ms.into_iter().map(at).collect();
        points.dedup();
        points
    }

    /// The most each new pod may charge of one quota line (in its unit) so that every point
    /// fits in `room`, each old pod charging `old`; `None`: no new pod starts.
    pub fn per_pod_room(&self, room: u64, old: u64) -> Option<u64> {
        self.points()
            .iter()
            .filter(|p| p.new > 0)
            .map(|p| room.saturating_sub(p.old.saturating_mul(old)) / p.new)
            .min()
    }
}

/// An allocation the namespace's budget cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The first quota line it would pass, as the webhook would refuse the pods; `requested`
    /// is what the workload's pods hold at the rollout's worst point.
    #[error("{workload}: {ask}{during}: {exceeded}{freed}{fits}")]
    Over {
        workload: String,
        ask: String,
        /// The rollout's worst point, when old pods still run there beside new ones.
        during: String,
        exceeded: Box<QuotaError>,
        /// Said when the workload's current slices were counted as freed.
        freed: &'static str,
        /// What would fit instead, when old pods running beside new ones refuse it.
        fits: String,
    },
    #[error(transparent)]
    Charge(Box<QuotaError>),
    /// A pod of the edited template cannot be charged as the webhook would charge it.
    #[error("{0}")]
    Pod(String),
}

/// `budget` with what `freed` charges taken off its used values (never below 0).
fn without(budget: &Budget, freed: Option<&Charge>) -> Budget {
    let mut b = budget.clone();
    if let Some(f) = freed {
        for l in &mut b.lines {
            l.used -= f.in_unit(l.name).min(l.used);
        }
    }
    b
}

/// The largest of each resource of `a` and `b`.
fn max_each(a: &Charge, b: &Charge) -> Charge {
    Charge {
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
        cores: a.cores.max(b.cores),
        gpus: a.gpus.max(b.gpus),
    }
}

/// Checks `ask` against every budget of the namespace that counts the workload's pods (`pod`,
/// one of them as admitted: [`NamespaceBudget::counts`], its scopes) as the webhook books it,
/// through the workload's `rollout`: what its pods charge now (`held`, which the ledger
/// counts) is taken off the used values, and each resource must fit at the rollout's worst
/// point, its old pods (charging as `held`'s) still running beside the new ones started. The
/// old pods are counted by the same budgets as the new: an allocation changes no field a
/// scope reads (GPU limits and claims do not make a pod's QoS class).
pub fn check(
    budgets: &[NamespaceBudget],
    pod: &Pod,
    workload: &str,
    ask: &Ask,
    held: Option<&Ask>,
    rollout: &Rollout,
) -> Result<(), BudgetError> {
    let unchargeable = |e| BudgetError::Charge(Box::new(e));
    let freed = match held {
        Some(h) => Some(h.charge(workload).map_err(unchargeable)?),
        None => None,
    };
    let old = held.map(|h| h.per_pod).unwrap_or_default();
    let new = ask.per_pod;
    let mut charges = Vec::new();
    for p in rollout.points() {
        let c = times(&old, p.old, workload)
            .and_then(|o| o.checked_add(&times(&new, p.new, workload)?, workload))
            .map_err(unchargeable)?;
        charges.push((p, c));
    }
    let peak = charges
        .iter()
        .fold(Charge::default(), |m, (_, c)| max_each(&m, c));
    let end = Point {
        old: rollout.kept,
        new: rollout.replaced,
    };
    for b in budgets.iter().filter(|b| b.counts(pod)) {
        let base = without(&b.budget, freed.as_ref());
        let Err(exceeded) = base.book(&peak) else {
            continue;
        };
        let line = match &exceeded {
            QuotaError::Exceeded { name, .. } => base.lines.iter().find(|l| l.name.name == *name),
            _ => None,
        };
        // The point that asks the most of the refused line, and what would fit instead.
        let worst = line.and_then(|l| {
            charges
                .iter()
                .max_by_key(|(_, c)| c.in_unit(l.name))
                .map(|(p, _)| (l, *p))
        });
        let (during, fits) = match worst {
            Some((l, p)) if p != end => {
                let (o, n) = (old.in_unit(l.name), new.in_unit(l.name));
                let show = |v| quota::format_value(l.name, v);
                let during = format!(
                    ", whose rollout ({}) keeps {} old pod(s) of {} while {} new pod(s) of {} start",
                    rollout.strategy,
                    p.old,
                    show(o),
                    p.new,
                    show(n)
                );
                let room = l.hard.saturating_sub(l.used);
                let mut fits = Vec::new();
                let at_end = times(&old, end.old, workload)
                    .and_then(|o| o.checked_add(&times(&new, end.new, workload)?, workload));
                if let (Some(how), Ok(c)) = (rollout.remove_first, at_end) {
                    if base.book(&c).is_ok() {
                        fits.push(format!(
                            "if its old pods are removed before new ones start ({how})"
                        ));
                    }
                }
                if let Some(most) = rollout.per_pod_room(room, o).filter(|m| *m > 0) {
                    fits.push(format!(
                        "with at most {} of {} per new pod",
                        show(most),
                        l.name.name
                    ));
                }
                let fits = if fits.is_empty() {
                    String::new()
                } else {
                    format!("; it fits {}", fits.join(", or "))
                };
                (during, fits)
            }
            _ => (String::new(), String::new()),
        };
        let freed = match (freed.is_some_and(|f| !f.is_zero()), during.is_empty()) {
            (false, _) => "",
            (true, true) => " (used not counting this workload's current slices, which the allocation replaces)",
            (true, false) => " (used not counting this workload's pods; requested: the most they hold at once during the rollout)",
        };
        return Err(BudgetError::Over {
            workload: workload.to_string(),
            ask: ask.describe(),
            during,
            exceeded: Box::new(exceeded),
            freed,
            fits,
        });
    }
    Ok(())
}

/// What is left of one quota line for an allocation, in the quota's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room<'a> {
    pub budget: &'a NamespaceBudget,
    pub line: Line,
    /// `hard - used`, with the workload's current charge counted as freed (0 when over).
    pub left: u64,
    /// The most one new pod may charge so that the rollout fits at its worst point, its old
    /// pods still running beside new ones ([`Rollout::per_pod_room`]); `left` when it starts
    /// no pod.
    pub per_pod: u64,
}

/// Per budget of the namespace that counts the workload's pods (`pod`, as in [`check`]) and
/// quota line, what an allocation may still ask through the workload's `rollout`, the
/// workload's current pods (`held`) counted as freed as they go; `None` for `held` that
/// cannot be charged is the same as none.
pub fn headroom<'a>(
    budgets: &'a [NamespaceBudget],
    pod: &Pod,
    held: Option<&Ask>,
    rollout: &Rollout,
) -> Vec<Room<'a>> {
    let freed = held.and_then(|h| h.charge("the workload").ok());
    let old = match (held, &freed) {
        (Some(h), Some(_)) => h.per_pod,
        _ => Charge::default(),
    };
    let mut out = Vec::new();
    for b in budgets.iter().filter(|b| b.counts(pod)) {
        let adjusted = without(&b.budget, freed.as_ref());
        for (line, after) in b.budget.lines.iter().zip(&adjusted.lines) {
            let left = after.hard.saturating_sub(after.used);
            out.push(Room {
                budget: b,
                line: *line,
                left,
                per_pod: rollout
                    .per_pod_room(left, old.in_unit(line.name))
                    .unwrap_or(left),
            });
        }
    }
    out
}

/// A quantity of a Kueue object (`8Gi`), 0 when absent or unreadable.
fn quantity(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => parse_kube_quantity(s).ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The sum over flavors of `field` of resource [`QUEUE_MEMORY`] in `flavors` (Kueue's
/// `[{name, resources: [{name, …}]}]`); `None` when no flavor names the resource.
fn flavor_sum(flavors: &Value, field: &str) -> Option<u64> {
    let mut found = false;
    let mut sum = 0u64;
    for f in flavors.as_array().into_iter().flatten() {
        for r in f["resources"].as_array().into_iter().flatten() {
            if r["name"] == QUEUE_MEMORY {
                found = true;
                sum = sum.saturating_add(quantity(&r[field]).unwrap_or(0));
            }
        }
    }
    found.then_some(sum)
}

/// A ClusterQueue's budget of [`QUEUE_MEMORY`]; `None` when it does not cover it.
pub fn queue_budget(cq: &Value) -> Option<QueueBudget> {
    let spec = &cq["spec"];
    let flavors: Vec<&Value> = spec["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
        .collect();
    let flavors = Value::Array(flavors.into_iter().cloned().collect());
    let nominal = flavor_sum(&flavors, "nominalQuota")?;
    // No borrowing limit on one flavor: the queue's borrowing is bounded by its cohort only.
    let limited = flavors.as_array().into_iter().flatten().all(|f| {
        f["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["name"] == QUEUE_MEMORY)
            .all(|r| !r["borrowingLimit"].is_null())
    });
    let cohort = spec["cohortName"]
        .as_str()
        .or_else(|| spec["cohort"].as_str())
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    let status = &cq["status"];
    Some(QueueBudget {
        name: cq["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        borrowing_limit: if cohort.is_none() {
            Some(0)
        } else if limited {
            flavor_sum(&flavors, "borrowingLimit")
        } else {
            None
        },
        cohort,
        nominal,
        used: flavor_sum(&status["flavorsUsage"], "total").unwrap_or(0),
        borrowed: flavor_sum(&status["flavorsUsage"], "borrowed").unwrap_or(0),
        reserved: flavor_sum(&status["flavorsReservation"], "total").unwrap_or(0),
    })
}

fn kueue(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: KUEUE_GROUP.into(),
        version: version.into(),
        api_version: format!("{KUEUE_GROUP}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Lists a Kueue kind in the first version served; `Ok(None)` when none is (Kueue is not
/// installed).
async fn list_kueue(
    client: &kube::Client,
    namespace: Option<&str>,
    kind: &str,
    plural: &str,
) -> Result<Option<Vec<Value>>, String> {
    for version in KUEUE_VERSIONS {
        let ar = kueue(version, kind, plural);
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                let items = list
                    .items
                    .into_iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .collect();
                return Ok(Some(items));
            }
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => return Err(format!("cannot list {plural}.{KUEUE_GROUP}: {e}")),
        }
    }
    Ok(None)
}

/// The ClusterQueues of `scope` (a namespace's: those its LocalQueues name); `Ok(None)`
/// without Kueue.
async fn queues(client: &kube::Client, scope: &Scope) -> Result<Option<Vec<QueueBudget>>, String> {
    let Some(all) = list_kueue(client, None, "ClusterQueue", "clusterqueues").await? else {
        return Ok(None);
    };
    let named: Option<BTreeSet<String>> = match scope {
        Scope::All => None,
        Scope::Namespace(ns) => Some(
            list_kueue(client, Some(ns), "LocalQueue", "localqueues")
                .await?
                .unwrap_or_default()
                .iter()
                .filter_map(|q| q["spec"]["clusterQueue"].as_str().map(str::to_string))
                .collect(),
        ),
    };
    let mut out: Vec<QueueBudget> = all
        .iter()
        .filter_map(queue_budget)
        .filter(|q| named.as_ref().is_none_or(|n| n.contains(&q.name)))
        .collect();
    out.sort_by(|a, b| (&a.cohort, &a.name).cmp(&(&b.cohort, &b.name)));
    Ok(Some(out))
}

/// The namespaces of `scope` labelled HAMi-compat; `Err`: why that is not known.
async fn hami_namespaces(
    client: &kube::Client,
    scope: &Scope,
) -> Result<BTreeSet<String>, FetchError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let (key, value) = HAMI_COMPAT;
    let selector = format!("{key}={value}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| FetchError {
            what: "namespaces",
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| match scope {
            Scope::All => true,
            Scope::Namespace(ns) => n == ns,
        })
        .collect())
}

/// The flag that tells the console whether the webhook converts HAMi's limits (started with
/// `--hami-compat`, the chart's `webhook.hamiCompat`; on unless set false), and its
/// environment variable.
pub const HAMI_COMPAT_FLAG: (&str, &str) = ("--hami-compat", "GPUSLICE_HAMI_COMPAT");

/// One quota's budget (`None` when it names none of the names counted in its namespace),
/// and the warnings of what does not count: a malformed value (the whole quota: the webhook
/// refuses to book against it), HAMi's names where the webhook does not count them. They
/// count only where the webhook runs with `--hami-compat` (`webhook_hami`: the console was
/// told so, [`HAMI_COMPAT_FLAG`]) and the namespace is labelled HAMi-compat (`labelled`).
pub fn quota_budget(
    q: &ResourceQuota,
    webhook_hami: bool,
    labelled: bool,
) -> (Option<NamespaceBudget>, Vec<String>) {
    let namespace = q.metadata.namespace.as_deref().unwrap_or_default();
    let name = q.metadata.name.as_deref().unwrap_or_default();
    let hami_compat = webhook_hami && labelled;
    let mut warnings = Vec::new();
    if !hami_compat {
        let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
        let hami: Vec<&str> = quota::NAMES
            .iter()
            .filter(|n| n.hami && hard.is_some_and(|h| h.contains_key(n.name)))
            .map(|n| n.name)
            .collect();
        if !hami.is_empty() {
            let (flag, env) = HAMI_COMPAT_FLAG;
            let why = if webhook_hami {
                format!("namespace {namespace} is not")
            } else {
                format!("this console was told the webhook runs without {flag} ({flag}=false or {env}=false; leave it out where the webhook runs with it)")
            };
            warnings.push(format!(
                "ResourceQuota {namespace}/{name} names HAMi's {}, counted only by a webhook started with {flag}, in namespaces labelled {}={}: {why}",
                hami.join(", "),
                HAMI_COMPAT.0,
                HAMI_COMPAT.1
            ));
        }
    }
    match Budget::read(q, hami_compat) {
        Ok(b) => (
            b.map(|b| NamespaceBudget::new(namespace, name, b)),
            warnings,
        ),
        Err(e) => {
            warnings.push(e.to_string());
            (None, warnings)
        }
    }
}

/// The budgets of the ResourceQuotas of `scope` (with the HAMi-compat label of their
/// namespaces when `webhook_hami`, the webhook converting HAMi's limits), sorted by
/// namespace and quota, and the warnings of what does not count.
pub async fn namespace_budgets(
    client: &kube::Client,
    scope: &Scope,
    webhook_hami: bool,
) -> Result<(Vec<NamespaceBudget>, Vec<String>), FetchError> {
    let quota_api: Api<ResourceQuota> = match scope {
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        Scope::All => Api::all(client.clone()),
    };
    let list_params = ListParams::default();
    let labelled = async {
        if webhook_hami {
            hami_namespaces(client, scope).await
        } else {
            Ok(BTreeSet::new())
        }
    };
    let (quotas, hami) = tokio::join!(quota_api.list(&list_params), labelled);
    let quotas = quotas.map_err(|source| FetchError {
        what: "resourcequotas",
        source,
    })?;
    let mut warnings = Vec::new();
    // Namespaces cannot be listed (a namespaced user): HAMi's names are taken as counting
    // nowhere, and the listing says so.
    let hami = hami.unwrap_or_else(|e| {
        warnings.push(format!(
            "{e}: quotas in HAMi's names (limits.nvidia.com/*) are shown as not counting"
        ));
        BTreeSet::new()
    });
    let mut rows = Vec::new();
    for q in &quotas.items {
        let ns = q.metadata.namespace.as_deref().unwrap_or_default();
        let (r, w) = quota_budget(q, webhook_hami, hami.contains(ns));
        rows.extend(r);
        warnings.extend(w);
    }
    rows.sort_by(|a, b| (&a.namespace, &a.quota).cmp(&(&b.namespace, &b.quota)));
    Ok((rows, warnings))
}

/// Reads the budgets of `scope`: [`namespace_budgets`], and Kueue's ClusterQueues when it is
/// installed. The quotas must be readable; queues that cannot be read are said in
/// `queues_unavailable`. `webhook_hami`: the webhook converts HAMi's limits.
pub async fn fetch(
    client: &kube::Client,
    scope: &Scope,
    webhook_hami: bool,
) -> Result<Budgets, FetchError> {
    let (namespaces, queues) = tokio::join!(
        namespace_budgets(client, scope, webhook_hami),
        queues(client, scope)
    );
    let (namespaces, warnings) = namespaces?;
    let (queues, queues_unavailable) = match queues {
        Ok(q) => (q, None),
        Err(e) => (None, Some(e)),
    };
    Ok(Budgets {
        namespaces,
        queues,
        queues_unavailable,
        warnings,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    pub(crate) fn rq(ns: &str, name: &str, hard: Value, used: Value) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"hard": hard},
            "status": {"hard": hard, "used": used},
        }))
        .unwrap()
    }

    /// A budget of `ns/gpu`: `memory` and `gpus` hard, `used_memory` and `used_gpus` used.
    pub(crate) fn budget(
        ns: &str,
        memory: &str,
        used_memory: &str,
        gpus: &str,
        used_gpus: &str,
    ) -> NamespaceBudget {
        let q = rq(
            ns,
            "gpu",
            json!({quota::MEMORY: memory, quota::GPUS: gpus, "pods": "10"}),
            json!({quota::MEMORY: used_memory, quota::GPUS: used_gpus, "pods": "3"}),
        );
        quota_budget(&q, true, false).0.unwrap()
    }

    /// A pod of no scope field but a CPU request: in every quota without scopes, and in
    /// those scoped to NotBestEffort, NotTerminating or DoesNotExist of a PriorityClass.
    pub(crate) fn pod() -> Pod {
        admitted_pod(
            serde_json::from_value(json!({"containers": [
                {"name": "main", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}))
            .unwrap(),
            None,
        )
    }

    fn ask(pods: u64, req: Request) -> Ask {
        Ask::of_request(pods, &req).unwrap()
    }

    fn req(memory: &str, cores: Option<&str>, gpus: u32) -> Request {
        Request::parse(memory, cores, gpus).unwrap()
    }

    /// Every old pod removed before a new one starts.
    fn recreate(pods: u64) -> Rollout {
        Rollout::remove_first(pods, "Recreate")
    }

    /// [`check`] of `pod`, no slices held, the old pods removed first.
    fn checked_pod(
        budgets: &[NamespaceBudget],
        pod: &Pod,
        workload: &str,
        ask: &Ask,
    ) -> Result<(), BudgetError> {
        check(budgets, pod, workload, ask, None, &recreate(ask.pods))
    }

    /// [`check`] with the old pods removed first: the figures of the end state alone.
    fn checked(
        budgets: &[NamespaceBudget],
        workload: &str,
        ask: &Ask,
        held: Option<&Ask>,
    ) -> Result<(), BudgetError> {
        check(budgets, &pod(), workload, ask, held, &recreate(ask.pods))
    }

    /// A Deployment's RollingUpdate of `pods` pods.
    fn rolling(pods: u64, surge: u64, unavailable: u64) -> Rollout {
        Rollout::rolling(pods, surge, unavailable, "strategy Recreate, or maxSurge 0")
    }

    #[test]
    fn a_rolling_update_needs_its_old_pods_beside_the_new_ones_at_its_worst_point() {
        // Deployment web: 1 pod of 6Gi on a 10Gi quota with 6Gi used; 8Gi each. The old pod
        // runs until the new one is ready (maxSurge 1, maxUnavailable 0): 6 + 8 > 10.
        let b = [budget("team", "10Gi", "6Gi", "8", "1")];
        let held = ask(1, req("6Gi", None, 1));
        let bigger = ask(1, req("8Gi", None, 1));
        let e = check(
            &b,
            &pod(),
            "deployment/web",
            &bigger,
            Some(&held),
            &rolling(1, 1, 0),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "deployment/web: 1 pod(s) of 1 GPU × 8Gi memory, whose rollout (RollingUpdate, maxSurge 1, maxUnavailable 0) keeps 1 old pod(s) of 6Gi while 1 new pod(s) of 8Gi start: exceeded quota: team/gpu, requested: limits.gpuslice.io/memory=14Gi, used: limits.gpuslice.io/memory=0, limited: limits.gpuslice.io/memory=10Gi (used not counting this workload's pods; requested: the most they hold at once during the rollout); it fits if its old pods are removed before new ones start (strategy Recreate, or maxSurge 0), or with at most 4Gi of limits.gpuslice.io/memory per new pod"
        );
        // Old pods removed first: 8Gi of 10Gi. 4Gi beside the old 6Gi fits the rollout too.
        assert_eq!(
            check(
                &b,
                &pod(),
                "deployment/web",
                &bigger,
                Some(&held),
                &recreate(1)
            ),
            Ok(())
        );
        let smaller = ask(1, req("4Gi", None, 1));
        assert_eq!(
            check(
                &b,
                &pod(),
                "deployment/web",
                &smaller,
                Some(&held),
                &rolling(1, 1, 0)
            ),
            Ok(())
        );
        // Too big even with the old pods gone: the end state's words, and no rollout clause.
        let huge = ask(1, req("12Gi", None, 1));
        let e = check(
            &b,
            &pod(),
            "deployment/web",
            &huge,
            Some(&held),
            &rolling(1, 1, 0),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("deployment/web: 1 pod(s) of 1 GPU × 12Gi memory, whose rollout"),
            "{e}"
        );
        assert!(!e.contains("removed before new ones start"), "{e}");

        // 4 pods of 1Gi to 2Gi on 8Gi used of 10Gi (maxSurge 1, maxUnavailable 1): at its worst
        // the rollout runs 1 old pod beside 4 new (1 + 8 = 9Gi fits); on 9Gi hard it does not.
        let b = [budget("team", "10Gi", "4Gi", "8", "1")];
        let held = ask(4, req("1Gi", None, 1));
        let two = ask(4, req("2Gi", None, 1));
        assert_eq!(
            check(
                &b,
                &pod(),
                "deployment/web",
                &two,
                Some(&held),
                &rolling(4, 1, 1)
            ),
            Ok(())
        );
        let tight = [budget("team", "8Gi", "4Gi", "8", "1")];
        let e = check(
            &tight,
            &pod(),
            "deployment/web",
            &two,
            Some(&held),
            &rolling(4, 1, 1),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("keeps 1 old pod(s) of 1Gi while 4 new pod(s) of 2Gi start: exceeded quota: team/gpu, requested: limits.gpuslice.io/memory=9Gi"),
            "{e}"
        );
        // Unchanged sizes still need a surge pod's room at a full quota.
        let full = [budget("team", "4Gi", "4Gi", "8", "4")];
        assert!(check(&full, &pod(), "w", &held, Some(&held), &rolling(4, 1, 1)).is_err());
        assert_eq!(
            check(&full, &pod(), "w", &held, Some(&held), &recreate(4)),
            Ok(())
        );
    }

    #[test]
    fn a_rollouts_points_are_its_old_and_new_pods_at_once() {
        let pts = |r: &Rollout| -> Vec<(u64, u64)> {
            r.points().iter().map(|p| (p.old, p.new)).collect()
        };
        // One pod, surge 1: the old one runs beside the new one.
        assert_eq!(pts(&rolling(1, 1, 0)), [(1, 1), (0, 1)]);
        // 4 pods, surge 1, unavailable 1: 3 old beside 2 new, then 1 old beside 4 new.
        assert_eq!(pts(&rolling(4, 1, 1)), [(3, 2), (1, 4), (0, 4)]);
        // Old pods removed first: never both.
        assert_eq!(pts(&recreate(3)), [(0, 3)]);
        // A StatefulSet's one pod at a time, 2 of 5 kept by its partition.
        let sts = Rollout {
            kept: 2,
            unavailable: 1,
            ..recreate(3)
        };
        assert_eq!(pts(&sts), [(4, 1), (2, 3)]);
        // The room per new pod: 10 with 6 per old pod, 1 pod surge 1: 4.
        assert_eq!(rolling(1, 1, 0).per_pod_room(10, 6), Some(4));
        assert_eq!(recreate(1).per_pod_room(10, 6), Some(10));
        assert_eq!(recreate(0).per_pod_room(10, 6), None);
    }

    #[test]
    fn a_quota_reads_into_bytes_cores_and_gpus_in_both_name_sets() {
        let b = budget("team", "10Gi", "6Gi", "4", "1");
        assert_eq!(
            b.memory,
            Limit {
                hard: Some(10 * GIB),
                used: 6 * GIB
            }
        );
        assert_eq!(
            b.gpus,
            Limit {
                hard: Some(4),
                used: 1
            }
        );
        assert_eq!(
            b.cores,
            Limit {
                hard: None,
                used: 0
            }
        );
        assert_eq!(b.names, [quota::MEMORY, quota::GPUS]);
        assert_eq!(b.name_sets(), "gpuslice.io");
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(
            v,
            json!({"namespace": "team", "quota": "gpu",
                   "names": ["limits.gpuslice.io/memory", "limits.gpuslice.io/gpus"],
                   "memory": {"hard": 10 * GIB, "used": 6 * GIB},
                   "cores": {"hard": null, "used": 0},
                   "gpus": {"hard": 4, "used": 1}})
        );

        // HAMi's names in MiB count in a HAMi-compat namespace, as bytes.
        let q = rq(
            "legacy",
            "hami",
            json!({quota::HAMI_MEMORY: "10240", quota::HAMI_CORES: "150"}),
            json!({quota::HAMI_MEMORY: "2048"}),
        );
        let (b, w) = quota_budget(&q, true, true);
        let b = b.unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            b.memory,
            Limit {
                hard: Some(10 * GIB),
                used: 2 * GIB
            }
        );
        assert_eq!(
            b.cores,
            Limit {
                hard: Some(150),
                used: 0
            },
            "no ledger figure yet: 0"
        );
        assert_eq!(b.name_sets(), "nvidia.com");
        // Elsewhere they count nowhere, and the listing says so.
        let (b, w) = quota_budget(&q, true, false);
        assert_eq!(b, None);
        assert_eq!(
            w,
            ["ResourceQuota legacy/hami names HAMi's limits.nvidia.com/gpumem, limits.nvidia.com/gpucores, counted only by a webhook started with --hami-compat, in namespaces labelled gpuslice.io/hami-compat=true: namespace legacy is not"]
        );
        // Nor in a labelled namespace when the webhook does not convert HAMi's limits (the
        // chart's default): the console is told so with --hami-compat=false.
        let (b, w) = quota_budget(&q, false, true);
        assert_eq!(b, None);
        assert_eq!(
            w,
            ["ResourceQuota legacy/hami names HAMi's limits.nvidia.com/gpumem, limits.nvidia.com/gpucores, counted only by a webhook started with --hami-compat, in namespaces labelled gpuslice.io/hami-compat=true: this console was told the webhook runs without --hami-compat (--hami-compat=false or GPUSLICE_HAMI_COMPAT=false; leave it out where the webhook runs with it)"]
        );
        // A quota of other resources only is no budget, and no warning.
        assert_eq!(
            quota_budget(
                &rq("a", "pods", json!({"pods": "3"}), json!({})),
                true,
                false
            ),
            (None, vec![])
        );
    }

    /// A budget of `ns/gpu-<class>` counting the pods of PriorityClass `class` (its
    /// `scopeSelector`): `memory` hard, `used` used.
    pub(crate) fn scoped_to_class(
        ns: &str,
        class: &str,
        memory: &str,
        used: &str,
    ) -> NamespaceBudget {
        let mut q = rq(
            ns,
            &format!("gpu-{class}"),
            json!({quota::MEMORY: memory}),
            json!({quota::MEMORY: used}),
        );
        q.spec.as_mut().unwrap().scope_selector = serde_json::from_value(json!({
            "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": [class]}]
        }))
        .unwrap();
        quota_budget(&q, true, false).0.unwrap()
    }

    /// [`pod`] of PriorityClass `class`.
    pub(crate) fn pod_of_class(class: &str) -> Pod {
        let mut spec = pod().spec.unwrap();
        spec.priority_class_name = Some(class.into());
        admitted_pod(spec, None)
    }

    #[test]
    fn a_quota_scoped_to_a_priority_class_counts_only_the_pods_of_that_class() {
        // gpu-high: 8Gi for the pods of class high, 6Gi of it used; 4Gi more asked.
        let b = [scoped_to_class("team", "high", "8Gi", "6Gi")];
        let four = ask(1, req("4Gi", None, 1));
        let high = pod_of_class("high");
        let check = |pod: &Pod| checked_pod(&b, pod, "deployment/web", &four);
        // A pod of no class, or of another, is not counted by it: nothing refuses it, and it
        // has no room to show.
        assert_eq!(check(&pod()), Ok(()));
        assert_eq!(check(&pod_of_class("low")), Ok(()));
        assert!(headroom(&b, &pod(), None, &recreate(1)).is_empty());
        // A pod of class high is: 6 + 4 > 8, in the webhook's words.
        assert_eq!(
            check(&high).unwrap_err().to_string(),
            "deployment/web: 1 pod(s) of 1 GPU × 4Gi memory: exceeded quota: team/gpu-high, requested: limits.gpuslice.io/memory=4Gi, used: limits.gpuslice.io/memory=6Gi, limited: limits.gpuslice.io/memory=8Gi"
        );
        let left: Vec<u64> = headroom(&b, &high, None, &recreate(1))
            .iter()
            .map(|r| r.left)
            .collect();
        assert_eq!(left, [2 * GIB]);
        // The decision is the webhook's own (Budget::applies_to on the pod as admitted).
        for p in [pod(), pod_of_class("low"), high.clone()] {
            assert_eq!(b[0].counts(&p), b[0].budget.applies_to(Charged::Pod(&p)));
        }
        // A pod naming no class is admitted with the cluster's default class (the lowest value
        // of those marked globalDefault), and counted as of that class; one naming a class
        // keeps it.
        let classes: Vec<PriorityClass> = serde_json::from_value(json!([
            {"metadata": {"name": "low"}, "value": 10},
            {"metadata": {"name": "higher"}, "value": 2000, "globalDefault": true},
            {"metadata": {"name": "high"}, "value": 1000, "globalDefault": true}
        ]))
        .unwrap();
        let default = default_class(&classes);
        assert_eq!(default.as_deref(), Some("high"));
        assert_eq!(default_class(&classes[..1]), None);
        let defaulted = admitted_pod(pod().spec.unwrap(), default.as_deref());
        assert!(check(&defaulted).is_err());
        let named = pod_of_class("low").spec.unwrap();
        assert_eq!(check(&admitted_pod(named, default.as_deref())), Ok(()));
        // Beside a quota without scopes, the pod of no class is checked against that one alone.
        let both = [
            budget("team", "10Gi", "8Gi", "8", "0"),
            scoped_to_class("team", "high", "8Gi", "6Gi"),
        ];
        let e = checked_pod(&both, &pod(), "deployment/web", &four)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceeded quota: team/gpu,"), "{e}");
        let two = ask(1, req("2Gi", None, 1));
        assert_eq!(checked_pod(&both, &pod(), "deployment/web", &two), Ok(()));
        assert!(checked_pod(&both, &high, "deployment/web", &ask(1, req("3Gi", None, 1))).is_err());
    }

    #[test]
    fn a_malformed_quota_is_one_warning_line_and_no_budget() {
        let q = rq("team", "bad", json!({quota::MEMORY: "-1Gi"}), json!({}));
        let (b, w) = quota_budget(&q, false, false);
        assert_eq!(b, None);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with(
                "ResourceQuota team/bad: spec.hard[limits.gpuslice.io/memory]: value \"-1Gi\""
            ),
            "{w:?}"
        );
        assert!(!w[0].contains('\n'));
    }

    #[test]
    fn an_allocation_past_the_budget_is_refused_naming_quota_resource_hard_used_asked() {
        let b = [budget("team", "10Gi", "6Gi", "8", "2")];
        // 2 pods × 2Gi = 4Gi: exactly what is left.
        let fits = ask(2, req("2Gi", None, 1));
        assert_eq!(checked(&b, "deployment/web", &fits, None), Ok(()));
        let over = ask(3, req("2Gi", None, 1));
        let e = checked(&b, "deployment/web", &over, None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "deployment/web: 3 pod(s) of 1 GPU × 2Gi memory: exceeded quota: team/gpu, requested: limits.gpuslice.io/memory=6Gi, used: limits.gpuslice.io/memory=6Gi, limited: limits.gpuslice.io/memory=10Gi"
        );
        // Memory counts per GPU times GPUs: 2 pods × 2 GPUs × 1Gi is 4Gi and 4 GPUs (fits);
        // 4 pods × 2 GPUs pass the 8 GPUs (6 left).
        let wide = ask(2, req("1Gi", None, 2));
        assert_eq!(checked(&b, "deployment/web", &wide, None), Ok(()));
        let e = checked(&b, "deployment/web", &ask(4, req("512Mi", None, 2)), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("requested: limits.gpuslice.io/gpus=8, used: limits.gpuslice.io/gpus=2, limited: limits.gpuslice.io/gpus=8"), "{e}");
        // An edit frees what the workload holds now: 3 pods of 2Gi where they hold 1Gi each
        // (3Gi of the 6Gi used) take 6Gi of 10 - 3.
        let held = ask(3, req("1Gi", None, 1));
        assert_eq!(checked(&b, "deployment/web", &over, Some(&held)), Ok(()));
        let bigger = ask(3, req("3Gi", None, 1));
        let e = checked(&b, "deployment/web", &bigger, Some(&held))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "requested: limits.gpuslice.io/memory=9Gi, used: limits.gpuslice.io/memory=3Gi"
            ) && e.ends_with(
                "(used not counting this workload's current slices, which the allocation replaces)"
            ),
            "{e}"
        );
        // No budget, no limit.
        assert_eq!(checked(&[], "deployment/web", &bigger, None), Ok(()));
    }

    #[test]
    fn a_limits_form_pod_is_charged_the_claims_the_webhook_makes_of_it() {
        use gpuslice_dra::claim_shape::{Mode, SlotSize};
        let mut spec: PodSpec = serde_json::from_value(json!({"containers": [
            {"name": "main", "image": "x"}, {"name": "sidecar", "image": "x"}]}))
        .unwrap();
        let r = req("2Gi", None, 1);
        crate::edit::set_limits("deployment/web", &mut spec, &r, &[]).unwrap();
        let capacity = PublishedGpus {
            mode: Mode::Capacity,
            max_gpus_per_node: Some(2),
            gpu_memory: vec![24 * GIB],
        };
        // Capacity mode: a claim per container, so two GPUs' worth of slices per pod.
        let a = Ask::of_pod_spec(3, None, &spec, "team", &[], &capacity, r.describe()).unwrap();
        assert_eq!(
            a.per_pod,
            Charge {
                memory_bytes: 4 * GIB,
                cores: 200,
                gpus: 2
            }
        );
        let b = [budget("team", "10Gi", "0", "8", "0")];
        let e = checked(&b, "deployment/web", &a, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("requested: limits.gpuslice.io/memory=12Gi"),
            "{e}"
        );
        // Slot mode: the containers share one claim of the pod's shape (one GPU).
        let slots = PublishedGpus {
            mode: Mode::Slots(vec![SlotSize {
                memory: 4 * GIB,
                cores: None,
                per_gpu: 6,
            }]),
            ..capacity.clone()
        };
        let a = Ask::of_pod_spec(3, None, &spec, "team", &[], &slots, r.describe()).unwrap();
        assert_eq!((a.per_pod.memory_bytes, a.per_pod.gpus), (4 * GIB, 1));
        // A claim form's one template is charged once per pod; a template the spec names
        // that is not given cannot be charged.
        let mut claim_spec: PodSpec =
            serde_json::from_value(json!({"containers": [{"name": "main", "image": "x"}]}))
                .unwrap();
        let (t, _) = crate::edit::claim_template(
            "team",
            crate::edit::Kind::Deployment,
            "web",
            &r,
            &capacity.mode,
        )
        .unwrap();
        let name = t.metadata.name.clone().unwrap();
        crate::edit::add_claim("deployment/web", &mut claim_spec, &name, &[]).unwrap();
        let a =
            Ask::of_pod_spec(3, None, &claim_spec, "team", &[t], &capacity, r.describe()).unwrap();
        assert_eq!((a.per_pod.memory_bytes, a.per_pod.gpus), (2 * GIB, 1));
        let e = Ask::of_pod_spec(3, None, &claim_spec, "team", &[], &capacity, r.describe())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "names ResourceClaimTemplate team/{name}, which does not exist"
            )),
            "{e}"
        );
    }

    #[test]
    fn cores_count_100_per_gpu_when_not_throttled_as_the_webhook_charges() {
        let q = rq(
            "team",
            "gpu",
            json!({quota::CORES: "250"}),
            json!({quota::CORES: "50"}),
        );
        let b = [quota_budget(&q, true, false).0.unwrap()];
        let share = ask(2, req("1Gi", Some("100"), 1));
        assert_eq!(checked(&b, "w", &share, None), Ok(()));
        let whole = ask(2, req("1Gi", None, 1));
        assert_eq!(checked(&b, "w", &whole, None), Ok(()));
        let three = ask(3, req("1Gi", None, 1));
        let e = checked(&b, "w", &three, None).unwrap_err().to_string();
        assert!(e.contains("requested: limits.gpuslice.io/cores=300"), "{e}");
    }

    #[test]
    fn headroom_is_what_is_left_with_the_current_slices_freed() {
        let b = [budget("team", "10Gi", "6Gi", "8", "2")];
        let rooms = headroom(&b, &pod(), None, &recreate(2));
        let left: Vec<(&str, u64)> = rooms.iter().map(|r| (r.line.name.name, r.left)).collect();
        assert_eq!(left, [(quota::MEMORY, 4 * GIB), (quota::GPUS, 6)]);
        let held = ask(2, req("1Gi", None, 1));
        let left: Vec<u64> = headroom(&b, &pod(), Some(&held), &recreate(2))
            .iter()
            .map(|r| r.left)
            .collect();
        assert_eq!(left, [6 * GIB, 8]);
        // Over the hard value (lowered after admissions): nothing left, not an underflow.
        let over = [budget("team", "4Gi", "6Gi", "8", "2")];
        assert_eq!(headroom(&over, &pod(), None, &recreate(2))[0].left, 0);
    }

    #[test]
    fn a_cluster_queue_sums_its_flavors_of_gpuslice_memory() {
        let cq = json!({
            "metadata": {"name": "team-a"},
            "spec": {"cohortName": "pool", "resourceGroups": [
                {"coveredResources": ["cpu"], "flavors": [{"name": "default", "resources": [{"name": "cpu", "nominalQuota": "9"}]}]},
                {"coveredResources": ["gpuslice.io/memory"], "flavors": [
                    {"name": "h200", "resources": [{"name": "gpuslice.io/memory", "nominalQuota": "8Gi", "borrowingLimit": "8Gi"}]},
                    {"name": "l4", "resources": [{"name": "gpuslice.io/memory", "nominalQuota": "4Gi", "borrowingLimit": "0"}]}]}]},
            "status": {
                "flavorsUsage": [{"name": "h200", "resources": [{"name": "gpuslice.io/memory", "total": "12Gi", "borrowed": "4Gi"}]},
                                 {"name": "default", "resources": [{"name": "cpu", "total": "3"}]}],
                "flavorsReservation": [{"name": "h200", "resources": [{"name": "gpuslice.io/memory", "total": "16Gi", "borrowed": "8Gi"}]}]}
        });
        assert_eq!(
            queue_budget(&cq),
            Some(QueueBudget {
                name: "team-a".into(),
                cohort: Some("pool".into()),
                nominal: 12 * GIB,
                borrowing_limit: Some(8 * GIB),
                used: 12 * GIB,
                borrowed: 4 * GIB,
                reserved: 16 * GIB,
            })
        );
        // v1beta1 spells the cohort `cohort`; one flavor without a limit: unlimited; a queue
        // that has not charged anything yet has no status.
        let v1beta1 = json!({
            "metadata": {"name": "team-b"},
            "spec": {"cohort": "pool", "resourceGroups": [{"flavors": [
                {"name": "h200", "resources": [{"name": "gpuslice.io/memory", "nominalQuota": 8589934592u64}]}]}]}
        });
        let b = queue_budget(&v1beta1).unwrap();
        assert_eq!(
            (b.cohort.as_deref(), b.nominal, b.borrowing_limit, b.used),
            (Some("pool"), 8 * GIB, None, 0)
        );
        // No cohort: nothing to borrow.
        let alone = json!({"metadata": {"name": "c"}, "spec": {"resourceGroups": [{"flavors": [
            {"name": "f", "resources": [{"name": "gpuslice.io/memory", "nominalQuota": "1Gi"}]}]}]}});
        assert_eq!(queue_budget(&alone).unwrap().borrowing_limit, Some(0));
        // A queue not charging gpuslice.io/memory is not a GPU budget.
        let cpu = json!({"metadata": {"name": "cpu"}, "spec": {"resourceGroups": [{"flavors": [
            {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "9"}]}]}]}});
        assert_eq!(queue_budget(&cpu), None);
    }
}
