//! Watching the node's ResourceSlices so that slices someone else deleted are published again
//! at once: a starting kubelet deletes its node's slices (sometimes only after it has
//! registered the plugin again, whose republication then found them still there), and a
//! kubelet deletes a driver's slices when the plugin's connection stays gone. Without this the
//! scheduler would see no devices on the node until the next resync.

use std::sync::Arc;
use std::time::Duration;

use gpuslice_dra::api::WatchClient;
use gpuslice_dra::DRIVER;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{WatchEvent, WatchParams};
use kube::Api;
use tokio::sync::Notify;

use crate::api_watch::{watch_forever, Seen};

/// Whether what the watch saw asks for a republication: a slice was deleted, or the watch
/// started afresh (what was deleted before it is the publisher's list to find).
pub fn republish_after(seen: &Seen<ResourceSlice>) -> bool {
    matches!(seen, Seen::Started | Seen::Event(WatchEvent::Deleted(_)))
}

/// Watches the ResourceSlices of `node` (this driver's) until the task is aborted, notifying
/// `republish` when one is deleted and each time a watch starts afresh; a failed watch is
/// started again after `retry`.
pub async fn watch_slices(
    client: WatchClient,
    node: String,
    republish: Arc<Notify>,
    retry: Duration,
) {
    let api: Api<ResourceSlice> = Api::all(client.client);
    let params =
        WatchParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    let what = format!("the ResourceSlices of node {node}");
    watch_forever(api, client.seconds, params, what, retry, |seen| {
        if republish_after(&seen) {
            republish.notify_one();
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice() -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("n-gpuslice.io".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_deletion_or_a_fresh_watch_asks_for_a_republication() {
        assert!(!republish_after(&Seen::Event(WatchEvent::Added(slice()))));
        assert!(!republish_after(&Seen::Event(
            WatchEvent::Modified(slice())
        )));
        // The kubelet's wipe at its start.
        assert!(republish_after(&Seen::Event(WatchEvent::Deleted(slice()))));
        assert!(republish_after(&Seen::Started));
    }
}
