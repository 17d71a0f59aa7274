//! A deletion frees its namespace's budget however the webhook's watch of the Pods ends. Against
//! the FAKE API server of `gpuslice-fakeapi`, which ends open watches, refuses lists and watches
//! (500) and compacts its changes (a watch from an earlier version told `410 Expired` by an
//! ERROR event) as the API server does: a pod deleted while no watch could be opened is freed
//! once one is, the watch resuming from the version the last one reached (no list); a pod
//! deleted while the version expired is freed after the list that follows (the lists refused
//! for a while first), the watch starting from that list's version and the expired one never
//! asked again; no retry comes sooner than the pause after the one before. The periodic
//! recount runs at the start and then not for 300 s: only a recount the watch triggers frees.

use std::time::{Duration, Instant};

use gpuslice_fakeapi::{Call, FakeApi};

use crate::budgets::{pod, quota, template_2gi, used, WINDOW};
use crate::hostile::{patient, start_recounting, Webhook};

/// The webhook's watch of the Pods of every namespace (and the list it starts from).
const PODS: &str = "/api/v1/pods";
/// The pause the webhook makes before it tries again (crate::mirror's `RETRY`), less what
/// timing may take off it.
const PAUSE: Duration = Duration::from_millis(900);
const WAIT: Duration = Duration::from_secs(20);

/// Waits until `f` holds, for at most [`WAIT`].
fn until(api: &FakeApi, what: &str, mut f: impl FnMut() -> bool) {
    let began = Instant::now();
    while !f() {
        assert!(
            began.elapsed() < WAIT,
            "not {what} after {WAIT:?}: {:#?}",
            api.calls("pods")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The webhook's lists and watches of the Pods of every namespace (not the recount's).
fn watching(api: &FakeApi) -> Vec<Call> {
    api.calls("pods")
        .into_iter()
        .filter(|c| c.path == PODS)
        .collect()
}

/// A namespace `ns` at its 4Gi budget, two running pods of 2Gi each, and a webhook whose
/// start's recount has looked at it, watching the Pods for more than the pause (a watch that
/// ended sooner would be taken for a failure), a window later.
fn at_budget(ns: &str) -> (FakeApi, Webhook) {
    let api = FakeApi::start();
    template_2gi(&api, ns);
    api.put("resourcequotas", &quota(ns, "4Gi", "4Gi"));
    for name in ["a", "b"] {
        api.put("pods", &pod(ns, name));
    }
    let w = start_recounting(
        &api.url,
        patient(),
        Some((Duration::from_secs(300), WINDOW)),
    );
    let recounted = format!("GET /api/v1/namespaces/{ns}/pods");
    until(&api, "recounted and watched", || {
        api.requests().contains(&recounted) && watching(&api).iter().any(|c| c.watch)
    });
    std::thread::sleep(WINDOW.max(PAUSE) + Duration::from_millis(300));
    assert_eq!(used(&api, ns), "4Gi");
    (api, w)
}

/// Each call is at least [`PAUSE`] after the one before it.
fn spaced(calls: &[Call]) {
    for pair in calls.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= PAUSE, "{gap:?} between {:#?}", pair);
    }
}

#[test]
fn a_pod_deleted_while_the_watch_was_down_is_freed_once_it_resumes_from_its_version() {
    const NS: &str = "down";
    let (api, _w) = at_budget(NS);
    let first = watching(&api);
    let Some(from) = first.iter().rfind(|c| c.watch).map(|c| c.version.clone()) else {
        panic!("no watch: {first:#?}");
    };
    assert!(!from.is_empty(), "{first:#?}");

    // The watch ends (as at the API server's timeout): the next one resumes from its version,
    // without a list.
    api.end_watches("pods");
    until(&api, "watched again", || {
        watching(&api).iter().filter(|c| c.watch).count() > 1
    });
    // Then the API server refuses the watches: a pod deleted meanwhile.
    api.refuse("pods", false, true);
    api.end_watches("pods");
    let refused_since = watching(&api).len();
    until(&api, "refused twice", || {
        watching(&api)[refused_since..]
            .iter()
            .filter(|c| c.code == 500)
            .count()
            >= 2
    });
    api.remove("pods", NS, "a");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(used(&api, NS), "4Gi", "nothing recounted it yet");
    api.refuse("pods", false, false);
    let served = Instant::now();
    until(&api, "freed", || used(&api, NS) == "2Gi");
    assert!(
        served.elapsed() < Duration::from_secs(3),
        "freed {:?} after the watch could resume",
        served.elapsed()
    );

    let calls = watching(&api);
    // One list (the start's); each watch from the version the one before reached (no pod
    // changed before the deletion, which the resumed watch heard).
    let lists: Vec<&Call> = calls.iter().filter(|c| !c.watch).collect();
    assert_eq!(lists.len(), 1, "{calls:#?}");
    for c in calls.iter().filter(|c| c.watch && c.code != 500) {
        assert_eq!(c.version, from, "{calls:#?}");
    }
    // The refused tries, each a pause after the one before.
    spaced(&calls[refused_since..]);
}

#[test]
fn a_pod_deleted_while_the_version_expired_is_freed_after_the_list_that_follows() {
    const NS: &str = "gone";
    let (api, _w) = at_budget(NS);

    // The watches refused, a pod deleted, and its deletion compacted away: the watch resumed
    // from the last version is told it expired.
    api.refuse("pods", true, true);
    api.end_watches("pods");
    let down = watching(&api).len();
    until(&api, "refused", || {
        watching(&api)[down..].iter().any(|c| c.code == 500)
    });
    api.remove("pods", NS, "a");
    api.compact();
    // Watches served again, lists refused for a while.
    api.refuse("pods", true, false);
    until(&api, "expired", || {
        watching(&api)[down..].iter().any(|c| c.code == 410)
    });
    let expired = watching(&api)
        .into_iter()
        .rfind(|c| c.code == 410)
        .map(|c| c.version)
        .unwrap_or_default();
    until(&api, "lists refused twice", || {
        watching(&api)[down..]
            .iter()
            .filter(|c| !c.watch && c.code == 500)
            .count()
            >= 2
    });
    assert_eq!(used(&api, NS), "4Gi", "nothing recounted it yet");
    api.refuse("pods", false, false);
    let served = Instant::now();
    until(&api, "freed", || used(&api, NS) == "2Gi");
    assert!(
        served.elapsed() < Duration::from_secs(3),
        "freed {:?} after the list was served",
        served.elapsed()
    );
    until(&api, "watched from the list", || {
        watching(&api)
            .last()
            .is_some_and(|c| c.watch && c.code == 200)
    });

    let calls = &watching(&api)[down..];
    // The expired version was asked once; the watch after the list starts from its version.
    let asked = calls.iter().filter(|c| c.watch && c.version == expired);
    assert_eq!(asked.count(), 1, "{calls:#?}");
    let Some(listed) = calls.iter().rfind(|c| !c.watch && c.code == 200) else {
        panic!("no list: {calls:#?}");
    };
    let last = &calls[calls.len() - 1];
    assert_eq!(last.version, listed.version, "{calls:#?}");
    // No try comes sooner than a pause after the one before, the refused lists included.
    let tries: Vec<Call> = calls.iter().filter(|c| c.code != 200).cloned().collect();
    spaced(&tries);
}
