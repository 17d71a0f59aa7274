//! A watch of one API collection kept open for good, for the plugin's watches (its node's
//! ResourceSlices, the kubelet's failed prepares): each request resumes from the last
//! resourceVersion seen, an expired one (410) starts again from the API server's cache at once,
//! and a failure is logged once per distinct error and retried after a pause that doubles
//! while the watch keeps failing.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use kube::api::{WatchEvent, WatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

/// The longest pause between failed watches, and the pause after a refused one (401, 403:
/// rights are not granted within seconds).
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// The pause before watching again after a failure: `first` after the first failure since a
/// watch worked (`previous` is `None`), then twice the previous pause, at most [`MAX_PAUSE`]
/// (never below `first`); [`MAX_PAUSE`] at once when the API server `refused` the watch.
pub fn next_pause(previous: Option<Duration>, first: Duration, refused: bool) -> Duration {
    let pause = match previous {
        _ if refused => MAX_PAUSE,
        None => first,
        Some(p) => p.saturating_mul(2).min(MAX_PAUSE),
    };
    pause.max(first)
}

/// The resourceVersion a watch starts from when it has none to resume from: the API server's
/// watch cache, which first replays the objects as they are (as `Added` events).
pub const ANY_VERSION: &str = "0";

/// Why a watch ended (it is started again).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch {what}: {source}")]
    Start { what: String, source: kube::Error },
    #[error("the watch of {what} broke: {source}")]
    Stream { what: String, source: kube::Error },
    #[error("the API server ended the watch of {what}: {code} {reason}: {message}")]
    Ended {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
}

/// What the watcher hands its caller.
#[derive(Debug)]
pub enum Seen<K> {
    /// A watch started afresh (at [`ANY_VERSION`]): from now on every change is reported, and
    /// the objects as they are come first as `Added`; a change before this one was missed.
    Started,
    /// One event of the stream (an `Error` event is not passed on: it ends the watch).
    Event(WatchEvent<K>),
}

/// Follows `event`'s resourceVersion in `version`, so that the next watch resumes where this
/// one stopped; returns the status of an `Error` event, which ends the watch.
pub fn follow<K: Resource>(
    event: &WatchEvent<K>,
    version: &mut String,
) -> Option<(u16, String, String)> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
            if let Some(rv) = o.resource_version() {
                *version = rv;
            }
            None
        }
        WatchEvent::Bookmark(b) => {
            version.clone_from(&b.metadata.resource_version);
            None
        }
        WatchEvent::Error(s) => {
            ended(s.code, version);
            Some((s.code, s.reason.clone(), s.message.clone()))
        }
    }
}

/// The API server refused or ended a watch with HTTP status `code`: after 410 (Gone, the
/// resourceVersion expired) the next watch starts afresh, whether the refusal came as the
/// answer to the request or as an event of the stream.
pub fn ended(code: u16, version: &mut String) {
    if code == 410 {
        *version = ANY_VERSION.to_string();
    }
}

impl WatchError {
    /// Whether the API server answered 410 Gone: the resourceVersion resumed from is no longer
    /// in its watch cache.
    pub fn expired(&self) -> bool {
        match self {
            WatchError::Start {
                source: kube::Error::Api(s),
                ..
            } => s.code == 410,
            WatchError::Ended { code, .. } => *code == 410,
            _ => false,
        }
    }

    /// Whether the API server refused the watch for want of credentials or rights.
    pub fn refused(&self) -> bool {
        matches!(self, WatchError::Start {
            source: kube::Error::Api(s),
            ..
        } if s.code == 401 || s.code == 403)
    }
}

/// The errors a watch logged since its last request that ran to its end: each is logged once,
/// however they alternate.
#[derive(Debug, Default)]
pub struct Logged(Vec<String>);

impl Logged {
    /// How many distinct errors are remembered (the oldest is forgotten first).
    const KEPT: usize = 16;

    /// Whether `error` is new, remembering it.
    pub fn first_time(&mut self, error: &str) -> bool {
        if self.0.iter().any(|e| e == error) {
            return false;
        }
        if self.0.len() == Self::KEPT {
            self.0.remove(0);
        }
        self.0.push(error.to_string());
        true
    }

    /// A watch ran to its end: the next failure is news again.
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// Watches `api` with `params`, each request lasting `seconds`, until the task is aborted,
/// handing `on` each event and each fresh start; a failed watch is logged (once per distinct
/// error, naming `what`) and started again after a pause ([`next_pause`], from `retry`; a
/// watch that lasted [`MAX_PAUSE`] or ran to its end starts the pauses over). A resume from an
/// expired version is the watch's normal course: it starts afresh at once, unlogged.
pub async fn watch_forever<K>(
    api: Api<K>,
    seconds: u32,
    params: WatchParams,
    what: String,
    retry: Duration,
    mut on: impl FnMut(Seen<K>),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let params = params.timeout(seconds);
    let mut version = ANY_VERSION.to_string();
    let mut logged = Logged::default();
    let mut pause: Option<Duration> = None;
    loop {
        let resumed = version != ANY_VERSION;
        let started = Instant::now();
        match watch_once(&api, &params, &what, &mut version, &mut on).await {
            Ok(()) => {
                logged.clear();
                pause = None;
            }
            Err(e) if resumed && e.expired() => {}
            Err(e) => {
                if started.elapsed() >= MAX_PAUSE {
                    pause = None;
                }
                let next = next_pause(pause, retry, e.refused());
                pause = Some(next);
                let e = e.to_string();
                if logged.first_time(&e) {
                    eprintln!("gpuslice kubelet-plugin: {e} (watching again)");
                }
                tokio::time::sleep(next).await;
            }
        }
    }
}

/// One watch request, until the API server ends it (`Ok`) or it fails.
async fn watch_once<K>(
    api: &Api<K>,
    params: &WatchParams,
    what: &str,
    version: &mut String,
    on: &mut impl FnMut(Seen<K>),
) -> Result<(), WatchError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let fresh = version == ANY_VERSION;
    let stream = match api.watch(params, version).await {
        Ok(stream) => stream,
        Err(source) => {
            if let kube::Error::Api(s) = &source {
                ended(s.code, version);
            }
            return Err(WatchError::Start {
                what: what.to_string(),
                source,
            });
        }
    };
    if fresh {
        on(Seen::Started);
    }
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = event.map_err(|source| WatchError::Stream {
            what: what.to_string(),
            source,
        })?;
        if let Some((code, reason, message)) = follow(&event, version) {
            return Err(WatchError::Ended {
                what: what.to_string(),
                code,
                reason,
                message,
            });
        }
        on(Seen::Event(event));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(rv: &str) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("n-gpuslice.io".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn status(code: u16) -> WatchEvent<ResourceSlice> {
        let s: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "Expired",
            "message": "too old resource version"
        }))
        .unwrap();
        WatchEvent::Error(Box::new(s))
    }

    #[test]
    fn alternating_errors_are_logged_once_each_until_a_watch_runs_to_its_end() {
        let mut logged = Logged::default();
        assert!(logged.first_time("timed out"));
        assert!(logged.first_time("410 Gone"));
        for _ in 0..5 {
            assert!(!logged.first_time("timed out"));
            assert!(!logged.first_time("410 Gone"));
        }
        logged.clear();
        assert!(logged.first_time("timed out"));
    }

    #[test]
    fn failed_watches_back_off_to_a_cap_and_a_refusal_waits_the_cap_at_once() {
        let first = Duration::from_secs(1);
        let mut pause = None;
        let mut seen = Vec::new();
        for _ in 0..8 {
            let p = next_pause(pause, first, false);
            seen.push(p.as_secs());
            pause = Some(p);
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 30, 30, 30]);
        // After a watch that worked, the first pause again.
        assert_eq!(next_pause(None, first, false), first);
        // No rights: nothing changes within seconds.
        assert_eq!(next_pause(None, first, true), MAX_PAUSE);
        // A retry above the cap is never shortened.
        let long = Duration::from_secs(60);
        assert_eq!(next_pause(Some(long), long, false), long);
        assert_eq!(next_pause(None, long, true), long);
    }

    #[test]
    fn only_a_410_is_an_expired_version() {
        let ended = |code| WatchError::Ended {
            what: "w".into(),
            code,
            reason: "r".into(),
            message: "m".into(),
        };
        assert!(ended(410).expired());
        assert!(!ended(500).expired());
        let start = |code| WatchError::Start {
            what: "w".into(),
            source: kube::Error::Api(Box::new(
                serde_json::from_value(serde_json::json!({"code": code, "status": "Failure"}))
                    .unwrap(),
            )),
        };
        assert!(start(410).expired());
        assert!(!start(403).expired());
        assert!(start(403).refused() && start(401).refused());
        assert!(!start(500).refused() && !ended(403).refused());
    }

    #[test]
    fn the_version_follows_the_events_and_an_expired_watch_starts_afresh() {
        let mut v = ANY_VERSION.to_string();
        assert_eq!(follow(&WatchEvent::Added(slice("5")), &mut v), None);
        assert_eq!(v, "5");
        assert_eq!(follow(&WatchEvent::Modified(slice("7")), &mut v), None);
        assert_eq!(v, "7");
        assert_eq!(follow(&WatchEvent::Deleted(slice("9")), &mut v), None);
        assert_eq!(v, "9");
        // Another error ends the watch; it resumes from the version reached.
        assert_eq!(follow(&status(500), &mut v).map(|e| e.0), Some(500));
        assert_eq!(v, "9");
        // An expired version: it starts afresh.
        assert_eq!(follow(&status(410), &mut v).map(|e| e.0), Some(410));
        assert_eq!(v, ANY_VERSION);
        // The same refusal as the answer to the watch request.
        let mut v = "9".to_string();
        ended(500, &mut v);
        assert_eq!(v, "9");
        ended(410, &mut v);
        assert_eq!(v, ANY_VERSION);
    }
}
