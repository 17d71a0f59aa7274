//! A FAKE Kubernetes API server for the plugin's tests (no real control plane runs here yet):
//! plain HTTP on 127.0.0.1 serving the few paths the plugin uses — ResourceClaims by name,
//! Nodes by name, ResourceSlices list/watch/create/replace/delete with resourceVersion checks
//! (a watch streams each change from then on, as ADDED/MODIFIED/DELETED lines, and ends after
//! its `timeoutSeconds` as the API server ends it, however quiet it was) — from an
//! in-memory store the test fills. The real control plane test comes with
//! scripts/kube-cluster.sh.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

#[derive(Default)]
struct State {
    /// (namespace, name) → the body served, verbatim (so a test can serve malformed JSON).
    claims: BTreeMap<(String, String), String>,
    nodes: BTreeMap<String, Value>,
    slices: BTreeMap<String, Value>,
    version: u64,
    /// Requests served, per "METHOD path".
    requests: Vec<String>,
    /// Drop the consumable-capacity fields of slices, as an API server with
    /// `DRAConsumableCapacity` off does (Kubernetes 1.34/1.35).
    drops_consumable_capacity: bool,
    /// The open watches of ResourceSlices: each gets every change from its start of the
    /// slices its field selector matches.
    watchers: Vec<(Fields, tokio::sync::mpsc::UnboundedSender<Bytes>)>,
    /// When each watch of ResourceSlices was asked for.
    watch_starts: Vec<std::time::Instant>,
}

/// A field selector of ResourceSlices (`spec.nodeName=N,spec.driver=D`) as (field, value)
/// pairs; empty: every slice.
type Fields = Vec<(String, String)>;

/// The `fieldSelector` of `url`, refused (as the API server refuses it) when it names a field
/// ResourceSlices cannot be selected by or is not `field=value` pairs.
fn fields(url: &str) -> Result<Fields, String> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let Some((_, sel)) =
        form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "fieldSelector")
    else {
        return Ok(Vec::new());
    };
    sel.split(',')
        .map(|term| {
            let (field, value) = term
                .split_once('=')
                .ok_or_else(|| format!("invalid field selector term {term:?}"))?;
            if !["spec.nodeName", "spec.driver", "spec.pool.name"].contains(&field) {
                return Err(format!(
                    "field label not supported for resourceslices: {field}"
                ));
            }
            Ok((field.to_string(), value.to_string()))
        })
        .collect()
}

/// The `timeoutSeconds` of `url`, if it names one.
fn timeout_seconds(url: &str) -> Option<u64> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "timeoutSeconds")
        .and_then(|(_, v)| v.parse().ok())
}

/// Whether `slice` has every field of `fields` at its value.
fn matches(fields: &Fields, slice: &Value) -> bool {
    fields.iter().all(|(field, value)| {
        let at = field.split('.').fold(slice, |v, part| &v[part]);
        at.as_str() == Some(value.as_str())
    })
}

impl State {
    /// Tells every open watch that `slice` was `kind` (ADDED, MODIFIED, DELETED).
    fn emit(&mut self, kind: &str, slice: &Value) {
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": slice})));
        self.watchers
            .retain(|(f, w)| !matches(f, slice) || w.send(line.clone()).is_ok());
    }

    /// Removes slice `name`, as the API server does, with a DELETED event.
    fn remove_slice(&mut self, name: &str) -> Option<Value> {
        let mut gone = self.slices.remove(name)?;
        self.version += 1;
        gone["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.emit("DELETED", &gone);
        Some(gone)
    }
}

/// What an API server without consumable capacity keeps of a slice.
fn drop_consumable_capacity(slice: &mut Value) {
    if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
        for d in devices {
            if let Some(d) = d.as_object_mut() {
                d.remove("allowMultipleAllocations");
            }
            if let Some(caps) = d["capacity"].as_object_mut() {
                for c in caps.values_mut() {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("requestPolicy");
                    }
                }
            }
        }
    }
}

/// The fake server; stops when dropped.
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pub url: String,
}

fn status(code: u16, reason: &str, message: &str) -> (u16, String) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code})
        .to_string(),
    )
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

async fn serve(
    state: Arc<Mutex<State>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, hyper::Error> {
    let method = req.method().as_str().to_string();
    let url = req.uri().to_string();
    let body = req.into_body().collect().await?.to_bytes();
    let watch =
        method == "GET" && url.split('?').next() == Some(SLICES) && url.contains("watch=true");
    let (code, body): (u16, Body) = if watch {
        // A watch: the changes from now on, one JSON line each, until the client goes.
        match fields(&url) {
            Ok(f) => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                if let Some(secs) = timeout_seconds(&url) {
                    // The end of the watch: an empty line, which is not sent on.
                    let end = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
                        let _ = end.send(Bytes::new());
                    });
                }
                let mut st = state.lock().unwrap();
                st.requests.push(format!("WATCH {SLICES}"));
                st.watch_starts.push(std::time::Instant::now());
                st.watchers.push((f, tx));
                let lines = tokio_stream::StreamExt::map(
                    tokio_stream::StreamExt::take_while(
                        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
                        |line| !line.is_empty(),
                    ),
                    |line| Ok(Frame::data(line)),
                );
                (200, StreamBody::new(lines).boxed())
            }
            Err(e) => {
                let (code, out) = status(400, "BadRequest", &e);
                (code, Full::new(Bytes::from(out)).boxed())
            }
        }
    } else {
        let (code, out) = handle(&state, &method, &url, &String::from_utf8_lossy(&body));
        (code, Full::new(Bytes::from(out)).boxed())
    };
    let mut resp = hyper::Response::new(body);
    *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::OK);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

impl FakeApi {
    pub fn start() -> FakeApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fake API");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let st = st.clone();
                            tokio::spawn(async move {
                                let svc = hyper::service::service_fn(move |req| serve(st.clone(), req));
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .await;
                            });
                        }
                    }
                }
            });
        });
        FakeApi {
            state,
            stop: Some(tx),
            thread: Some(thread),
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Writes a kubeconfig naming this server into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig_for(&self.url, dir)
    }

    pub fn put_claim_raw(&self, namespace: &str, name: &str, body: String) {
        self.state
            .lock()
            .unwrap()
            .claims
            .insert((namespace.into(), name.into()), body);
    }

    pub fn put_claim(&self, claim: &Value) {
        let ns = claim["metadata"]["namespace"].as_str().unwrap().to_string();
        let name = claim["metadata"]["name"].as_str().unwrap().to_string();
        self.put_claim_raw(&ns, &name, claim.to_string());
    }

    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.state
            .lock()
            .unwrap()
            .claims
            .remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn put_node(&self, name: &str, uid: &str) {
        self.state.lock().unwrap().nodes.insert(
            name.into(),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid}}),
        );
    }

    /// Makes the server drop consumable capacity (`true`) or keep it (the default).
    pub fn set_drops_consumable_capacity(&self, drops: bool) {
        self.state.lock().unwrap().drops_consumable_capacity = drops;
    }

    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().slices.clone()
    }

    /// Deletes every slice (as a starting kubelet does), each with a DELETED event.
    pub fn delete_slices(&self) {
        let mut st = self.state.lock().unwrap();
        let names: Vec<String> = st.slices.keys().cloned().collect();
        for name in names {
            st.remove_slice(&name);
        }
    }

    /// Changes slice `name` as another writer would (a MODIFIED event).
    pub fn edit_slice(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut st = self.state.lock().unwrap();
        let mut v = st.slices[name].clone();
        edit(&mut v);
        st.version += 1;
        v["metadata"]["resourceVersion"] = json!(st.version.to_string());
        st.slices.insert(name.to_string(), v.clone());
        st.emit("MODIFIED", &v);
    }

    /// When each watch of ResourceSlices was asked for.
    pub fn watch_starts(&self) -> Vec<std::time::Instant> {
        self.state.lock().unwrap().watch_starts.clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A kubeconfig for an API server at `url` (no credentials).
pub fn kubeconfig_for(url: &str, dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn handle(state: &Mutex<State>, method: &str, url: &str, body: &str) -> (u16, String) {
    let mut st = state.lock().unwrap();
    let path = url.split('?').next().unwrap_or("");
    st.requests.push(format!("{method} {path}"));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        ("GET", ["api", "v1", "nodes", name]) => match st.nodes.get(*name) {
            Some(n) => (200, n.to_string()),
            None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
        },
        ("GET", ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name]) => {
            match st.claims.get(&(ns.to_string(), name.to_string())) {
                Some(c) => (200, c.clone()),
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        ("GET", _) if path == SLICES => {
            let f = match fields(url) {
                Ok(f) => f,
                Err(e) => return status(400, "BadRequest", &e),
            };
            let items: Vec<Value> = st
                .slices
                .values()
                .filter(|v| matches(&f, v))
                .cloned()
                .collect();
            let rv = st.version.to_string();
            (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": rv}, "items": items})
                .to_string(),
            )
        }
        ("POST", _) if path == SLICES => {
            let mut v: Value = match serde_json::from_str(body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            if st.drops_consumable_capacity {
                drop_consumable_capacity(&mut v);
            }
            if url.contains("dryRun=All") {
                return (201, v.to_string());
            }
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
            if st.slices.contains_key(&name) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("resourceslices \"{name}\" already exists"),
                );
            }
            st.version += 1;
            v["metadata"]["resourceVersion"] = json!(st.version.to_string());
            v["metadata"]["uid"] = json!(format!("slice-uid-{}", st.version));
            st.slices.insert(name, v.clone());
            st.emit("ADDED", &v);
            (201, v.to_string())
        }
        ("PUT", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let mut v: Value = match serde_json::from_str(body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            let Some(old) = st.slices.get(*name) else {
                return status(
                    404,
                    "NotFound",
                    &format!("resourceslices \"{name}\" not found"),
                );
            };
            if old["metadata"]["resourceVersion"] != v["metadata"]["resourceVersion"] {
                return status(409, "Conflict", "the object has been modified");
            }
            if st.drops_consumable_capacity {
                drop_consumable_capacity(&mut v);
            }
            st.version += 1;
            v["metadata"]["resourceVersion"] = json!(st.version.to_string());
            st.slices.insert(name.to_string(), v.clone());
            st.emit("MODIFIED", &v);
            (200, v.to_string())
        }
        ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            match st.remove_slice(name) {
                Some(_) => (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}).to_string(),
                ),
                None => status(404, "NotFound", &format!("resourceslices \"{name}\" not found")),
            }
        }
        _ => status(
            404,
            "NotFound",
            &format!("the fake API server does not serve {method} {path}"),
        ),
    }
}

/// A claim object allocated `results` (each `(request, pool, device, memory, cores)`).
pub fn claim(ns: &str, name: &str, uid: &str, results: &[(&str, &str, &str, &str, &str)]) -> Value {
    let results: Vec<Value> = results
        .iter()
        .map(|(req, pool, dev, mem, cores)| {
            json!({"request": req, "driver": "gpuslice.io", "pool": pool, "device": dev,
                "shareID": format!("{uid}-{req}"),
                "consumedCapacity": {"memory": mem, "cores": cores}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    })
}
