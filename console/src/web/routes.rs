//! Path to handler: every request passes the checks of [`super::http`] (Host, route and
//! names, method, and for an action `--allow-edit`, Origin and the form), then goes to
//! the page or action that answers it.

use std::collections::BTreeMap;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header;
use hyper::{Method, Request, Response, StatusCode};

use crate::idle::{self, IdleOptions};
use crate::usage;

use super::actions::{allocate, release};
use super::budgets::budgets;
use super::http::{self, Refusal, Route};
use super::nodes::{node, nodes};
use super::pages::IdleSort;
use super::pods::{idle_page, pods};
use super::respond::{refusal, respond};
use super::state::State;
use super::workloads::{workload_tab, workloads};
use gpuslice_conn::{Activity, Limits};

/// The stylesheet, served at `/static/console.css`.
const CSS: &str = include_str!("../../static/console.css");

fn header_str(req: &Request<Incoming>, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The answer to one request: its page or action, or the one-line refusal of a check.
/// `activity` says when the console works on it (not while a form body is awaited).
pub(super) async fn handle(
    state: &State,
    limits: &Limits,
    activity: &Arc<Activity>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    match serve(state, limits, activity, req).await {
        Ok(r) => r,
        Err(r) => refusal(r),
    }
}

async fn serve(
    state: &State,
    limits: &Limits,
    activity: &Arc<Activity>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Refusal> {
    let host = http::check_host(header_str(&req, header::HOST), state.listen, &state.public)?;
    let route = http::route(req.uri().path())?;
    let method = req.method().clone();
    if route.is_action() {
        if method != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} {}: POST only", req.uri().path()),
            ));
        }
        if !state.allow_edit {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "read-only: start gpuslice console with --allow-edit to allocate",
            ));
        }
        http::check_origin(
            &host,
            header_str(&req, header::ORIGIN),
            header_str(&req, header::REFERER),
            &state.public,
        )?;
        http::check_form(
            header_str(&req, header::CONTENT_TYPE),
            header_str(&req, header::CONTENT_LENGTH),
        )?;
        // The whole body within the deadline: a client declaring one and never sending it
        // holds nothing for long.
        let collect = Limited::new(req.into_body(), http::MAX_BODY).collect();
        let body = tokio::time::timeout(limits.body, collect)
            .await
            .map_err(|_| http::too_slow(limits.body))?
            .map_err(|_| http::too_large())?
            .to_bytes();
        let _serving = activity.serving();
        let form: BTreeMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
        return Ok(match route {
            Route::Allocate(w) => allocate(state, &w, &form).await,
            Route::Release(w) => release(state, &w, &form).await,
            _ => unreachable_route(),
        });
    }
    if method != Method::GET && method != Method::HEAD {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} {}: pages take GET and HEAD", req.uri().path()),
        ));
    }
    let _serving = activity.serving();
    let query = req.uri().query();
    let namespace = match http::query_param(query, "namespace").filter(|n| !n.is_empty()) {
        Some(ns) => Some(http::namespace(&ns)?),
        None => None,
    };
    Ok(match route {
        Route::Css => respond(StatusCode::OK, "text/css; charset=utf-8", CSS.to_string()),
        Route::Nodes => {
            let available = http::query_param(query, "available").is_some_and(|v| v == "1");
            nodes(state, available).await
        }
        Route::Node(name) => node(state, &name).await,
        Route::Pods => {
            let node = match http::query_param(query, "node").filter(|n| !n.is_empty()) {
                Some(n) => Some(http::object_name("node name", &n)?),
                None => None,
            };
            pods(state, namespace.as_deref(), node.as_deref()).await
        }
        Route::Idle => {
            let mut opts = IdleOptions::default();
            if let Some(t) = http::query_param(query, "threshold").filter(|t| !t.is_empty()) {
                opts.threshold_percent = idle::parse_threshold(&t)
                    .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
            }
            if let Some(w) = http::query_param(query, "window").filter(|w| !w.is_empty()) {
                opts.window = usage::parse_window(&w)
                    .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
            }
            let sort = match http::query_param(query, "sort").as_deref() {
                None | Some("" | "memory") => IdleSort::Memory,
                Some("workload") => IdleSort::Workload,
                Some(other) => {
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "sort `{}`: accepted memory or workload",
                            other.escape_default()
                        ),
                    ))
                }
            };
            idle_page(state, namespace.as_deref(), opts, sort).await
        }
        Route::Workloads => workloads(state, namespace.as_deref()).await,
        Route::Budgets => budgets(state, namespace.as_deref()).await,
        Route::Workload(w) => workload_tab(state, &w).await,
        Route::Allocate(_) | Route::Release(_) => unreachable_route(),
    })
}

fn unreachable_route() -> Response<Full<Bytes>> {
    refusal(Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal: unrouted request",
    ))
}
