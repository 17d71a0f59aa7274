//! `allocate` and `release` against the API server: reads the workload, chooses the form of
//! its slice (the webhook's limits when the webhook is installed, else the claim of the
//! cluster's publication mode; a workload keeps the form it has), checks the request and the
//! free room, creates the ResourceClaimTemplate (claim form), replaces the workload with its
//! edited pod template (the read resourceVersion travels with it, so an edit made meanwhile
//! is never overwritten: the console re-reads and edits again), and deletes templates of
//! its own that nothing names any more. `--dry-run` prints the diff and writes nothing.

use gpuslice_dra::claim_shape::{describe, shape_of, Mode, PublishedGpus, Shape};
use gpuslice_fsutil::diff::{diff, Context};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::budgets::{self, Ask, NamespaceBudget, Rollout, Scope};
use crate::edit::{self, EditError, Form, Kind, Request, MANAGED_BY};
use crate::fetch::{self, FetchError, PodScope};
use crate::model;

/// How often a replace that lost a race with another edit is redone.
const ATTEMPTS: usize = 5;
/// The webhook's name in the MutatingWebhookConfiguration that installs it (the chart's and
/// the test cluster's).
pub const WEBHOOK_NAME: &str = "pods.gpuslice.io";

/// `kubectl gpuslice allocate` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AllocateArgs {
    /// deployment/NAME, statefulset/NAME or daemonset/NAME.
    pub workload: String,
    /// GPU memory per GPU (a quantity: 20Gi, 1536Mi): with `--form limits`, of each container
    /// that gets the slice (capacity mode gives each its own claim; slot mode one claim of the
    /// pod, their sum); with `--form claim`, of the pod's one shared claim.
    #[arg(long)]
    pub memory: String,
    /// Compute share per GPU, percent (0–100; default: not throttled).
    #[arg(long)]
    pub cores: Option<String>,
    /// GPUs of each slice (whose slices: as for `--memory`).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Only these containers get the slice (repeatable; default: every container).
    #[arg(short = 'c', long = "container")]
    pub containers: Vec<String>,
    /// Print the diff and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write even when the replicas do not fit now (their pods stay Pending until room is
    /// free) or would take more than the namespace's budget has left (the pods past it are
    /// refused at admission until some of the budget is freed); a template the webhook would
    /// refuse every pod of is still refused.
    #[arg(long)]
    pub force: bool,
    /// How the pod template asks for the slice: `limits` (gpuslice.io/gpus, memory, cores in
    /// the containers' limits, which the webhook turns into a claim of each pod) or `claim` (a
    /// ResourceClaimTemplate of the cluster's publication mode). Default: the form the
    /// workload has; for a new slice, limits when the webhook (pods.gpuslice.io) is
    /// installed, else claim.
    #[arg(long, value_parser = ["limits", "claim"])]
    pub form: Option<String>,
}

/// `kubectl gpuslice release` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReleaseArgs {
    /// deployment/NAME, statefulset/NAME or daemonset/NAME.
    pub workload: String,
    /// Print the diff and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Why nothing (or not everything) was changed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("{workload} not found in namespace {namespace}")]
    NotFound { workload: String, namespace: String },
    #[error("cannot {op} {what}: {source}")]
    Api {
        op: &'static str,
        what: String,
        source: kube::Error,
    },
    #[error("{workload} needs {want} pod(s) of {request}; the GPUs' free room fits {fit} ({per_node}): nothing changed; free room or pass --force to let the pods wait Pending")]
    NoRoom {
        workload: String,
        want: u64,
        request: String,
        fit: u64,
        per_node: String,
    },
    #[error("{workload}: the webhook would refuse its pods: {source}: nothing changed")]
    Refused {
        workload: String,
        source: Box<gpuslice_webhook::mutate::MutateError>,
    },
    #[error("{workload}: its pod template cannot be read as the webhook reads a pod: {detail}: nothing changed")]
    Template { workload: String, detail: String },
    #[error("{workload}: cannot size claim {entry} of its pods: {detail}: nothing changed")]
    Unsized {
        workload: String,
        entry: String,
        detail: String,
    },
    #[error("{0}: nothing changed; raise the quota, free some of its budget, or pass --force to write anyway (the pods past the budget are refused at admission)")]
    OverBudget(budgets::BudgetError),
    #[error("{workload}: {field} {value:?} cannot be read; accepted: a whole number of pods, at least 0, or a percentage (`25%`): nothing changed")]
    Strategy {
        workload: String,
        field: &'static str,
        value: String,
    },
    #[error("{0}: nothing changed")]
    Unchargeable(Box<gpuslice_dra::quota::QuotaError>),
    #[error(
        "{workload}: ResourceClaimTemplate {name} exists and is not the console's: nothing changed"
    )]
    ForeignTemplate { workload: String, name: String },
    #[error("{workload} has no slice the console writes (no claim `gpuslice` of its templates, no gpuslice.io/* limits): nothing to release")]
    NotAllocated { workload: String },
    #[error("{workload} kept changing under the console ({attempts} attempts): nothing changed")]
    Contended { workload: String, attempts: usize },
    #[error("cannot encode {what} as YAML: {detail}")]
    Yaml { what: String, detail: String },
}

/// The workload kinds, as one shape: their pod template and replicas.
pub trait Workload:
    kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
{
    fn pod_spec(&self) -> Option<&PodSpec>;
    fn pod_spec_mut(&mut self) -> Option<&mut PodSpec>;
    /// The pod template's metadata: its labels make the pods ranks of a job, which the
    /// webhook plans otherwise (`gpuslice_webhook::budget::template_pod`).
    fn pod_meta(&self) -> Option<&ObjectMeta>;
    /// `None` for a DaemonSet (one pod per node).
    fn replicas(&self) -> Option<u64>;
    /// How its controller replaces its `pods` pods (as [`budget_pods`] counts them) once the
    /// template changes; `label` names it for the message of a value that cannot be read.
    fn rollout(&self, pods: u64, label: &str) -> Result<Rollout, WorkloadError>;
}

/// The three kinds keep their pod template at `spec.template.spec`; only how many pods they
/// run differs.
macro_rules! workload_kind {
    ($kind:ty, $replicas:expr, $rollout:expr) => {
        impl Workload for $kind {
            fn pod_spec(&self) -> Option<&PodSpec> {
                self.spec.template.spec.as_ref()
            }
            fn pod_spec_mut(&mut self) -> Option<&mut PodSpec> {
                self.spec.template.spec.as_mut()
            }
            fn pod_meta(&self) -> Option<&ObjectMeta> {
                self.spec.template.metadata.as_ref()
            }
            fn replicas(&self) -> Option<u64> {
                let replicas: fn(&$kind) -> Option<u64> = $replicas;
                replicas(self)
            }
            fn rollout(&self, pods: u64, label: &str) -> Result<Rollout, WorkloadError> {
                let rollout: fn(&$kind, u64, &str) -> Result<Rollout, WorkloadError> = $rollout;
                rollout(self, pods, label)
            }
        }
    };
}

workload_kind!(
    Deployment,
    |d| declared_replicas(d.spec.replicas),
    deployment_rollout
);
workload_kind!(
    StatefulSet,
    |s| declared_replicas(s.spec.replicas),
    statefulset_rollout
);
workload_kind!(DaemonSet, |_| None, daemonset_rollout);

/// `v` (default `default`) of `total` pods, as Kubernetes scales a maxSurge or maxUnavailable
/// (`intstr.GetScaledValueFromIntOrPercent`): a whole number as it is, a percentage of
/// `total` rounded up (`round_up`) or down.
fn scaled(
    label: &str,
    field: &'static str,
    v: Option<&IntOrString>,
    default: &str,
    total: u64,
    round_up: bool,
) -> Result<u64, WorkloadError> {
    let unreadable = |value: String| WorkloadError::Strategy {
        workload: label.to_string(),
        field,
        value,
    };
    let percent = match v {
        Some(IntOrString::Int(n)) => {
            return u64::try_from(*n).map_err(|_| unreadable(n.to_string()))
        }
        Some(IntOrString::String(s)) => s.as_str(),
        None => default,
    };
    let p: u64 = percent
        .strip_suffix('%')
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| unreadable(percent.to_string()))?;
    let of = total.saturating_mul(p);
    Ok(if round_up { of.div_ceil(100) } else { of / 100 })
}

/// A Deployment's rollout: RollingUpdate (the default) runs up to maxSurge pods beyond its
/// replicas (rounded up) and removes up to maxUnavailable old ones before new ones are ready
/// (rounded down; 1 when both come to 0), both 25% by default; Recreate removes every old pod
/// first.
fn deployment_rollout(d: &Deployment, pods: u64, label: &str) -> Result<Rollout, WorkloadError> {
    let strategy = d.spec.strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return Ok(Rollout::remove_first(pods, "Recreate"));
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let surge = scaled(
        label,
        "spec.strategy.rollingUpdate.maxSurge",
        rolling.and_then(|r| r.max_surge.as_ref()),
        "25%",
        pods,
        true,
    )?;
    let mut unavailable = scaled(
        label,
        "spec.strategy.rollingUpdate.maxUnavailable",
        rolling.and_then(|r| r.max_unavailable.as_ref()),
        "25%",
        pods,
        false,
    )?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok(Rollout::rolling(
        pods,
        surge,
        unavailable,
        "strategy Recreate, or maxSurge 0",
    ))
}

/// A StatefulSet's rollout: it deletes an old pod before it creates its replacement (one at
/// a time, or maxUnavailable at a time), whatever the strategy; pods below a RollingUpdate's
/// `partition` keep the old template.
fn statefulset_rollout(s: &StatefulSet, pods: u64, _label: &str) -> Result<Rollout, WorkloadError> {
    let strategy = s.spec.update_strategy.as_ref();
    let partition = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .map_or(0, |p| p.max(0) as u64)
        .min(pods);
    let name = match strategy.and_then(|s| s.type_.as_deref()) {
        Some("OnDelete") => "OnDelete",
        _ => "RollingUpdate",
    };
    Ok(Rollout {
        kept: partition,
        ..Rollout::remove_first(pods - partition, name)
    })
}

/// A DaemonSet's rollout: RollingUpdate (the default) runs up to maxSurge new pods beside old
/// ones (default 0) and removes up to maxUnavailable old ones first (default 1), both
/// percentages of its pods rounded up; OnDelete replaces a pod only once it is deleted.
fn daemonset_rollout(d: &DaemonSet, pods: u64, label: &str) -> Result<Rollout, WorkloadError> {
    let strategy = d.spec.update_strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return Ok(Rollout::remove_first(pods, "OnDelete"));
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let surge = scaled(
        label,
        "spec.updateStrategy.rollingUpdate.maxSurge",
        rolling.and_then(|r| r.max_surge.as_ref()),
        "0%",
        pods,
        true,
    )?;
    let unavailable = match rolling.and_then(|r| r.max_unavailable.as_ref()) {
        None => 1,
        v => scaled(
            label,
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
            v,
            "0%",
            pods,
            true,
        )?,
    };
    Ok(Rollout::rolling(pods, surge, unavailable, "maxSurge 0"))
}

/// A Deployment or StatefulSet without `replicas` runs one pod; a negative count none.
fn declared_replicas(replicas: Option<i32>) -> Option<u64> {
    Some(replicas.unwrap_or(1).max(0) as u64)
}

fn api_err<'a>(op: &'static str, what: &'a str) -> impl FnOnce(kube::Error) -> WorkloadError + 'a {
    move |source| WorkloadError::Api {
        op,
        what: what.to_string(),
        source,
    }
}

fn yaml<T: Serialize>(what: &str, v: &T) -> Result<String, WorkloadError> {
    serde_yaml_ng::to_string(v).map_err(|e| WorkloadError::Yaml {
        what: what.to_string(),
        detail: e.to_string(),
    })
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The console's templates of workload `kind/name`.
async fn our_templates(
    templates: &Api<ResourceClaimTemplate>,
    kind: Kind,
    name: &str,
) -> Result<Vec<String>, WorkloadError> {
    let lp = ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let list = templates
        .list(&lp)
        .await
        .map_err(api_err("list", "resourceclaimtemplates.resource.k8s.io"))?;
    Ok(list
        .items
        .iter()
        .filter(|t| gpuslice_dra::claim_shape::written_by(t, &edit::writer(kind, name)))
        .filter_map(|t| t.metadata.name.clone())
        .collect())
}

/// The workload's pod template, which allocate and release edit; refused when it has none or
/// still asks HAMi's limits (left for the webhook's HAMi compatibility to turn into a slice).
fn editable_spec<'w, W: Workload>(w: &'w W, label: &str) -> Result<&'w PodSpec, WorkloadError> {
    let spec = w.pod_spec().ok_or_else(|| EditError::NoPodSpec {
        workload: label.to_string(),
    })?;
    match edit::hami_limits(spec) {
        Some(limits) => Err(EditError::Hami {
            workload: label.to_string(),
            limits,
        }
        .into()),
        None => Ok(spec),
    }
}

async fn get<W: Workload>(
    api: &Api<W>,
    label: &str,
    name: &str,
    ns: &str,
) -> Result<W, WorkloadError> {
    match api.get_opt(name).await {
        Ok(Some(w)) => Ok(w),
        Ok(None) => Err(WorkloadError::NotFound {
            workload: label.to_string(),
            namespace: ns.to_string(),
        }),
        Err(e) => Err(api_err("get", label)(e)),
    }
}

/// The pod template part of a workload, as YAML for the diff.
fn template_yaml<W: Workload>(label: &str, w: &W) -> Result<String, WorkloadError> {
    yaml(label, &w.pod_spec())
}

/// The slices one pod of the template `meta`, `spec` in `namespace` holds once admitted, as
/// the webhook will give them: its own plan of the spec's gpuslice limits
/// (`gpuslice_webhook::mutate::plan`, of the pod as the webhook is sent it,
/// `gpuslice_webhook::budget::template_pod`: in capacity mode a claim per container, in slot
/// mode one claim of the containers' summed ask; refused as the webhook refuses it, a rank of
/// a job by its labels included) and the claim templates the spec names (`named`, the
/// console's new one among them), each claim read back as its shape. The same plan the
/// budget check charges (`gpuslice_webhook::budget::pod_spec_charge`).
pub fn pod_slices(
    label: &str,
    meta: Option<&ObjectMeta>,
    spec: &PodSpec,
    namespace: &str,
    named: &[ResourceClaimTemplate],
    inventory: &PublishedGpus,
) -> Result<Vec<Shape>, WorkloadError> {
    let pod = gpuslice_webhook::budget::template_pod(meta, spec).map_err(|e| {
        WorkloadError::Template {
            workload: label.to_string(),
            detail: e.to_string(),
        }
    })?;
    let plan = gpuslice_webhook::mutate::plan(&pod, namespace, false, inventory).map_err(|e| {
        WorkloadError::Refused {
            workload: label.to_string(),
            source: Box::new(e),
        }
    })?;
    let no_size = |entry: &str, detail: String| WorkloadError::Unsized {
        workload: label.to_string(),
        entry: entry.to_string(),
        detail,
    };
    gpuslice_webhook::budget::template_entries(&pod, &plan)
        .iter()
        .map(|(entry, name)| {
            let t = plan
                .templates
                .iter()
                .chain(named)
                .find(|t| t.metadata.name.as_deref() == Some(name.as_str()))
                .ok_or_else(|| no_size(entry, format!("ResourceClaimTemplate {name} not found")))?;
            t.spec
                .as_ref()
                .and_then(|s| s.spec.as_ref())
                .and_then(|s| shape_of(s, &inventory.mode))
                .ok_or_else(|| {
                    no_size(
                        entry,
                        format!("ResourceClaimTemplate {name} is not a claim of gpuslice's shape"),
                    )
                })
        })
        .collect()
}

/// What each pod of `next` holds, for the refusal: `req` once (the claim form's one claim, or
/// one container), in each of N containers (a claim each), or N containers' shared slice.
fn pod_request(req: &Request, next: &PodSpec, slices: &[Shape]) -> String {
    match (edit::limited_containers(next), slices) {
        (0 | 1, _) => req.describe(),
        (n, s) if s.len() == n => format!("{} in each of {n} containers", req.describe()),
        (n, s) => format!(
            "{} in each of {n} containers, as {} shared slice(s) of {}",
            req.describe(),
            s.len(),
            s.iter().map(describe).collect::<Vec<_>>().join(" + ")
        ),
    }
}

/// Checks that `want` pods (`None`: a DaemonSet, one per node with GPUs), each holding the
/// slices `pod` ([`pod_slices`]), fit.
fn check_fit(
    m: &model::Model,
    mode: &Mode,
    label: &str,
    pod: &[Shape],
    request: String,
    want: Option<u64>,
) -> Result<(), WorkloadError> {
    let per_node = edit::fit_per_node(&m.gpus, pod, want.unwrap_or(1), mode);
    let describe = || {
        if per_node.is_empty() {
            "no node publishes gpuslice GPUs".to_string()
        } else {
            per_node
                .iter()
                .map(|(n, k)| format!("{n}: {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let (need, fit) = match want {
        Some(w) => (w, per_node.values().sum::<u64>()),
        // A DaemonSet: one pod on each node with GPUs.
        None => (
            per_node.len().max(1) as u64,
            per_node.values().filter(|k| **k >= 1).count() as u64,
        ),
    };
    if fit < need {
        return Err(WorkloadError::NoRoom {
            workload: label.to_string(),
            want: need,
            request,
            fit,
            per_node: describe(),
        });
    }
    Ok(())
}

/// Whether the webhook is installed (a MutatingWebhookConfiguration holds a webhook named
/// [`WEBHOOK_NAME`]), and the reason as a clause for the output.
pub async fn webhook_installed(client: &kube::Client) -> (bool, String) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => match list.items.iter().find(|c| {
            c.webhooks
                .iter()
                .flatten()
                .any(|w| w.name == WEBHOOK_NAME)
        }) {
            Some(c) => (
                true,
                format!(
                    "the webhook {WEBHOOK_NAME} is installed (mutatingwebhookconfiguration/{})",
                    c.metadata.name.as_deref().unwrap_or_default()
                ),
            ),
            None => (false, format!("no webhook {WEBHOOK_NAME} is installed")),
        },
        Err(e) => (
            false,
            format!("mutatingwebhookconfigurations cannot be read ({e}), so the webhook is taken as not installed"),
        ),
    }
}

/// The form to write and why: `--form`, else the form the workload has, else limits when the
/// webhook is installed.
async fn choose_form(
    client: &kube::Client,
    asked: Option<&str>,
    spec: &PodSpec,
) -> Result<(Form, String), WorkloadError> {
    if let Some(f) = asked {
        return Ok((Form::parse(f)?, format!("--form {f}")));
    }
    if edit::current_template(spec).is_some() {
        return Ok((Form::Claim, "the workload has the claim form".to_string()));
    }
    if edit::current_limits(spec).is_some() {
        return Ok((Form::Limits, "the workload has the limits form".to_string()));
    }
    let (installed, why) = webhook_installed(client).await;
    Ok((if installed { Form::Limits } else { Form::Claim }, why))
}

/// What the summary line says of the form written.
fn form_line(form: Form, mode: &Mode, template: &str, why: &str) -> String {
    match form {
        Form::Limits => format!(
            "limits form: gpuslice.io/gpus, gpuslice.io/memory, gpuslice.io/cores in the containers' limits, which the webhook turns into a claim of each pod; because {why}"
        ),
        Form::Claim => format!(
            "claim form, {} mode: resourceclaimtemplate/{template}; because {why}",
            mode.describe()
        ),
    }
}

/// The claim templates `spec`'s entries name that exist in the namespace (the budget charges
/// what they ask).
async fn named_templates(
    templates: &Api<ResourceClaimTemplate>,
    spec: &PodSpec,
) -> Vec<ResourceClaimTemplate> {
    let mut out = Vec::new();
    for name in spec
        .resource_claims
        .iter()
        .flatten()
        .filter_map(|e| e.resource_claim_template_name.as_ref())
    {
        if let Ok(Some(t)) = templates.get_opt(name).await {
            out.push(t);
        }
    }
    out
}

/// The namespace's budgets for the allocate check (`hami`: the webhook counts HAMi's quota
/// names); when its quotas cannot be read, none and a note saying the budget was not checked
/// (the webhook still enforces it at admission).
async fn budgets_of(
    client: &kube::Client,
    ns: &str,
    hami: bool,
) -> (Vec<NamespaceBudget>, Option<String>) {
    match budgets::namespace_budgets(client, &Scope::Namespace(ns.to_string()), hami).await {
        Ok((b, _)) => (b, None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "note: the namespace's budget was not checked: {e}\n"
            )),
        ),
    }
}

/// What the budget check of one allocation reads: the namespace's budgets, the templates the
/// pods may name (those that exist and the console's new one), the cluster's GPUs and its
/// default PriorityClass where a budget's scope reads it ([`budgets::default_class_for`]).
struct BudgetCheck<'a> {
    budgets: &'a [NamespaceBudget],
    named: &'a [ResourceClaimTemplate],
    inventory: &'a PublishedGpus,
    default_class: Option<&'a str>,
}

/// The cluster's default PriorityClass where a budget of the namespace reads it; when it
/// cannot be read, none and a note saying the budget was checked as though none were set
/// (the webhook matches the pods as admitted).
async fn default_class_of(
    client: &kube::Client,
    budgets: &[NamespaceBudget],
) -> (Option<String>, Option<String>) {
    match budgets::default_class_for(client, budgets).await {
        Ok(c) => (c, None),
        Err(e) => (
            None,
            Some(format!(
                "note: the budget was checked as though the cluster had no default PriorityClass: {e}\n"
            )),
        ),
    }
}

/// How many pods the namespace's budget is checked for: `replicas` (a workload's
/// [`Workload::replicas`]); a DaemonSet's (`None`) one on each node of `m`, the nodes with
/// gpuslice GPUs, whatever its status says it is scheduled on. The GPU tab shows the same.
pub fn budget_pods(replicas: Option<u64>, m: &model::Model) -> u64 {
    replicas.unwrap_or(m.nodes.len() as u64)
}

/// Checks that the workload's pods of `next` stay within the namespace's budgets that count
/// them (their scopes, read of a pod of `next` as admitted) through its `rollout`, each pod
/// charged as the webhook charges it, its pods of `current` freed only as
/// the rollout removes them. A DaemonSet (`want` `None`) runs a pod on each node with
/// gpuslice GPUs ([`budget_pods`]).
#[allow(clippy::too_many_arguments)]
fn check_budget(
    c: &BudgetCheck<'_>,
    m: &model::Model,
    ns: &str,
    label: &str,
    req: &Request,
    meta: Option<&ObjectMeta>,
    next: &PodSpec,
    current: &PodSpec,
    want: Option<u64>,
    rollout: &Rollout,
) -> Result<(), WorkloadError> {
    let pods = budget_pods(want, m);
    let over = |e| match e {
        budgets::BudgetError::Charge(c) => WorkloadError::Unchargeable(c),
        over => WorkloadError::OverBudget(over),
    };
    let what = match edit::limited_containers(next) {
        n if n > 1 => format!("{} in each of {n} containers", req.describe()),
        _ => req.describe(),
    };
    let ask = Ask::of_pod_spec(pods, meta, next, ns, c.named, c.inventory, what).map_err(over)?;
    // What the pods hold now is freed as the rollout removes them; one that cannot be
    // charged frees nothing.
    let held = Ask::of_pod_spec(pods, meta, current, ns, c.named, c.inventory, String::new()).ok();
    let pod = budgets::admitted_pod(next.clone(), c.default_class);
    budgets::check(c.budgets, &pod, label, &ask, held.as_ref(), rollout).map_err(over)
}

async fn allocate_kind<W: Workload>(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    name: &str,
    args: &AllocateArgs,
    req: Request,
    hami: bool,
) -> Result<String, WorkloadError> {
    let label = format!("{}/{name}", kind.as_str());
    let api: Api<W> = Api::namespaced(client.clone(), ns);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), ns);
    let src = fetch::sources(client, &PodScope::None, None).await?;
    let inventory = PublishedGpus::from_slices(&src.slices);
    let mode = &inventory.mode;
    let m = model::build(&src, None);
    let first = get(&api, &label, name, ns).await?;
    let spec = editable_spec(&first, &label)?;
    let (form, why) = choose_form(client, args.form.as_deref(), spec).await?;
    let mut named = named_templates(&templates, spec).await;
    let (budgets, unchecked) = budgets_of(client, ns, hami).await;
    let (default_class, no_default) = default_class_of(client, &budgets).await;
    let (template, notes) = edit::claim_template(ns, kind, name, &req, mode)?;
    named.push(template.clone());
    let budget_check = BudgetCheck {
        budgets: &budgets,
        named: &named,
        inventory: &inventory,
        default_class: default_class.as_deref(),
    };
    // Before anything is written: the webhook would admit the pods of `then` (always: a
    // template it refuses gives no pod at all, `--force` or not); unless `force`, they fit the
    // GPUs' free room and the namespace's budget through the workload's rollout, what `now`'s
    // pods hold freed as it removes them.
    let checks = |then: &PodSpec, now: &PodSpec, w: &W, force: bool| {
        let want = w.replicas();
        // The edit changes the spec alone: the template's labels (a job's) are the same.
        let meta = w.pod_meta();
        let pod = pod_slices(&label, meta, then, ns, &named, &inventory)?;
        if force {
            return Ok(());
        }
        let rollout = w.rollout(budget_pods(want, &m), &label)?;
        check_fit(&m, mode, &label, &pod, pod_request(&req, then, &pod), want)?;
        check_budget(
            &budget_check,
            &m,
            ns,
            &label,
            &req,
            meta,
            then,
            now,
            want,
            &rollout,
        )
    };
    let template_name = template.metadata.name.clone().unwrap_or_default();
    let mut ours = our_templates(&templates, kind, name).await?;
    if form == Form::Claim && !ours.contains(&template_name) {
        ours.push(template_name.clone());
    }
    // The templates of ours the workload names no more once written.
    let stale: Vec<String> = ours
        .iter()
        .filter(|t| form == Form::Limits || **t != template_name)
        .cloned()
        .collect();
    let mut notes: String = notes.iter().map(|n| format!("note: {n}\n")).collect();
    notes.extend(unchecked);
    notes.extend(no_default);
    let mut created = false;
    let mut checked = false;
    for _ in 0..ATTEMPTS {
        let current = get(&api, &label, name, ns).await?;
        let spec = current.pod_spec().ok_or_else(|| EditError::NoPodSpec {
            workload: label.clone(),
        })?;
        edit::check_claims(&label, spec, &ours)?;
        let previous = edit::current_template(spec);
        let mut next = current.clone();
        let spec = next.pod_spec_mut().ok_or_else(|| EditError::NoPodSpec {
            workload: label.clone(),
        })?;
        match form {
            Form::Limits => {
                edit::remove_claim(spec);
                edit::set_limits(&label, spec, &req, &args.containers)?;
            }
            Form::Claim => {
                edit::remove_limits(spec);
                edit::add_claim(&label, spec, &template_name, &args.containers)?;
            }
        }
        let unchanged = next.pod_spec() == current.pod_spec();
        let no_spec = || EditError::NoPodSpec {
            workload: label.clone(),
        };
        let now = current.pod_spec().ok_or_else(no_spec)?;
        let then = next.pod_spec().ok_or_else(no_spec)?;
        if args.dry_run {
            let mut out = String::new();
            if form == Form::Claim && previous.as_deref() != Some(template_name.as_str()) {
                out.push_str(&diff(
                    &format!("resourceclaimtemplate/{template_name}"),
                    "",
                    &yaml("the template", &template)?,
                    Context::All,
                ));
            }
            out.push_str(&diff(
                &format!("{label} spec.template.spec"),
                &template_yaml(&label, &current)?,
                &template_yaml(&label, &next)?,
                Context::All,
            ));
            for p in previous.iter().filter(|p| stale.contains(p)) {
                out.push_str(&format!("resourceclaimtemplate/{p} would be deleted\n"));
            }
            if !checked {
                checks(then, now, &current, args.force)?;
            }
            out.push_str(&format!(
                "({})\n",
                form_line(form, mode, &template_name, &why)
            ));
            out.push_str(&notes);
            out.push_str("(dry run: nothing changed)\n");
            return Ok(out);
        }
        if unchanged {
            return Ok(format!(
                "{label} unchanged: already allocated {} ({})\n",
                req.describe(),
                form_line(form, mode, &template_name, &why)
            ));
        }
        if !checked {
            checks(then, now, &current, args.force)?;
        }
        checked = true;
        if form == Form::Claim && !created {
            match templates.create(&PostParams::default(), &template).await {
                Ok(_) => created = true,
                Err(e) if is_status(&e, 409) => {
                    let existing = templates
                        .get(&template_name)
                        .await
                        .map_err(api_err("get", &template_name))?;
                    if !gpuslice_dra::claim_shape::is_ours(&existing, &template) {
                        return Err(WorkloadError::ForeignTemplate {
                            workload: label,
                            name: template_name,
                        });
                    }
                }
                Err(e) => return Err(api_err("create", &template_name)(e)),
            }
        }
        match api.replace(name, &PostParams::default(), &next).await {
            Ok(_) => {
                for old in &stale {
                    match templates.delete(old, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => return Err(api_err("delete", old)(e)),
                    }
                }
                return Ok(format!(
                    "{label} allocated: each pod gets {} ({})\n{notes}",
                    req.describe(),
                    form_line(form, mode, &template_name, &why)
                ));
            }
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => {
                if created {
                    let _ = templates
                        .delete(&template_name, &DeleteParams::default())
                        .await;
                }
                return Err(api_err("update", &label)(e));
            }
        }
    }
    if created {
        let _ = templates
            .delete(&template_name, &DeleteParams::default())
            .await;
    }
    Err(WorkloadError::Contended {
        workload: label,
        attempts: ATTEMPTS,
    })
}

async fn release_kind<W: Workload>(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    name: &str,
    dry_run: bool,
) -> Result<String, WorkloadError> {
    let label = format!("{}/{name}", kind.as_str());
    let api: Api<W> = Api::namespaced(client.clone(), ns);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), ns);
    let ours = our_templates(&templates, kind, name).await?;
    for _ in 0..ATTEMPTS {
        let current = get(&api, &label, name, ns).await?;
        let spec = editable_spec(&current, &label)?;
        let claim = edit::current_template(spec).is_some_and(|t| ours.contains(&t));
        let limits = edit::current_limits(spec).is_some();
        if !claim && !limits {
            return Err(WorkloadError::NotAllocated { workload: label });
        }
        let forms = match (claim, limits) {
            (true, true) => "claim and limits forms",
            (true, false) => "claim form",
            _ => "limits form",
        };
        let mut next = current.clone();
        if let Some(spec) = next.pod_spec_mut() {
            if claim {
                edit::remove_claim(spec);
            }
            edit::remove_limits(spec);
        }
        if dry_run {
            let mut out = diff(
                &format!("{label} spec.template.spec"),
                &template_yaml(&label, &current)?,
                &template_yaml(&label, &next)?,
                Context::All,
            );
            for t in &ours {
                out.push_str(&format!("resourceclaimtemplate/{t} would be deleted\n"));
            }
            out.push_str(&format!("({forms} would be removed)\n"));
            out.push_str("(dry run: nothing changed)\n");
            return Ok(out);
        }
        match api.replace(name, &PostParams::default(), &next).await {
            Ok(_) => {
                for t in &ours {
                    match templates.delete(t, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => return Err(api_err("delete", t)(e)),
                    }
                }
                return Ok(format!("{label} released ({forms} removed)\n"));
            }
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(api_err("update", &label)(e)),
        }
    }
    Err(WorkloadError::Contended {
        workload: label,
        attempts: ATTEMPTS,
    })
}

/// `allocate`: returns what to print. `hami`: the webhook runs with `--hami-compat`, so the
/// budget check counts HAMi's quota names where it does.
pub async fn allocate(
    client: &kube::Client,
    ns: &str,
    args: &AllocateArgs,
    hami: bool,
) -> Result<String, WorkloadError> {
    let (kind, name) = edit::parse_workload(&args.workload)?;
    let req = Request::parse(&args.memory, args.cores.as_deref(), args.gpus)?;
    match kind {
        Kind::Deployment => {
            allocate_kind::<Deployment>(client, ns, kind, &name, args, req, hami).await
        }
        Kind::StatefulSet => {
            allocate_kind::<StatefulSet>(client, ns, kind, &name, args, req, hami).await
        }
        Kind::DaemonSet => {
            allocate_kind::<DaemonSet>(client, ns, kind, &name, args, req, hami).await
        }
    }
}

/// `release`: returns what to print.
pub async fn release(
    client: &kube::Client,
    ns: &str,
    args: &ReleaseArgs,
) -> Result<String, WorkloadError> {
    let (kind, name) = edit::parse_workload(&args.workload)?;
    match kind {
        Kind::Deployment => release_kind::<Deployment>(client, ns, kind, &name, args.dry_run).await,
        Kind::StatefulSet => {
            release_kind::<StatefulSet>(client, ns, kind, &name, args.dry_run).await
        }
        Kind::DaemonSet => release_kind::<DaemonSet>(client, ns, kind, &name, args.dry_run).await,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};

    use super::*;

    fn template() -> PodTemplateSpec {
        PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn deployment(replicas: Option<i32>) -> Deployment {
        let mut d = Deployment::default();
        d.spec.replicas = replicas;
        d.spec.template = template();
        d
    }

    /// One L4 of 24Gi on node-l4 (published as 6 slots of 4Gi when `slots`), nothing booked:
    /// its model and inventory.
    fn one_l4(slots: bool) -> (model::Model, PublishedGpus) {
        use gpuslice_dra::slices::{build_slices, OfferedGpu, SlotOffer};
        let gpu = OfferedGpu {
            index: 0,
            uuid: "GPU-l4".into(),
            model: "NVIDIA L4".into(),
            numa_node: None,
            pcie_root: None,
            memory: 24 << 30,
            cores: 100,
            slots: slots.then(|| SlotOffer {
                memory: 4 << 30,
                cores: 16,
                published: (0..6).collect(),
            }),
        };
        let slices = build_slices("node-l4", &[gpu], 1, None).unwrap();
        let inventory = PublishedGpus::from_slices(&slices);
        let m = model::build(
            &model::Sources {
                slices,
                claims: vec![],
                pods: vec![],
                usage: Err(String::new()),
            },
            None,
        );
        (m, inventory)
    }

    /// The fit check of `replicas` pods of `spec` on `one_l4`.
    fn fit(
        (m, inventory): &(model::Model, PublishedGpus),
        req: &Request,
        spec: &PodSpec,
        named: &[ResourceClaimTemplate],
        replicas: u64,
    ) -> Result<(), WorkloadError> {
        let pod = pod_slices("deployment/x", None, spec, "ml", named, inventory)?;
        let request = pod_request(req, spec, &pod);
        check_fit(
            m,
            &inventory.mode,
            "deployment/x",
            &pod,
            request,
            Some(replicas),
        )
    }

    #[test]
    fn the_fit_counts_the_slices_the_webhook_gives_each_pods_containers() {
        let req = Request::parse("10Gi", None, 1).unwrap();
        let mut d = deployment(Some(2));
        let spec = d.pod_spec_mut().unwrap();
        spec.containers.push(Container {
            name: "istio-proxy".into(),
            ..Default::default()
        });
        let mut limits = spec.clone();
        edit::set_limits("deployment/x", &mut limits, &req, &[]).unwrap();
        // Capacity mode: a claim of 10Gi per container, 4 of the L4's 24Gi for 2 pods.
        let capacity = one_l4(false);
        let e = fit(&capacity, &req, &limits, &[], 2)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "deployment/x needs 2 pod(s) of 1 GPU × 10Gi memory in each of 2 containers; the GPUs' free room fits 1 (node-l4: 1): nothing changed; free room or pass --force to let the pods wait Pending"
        );
        fit(&capacity, &req, &limits, &[], 1).unwrap();
        // Only main listed: one claim a pod, both pods fit.
        let mut main = spec.clone();
        edit::set_limits("deployment/x", &mut main, &req, &["main".into()]).unwrap();
        fit(&capacity, &req, &main, &[], 2).unwrap();
        // The claim form: the containers share the pod's one claim of the template.
        let (t, _) =
            edit::claim_template("ml", Kind::Deployment, "x", &req, &capacity.1.mode).unwrap();
        let mut claim = spec.clone();
        edit::add_claim(
            "deployment/x",
            &mut claim,
            t.metadata.name.as_deref().unwrap(),
            &[],
        )
        .unwrap();
        fit(&capacity, &req, &claim, std::slice::from_ref(&t), 2).unwrap();
        let big = Request::parse("13Gi", None, 1).unwrap();
        let (t, _) =
            edit::claim_template("ml", Kind::Deployment, "x", &big, &capacity.1.mode).unwrap();
        edit::add_claim(
            "deployment/x",
            &mut claim,
            t.metadata.name.as_deref().unwrap(),
            &[],
        )
        .unwrap();
        let e = fit(&capacity, &big, &claim, &[t], 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("deployment/x needs 2 pod(s) of 1 GPU × 13Gi memory; the GPUs' free room fits 1 (node-l4: 1)"),
            "{e}"
        );
        // Slot mode: the containers share one claim of their summed 20Gi, 5 of the 6 slots.
        let slots = one_l4(true);
        let e = fit(&slots, &req, &limits, &[], 2).unwrap_err().to_string();
        assert!(
            e.starts_with("deployment/x needs 2 pod(s) of 1 GPU × 10Gi memory in each of 2 containers, as 1 shared slice(s) of 1 GPU × 20Gi; the GPUs' free room fits 1 (node-l4: 1)"),
            "{e}"
        );
        fit(&slots, &req, &main, &[], 2).unwrap();
        // What the webhook refuses is refused before anything is written.
        let mut huge = spec.clone();
        let r = Request::parse("16Gi", None, 1).unwrap();
        edit::set_limits("deployment/x", &mut huge, &r, &[]).unwrap();
        let e = fit(&slots, &r, &huge, &[], 1).unwrap_err().to_string();
        assert!(
            e.starts_with("deployment/x: the webhook would refuse its pods: spec.containers[0], spec.containers[1]: 1 GPU × 32Gi needs 8 slots"),
            "{e}"
        );
    }

    /// Deployment `web` of one pod holding 6Gi (limits form) on a quota of 10Gi with those
    /// 6Gi used: the budget check of 8Gi each under `strategy`.
    fn resize_web(strategy: serde_json::Value) -> Result<(), WorkloadError> {
        let capacity = one_l4(false);
        let (m, inventory) = &capacity;
        let mut d = deployment(Some(1));
        d.spec.strategy = serde_json::from_value(strategy).unwrap();
        let old = Request::parse("6Gi", None, 1).unwrap();
        let new = Request::parse("8Gi", None, 1).unwrap();
        let mut now = d.pod_spec().unwrap().clone();
        edit::set_limits("deployment/web", &mut now, &old, &[]).unwrap();
        let mut then = now.clone();
        edit::set_limits("deployment/web", &mut then, &new, &[]).unwrap();
        let budgets = [crate::budgets::tests::budget("ml", "10Gi", "6Gi", "8", "1")];
        let c = BudgetCheck {
            budgets: &budgets,
            named: &[],
            inventory,
            default_class: None,
        };
        let rollout = d.rollout(budget_pods(d.replicas(), m), "deployment/web")?;
        check_budget(
            &c,
            m,
            "ml",
            "deployment/web",
            &new,
            d.pod_meta(),
            &then,
            &now,
            d.replicas(),
            &rollout,
        )
    }

    #[test]
    fn the_budget_check_counts_the_quotas_whose_scopes_hold_for_the_pods_it_writes() {
        // Deployment web of one pod given 4Gi on a quota of 8Gi for PriorityClass high with
        // 6Gi used: its template's class (or the cluster's default) decides.
        let (m, inventory) = &one_l4(false);
        let req = Request::parse("4Gi", None, 1).unwrap();
        let budgets = [crate::budgets::tests::scoped_to_class(
            "ml", "high", "8Gi", "6Gi",
        )];
        let check = |class: Option<&str>, default_class: Option<&str>| {
            let mut d = deployment(Some(1));
            d.spec.template.spec.as_mut().unwrap().priority_class_name = class.map(Into::into);
            let now = d.pod_spec().unwrap().clone();
            let mut then = now.clone();
            edit::set_limits("deployment/web", &mut then, &req, &[]).unwrap();
            let c = BudgetCheck {
                budgets: &budgets,
                named: &[],
                inventory,
                default_class,
            };
            let rollout = d.rollout(budget_pods(d.replicas(), m), "deployment/web")?;
            check_budget(
                &c,
                m,
                "ml",
                "deployment/web",
                &req,
                d.pod_meta(),
                &then,
                &now,
                d.replicas(),
                &rollout,
            )
        };
        // Pods of no class, or of class low: the quota does not count them.
        check(None, None).unwrap();
        check(Some("low"), None).unwrap();
        check(Some("low"), Some("high")).unwrap();
        // Pods of class high, named or the cluster's default: 6 + 4 > 8.
        for (class, default) in [(Some("high"), None), (None, Some("high"))] {
            let e = check(class, default).unwrap_err().to_string();
            assert!(
                e.starts_with("deployment/web: 1 pod(s) of 1 GPU × 4Gi memory: exceeded quota: ml/gpu-high, requested: limits.gpuslice.io/memory=4Gi, used: limits.gpuslice.io/memory=6Gi, limited: limits.gpuslice.io/memory=8Gi"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_jobs_template_whose_containers_each_get_the_slice_is_refused_before_writing() {
        // A StatefulSet whose pods are ranks of a job (by any job label), with a sidecar:
        // the limits written into every container make the webhook refuse each new pod, so
        // the check refuses first, with the webhook's own words.
        let (_, inventory) = &one_l4(false);
        let req = Request::parse("4Gi", None, 1).unwrap();
        for label in gpuslice_webhook::placement::JOB_LABELS {
            let mut s = StatefulSet::default();
            s.spec.replicas = Some(1);
            s.spec.template = template();
            s.spec.template.metadata = Some(ObjectMeta {
                labels: Some([(label.to_string(), "train".to_string())].into()),
                ..Default::default()
            });
            let spec = s.pod_spec_mut().unwrap();
            spec.containers.push(Container {
                name: "log".into(),
                ..Default::default()
            });
            let mut every = spec.clone();
            edit::set_limits("statefulset/x", &mut every, &req, &[]).unwrap();
            let rank = format!("spec.containers[0], spec.containers[1]: containers of a rank of job {label}=train that run at the same time each ask a GPU slice");
            let e = pod_slices("statefulset/x", s.pod_meta(), &every, "ml", &[], inventory)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "statefulset/x: the webhook would refuse its pods: {rank}"
                )),
                "{e}"
            );
            let e = Ask::of_pod_spec(1, s.pod_meta(), &every, "ml", &[], inventory, String::new())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&rank), "{e}");
            // The slice in one container (`-c main`): one rank's GPUs, admitted.
            let mut main = s.pod_spec().unwrap().clone();
            edit::set_limits("statefulset/x", &mut main, &req, &["main".into()]).unwrap();
            let slices =
                pod_slices("statefulset/x", s.pod_meta(), &main, "ml", &[], inventory).unwrap();
            assert_eq!(slices.len(), 1);
            Ask::of_pod_spec(1, s.pod_meta(), &main, "ml", &[], inventory, String::new()).unwrap();
        }
    }

    #[test]
    fn a_resize_whose_rolling_update_keeps_the_old_pod_beside_the_new_is_refused() {
        // Defaults (maxSurge 25% of 1 rounds up to 1, maxUnavailable down to 0): the new 8Gi
        // pod starts beside the old 6Gi one, 14Gi on a quota of 10Gi, and would wait forever.
        let e = resize_web(serde_json::json!(null)).unwrap_err().to_string();
        assert!(
            e.starts_with("deployment/web: 1 pod(s) of 1 GPU × 8Gi memory, whose rollout (RollingUpdate, maxSurge 1, maxUnavailable 0) keeps 1 old pod(s) of 6Gi while 1 new pod(s) of 8Gi start: exceeded quota: ml/gpu, requested: limits.gpuslice.io/memory=14Gi, used: limits.gpuslice.io/memory=0, limited: limits.gpuslice.io/memory=10Gi"),
            "{e}"
        );
        assert!(
            e.contains("it fits if its old pods are removed before new ones start (strategy Recreate, or maxSurge 0), or with at most 4Gi of limits.gpuslice.io/memory per new pod: nothing changed"),
            "{e}"
        );
        // Old pods removed first: the 8Gi pod starts once the 6Gi one is gone.
        resize_web(serde_json::json!({"type": "Recreate"})).unwrap();
        resize_web(serde_json::json!({"rollingUpdate": {"maxSurge": 0}})).unwrap();
        // 100% unavailable: the old pod may go before the new one is ready.
        resize_web(
            serde_json::json!({"rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "100%"}}),
        )
        .unwrap();
        let e = resize_web(serde_json::json!({"rollingUpdate": {"maxSurge": "x"}}))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "deployment/web: spec.strategy.rollingUpdate.maxSurge \"x\" cannot be read; accepted: a whole number of pods, at least 0, or a percentage (`25%`): nothing changed");
    }

    #[test]
    fn each_kind_resolves_its_rollout_as_kubernetes_does() {
        let of = |d: &Deployment, pods| {
            let r = d.rollout(pods, "deployment/x").unwrap();
            (r.replaced, r.kept, r.surge, r.unavailable)
        };
        // maxSurge rounds up, maxUnavailable down, both 25% by default.
        let d = deployment(Some(1));
        assert_eq!(of(&d, 1), (1, 0, 1, 0));
        assert_eq!(of(&d, 4), (4, 0, 1, 1));
        assert_eq!(of(&d, 10), (10, 0, 3, 2));
        let mut d = deployment(Some(3));
        d.spec.strategy = serde_json::from_value(
            serde_json::json!({"rollingUpdate": {"maxSurge": 2, "maxUnavailable": "50%"}}),
        )
        .unwrap();
        assert_eq!(of(&d, 3), (3, 0, 2, 1));
        // Both come to 0: Kubernetes lets one be unavailable.
        d.spec.strategy = serde_json::from_value(
            serde_json::json!({"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}}),
        )
        .unwrap();
        assert_eq!(of(&d, 0), (0, 0, 0, 1));
        d.spec.strategy = serde_json::from_value(serde_json::json!({"type": "Recreate"})).unwrap();
        assert_eq!(of(&d, 3), (3, 0, 0, 3));

        // A StatefulSet replaces one pod at a time, old first; its partition keeps pods old.
        let mut s = StatefulSet::default();
        let r = s.rollout(5, "statefulset/x").unwrap();
        assert_eq!((r.replaced, r.kept, r.surge), (5, 0, 0));
        s.spec.update_strategy = serde_json::from_value(
            serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}),
        )
        .unwrap();
        let r = s.rollout(5, "statefulset/x").unwrap();
        assert_eq!((r.replaced, r.kept, r.surge), (3, 2, 0));

        // A DaemonSet: maxUnavailable 1 and maxSurge 0 by default, percentages rounded up.
        let mut ds = DaemonSet::default();
        let r = ds.rollout(4, "daemonset/x").unwrap();
        assert_eq!((r.surge, r.unavailable), (0, 1));
        ds.spec.update_strategy = serde_json::from_value(
            serde_json::json!({"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}}),
        )
        .unwrap();
        let r = ds.rollout(4, "daemonset/x").unwrap();
        assert_eq!((r.surge, r.unavailable), (1, 0));
    }

    #[test]
    fn each_kind_reports_its_pods_and_its_template() {
        assert_eq!(deployment(Some(3)).replicas(), Some(3));
        assert_eq!(deployment(None).replicas(), Some(1), "unset means one pod");
        assert_eq!(deployment(Some(-2)).replicas(), Some(0));
        let mut s = StatefulSet::default();
        s.spec.replicas = Some(5);
        assert_eq!(s.replicas(), Some(5));
        s.spec.replicas = None;
        assert_eq!(s.replicas(), Some(1));
        assert_eq!(DaemonSet::default().replicas(), None, "one pod per node");

        let mut d = deployment(Some(1));
        d.pod_spec_mut().expect("template").containers[0].name = "edited".into();
        assert_eq!(
            d.spec.template.spec.as_ref().expect("template").containers[0].name,
            "edited"
        );
        assert_eq!(d.pod_spec().expect("template").containers[0].name, "edited");
        assert!(
            DaemonSet::default().pod_spec().is_none(),
            "no template, no pod spec"
        );
    }
}
