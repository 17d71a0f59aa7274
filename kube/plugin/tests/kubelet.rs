//! The plugin as the kubelet sees it, over its unix sockets, against a FAKE API server
//! (`gpuslice-fakeapi`, kube/fakeapi/: no control plane runs in this tier): registration, slice
//! publication, prepare and unprepare (repeated, concurrent, across a restart, unknown
//! claims), the bad inputs, and the cleanup of claims that went away.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use gpuslice_config::Quantity;
use gpuslice_dra::api::Timeouts;
use gpuslice_fakeapi::{kubeconfig_for, FakeApi};
use gpuslice_hook::create::slicewriter::write_slice_files;
use gpuslice_kube::proto::registration::{InfoRequest, RegistrationStatus};
use gpuslice_kube::{claim_device_id, SliceWriter, WriteError};
use gpuslice_registry::{Owner, Request, Reservation, Selector, RECORD_FILE};
use serde_json::Value;
use support::{claim, wait_for, Kubelet, Node, GIB};

fn node(api: &FakeApi, gpus: &[u64]) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let kc = api.kubeconfig(tmp.path());
    let n = Node::new("node-a", gpus, kc.clone());
    // Keep the kubeconfig with the node's own dir.
    let kept = n.dir.path().join("kubeconfig");
    std::fs::copy(&kc, &kept).unwrap();
    let mut n = n;
    n.options.kubeconfig = Some(kept);
    n
}

fn memory_of(slice: &Value, device: &str) -> String {
    let d = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == device)
        .unwrap_or_else(|| panic!("no {device} in {slice}"));
    d["capacity"]["memory"]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn registration_and_slice_publication() {
    let api = FakeApi::start();
    api.put_node("node-a", "node-uid-1");
    let n = node(&api, &[16, 80]);
    let p = n.start();
    // The sockets are in place under their final names; no dot-name is left.
    let leftovers: Vec<_> = std::fs::read_dir(&n.options.registration_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(leftovers, ["gpuslice.io-reg.sock"]);
    let k = Kubelet::connect(&p);
    let mut reg = k.reg.clone();
    let info =
        k.rt.block_on(reg.get_info(InfoRequest {}))
            .unwrap()
            .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpuslice.io");
    assert_eq!(info.endpoint, p.dra.display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);

    wait_for("the slice", || {
        api.slices().contains_key("node-a-gpuslice.io")
    });
    let s = &api.slices()["node-a-gpuslice.io"];
    assert_eq!(s["spec"]["driver"], "gpuslice.io");
    assert_eq!(s["spec"]["nodeName"], "node-a");
    assert_eq!(s["spec"]["pool"]["name"], "node-a");
    assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");
    assert_eq!(memory_of(s, "gpu-0"), "16Gi");
    assert_eq!(memory_of(s, "gpu-1"), "80Gi");
    let g1 = s["spec"]["pool"]["generation"].as_i64().unwrap();

    // A node-path booking (annotations) shrinks what the scheduler is offered.
    let mut req = Request::new(Owner::container());
    req.memory = Some(Quantity::Bytes(6 * GIB));
    req.cores = 25;
    req.selectors = vec![Selector::Index(0)];
    n.registry.reserve(&req).unwrap();
    wait_for("the shrunk slice", || {
        memory_of(&api.slices()["node-a-gpuslice.io"], "gpu-0") == "10Gi"
    });
    let s = &api.slices()["node-a-gpuslice.io"];
    let gpu0 = &s["spec"]["devices"][0];
    assert_eq!(gpu0["capacity"]["cores"]["value"], "75");
    assert_eq!(
        gpu0["capacity"]["memory"]["requestPolicy"]["validRange"]["max"],
        "10Gi"
    );
    let g2 = s["spec"]["pool"]["generation"].as_i64().unwrap();
    assert!(g2 > g1, "generation bumped on change: {g1} -> {g2}");

    // A starting kubelet deletes the node's slices and registers the plugin again.
    api.delete_slices();
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    k.rt.block_on(reg.notify_registration_status(ok)).unwrap();
    wait_for("the republished slice", || {
        api.slices().contains_key("node-a-gpuslice.io")
    });
    let refused = RegistrationStatus {
        plugin_registered: false,
        error: "version mismatch".into(),
    };
    k.rt.block_on(reg.notify_registration_status(refused))
        .unwrap();

    // SIGTERM's path: stop serving, remove the sockets, return Ok.
    let (dra, regp) = (p.dra.clone(), p.reg.clone());
    p.stop().unwrap();
    assert!(!dra.exists() && !regp.exists());
}

#[test]
fn a_quiet_slice_watch_lasts_its_timeout_however_short_the_read_timeout() {
    let api = FakeApi::start();
    api.put_node("node-a", "node-uid-1");
    let mut n = node(&api, &[16]);
    // The API server sends nothing on a quiet watch until it ends it: a watch client with
    // the requests' read timeout would break it after 0.3 s and watch again.
    n.options.api_timeouts = Timeouts {
        read: Duration::from_millis(300),
        watch_seconds: 1,
    };
    let p = n.start();
    wait_for("a second slice watch", || {
        api.watch_starts("resourceslices").len() >= 2
    });
    let starts = api.watch_starts("resourceslices");
    let lasted = starts[1] - starts[0];
    assert!(
        lasted >= Duration::from_secs(1),
        "the first watch lasted {lasted:?}"
    );
    p.stop().unwrap();
}

/// How many times the plugin has listed the slices.
fn slice_lists(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.as_str() == "GET /apis/resource.k8s.io/v1/resourceslices")
        .count()
}

fn generation(slice: &Value) -> i64 {
    slice["spec"]["pool"]["generation"].as_i64().unwrap()
}

#[test]
fn slices_a_starting_kubelet_deletes_after_registering_the_plugin_are_published_again() {
    let api = FakeApi::start();
    api.put_node("node-a", "node-uid-1");
    // The resync (60 s by default) is not what brings them back here.
    let n = node(&api, &[16]);
    let p = n.start();
    let k = Kubelet::connect(&p);
    let mut reg = k.reg.clone();
    wait_for("the slice", || {
        api.slices().contains_key("node-a-gpuslice.io")
    });
    let g1 = generation(&api.slices()["node-a-gpuslice.io"]);
    // The restarted kubelet registers the plugin, whose republication finds the slices as it
    // left them; only then does the kubelet's start-up wipe delete them.
    let listed = slice_lists(&api);
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    k.rt.block_on(reg.notify_registration_status(ok)).unwrap();
    wait_for("the republication after the registration", || {
        slice_lists(&api) > listed
    });
    assert_eq!(
        generation(&api.slices()["node-a-gpuslice.io"]),
        g1,
        "nothing to write: the slices were as published"
    );
    api.delete_slices();
    wait_for("the slice published again after the wipe", || {
        api.slices().contains_key("node-a-gpuslice.io")
    });
    let s = &api.slices()["node-a-gpuslice.io"];
    assert_eq!(memory_of(s, "gpu-0"), "16Gi");
    assert!(generation(s) > g1, "{s}");
    p.stop().unwrap();
}

#[test]
fn a_slice_someone_else_changed_is_restored_at_the_resync() {
    let api = FakeApi::start();
    api.put_node("node-a", "node-uid-1");
    let mut n = node(&api, &[16]);
    n.options.resync_interval = Duration::from_millis(300);
    let p = n.start();
    wait_for("the slice", || {
        api.slices().contains_key("node-a-gpuslice.io")
    });
    // The loop's unforced ticks (every 50 ms here) ask nothing of the API server and must not
    // put the resync off.
    api.edit_slice("node-a-gpuslice.io", |s| {
        s["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi".into();
    });
    wait_for("the slice restored by the resync", || {
        memory_of(&api.slices()["node-a-gpuslice.io"], "gpu-0") == "16Gi"
    });
    p.stop().unwrap();
}

#[test]
fn prepare_books_exactly_what_was_consumed_and_unprepare_releases() {
    let api = FakeApi::start();
    let n = node(&api, &[16, 80]);
    // One claim with two results (two GPUs), another on one of the same GPUs, one with two
    // results on one GPU.
    api.put_claim(&claim(
        "ns",
        "two",
        "uid-two",
        &[
            ("a", "node-a", "gpu-0", "4Gi", "30"),
            ("b", "node-a", "gpu-1", "20Gi", "0"),
        ],
    ));
    api.put_claim(&claim(
        "ns",
        "one",
        "uid-one",
        &[("gpu", "node-a", "gpu-0", "2Gi", "10")],
    ));
    api.put_claim(&claim(
        "ns",
        "same",
        "uid-same",
        &[
            ("x", "node-a", "gpu-1", "1Gi", "5"),
            ("y", "node-a", "gpu-1", "512Mi", "5"),
        ],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    let calls = [
        ("ns", "two", "uid-two"),
        ("ns", "one", "uid-one"),
        ("ns", "same", "uid-same"),
    ];
    let resp = k.prepare(&calls);
    assert_eq!(resp.claims.len(), 3);
    for (_, _, uid) in calls {
        let r = &resp.claims[uid];
        assert_eq!(r.error, "", "{uid}");
        for d in &r.devices {
            assert_eq!(d.cdi_device_ids, [format!("gpuslice.io/claim={uid}")]);
            assert_eq!(d.pool_name, "node-a");
            assert_eq!(
                d.share_id.as_deref(),
                Some(format!("{uid}-{}", d.request_names[0]).as_str())
            );
        }
    }
    let two = &resp.claims["uid-two"].devices;
    assert_eq!(two.len(), 2);
    assert_eq!(
        (two[0].device_name.as_str(), two[1].device_name.as_str()),
        ("gpu-0", "gpu-1")
    );
    assert_eq!(resp.claims["uid-same"].devices.len(), 2);

    let booked = |uid: &str| {
        n.reservations()
            .into_iter()
            .find(|r| matches!(&r.owner, Owner::DraClaim { claim_uid, .. } if claim_uid == uid))
    };
    let r2 = booked("uid-two").unwrap();
    assert_eq!(r2.gpus.len(), 2);
    assert_eq!(
        (r2.gpus[0].uuid.clone(), r2.gpus[0].memory, r2.gpus[0].cores),
        (n.uuid(0), 4 * GIB, 30)
    );
    assert_eq!(
        (r2.gpus[1].uuid.clone(), r2.gpus[1].memory, r2.gpus[1].cores),
        (n.uuid(1), 20 * GIB, 0)
    );
    let rs = booked("uid-same").unwrap();
    assert_eq!(rs.gpus.len(), 1, "two results on one GPU: one booking");
    assert_eq!((rs.gpus[0].memory, rs.gpus[0].cores), (GIB + GIB / 2, 10));
    assert!(n.writer.file("uid-two").is_file());

    // Repeated: the same reservations, nothing more booked.
    let ids: Vec<String> = n.reservations().into_iter().map(|r| r.id).collect();
    let again = k.prepare(&calls);
    assert!(again.claims.values().all(|r| r.error.is_empty()));
    assert_eq!(
        n.reservations()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>(),
        ids
    );

    // Unprepare releases and removes the claim's files; unknown claims succeed.
    let un = k.unprepare(&[("ns", "two", "uid-two"), ("ns", "ghost", "uid-ghost")]);
    assert_eq!(un.claims["uid-two"].error, "");
    assert_eq!(un.claims["uid-ghost"].error, "");
    assert!(booked("uid-two").is_none());
    assert!(!n.writer.file("uid-two").exists());
    assert_eq!(n.reservations().len(), 2);
    let un = k.unprepare(&[("ns", "two", "uid-two")]);
    assert_eq!(un.claims["uid-two"].error, "");
}

#[test]
fn concurrent_prepares_of_different_claims() {
    let api = FakeApi::start();
    let n = node(&api, &[16]);
    let uids: Vec<String> = (0..12).map(|i| format!("uid-{i}")).collect();
    for (i, uid) in uids.iter().enumerate() {
        api.put_claim(&claim(
            "ns",
            &format!("c{i}"),
            uid,
            &[("gpu", "node-a", "gpu-0", "1Gi", "5")],
        ));
    }
    let p = n.start();
    let k = Kubelet::connect(&p);
    let names: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    // Six concurrent calls of two claims each, every claim asked for twice.
    let handles: Vec<_> = (0..6)
        .map(|j| {
            let mut c = k.dra.clone();
            let claims = support::claims_of(&[
                ("ns", &names[2 * j], &uids[2 * j]),
                ("ns", &names[2 * j + 1], &uids[2 * j + 1]),
                ("ns", &names[(2 * j + 2) % 12], &uids[(2 * j + 2) % 12]),
            ]);
            k.rt.spawn(async move {
                c.node_prepare_resources(gpuslice_kube::proto::dra::NodePrepareResourcesRequest {
                    claims,
                })
                .await
                .unwrap()
                .into_inner()
            })
        })
        .collect();
    for h in handles {
        let r = k.rt.block_on(h).unwrap();
        assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    }
    let res = n.reservations();
    assert_eq!(res.len(), 12, "one reservation per claim");
    assert_eq!(res.iter().map(|r| r.gpus[0].memory).sum::<u64>(), 12 * GIB);
    assert_eq!(
        res.iter().map(|r| u32::from(r.gpus[0].cores)).sum::<u32>(),
        60
    );
}

#[test]
fn a_restart_between_prepare_and_unprepare_loses_nothing() {
    let api = FakeApi::start();
    let n = node(&api, &[16]);
    api.put_claim(&claim(
        "ns",
        "c",
        "uid-c",
        &[("gpu", "node-a", "gpu-0", "3Gi", "20")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(k.prepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error, "");
    let id = n.reservations()[0].id.clone();
    drop(k);
    p.stop().unwrap();
    assert_eq!(n.reservations().len(), 1, "the booking outlives the plugin");

    let p = n.start();
    let k = Kubelet::connect(&p);
    // The kubelet may repeat the prepare after a restart: the same reservation.
    assert_eq!(k.prepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error, "");
    assert_eq!(n.reservations()[0].id, id);
    assert_eq!(
        k.unprepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error,
        ""
    );
    assert!(n.reservations().is_empty());
}

/// Writes a claim's slice files into its slice directory, as the node's writer does, without
/// the CDI spec.
struct SliceDirWriter {
    registry: std::sync::Arc<gpuslice_registry::Registry>,
}

impl SliceWriter for SliceDirWriter {
    fn write(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, WriteError> {
        let dir = self
            .registry
            .slice_dir(&r.id)
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        write_slice_files(&dir, r, true).map_err(|e| WriteError::Failed(e.to_string()))?;
        Ok(vec![claim_device_id(uid)])
    }

    fn remove(&self, _uid: &str) -> Result<(), WriteError> {
        Ok(())
    }
}

#[test]
fn a_claim_whose_slice_directory_a_crash_lost_is_prepared_again() {
    let api = FakeApi::start();
    let n = node(&api, &[16]);
    api.put_claim(&claim(
        "ns",
        "c",
        "uid-c",
        &[("gpu", "node-a", "gpu-0", "3Gi", "20")],
    ));
    let writer = std::sync::Arc::new(SliceDirWriter {
        registry: n.registry.clone(),
    });
    let p = n.start_with(writer.clone());
    let k = Kubelet::connect(&p);
    assert_eq!(k.prepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error, "");
    let id = n.reservations()[0].id.clone();
    drop(k);
    p.stop().unwrap();
    // The plugin died after `registry.json` listed the booking and before its directory
    // was made (or a power loss took the directory's entry).
    let slice = n.registry.slice_dir(&id).unwrap();
    std::fs::remove_dir_all(&slice).unwrap();

    let p = n.start_with(writer);
    let k = Kubelet::connect(&p);
    assert_eq!(k.prepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error, "");
    assert_eq!(n.reservations().len(), 1);
    assert_eq!(n.reservations()[0].id, id);
    assert!(slice.join(RECORD_FILE).is_file());
    assert!(slice.join("limits.json").is_file());
}

#[test]
fn bad_claims_get_one_clear_error_and_nothing_is_booked() {
    let api = FakeApi::start();
    let n = node(&api, &[16, 80]);
    api.put_claim(&claim(
        "ns",
        "other-node",
        "u1",
        &[("gpu", "node-b", "gpu-0", "1Gi", "0")],
    ));
    let mut other_driver = claim(
        "ns",
        "other-driver",
        "u2",
        &[("gpu", "node-a", "gpu-0", "1Gi", "0")],
    );
    other_driver["status"]["allocation"]["devices"]["results"][0]["driver"] =
        "gpu.nvidia.com".into();
    api.put_claim(&other_driver);
    let mut pending = claim("ns", "pending", "u3", &[]);
    pending["status"] = serde_json::json!({});
    api.put_claim(&pending);
    api.put_claim(&claim(
        "ns",
        "too-big",
        "u4",
        &[("gpu", "node-a", "gpu-0", "12Gi", "0")],
    ));
    api.put_claim_raw("ns", "malformed", r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"malformed","uid":"u5"},"spec":{"devices":{}},"status":{"allocation":{"devices":{"results":"gpu-0"}}}}"#.into());
    api.put_claim(&claim(
        "ns",
        "recreated",
        "u6-new",
        &[("gpu", "node-a", "gpu-0", "1Gi", "0")],
    ));
    api.put_claim(&claim(
        "ns",
        "bad-quantity",
        "u7",
        &[("gpu", "node-a", "gpu-0", "1.5", "0")],
    ));
    api.put_claim(&claim(
        "ns",
        "no-such-gpu",
        "u8",
        &[("gpu", "node-a", "gpu-7", "1Gi", "0")],
    ));
    api.put_claim(&claim(
        "ns",
        "write-fails",
        "u9",
        &[("gpu", "node-a", "gpu-1", "1Gi", "0")],
    ));
    // The annotation path holds 6 GiB of GPU 0: a claim for 12 GiB cannot be honoured.
    let mut req = Request::new(Owner::container());
    req.memory = Some(Quantity::Bytes(6 * GIB));
    req.selectors = vec![Selector::Index(0)];
    n.registry.reserve(&req).unwrap();

    let p = n.start();
    let k = Kubelet::connect(&p);
    let cases = [
        ("other-node", "u1", "in pool node-a (this node)"),
        ("other-driver", "u2", "driver gpu.nvidia.com"),
        ("pending", "u3", "no allocation yet"),
        ("too-big", "u4", "one bookkeeper per GPU"),
        ("malformed", "u5", "cannot read claim ns/malformed"),
        ("recreated", "u6-old", "uid u6-new"),
        ("bad-quantity", "u7", "not a whole"),
        (
            "no-such-gpu",
            "u8",
            "gpu-7 is not in this node's GPU inventory",
        ),
        ("absent", "u10", "does not exist in the API server"),
        ("bad-uid", "../etc", "is not a Kubernetes UID"),
    ];
    for (name, uid, text) in cases {
        let r = k.prepare(&[("ns", name, uid)]);
        let e = &r.claims[uid].error;
        assert!(e.contains(text), "{name}: `{e}` lacks `{text}`");
        assert!(
            e.contains(name) || name == "bad-uid",
            "{name}: the error names the claim: {e}"
        );
        assert!(r.claims[uid].devices.is_empty());
    }
    n.writer.fail.store(true, Ordering::SeqCst);
    let e = &k.prepare(&[("ns", "write-fails", "u9")]).claims["u9"].error;
    assert!(e.contains("told to fail"), "{e}");
    n.writer.fail.store(false, Ordering::SeqCst);
    let res = n.reservations();
    assert_eq!(res.len(), 1, "only the annotation booking: {res:?}");
    assert!(matches!(res[0].owner, Owner::Container { .. }));
}

#[test]
fn an_unreachable_api_server_fails_prepare_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kc = kubeconfig_for(&format!("http://127.0.0.1:{port}"), tmp.path());
    let n = Node::new("node-a", &[16], kc);
    let p = n.start();
    let k = Kubelet::connect(&p);
    let r = k.prepare(&[("ns", "c", "uid-c")]);
    let e = &r.claims["uid-c"].error;
    assert!(
        e.contains("cannot read claim ns/c (uid uid-c) from the API server"),
        "{e}"
    );
    assert!(n.reservations().is_empty());
    // Unprepare needs no API server.
    assert_eq!(
        k.unprepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error,
        ""
    );
}

#[test]
fn claims_that_went_away_are_released_by_the_cleanup_loop() {
    let api = FakeApi::start();
    let n = node(&api, &[16]);
    api.put_claim(&claim(
        "ns",
        "gone",
        "uid-gone",
        &[("gpu", "node-a", "gpu-0", "1Gi", "0")],
    ));
    api.put_claim(&claim(
        "ns",
        "moved",
        "uid-moved",
        &[("gpu", "node-a", "gpu-0", "1Gi", "0")],
    ));
    api.put_claim(&claim(
        "ns",
        "kept",
        "uid-kept",
        &[("gpu", "node-a", "gpu-0", "1Gi", "0")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    let r = k.prepare(&[
        ("ns", "gone", "uid-gone"),
        ("ns", "moved", "uid-moved"),
        ("ns", "kept", "uid-kept"),
    ]);
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    assert_eq!(n.reservations().len(), 3);
    api.delete_claim("ns", "gone");
    api.put_claim(&claim(
        "ns",
        "moved",
        "uid-moved",
        &[("gpu", "node-b", "gpu-0", "1Gi", "0")],
    ));
    // The registry releases first, then the claim's spec goes.
    wait_for("the cleanup", || {
        n.reservations().len() == 1
            && !n.writer.file("uid-gone").exists()
            && !n.writer.file("uid-moved").exists()
    });
    let left = n.reservations();
    assert!(matches!(&left[0].owner, Owner::DraClaim { claim_uid, .. } if claim_uid == "uid-kept"));
    assert!(n.writer.file("uid-kept").exists());
}

#[test]
fn a_claim_that_consumes_no_memory_is_refused_and_nothing_is_booked() {
    let api = FakeApi::start();
    let n = node(&api, &[16, 80]);
    api.put_claim(&claim(
        "ns",
        "zero",
        "uid-zero",
        &[("gpu", "node-a", "gpu-1", "0", "10")],
    ));
    // A zero spelled with a unit, beside a result that does consume memory on the same GPU:
    // the empty result is still refused (a share of 0 bytes is never a slice).
    api.put_claim(&claim(
        "ns",
        "zero-gi",
        "uid-zero-gi",
        &[
            ("a", "node-a", "gpu-0", "1Gi", "0"),
            ("b", "node-a", "gpu-0", "0Gi", "5"),
        ],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    for (name, uid, device) in [
        ("zero", "uid-zero", "gpu-1"),
        ("zero-gi", "uid-zero-gi", "gpu-0"),
    ] {
        let r = k.prepare(&[("ns", name, uid)]);
        let e = &r.claims[uid].error;
        for text in [
            format!("claim ns/{name} (uid {uid})"),
            format!("device {device}"),
            "consumes 0 bytes of `memory`".to_string(),
            "accepted: at least 1 byte".to_string(),
        ] {
            assert!(e.contains(&text), "{name}: `{e}` lacks `{text}`");
        }
        assert!(r.claims[uid].devices.is_empty());
        assert!(!n.writer.file(uid).exists(), "{name}: no CDI spec");
    }
    assert!(n.reservations().is_empty(), "{:?}", n.reservations());
}

#[test]
fn unprepare_releases_only_the_claim_prepare_booked() {
    let api = FakeApi::start();
    let n = node(&api, &[16]);
    api.put_claim(&claim(
        "ns",
        "c",
        "uid-c",
        &[("gpu", "node-a", "gpu-0", "2Gi", "10")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(k.prepare(&[("ns", "c", "uid-c")]).claims["uid-c"].error, "");
    let id = n.reservations()[0].id.clone();

    // The UID of the booked claim under another name or namespace: that claim was never
    // prepared here, so nothing is released and the booked claim's spec stays.
    for (ns, name) in [("ns", "other"), ("other-ns", "c"), ("other-ns", "other")] {
        let un = k.unprepare(&[(ns, name, "uid-c")]);
        let e = &un.claims["uid-c"].error;
        for text in [
            format!("claim {ns}/{name} (uid uid-c)"),
            "claim ns/c (uid uid-c)".to_string(),
            "nothing was released".to_string(),
        ] {
            assert!(e.contains(&text), "{ns}/{name}: `{e}` lacks `{text}`");
        }
        let left = n.reservations();
        assert_eq!(left.len(), 1, "{ns}/{name}: {left:?}");
        assert_eq!(left[0].id, id);
        assert!(n.writer.file("uid-c").is_file(), "{ns}/{name}: spec kept");
    }

    // The claim prepare booked is released as before.
    let un = k.unprepare(&[("ns", "c", "uid-c")]);
    assert_eq!(un.claims["uid-c"].error, "");
    assert!(n.reservations().is_empty());
    assert!(!n.writer.file("uid-c").exists());
}

#[test]
fn a_claim_allocated_a_gpu_that_became_unhealthy_is_refused_at_prepare() {
    let api = FakeApi::start();
    let mut n = node(&api, &[16, 16]);
    let health = n.dir.path().join("health.json");
    n.options.health_file = Some(health.clone());
    // Booked while GPU 1 was healthy: a repeated prepare keeps it.
    api.put_claim(&claim(
        "ns",
        "before",
        "uid-before",
        &[("gpu", "node-a", "gpu-1", "2Gi", "0")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(
        k.prepare(&[("ns", "before", "uid-before")]).claims["uid-before"].error,
        ""
    );
    // GPU 1 falls off the bus; a claim the scheduler allocated it before the taint reached
    // it is prepared.
    let sick = gpuslice_driver::health::Unhealthy {
        index: 1,
        uuid: n.uuid(1),
        xid: 79,
        since_ms: 1_796_000_000_000,
        recovery_seen: false,
    };
    gpuslice_driver::health::write_health(&health, std::slice::from_ref(&sick)).unwrap();
    api.put_claim(&claim(
        "ns",
        "after",
        "uid-after",
        &[("gpu", "node-a", "gpu-1", "2Gi", "0")],
    ));
    let e = k.prepare(&[("ns", "after", "uid-after")]).claims["uid-after"]
        .error
        .clone();
    for part in [
        "claim ns/after (uid uid-after)",
        &format!(
            "GPU 1 ({}) is unhealthy: the driver reported XID 79",
            sick.uuid
        ),
        "nothing was booked",
    ] {
        assert!(e.contains(part), "`{e}` lacks `{part}`");
    }
    let booked: Vec<String> = n
        .reservations()
        .iter()
        .filter_map(|r| gpuslice_registry::claim_uid(r).map(str::to_string))
        .collect();
    assert_eq!(booked, ["uid-before"]);
    assert!(!n.writer.file("uid-after").exists());
    assert_eq!(
        k.prepare(&[("ns", "before", "uid-before")]).claims["uid-before"].error,
        ""
    );
    // The healthy GPU is prepared as before.
    api.put_claim(&claim(
        "ns",
        "healthy",
        "uid-healthy",
        &[("gpu", "node-a", "gpu-0", "2Gi", "0")],
    ));
    assert_eq!(
        k.prepare(&[("ns", "healthy", "uid-healthy")]).claims["uid-healthy"].error,
        ""
    );
    p.stop().unwrap();
}
