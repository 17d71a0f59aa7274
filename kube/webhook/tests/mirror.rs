//! The webhook's watched copies (crate::mirror) stay current when one object in them cannot be
//! decoded whole: against a FAKE API server (plain HTTP on 127.0.0.1; no control plane runs in
//! a crate's tests, `webhook::` and `budgets::` in tests/ run the real one), whose template list
//! holds a template nested past the JSON parser's limit and one that cannot be read at all, and
//! whose watch then sends another deep one split across two chunks, the copy of the templates is
//! current with every readable one in it; the copy of the quotas answers for a namespace whose
//! quotas it read, and sends a namespace holding a quota it could not read to the API server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{json, Value};

use gpuslice_webhook::mirror::Mirror;

/// How long the copies may take to become current.
const WAIT: Duration = Duration::from_secs(20);

/// JSON nesting `depth` objects inside each other, past the parser's recursion limit.
fn nested(depth: usize) -> String {
    format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
}

/// A template labelled as the webhook's whose devices' configuration is `config` (JSON text).
fn template(name: &str, config: &str) -> String {
    let t = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "team", "name": name, "resourceVersion": "5",
            "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"}},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "g", "exactly": {"deviceClassName": "gpuslice.io"}}],
            "config": "CONFIG"}}}});
    t.to_string().replace("\"CONFIG\"", config)
}

/// A template whose other driver's opaque parameters nest past the parser's limit.
fn deep(name: &str) -> String {
    let config = format!(
        r#"[{{"opaque": {{"driver": "example.com", "parameters": {}}}}}]"#,
        nested(300)
    );
    template(name, &config)
}

fn quota(ns: &str, name: &str, hard: Value) -> String {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": "7"},
        "spec": {"hard": hard}})
    .to_string()
}

fn list(kind: &str, items: &[String]) -> String {
    format!(
        r#"{{"kind": "{kind}", "apiVersion": "v1", "metadata": {{"resourceVersion": "10"}}, "items": [{}]}}"#,
        items.join(",")
    )
}

/// A fake API server: lists of templates and quotas, and their watches, which send `events`
/// (the templates') and then stay open until the client closes them. Records the
/// resourceVersion each watch starts from.
struct FakeApi {
    url: String,
    watched_from: Arc<Mutex<Vec<String>>>,
}

impl FakeApi {
    fn start() -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let watched_from = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&watched_from);
        // The accept loop ends with the test process.
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || {
                    let _ = serve_connection(tcp, &seen);
                });
            }
        });
        FakeApi { url, watched_from }
    }
}

/// HTTP/1.1 requests on `tcp`, answered in turn until the client closes it.
fn serve_connection(tcp: TcpStream, seen: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut out = tcp.try_clone()?;
    let mut from = BufReader::new(tcp);
    loop {
        let mut line = String::new();
        if from.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let target = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        loop {
            let mut header = String::new();
            if from.read_line(&mut header)? == 0 || header.trim().is_empty() {
                break;
            }
        }
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let version = query
            .split('&')
            .find_map(|q| q.strip_prefix("resourceVersion="));
        let watch = query.split('&').any(|q| q.starts_with("watch="));
        let (kind, items, events) = match path {
            "/apis/resource.k8s.io/v1/resourceclaimtemplates" => (
                "ResourceClaimTemplateList",
                vec![template("plain", "[]"), deep("deep"), template("odd", "5")],
                vec![format!(
                    r#"{{"type": "ADDED", "object": {}}}"#,
                    deep("deeper")
                )],
            ),
            "/api/v1/resourcequotas" => (
                "ResourceQuotaList",
                vec![
                    quota("other", "gpu", json!({"limits.gpuslice.io/gpus": "2"})),
                    quota("team", "gpu", json!({"limits.gpuslice.io/gpus": "2"})),
                    quota("team", "odd", json!(5)),
                ],
                vec![],
            ),
            _ => {
                let body = r#"{"kind": "Status", "status": "Failure", "code": 404}"#;
                write!(
                    out,
                    "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )?;
                continue;
            }
        };
        if !watch {
            let body = list(kind, &items);
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            continue;
        }
        seen.lock()
            .unwrap()
            .push(version.unwrap_or_default().to_string());
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )?;
        // Each event in two chunks: a line is read whole however it arrives.
        for e in events {
            let line = format!("{e}\n");
            let (a, b) = line.split_at(line.len() / 2);
            for part in [a, b] {
                write!(out, "{:x}\r\n{part}\r\n", part.len())?;
                out.flush()?;
            }
        }
        // The watch stays open until the client closes the connection.
        let _ = from.read(&mut [0u8; 1]);
        return Ok(());
    }
}

/// Waits until `f` answers `Some`, for at most [`WAIT`].
async fn until<R>(mut f: impl FnMut() -> Option<R>) -> Option<R> {
    let began = Instant::now();
    loop {
        if let Some(r) = f() {
            return Some(r);
        }
        if began.elapsed() > WAIT {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_object_that_cannot_be_decoded_whole_leaves_the_copies_current() {
    let api = FakeApi::start();
    let client = kube::Client::try_from(kube::Config::new(api.url.parse().unwrap())).unwrap();
    let templates = Mirror::<ResourceClaimTemplate>::follow(
        client.clone(),
        Some("app.kubernetes.io/managed-by=gpuslice-webhook".into()),
    );
    let quotas = Mirror::<ResourceQuota>::follow(client, None);

    // The copy of the templates becomes current with the readable ones, the deep ones
    // included, and the one the watch sent; the one that cannot be read is left out.
    let names = until(|| {
        templates
            .read(|m| m.keys().map(|(_, n)| n.clone()).collect::<Vec<_>>())
            .filter(|n| n.len() == 3)
    })
    .await;
    assert_eq!(
        names,
        Some(vec!["deep".into(), "deeper".into(), "plain".into()]),
        "the copy of the templates is not current with every readable one"
    );
    // The watch started from the list's version: the list was read, not failed.
    assert_eq!(
        api.watched_from.lock().unwrap().first().map(String::as_str),
        Some("10")
    );

    // The copy of the quotas answers for the namespace it read whole ...
    let other = until(|| quotas.in_namespace("other")).await.unwrap();
    assert_eq!(other.len(), 1);
    // ... and sends the one holding a quota it could not read to the API server.
    assert!(quotas.in_namespace("team").is_none());
}
