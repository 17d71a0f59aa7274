//! A FAKE Kubernetes API server for the tests where no control plane runs (the kubelet
//! plugin's and the webhook's crate tests and the plugin's benchmark; the end-to-end tests in
//! tests/ run the real one, scripts/kube-cluster.sh). Plain HTTP on 127.0.0.1 serving, from
//! an in-memory store the test fills, the kinds those crates use — Nodes, Pods, ResourceQuotas,
//! ResourceClaims, ResourceClaimTemplates, ResourceSlices — as the API server serves them
//! (`store`): get; list and watch, in a namespace or across all, with field and label
//! selectors (`select`), a list carrying its `metadata.resourceVersion`; create, replace,
//! merge-patch and delete checked against the resourceVersion they name; each refusal a
//! `Status` body (404 for a missing object, 409 for a stale version or an existing name). A
//! watch streams, as ADDED/MODIFIED/DELETED lines, every change after the resourceVersion it
//! names (naming none or `0`: an ADDED of each object as it is, then the changes), and ends
//! after its `timeoutSeconds` as the API server ends it, however quiet it was. A test may end
//! the open watches of a kind at once ([`FakeApi::end_watches`]), forget the changes made so
//! far as etcd's compaction does ([`FakeApi::compact`]: a watch from an earlier version is then
//! told `410 Expired` by an ERROR event, as the API server tells it), and refuse a kind's lists
//! or watches for a while (500, [`FakeApi::refuse`]); each list and watch is recorded with
//! the version it answered or named, and a list's `limit` and whether it continued one
//! ([`FakeApi::calls`]). A list with a `limit` is answered in pages as the API server pages
//! it: at most that many items, a `metadata.continue` token while more remain (none on the
//! last page), each later page from the items and resourceVersion of the first (`410 Expired`
//! once a compaction passed it).
//!
//! The status subresource of Pods, ResourceQuotas and ResourceClaims: GET, and PUT, which
//! replaces the status only (checked against the resourceVersion it names).
//!
//! Not served: other kinds and subresources (404 naming the request, which the request log
//! keeps), bookmarks (the API server sends them when it likes, so never is one of its
//! answers), server-side apply and JSON patches.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a fake that cannot start, or a test's object without a name, fails that test

mod kinds;
mod select;
mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use kinds::{Kind, KINDS};
pub use store::Call;
use store::State;

/// The fake server; stops when dropped.
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Where it listens: `http://127.0.0.1:PORT`.
    pub url: String,
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn serve(
    state: Arc<Mutex<State>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, hyper::Error> {
    let method = req.method().as_str().to_string();
    let url = req.uri().to_string();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = req.into_body().collect().await?.to_bytes();
    let (code, body): (u16, Body) = if method == "GET" && store::is_watch(&url) {
        let opened = lock(&state).watch(&url);
        match opened {
            Ok((end, rx)) => {
                if let Some(secs) = store::timeout_seconds(&url) {
                    // The end of the watch: an empty line, which is not sent on.
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
                        let _ = end.send(Bytes::new());
                    });
                }
                let lines = tokio_stream::StreamExt::map(
                    tokio_stream::StreamExt::take_while(
                        tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
                        |line| !line.is_empty(),
                    ),
                    |line| Ok(Frame::data(line)),
                );
                (200, StreamBody::new(lines).boxed())
            }
            Err((code, out)) => (code, Full::new(Bytes::from(out)).boxed()),
        }
    } else {
        let (code, out) = lock(&state).handle(
            &method,
            &url,
            &content_type,
            &String::from_utf8_lossy(&body),
        );
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

/// The kind served as `plural`; a test naming another is wrong.
fn kind(plural: &str) -> &'static Kind {
    Kind::named(plural).unwrap_or_else(|| {
        let served: Vec<&str> = KINDS.iter().map(|k| k.plural).collect();
        panic!("the fake API server serves no {plural:?}, only {served:?}")
    })
}

/// The namespace and name of `object`.
fn key(object: &Value) -> (String, String) {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("the object has no metadata.name: {object}"));
    let ns = object["metadata"]["namespace"].as_str().unwrap_or("");
    (ns.to_string(), name.to_string())
}

impl FakeApi {
    /// Starts an empty server on a port of its own, on a thread of its own.
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

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Writes a kubeconfig naming this server into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig_for(&self.url, dir)
    }

    /// Stores `object` of kind `plural` (`resourceclaimtemplates`) as another writer would:
    /// a new resourceVersion, a uid if it has none, an ADDED or MODIFIED event.
    pub fn put(&self, plural: &str, object: &Value) {
        let kind = kind(plural);
        let (ns, _) = key(object);
        assert_eq!(
            ns.is_empty(),
            !kind.namespaced,
            "{plural} are {}: {object}",
            if kind.namespaced {
                "namespaced"
            } else {
                "cluster-scoped"
            }
        );
        self.state().put(kind, object.clone());
    }

    /// Removes object `name` of kind `plural` in `namespace` (empty for a cluster-scoped
    /// kind) as another writer would, with a DELETED event; what it was, if it was.
    pub fn remove(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.state().remove(kind(plural), namespace, name)
    }

    /// The objects of kind `plural`, by namespace (empty for a cluster-scoped kind) and name.
    pub fn objects(&self, plural: &str) -> BTreeMap<(String, String), Value> {
        self.state().objects(kind(plural))
    }

    /// Changes object `name` of kind `plural` in `namespace` as another writer would (a
    /// MODIFIED event).
    pub fn edit(&self, plural: &str, namespace: &str, name: &str, edit: impl FnOnce(&mut Value)) {
        let kind = kind(plural);
        let mut st = self.state();
        let mut v = st
            .object(kind, namespace, name)
            .unwrap_or_else(|| panic!("the fake API server holds no {plural} {namespace}/{name}"))
            .clone();
        edit(&mut v);
        st.put(kind, v);
    }

    /// Serves `body` verbatim to a get of claim `namespace/name` (a malformed claim).
    pub fn put_claim_raw(&self, namespace: &str, name: &str, body: String) {
        self.state()
            .put_verbatim(kind("resourceclaims"), namespace, name, body);
    }

    pub fn put_claim(&self, claim: &Value) {
        self.put("resourceclaims", claim);
    }

    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.remove("resourceclaims", namespace, name);
    }

    pub fn put_node(&self, name: &str, uid: &str) {
        self.put(
            "nodes",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid}}),
        );
    }

    /// Makes the server drop consumable capacity (`true`) or keep it (the default).
    pub fn set_drops_consumable_capacity(&self, drops: bool) {
        self.state().drops_consumable_capacity = drops;
    }

    /// The ResourceSlices by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.objects("resourceslices")
            .into_iter()
            .map(|((_, name), v)| (name, v))
            .collect()
    }

    /// Deletes every slice (as a starting kubelet does), each with a DELETED event.
    pub fn delete_slices(&self) {
        for name in self.slices().into_keys() {
            self.remove("resourceslices", "", &name);
        }
    }

    /// Changes slice `name` as another writer would (a MODIFIED event).
    pub fn edit_slice(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        self.edit("resourceslices", "", name, edit);
    }

    /// When each watch of kind `plural` was asked for.
    pub fn watch_starts(&self, plural: &str) -> Vec<Instant> {
        let kind = kind(plural);
        let st = self.state();
        st.watch_starts
            .iter()
            .filter(|(k, _)| *k == kind.plural)
            .map(|(_, at)| *at)
            .collect()
    }

    /// Ends every open watch of kind `plural` at once, as the API server ends one at its
    /// timeout (the client's next watch resumes from the version it reached).
    pub fn end_watches(&self, plural: &str) {
        self.state().end_watches(kind(plural));
    }

    /// Forgets the changes made so far, as etcd's compaction does: a watch naming an earlier
    /// version than the current one is told `410 Expired` (open watches go on).
    pub fn compact(&self) {
        self.state().compact();
    }

    /// Refuses the lists (`lists`) and the watches (`watches`) of kind `plural` with 500, as
    /// an API server whose storage does not answer, and serves the others.
    pub fn refuse(&self, plural: &str, lists: bool, watches: bool) {
        let kind = kind(plural);
        let mut st = self.state();
        for (watch, refused) in [(false, lists), (true, watches)] {
            if refused {
                st.refused.insert((kind.plural, watch));
            } else {
                st.refused.remove(&(kind.plural, watch));
            }
        }
    }

    /// Each list and watch of kind `plural` (across namespaces or in one), in order.
    pub fn calls(&self, plural: &str) -> Vec<Call> {
        let kind = kind(plural);
        let st = self.state();
        st.calls
            .iter()
            .filter(|(k, _)| *k == kind.plural)
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// The requests served, in order: "METHOD path" (no query), "WATCH path" for a watch.
    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
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

/// Writes a kubeconfig for an API server at `url` (no credentials) into `dir`.
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
