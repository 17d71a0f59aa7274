//! The Allocate / Edit and Release forms' POSTs (`--allow-edit` only): the same
//! `workload::allocate` and `workload::release` as `kubectl gpuslice`, answered with the
//! plugin's line, a dry run's diff, or its refusal with a 4xx status.

use std::collections::BTreeMap;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use gpuslice_registry::MAX_GPUS;

use crate::workload::{self, AllocateArgs, ReleaseArgs, WorkloadError};

use super::http;
use super::pages;
use super::respond::html;
use super::state::{chrome, State};

/// The status of a refusal of allocate or release.
fn status_of(e: &WorkloadError) -> StatusCode {
    match e {
        WorkloadError::Edit(_)
        | WorkloadError::Unchargeable(_)
        | WorkloadError::Refused { .. }
        | WorkloadError::Unsized { .. }
        | WorkloadError::Template { .. } => StatusCode::BAD_REQUEST,
        WorkloadError::NotFound { .. } => StatusCode::NOT_FOUND,
        WorkloadError::NoRoom { .. }
        | WorkloadError::ForeignTemplate { .. }
        | WorkloadError::NotAllocated { .. }
        | WorkloadError::Contended { .. }
        | WorkloadError::Strategy { .. }
        | WorkloadError::OverBudget(_) => StatusCode::CONFLICT,
        // The API server's own refusal (403 forbidden to the kubeconfig's user, 422 invalid)
        // keeps its status; an unreachable one is a bad gateway.
        WorkloadError::Api {
            source: kube::Error::Api(s),
            ..
        } if (400..500).contains(&s.code) => {
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY)
        }
        WorkloadError::Fetch(_) | WorkloadError::Api { .. } => StatusCode::BAD_GATEWAY,
        WorkloadError::Yaml { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn back(w: &http::Workload) -> String {
    format!("/workloads/{}/{}/{}", w.namespace, w.kind.as_str(), w.name)
}

fn outcome(
    state: &State,
    w: &http::Workload,
    r: Result<String, (StatusCode, String)>,
) -> Response<Full<Bytes>> {
    let c = chrome(state, vec![]);
    let label = w.arg();
    match r {
        Ok(out) => html(
            StatusCode::OK,
            pages::result_page(&c, &label, &back(w), Ok(&out)),
        ),
        Err((status, line)) => html(status, pages::result_page(&c, &label, &back(w), Err(&line))),
    }
}

fn dry_run(form: &BTreeMap<String, String>) -> bool {
    form.get("dry_run")
        .is_some_and(|v| !v.is_empty() && v != "0")
}

/// The Allocate / Edit form: `kubectl gpuslice allocate KIND/NAME -n NS --gpus G --memory M
/// [--cores C] [--form F] [--dry-run]`, through the same function.
pub(super) async fn allocate(
    state: &State,
    w: &http::Workload,
    form: &BTreeMap<String, String>,
) -> Response<Full<Bytes>> {
    let gpus_text = form
        .get("gpus")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or("1");
    let gpus = match gpus_text.parse::<u32>() {
        Ok(g) => g,
        Err(_) => {
            let line = format!(
                "--gpus `{}`: accepted 1 to {MAX_GPUS} GPUs per pod",
                gpus_text.escape_default()
            );
            return outcome(state, w, Err((StatusCode::BAD_REQUEST, line)));
        }
    };
    let args = AllocateArgs {
        workload: w.arg(),
        memory: form
            .get("memory")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cores: form
            .get("cores")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        gpus,
        containers: Vec::new(),
        dry_run: dry_run(form),
        force: false,
        form: form
            .get("form")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
    };
    let r = workload::allocate(
        &state.cluster.client,
        &w.namespace,
        &args,
        state.hami_compat,
    )
    .await;
    outcome(state, w, r.map_err(|e| (status_of(&e), e.to_string())))
}

/// The Release form: `kubectl gpuslice release KIND/NAME -n NS [--dry-run]`.
pub(super) async fn release(
    state: &State,
    w: &http::Workload,
    form: &BTreeMap<String, String>,
) -> Response<Full<Bytes>> {
    let args = ReleaseArgs {
        workload: w.arg(),
        dry_run: dry_run(form),
    };
    let r = workload::release(&state.cluster.client, &w.namespace, &args).await;
    outcome(state, w, r.map_err(|e| (status_of(&e), e.to_string())))
}
