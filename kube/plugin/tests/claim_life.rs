//! A claim's booking lives as long as the containers it was given to, against a FAKE API
//! server (`gpuslice-fakeapi`, kube/fakeapi/): a claim deleted under a running container (its
//! finalizer removed) stays booked, is withdrawn from the slice, and is refused to a claim the
//! scheduler then allocates over it, by name; once the container's process is gone it is
//! released.

use crate::support;

use gpuslice_fakeapi::FakeApi;
use serde_json::Value;
use support::{claim, wait_for, Kubelet, Node};

const HELD_CLAIM_GET: &str = "GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/held";

fn node(api: &FakeApi, gpus: &[u64]) -> Node {
    let mut n = Node::new("node-a", gpus, std::path::PathBuf::new());
    let kc = api.kubeconfig(n.dir.path());
    n.options.kubeconfig = Some(kc);
    n
}

/// The memory capacity the node's slice publishes for `device`.
fn published(api: &FakeApi, device: &str) -> Option<String> {
    let slices = api.slices();
    let s: &Value = slices.get("node-a-gpuslice.io")?;
    s["spec"]["devices"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == device)?["capacity"]["memory"]["value"]
        .as_str()
        .map(str::to_string)
}

/// How many times the plugin has read claim ns/held.
fn reads_of_held(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.as_str() == HELD_CLAIM_GET)
        .count()
}

#[test]
fn a_deleted_claim_stays_booked_while_its_container_runs_and_is_released_after() {
    let api = FakeApi::start();
    let n = node(&api, &[10]);
    api.put_claim(&claim(
        "ns",
        "held",
        "uid-held",
        &[("gpu", "node-a", "gpu-0", "6Gi", "0")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(
        k.prepare(&[("ns", "held", "uid-held")]).claims["uid-held"].error,
        ""
    );
    let id = n.reservations()[0].id.clone();
    // The claim's container, as its createRuntime hook records it.
    n.system.spawn(4242, 77);
    n.system.set_cgroup(4242, "kubepods/pod-a/ctr");
    n.registry.join_claim(&id, 4242).unwrap();
    // The scheduler counts the claim itself: the whole GPU stays published.
    wait_for("the slice", || {
        published(&api, "gpu-0").as_deref() == Some("10Gi")
    });

    // Deleted with its finalizer removed: the scheduler sees 6 GiB free again and allocates a
    // 9 GiB claim on the 10 GiB GPU.
    api.delete_claim("ns", "held");
    api.put_claim(&claim(
        "ns",
        "over",
        "uid-over",
        &[("gpu", "node-a", "gpu-0", "9Gi", "0")],
    ));
    wait_for("the booking to be kept", || {
        n.reservations()
            .first()
            .is_some_and(|r| r.owner.claim_gone().is_some())
    });
    let kept = n.reservations();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].id, id);
    assert_eq!(kept[0].gpus[0].memory, 6 << 30);
    assert_eq!(
        kept[0].owner.claim_gone().unwrap().why,
        "the claim no longer exists"
    );
    assert!(n.writer.file("uid-held").exists(), "its CDI spec stays");
    // Offered to no one: the slice withdraws what it holds, as for the node paths.
    wait_for("the kept booking to be withdrawn", || {
        published(&api, "gpu-0").as_deref() == Some("4Gi")
    });
    // The claim allocated over it is not prepared, and the error names who holds the GPU.
    let e = k.prepare(&[("ns", "over", "uid-over")]).claims["uid-over"]
        .error
        .clone();
    for part in [
        "claim ns/over (uid uid-over) cannot be prepared on GPU 0",
        "it needs 9Gi of memory and 4Gi of 10Gi is free",
        "held there by claim ns/held (6Gi; the claim no longer exists, kept while its containers run)",
    ] {
        assert!(e.contains(part), "`{e}` lacks `{part}`");
    }
    assert!(!n.writer.file("uid-over").exists());
    // Passes later, and across a plugin restart, it is still kept and still withdrawn.
    let reads = reads_of_held(&api);
    wait_for("two more cleanup passes", || {
        reads_of_held(&api) >= reads + 2
    });
    drop(k);
    p.stop().unwrap();
    let p = n.start();
    let k = Kubelet::connect(&p);
    let reads = reads_of_held(&api);
    wait_for("a pass after the restart", || reads_of_held(&api) > reads);
    assert_eq!(n.reservations().len(), 1);
    assert_eq!(n.reservations()[0].id, id);
    wait_for("the kept booking withdrawn after the restart", || {
        published(&api, "gpu-0").as_deref() == Some("4Gi")
    });

    // The container's process is gone: the next pass releases the booking and its spec.
    n.system.kill(4242);
    wait_for("the release", || {
        n.reservations().is_empty() && !n.writer.file("uid-held").exists()
    });
    wait_for("the whole GPU published again", || {
        published(&api, "gpu-0").as_deref() == Some("10Gi")
    });
    // The kubelet's retry of the 9 GiB claim now succeeds.
    let r = k.prepare(&[("ns", "over", "uid-over")]);
    assert_eq!(r.claims["uid-over"].error, "");
    assert_eq!(n.reservations()[0].gpus[0].memory, 9 << 30);
}

/// A claim deallocated under a running container (its pod force-deleted) and allocated to
/// this node again with the same devices, the kubelet keeping it prepared: the cleanup finds
/// it allocated here and the booking is live again, so the old container's exit (before the
/// new pod's starts) does not reap it.
#[test]
fn a_kept_claim_allocated_here_again_is_not_reaped_when_its_old_container_exits() {
    let api = FakeApi::start();
    let n = node(&api, &[10]);
    let allocated = claim(
        "ns",
        "held",
        "uid-held",
        &[("gpu", "node-a", "gpu-0", "6Gi", "0")],
    );
    api.put_claim(&allocated);
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(
        k.prepare(&[("ns", "held", "uid-held")]).claims["uid-held"].error,
        ""
    );
    let id = n.reservations()[0].id.clone();
    n.system.spawn(4242, 77);
    n.registry.join_claim(&id, 4242).unwrap();

    let mut unallocated = allocated.clone();
    unallocated["status"] = serde_json::json!({});
    api.put_claim(&unallocated);
    wait_for("the booking to be kept", || {
        n.reservations()
            .first()
            .is_some_and(|r| r.owner.claim_gone().is_some())
    });
    api.put_claim(&allocated);
    wait_for("the mark to go", || {
        n.reservations()
            .first()
            .is_some_and(|r| r.owner.claim_gone().is_none())
    });
    wait_for("the whole GPU published again", || {
        published(&api, "gpu-0").as_deref() == Some("10Gi")
    });
    // The old container exits: passes go on, the booking and its spec stay.
    n.system.kill(4242);
    let reads = reads_of_held(&api);
    wait_for("two more cleanup passes", || {
        reads_of_held(&api) >= reads + 2
    });
    n.registry.gc().unwrap();
    let left = n.reservations();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, id);
    assert!(n.writer.file("uid-held").exists());
}

#[test]
fn a_kept_claim_whose_container_left_children_in_its_cgroup_stays_until_they_exit() {
    let api = FakeApi::start();
    let n = node(&api, &[10]);
    api.put_claim(&claim(
        "ns",
        "held",
        "uid-held",
        &[("gpu", "node-a", "gpu-0", "2Gi", "0")],
    ));
    let p = n.start();
    let k = Kubelet::connect(&p);
    assert_eq!(
        k.prepare(&[("ns", "held", "uid-held")]).claims["uid-held"].error,
        ""
    );
    let id = n.reservations()[0].id.clone();
    n.system.spawn(4242, 77);
    n.system.set_cgroup(4242, "kubepods/pod-a/ctr");
    n.registry.join_claim(&id, 4242).unwrap();
    // Init exits, its children keep the container's cgroup populated.
    n.system.kill(4242);
    n.system.set_populated("kubepods/pod-a/ctr", true);
    api.delete_claim("ns", "held");
    wait_for("the booking to be kept", || {
        n.reservations()
            .first()
            .is_some_and(|r| r.owner.claim_gone().is_some())
    });
    let reads = reads_of_held(&api);
    wait_for("two more cleanup passes", || {
        reads_of_held(&api) >= reads + 2
    });
    assert_eq!(n.reservations().len(), 1);
    n.system.set_populated("kubepods/pod-a/ctr", false);
    wait_for("the release", || n.reservations().is_empty());
}
