//! The webhook's watched copies (crate::mirror) stay current when one object in them cannot be
//! decoded whole. Against the FAKE API server of `gpuslice-fakeapi` (no control plane runs in a
//! crate's tests; `webhook::` and `budgets::` in tests/ run the real one) holding a template
//! labelled as the webhook's nested past the JSON parser's limit and one that cannot be read at
//! all: the copy of the templates becomes current from one list with every readable template,
//! and takes another deep one from its watch (a line long enough to arrive in pieces); the copy
//! of the quotas answers for a namespace whose quotas it read, and sends a namespace holding a
//! quota it could not read to the API server. A tenant's templates labelled as the webhook's,
//! named otherwise and as large as the API server stores, are not kept by the webhook's watch
//! (from its list or its watch), which keeps the webhook's own, and a review is answered.

use std::time::{Duration, Instant};

use gpuslice_fakeapi::FakeApi;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{json, Value};

use gpuslice_webhook::mirror::Mirror;

/// How long the copies may take to become current.
const WAIT: Duration = Duration::from_secs(20);
const TEMPLATES: &str = "/apis/resource.k8s.io/v1/resourceclaimtemplates";

/// A template labelled as the webhook's whose devices' configuration is `config`.
fn template(name: &str, config: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "team", "name": name,
            "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"}},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "g", "exactly": {"deviceClassName": "gpuslice.io"}}],
            "config": config}}}})
}

/// A template whose other driver's opaque parameters nest past the parser's limit, padded with
/// `pad` bytes of annotation.
fn deep(name: &str, pad: usize) -> Value {
    let mut parameters = json!(1);
    for _ in 0..300 {
        parameters = json!({ "a": parameters });
    }
    let mut t = template(
        name,
        json!([{"opaque": {"driver": "example.com", "parameters": parameters}}]),
    );
    t["metadata"]["annotations"] = json!({"example.com/pad": "x".repeat(pad)});
    t
}

fn quota(ns: &str, name: &str, hard: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"namespace": ns, "name": name}, "spec": {"hard": hard}})
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
    api.put("resourceclaimtemplates", &template("plain", json!([])));
    api.put("resourceclaimtemplates", &deep("deep", 0));
    api.put("resourceclaimtemplates", &template("odd", json!(5)));
    let gpus = json!({"limits.gpuslice.io/gpus": "2"});
    api.put("resourcequotas", &quota("other", "gpu", gpus.clone()));
    api.put("resourcequotas", &quota("team", "gpu", gpus));
    api.put("resourcequotas", &quota("team", "odd", json!(5)));

    let client = kube::Client::try_from(kube::Config::new(api.url.parse().unwrap())).unwrap();
    let templates = Mirror::<ResourceClaimTemplate>::follow(
        client.clone(),
        Some("app.kubernetes.io/managed-by=gpuslice-webhook".into()),
    );
    let quotas = Mirror::<ResourceQuota>::follow(client, None);
    let names = || {
        templates.read(|m| {
            m.keys()
                .map(|(_, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
    };

    // The copy of the templates becomes current with the readable ones, the deep one
    // included; the one that cannot be read is left out.
    let read = until(|| names().filter(|n| n == "deep,plain")).await;
    assert_eq!(read.as_deref(), Some("deep,plain"), "{:?}", names());
    // From one list: a copy that could not be read would be listed again and again.
    let lists = |api: &FakeApi| {
        let get = format!("GET {TEMPLATES}");
        api.requests().iter().filter(|r| **r == get).count()
    };
    assert_eq!(lists(&api), 1, "{:?}", api.requests());

    // Another deep one arrives by the watch, in pieces, and the copy stays current.
    api.put("resourceclaimtemplates", &deep("deeper", 256 << 10));
    let read = until(|| names().filter(|n| n == "deep,deeper,plain")).await;
    assert_eq!(read.as_deref(), Some("deep,deeper,plain"), "{:?}", names());
    assert_eq!(lists(&api), 1, "{:?}", api.requests());

    // The copy of the quotas answers for the namespace it read whole ...
    let other = until(|| quotas.in_namespace("other")).await.unwrap();
    assert_eq!(other.len(), 1);
    // ... and sends the one holding a quota it could not read to the API server, until that
    // quota is gone.
    assert!(quotas.in_namespace("team").is_none());
    api.remove("resourcequotas", "team", "odd");
    let team = until(|| quotas.in_namespace("team")).await.unwrap();
    assert_eq!(team.len(), 1);
}

/// A template labelled as the webhook's, named `name` in `ns`, as large as the API server
/// stores: 32 requests of 32 selectors of 1 KiB each and 256 KiB of annotation (about 1.3 MiB).
fn foreign(ns: &str, name: &str) -> Value {
    let selectors: Vec<Value> = (0..32)
        .map(|i| json!({"cel": {"expression": format!("device.driver == '{i}{}'", "x".repeat(1000))}}))
        .collect();
    let requests: Vec<Value> = (0..32)
        .map(|i| {
            json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpuslice.io",
            "selectors": selectors}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": ns, "name": name,
            "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"},
            "annotations": {"example.com/pad": "x".repeat(256 << 10)}},
        "spec": {"spec": {"devices": {"requests": requests}}}})
}

/// The template the webhook writes in `ns` for one GPU's `gib` GiB.
fn written(ns: &str, gib: u64) -> Value {
    use gpuslice_dra::claim_shape::{claim_spec, template, Mode, Shape};
    let shape = Shape {
        gpus: 1,
        memory: Some(gib << 30),
        ..Default::default()
    };
    let (spec, _) = claim_spec(&Mode::Capacity, &shape, "f").unwrap();
    serde_json::to_value(template(ns, spec)).unwrap()
}

#[test]
fn templates_labelled_as_the_webhooks_that_it_did_not_name_are_not_kept_and_reviews_are_answered() {
    let api = FakeApi::start();
    // A tenant's templates labelled as the webhook's: any name, as large as they may be.
    for i in 0..24 {
        api.put(
            "resourceclaimtemplates",
            &foreign("tenant", &format!("big-{i}")),
        );
    }
    let ours = written("room", 2);
    api.put("resourceclaimtemplates", &ours);
    let ours_name = ours["metadata"]["name"].as_str().unwrap().to_string();

    // The runtime, and the watches it runs, end with the statement.
    crate::hostile::runtime().block_on(async {
        let cluster = crate::hostile::cluster_of(&api.url).await;
        let kept = || cluster.watched_templates();
        // From the list: the webhook's own alone.
        let want = vec![("room".to_string(), ours_name.clone())];
        let read = until(|| kept().filter(|k| *k == want)).await;
        assert_eq!(read, Some(want), "{:?}", kept());
        // From the watch: another of the tenant's is not kept; another of the webhook's is.
        api.put("resourceclaimtemplates", &foreign("tenant", "big-late"));
        let late = written("room", 3);
        api.put("resourceclaimtemplates", &late);
        let late_name = late["metadata"]["name"].as_str().unwrap().to_string();
        let mut want = vec![
            ("room".to_string(), ours_name.clone()),
            ("room".to_string(), late_name),
        ];
        want.sort();
        let read = until(|| kept().filter(|k| *k == want)).await;
        assert_eq!(read, Some(want), "{:?}", kept());
    });

    // The webhook answers a review, reusing its own template, with the tenant's present.
    let w = crate::hostile::start_against(&api.url, crate::hostile::patient());
    let answer = crate::hostile::reviewed(w.addr, &crate::budgets::review("room", "p", "2Gi"));
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let made = api
        .objects("resourceclaimtemplates")
        .keys()
        .filter(|(ns, _)| ns == "room")
        .count();
    assert_eq!(made, 2, "no other template made");
}
