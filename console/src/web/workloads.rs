//! The Workloads page (`/workloads[?namespace=NS]`: Deployments, StatefulSets and
//! DaemonSets with their slice) and a workload's GPU tab (`/workloads/NS/KIND/NAME`),
//! read from the API server per request.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::ListParams;
use kube::Api;

use gpuslice_dra::claim_shape::{shape_of, Mode, PublishedGpus};
use gpuslice_webhook::budget::pod_spec_charge;
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::budgets::{self, Rollout, Scope};
use crate::edit::{self, Kind, Request as SliceRequest};
use crate::model::{self, Model};
use crate::workload;

use super::http;
use super::pages::{self, Slice, SliceSource, WorkloadRow};
use super::respond::html;
use super::sources::api_banner;
use super::state::{chrome, State};

/// The request a template of the claim shape asks (the inverse of
/// [`edit::claim_template`] in the cluster's publication `mode`).
pub fn template_request(t: &ResourceClaimTemplate, mode: &Mode) -> Option<SliceRequest> {
    let shape = shape_of(t.spec.as_ref()?.spec.as_ref()?, mode)?;
    Some(SliceRequest {
        memory: shape.memory?,
        cores: shape.cores.map(u64::from),
        gpus: shape.gpus,
    })
}

/// The cluster's gpuslice GPUs as the model reads them from the ResourceSlices alone (its
/// nodes are those a DaemonSet's budget counts, [`workload::budget_pods`]).
fn gpu_model(slices: &[ResourceSlice]) -> Model {
    model::build(
        &model::Sources {
            slices: slices.to_vec(),
            claims: Vec::new(),
            pods: Vec::new(),
            usage: Err(String::new()),
        },
        None,
    )
}

/// A workload's row: `replicas` as shown (a DaemonSet: its status's desired pods), the pods
/// its budget is checked for counted as the allocation counts them on the GPUs of `gpus`.
fn row_of<W: workload::Workload>(
    kind: Kind,
    w: &W,
    replicas: Option<u64>,
    templates: &[ResourceClaimTemplate],
    inventory: &PublishedGpus,
    gpus: &Model,
) -> WorkloadRow {
    let namespace = w.meta().namespace.clone().unwrap_or_default();
    let templates: Vec<ResourceClaimTemplate> = templates
        .iter()
        .filter(|t| t.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .cloned()
        .collect();
    let spec = w.pod_spec();
    let charge = || {
        spec.and_then(|s| pod_spec_charge(w.pod_meta(), s, &namespace, &templates, inventory).ok())
    };
    let claim = spec.and_then(edit::current_template).map(|template| {
        let request = templates
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(template.as_str()))
            .and_then(|t| template_request(t, &inventory.mode));
        Slice {
            source: SliceSource::Claim(template),
            request,
            charge: charge(),
        }
    });
    let limits = || {
        spec.and_then(edit::current_limits).map(|r| Slice {
            source: SliceSource::Limits,
            request: Some(r),
            charge: charge(),
        })
    };
    let hami = || {
        spec.and_then(edit::hami_limits).map(|l| Slice {
            source: SliceSource::Hami(l),
            request: None,
            charge: None,
        })
    };
    let slice = claim.or_else(limits).or_else(hami);
    let name = w.meta().name.clone().unwrap_or_default();
    let pods = workload::budget_pods(w.replicas(), gpus);
    // A strategy that cannot be read (which the API server does not store) shows the room
    // with the old pods removed first; the allocation itself refuses it, naming the field.
    let rollout = w
        .rollout(pods, &format!("{}/{name}", kind.as_str()))
        .unwrap_or_else(|_| Rollout::remove_first(pods, "unreadable"));
    WorkloadRow {
        namespace,
        kind,
        name,
        replicas,
        pods,
        rollout,
        slice,
        pod: budgets::admitted_pod(spec.cloned().unwrap_or_default(), None),
    }
}

fn daemonset_pods(d: &DaemonSet) -> Option<u64> {
    d.status
        .as_ref()
        .map(|s| s.desired_number_scheduled.max(0) as u64)
}

fn api_of<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn list_all<K>(api: Api<K>, what: &str) -> Result<Vec<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("cannot list {what}: {e}"))
}

async fn workload_rows(state: &State, namespace: Option<&str>) -> Result<Vec<WorkloadRow>, String> {
    let c = &state.cluster.client;
    let (deployments, statefulsets, daemonsets, templates, slices) = tokio::join!(
        list_all(api_of::<Deployment>(c, namespace), "deployments.apps"),
        list_all(api_of::<StatefulSet>(c, namespace), "statefulsets.apps"),
        list_all(api_of::<DaemonSet>(c, namespace), "daemonsets.apps"),
        list_all(
            api_of::<ResourceClaimTemplate>(c, namespace),
            "resourceclaimtemplates.resource.k8s.io"
        ),
        list_all(
            Api::<ResourceSlice>::all(c.clone()),
            "resourceslices.resource.k8s.io"
        ),
    );
    let templates = templates?;
    let slices = slices?;
    let inventory = PublishedGpus::from_slices(&slices);
    let gpus = gpu_model(&slices);
    let mut rows = Vec::new();
    for d in deployments? {
        rows.push(row_of(
            Kind::Deployment,
            &d,
            workload::Workload::replicas(&d),
            &templates,
            &inventory,
            &gpus,
        ));
    }
    for s in statefulsets? {
        rows.push(row_of(
            Kind::StatefulSet,
            &s,
            workload::Workload::replicas(&s),
            &templates,
            &inventory,
            &gpus,
        ));
    }
    for d in daemonsets? {
        rows.push(row_of(
            Kind::DaemonSet,
            &d,
            daemonset_pods(&d),
            &templates,
            &inventory,
            &gpus,
        ));
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind)));
    Ok(rows)
}

pub(super) async fn workloads(state: &State, namespace: Option<&str>) -> Response<Full<Bytes>> {
    let (rows, banners) = match workload_rows(state, namespace).await {
        Ok(r) => (Some(r), vec![]),
        Err(e) => (None, vec![api_banner(e)]),
    };
    html(
        StatusCode::OK,
        pages::workloads_page(&chrome(state, banners), rows.as_deref(), namespace),
    )
}

async fn get_row<W: workload::Workload>(
    state: &State,
    w: &http::Workload,
    replicas: fn(&W) -> Option<u64>,
) -> Result<Option<WorkloadRow>, String> {
    let c = &state.cluster.client;
    let api: Api<W> = Api::namespaced(c.clone(), &w.namespace);
    let Some(obj) = api
        .get_opt(&w.name)
        .await
        .map_err(|e| format!("cannot get {}: {e}", w.arg()))?
    else {
        return Ok(None);
    };
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), &w.namespace);
    let named = obj.pod_spec().and_then(edit::current_template);
    let template = match named {
        Some(t) => templates
            .get_opt(&t)
            .await
            .map_err(|e| format!("cannot get resourceclaimtemplate {t}: {e}"))?,
        None => None,
    };
    let slices = list_all(
        Api::<ResourceSlice>::all(c.clone()),
        "resourceslices.resource.k8s.io",
    )
    .await?;
    Ok(Some(row_of(
        w.kind,
        &obj,
        replicas(&obj),
        template.as_slice(),
        &PublishedGpus::from_slices(&slices),
        &gpu_model(&slices),
    )))
}

/// `pod` (a workload row's) as admitted where `budgets` were read: its PriorityClass the
/// cluster's default where a budget's scope reads it (one that cannot be read: as though none
/// were set, as the allocation's check notes). Budgets that could not be read leave it whole.
async fn as_admitted(
    client: &kube::Client,
    budgets: &Result<Vec<budgets::NamespaceBudget>, String>,
    pod: &mut k8s_openapi::api::core::v1::Pod,
) {
    let Ok(b) = budgets else {
        return;
    };
    let Some(spec) = pod.spec.take() else {
        return;
    };
    let default = budgets::default_class_for(client, b).await.ok().flatten();
    *pod = budgets::admitted_pod(spec, default.as_deref());
}

pub(super) async fn workload_tab(state: &State, w: &http::Workload) -> Response<Full<Bytes>> {
    let row = async {
        match w.kind {
            Kind::Deployment => get_row::<Deployment>(state, w, workload::Workload::replicas).await,
            Kind::StatefulSet => {
                get_row::<StatefulSet>(state, w, workload::Workload::replicas).await
            }
            Kind::DaemonSet => get_row::<DaemonSet>(state, w, daemonset_pods).await,
        }
    };
    let scope = Scope::Namespace(w.namespace.clone());
    let (row, budgets) = tokio::join!(
        row,
        budgets::namespace_budgets(&state.cluster.client, &scope, state.hami_compat)
    );
    let budgets = budgets.map(|(b, _)| b).map_err(|e| e.to_string());
    match row {
        Ok(Some(mut row)) => {
            as_admitted(&state.cluster.client, &budgets, &mut row.pod).await;
            html(
                StatusCode::OK,
                pages::workload_page(
                    &chrome(state, vec![]),
                    &row,
                    budgets.as_deref().map_err(String::as_str),
                ),
            )
        }
        Ok(None) => html(
            StatusCode::NOT_FOUND,
            pages::not_found_page(
                &chrome(state, vec![]),
                &format!("{} in namespace {}", w.arg(), w.namespace),
            ),
        ),
        Err(e) => html(
            StatusCode::OK,
            pages::workloads_page(
                &chrome(state, vec![api_banner(e)]),
                None,
                Some(&w.namespace),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::slices;

    #[tokio::test]
    async fn a_rows_pod_is_kept_whole_whether_or_not_the_budgets_were_read() {
        // No call is made: no budget reads a PriorityClass, or none was read.
        let url = "http://127.0.0.1:9".parse().unwrap();
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
        let spec = k8s_openapi::api::core::v1::PodSpec {
            priority_class_name: Some("high".into()),
            ..Default::default()
        };
        for budgets in [Err("forbidden".to_string()), Ok(Vec::new())] {
            let mut pod = budgets::admitted_pod(spec.clone(), None);
            as_admitted(&client, &budgets, &mut pod).await;
            assert_eq!(pod.spec.as_ref(), Some(&spec), "{budgets:?}");
        }
    }

    #[test]
    fn a_daemonsets_budget_counts_a_pod_per_gpu_node_as_the_allocation_does() {
        use crate::budgets::tests::budget;
        // Scheduled on 7 nodes, 2 of which have gpuslice GPUs (node-a, node-b).
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "team-a", "name": "agent"},
            "spec": {
                "selector": {},
                "template": {"spec": {"containers": [{"name": "main", "image": "agent"}]}}
            },
            "status": {
                "desiredNumberScheduled": 7,
                "currentNumberScheduled": 7,
                "numberMisscheduled": 0,
                "numberReady": 7
            }
        }))
        .unwrap();
        let gpus = gpu_model(&slices());
        assert_eq!(gpus.nodes.len(), 2);
        let row = row_of(
            Kind::DaemonSet,
            &ds,
            daemonset_pods(&ds),
            &[],
            &PublishedGpus::from_slices(&slices()),
            &gpus,
        );
        assert_eq!(row.replicas, Some(7), "shown as its status says");
        assert_eq!(row.pods, workload::budget_pods(None, &gpus));
        let chrome = pages::Chrome {
            rights: String::new(),
            allow_edit: true,
            banners: vec![],
        };
        // 4 GPUs of budget over the 2 pods the allocation charges: 2 per pod.
        let b = [budget("team-a", "10Gi", "0", "4", "0")];
        let html = pages::workload_page(&chrome, &row, Ok(&b));
        assert!(
            html.contains("name=\"gpus\" value=\"1\" min=\"1\" max=\"2\""),
            "{html}"
        );
        assert!(html.contains("this workload's 2 pod(s)"), "{html}");
    }

    #[test]
    fn a_template_of_the_console_reads_back_as_its_request() {
        for (memory, cores, gpus) in [("20Gi", Some("30"), 1), ("1536Mi", None, 2)] {
            let req = SliceRequest::parse(memory, cores, gpus).unwrap();
            let t = edit::claim_template("ml", Kind::Deployment, "train", &req, &Mode::Capacity)
                .unwrap()
                .0;
            assert_eq!(template_request(&t, &Mode::Capacity), Some(req));
        }
        // Slot mode: the slots' memory (whole slots) and the opaque share (of one GPU: a slice
        // of several GPUs takes each whole, docs/kubernetes-dra.md "Bounded search").
        let slot = gpuslice_dra::claim_shape::SlotSize {
            memory: 4 << 30,
            cores: Some(16),
            per_gpu: 6,
        };
        let req = SliceRequest::parse("8Gi", Some("20"), 1).unwrap();
        let t = edit::claim_template(
            "ml",
            Kind::Deployment,
            "train",
            &req,
            &Mode::Slots(vec![slot]),
        )
        .unwrap()
        .0;
        assert_eq!(template_request(&t, &Mode::Slots(vec![slot])), Some(req));
        assert_eq!(
            template_request(&ResourceClaimTemplate::default(), &Mode::Capacity),
            None
        );
    }
}
