//! Watching the node's ResourceSlices so that slices someone else deleted are published again
//! at once: a starting kubelet deletes its node's slices (sometimes only after it has
//! registered the plugin again, whose republication then found them still there), and a
//! kubelet deletes a driver's slices when the plugin's connection stays gone. Without this the
//! scheduler would see no devices on the node until the next resync.

use std::sync::Arc;
use std::time::Duration;

use gpuslice_dra::DRIVER;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{WatchEvent, WatchParams};
use kube::Api;
use tokio::sync::Notify;
use tokio_stream::StreamExt;

/// How long one watch request lasts before it is renewed (the API server's own limit is
/// 5 to 10 minutes).
const WATCH_SECONDS: u32 = 290;

/// The resourceVersion a watch starts from when it has none to resume from: the API server's
/// watch cache, which first replays the slices as they are (ignored: only deletions matter).
const ANY_VERSION: &str = "0";

/// Why a watch of the node's slices ended (it is started again).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch the ResourceSlices of node {node}: {source}")]
    Start { node: String, source: kube::Error },
    #[error("the watch of the ResourceSlices of node {node} broke: {source}")]
    Stream { node: String, source: kube::Error },
    #[error("the API server ended the watch of the ResourceSlices of node {node}: {code} {reason}: {message}")]
    Ended {
        node: String,
        code: u16,
        reason: String,
        message: String,
    },
}

/// What one event of the watch asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the slices are as the publisher left them (or as it is writing them).
    Nothing,
    /// A slice was deleted: publish again.
    Republish,
    /// The API server ended the watch: watch again (from [`ANY_VERSION`] after an expired
    /// resourceVersion, 410).
    Rewatch,
}

/// What `event` asks for; `version` follows the events so that the next watch resumes where
/// this one stopped, or restarts from [`ANY_VERSION`] once it expired.
pub fn step(event: &WatchEvent<ResourceSlice>, version: &mut String) -> Step {
    let mut follow = |rv: &Option<String>| {
        if let Some(rv) = rv {
            version.clone_from(rv);
        }
    };
    match event {
        WatchEvent::Added(s) | WatchEvent::Modified(s) => {
            follow(&s.metadata.resource_version);
            Step::Nothing
        }
        WatchEvent::Deleted(s) => {
            follow(&s.metadata.resource_version);
            Step::Republish
        }
        WatchEvent::Bookmark(b) => {
            version.clone_from(&b.metadata.resource_version);
            Step::Nothing
        }
        WatchEvent::Error(status) => {
            ended(status.code, version);
            Step::Rewatch
        }
    }
}

/// The API server refused or ended a watch with HTTP status `code`: after 410 (Gone, the
/// resourceVersion expired) the next watch starts afresh, whether the refusal came as the
/// answer to the request or as an event of the stream.
fn ended(code: u16, version: &mut String) {
    if code == 410 {
        *version = ANY_VERSION.to_string();
    }
}

/// Watches the ResourceSlices of `node` (this driver's) until the task is aborted, notifying
/// `republish` when one is deleted, and each time a watch starts afresh (what was deleted
/// before it is the publisher's list to find); a failed watch is logged (once per distinct
/// error) and started again after `retry`.
pub async fn watch_slices(
    client: kube::Client,
    node: String,
    republish: Arc<Notify>,
    retry: Duration,
) {
    let api: Api<ResourceSlice> = Api::all(client);
    let params = WatchParams::default()
        .fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"))
        .timeout(WATCH_SECONDS);
    let mut version = ANY_VERSION.to_string();
    let mut last_error = String::new();
    loop {
        let ended = watch_once(&api, &params, &node, &mut version, &republish).await;
        match ended {
            Ok(()) => last_error.clear(),
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    eprintln!("gpuslice kubelet-plugin: {e} (watching again)");
                    last_error = e;
                }
                tokio::time::sleep(retry).await;
            }
        }
    }
}

/// One watch request, until the API server ends it (`Ok`) or it fails.
async fn watch_once(
    api: &Api<ResourceSlice>,
    params: &WatchParams,
    node: &str,
    version: &mut String,
    republish: &Notify,
) -> Result<(), WatchError> {
    let fresh = version == ANY_VERSION;
    let stream = match api.watch(params, version).await {
        Ok(stream) => stream,
        Err(source) => {
            if let kube::Error::Api(s) = &source {
                ended(s.code, version);
            }
            return Err(WatchError::Start {
                node: node.to_string(),
                source,
            });
        }
    };
    if fresh {
        // The API server now reports every deletion; one before this is found by the
        // publisher's list, which a republication makes.
        republish.notify_one();
    }
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = event.map_err(|source| WatchError::Stream {
            node: node.to_string(),
            source,
        })?;
        match step(&event, version) {
            Step::Nothing => {}
            Step::Republish => republish.notify_one(),
            Step::Rewatch => {
                if let WatchEvent::Error(s) = event {
                    return Err(WatchError::Ended {
                        node: node.to_string(),
                        code: s.code,
                        reason: s.reason,
                        message: s.message,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn a_deletion_asks_for_a_republication_and_an_expired_watch_starts_afresh() {
        let mut v = ANY_VERSION.to_string();
        assert_eq!(step(&WatchEvent::Added(slice("5")), &mut v), Step::Nothing);
        assert_eq!(v, "5");
        assert_eq!(
            step(&WatchEvent::Modified(slice("7")), &mut v),
            Step::Nothing
        );
        assert_eq!(v, "7");
        // The kubelet's wipe at its start.
        assert_eq!(
            step(&WatchEvent::Deleted(slice("9")), &mut v),
            Step::Republish
        );
        assert_eq!(v, "9");
        // Another error ends the watch; it resumes from the version reached.
        assert_eq!(step(&status(500), &mut v), Step::Rewatch);
        assert_eq!(v, "9");
        // An expired version: it starts afresh (and republishes then, `watch_once`).
        assert_eq!(step(&status(410), &mut v), Step::Rewatch);
        assert_eq!(v, ANY_VERSION);
        // The same refusal as the answer to the watch request.
        let mut v = "9".to_string();
        ended(500, &mut v);
        assert_eq!(v, "9");
        ended(410, &mut v);
        assert_eq!(v, ANY_VERSION);
    }
}
