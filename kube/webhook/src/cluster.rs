//! The webhook's view of the API server: the cluster's inventory (refreshed in the
//! background, so an admission waits on no list; none until one read succeeded, so that no
//! claim is written for a guessed mode), a namespace's HAMi label, and the templates it
//! creates or reuses — never one it did not write. The templates it wrote are watched, so that
//! reusing one costs no API call, and swept when no pod uses them (crate::sweep).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::Api;
use tokio_stream::StreamExt;

use gpuslice_dra::claim_shape::MANAGED_BY;

use gpuslice_dra::claim_shape::PublishedGpus;

use crate::sweep::{is_marked, mark_patch};

/// The namespace label that turns HAMi compatibility on (with `--hami-compat`).
pub use gpuslice_dra::quota::HAMI_COMPAT_LABEL as HAMI_LABEL;
/// How often the inventory is re-read.
pub const REFRESH: Duration = Duration::from_secs(5);

/// An API call failed, or a template of that name is someone else's.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot read namespace {namespace}: {detail}")]
    Namespace { namespace: String, detail: String },
    #[error("cannot create ResourceClaimTemplate {namespace}/{name}: {detail}")]
    Create {
        namespace: String,
        name: String,
        detail: String,
    },
    #[error("ResourceClaimTemplate {namespace}/{name} exists and is not the one gpuslice-webhook writes (label app.kubernetes.io/managed-by=gpuslice-webhook and the same spec); it is left alone: rename or delete it")]
    NotOurs { namespace: String, name: String },
    #[error("gpuslice-webhook has not read the cluster's ResourceSlices yet ({detail}); it admits no GPU pod until it has, so that no claim is written for a guessed publication mode")]
    NoInventory { detail: String },
}

type Key = (String, String);

/// The API server client, the last inventory read and the webhook's templates as watched.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    /// The last inventory read, or why none was read yet.
    inventory: Arc<RwLock<Result<Arc<PublishedGpus>, String>>>,
    /// The templates labelled as the webhook's, by (namespace, name), while `synced`.
    templates: Arc<RwLock<HashMap<Key, ResourceClaimTemplate>>>,
    synced: Arc<AtomicBool>,
}

fn key(t: &ResourceClaimTemplate) -> Key {
    (
        t.metadata.namespace.clone().unwrap_or_default(),
        t.metadata.name.clone().unwrap_or_default(),
    )
}

impl Cluster {
    /// Reads the inventory once and keeps re-reading it every [`REFRESH`] in the background;
    /// sweeps the templates no pod used for `grace` (crate::sweep).
    pub async fn start(client: kube::Client, grace: Duration) -> Cluster {
        let c = Cluster {
            client,
            inventory: Arc::new(RwLock::new(Err("not read yet".into()))),
            templates: Arc::default(),
            synced: Arc::default(),
        };
        c.refresh().await;
        let bg = c.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                bg.refresh().await;
            }
        });
        let watcher = c.clone();
        tokio::spawn(async move {
            loop {
                watcher.watch_templates().await;
                // The watch ended (an error, an expired version): ask the API server until it
                // answers again, then list anew.
                watcher.synced.store(false, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        tokio::spawn(crate::sweep::run(c.client.clone(), grace));
        c
    }

    /// Lists the webhook's templates, then follows their changes until the watch ends.
    async fn watch_templates(&self) {
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let api: Api<ResourceClaimTemplate> = Api::all(self.client.clone());
        let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
            return;
        };
        let version = list.metadata.resource_version.clone().unwrap_or_default();
        if let Ok(mut m) = self.templates.write() {
            *m = list.items.into_iter().map(|t| (key(&t), t)).collect();
        }
        let params = WatchParams::default().labels(&selector).timeout(290);
        let Ok(stream) = api.watch(&params, &version).await else {
            return;
        };
        self.synced.store(true, Ordering::SeqCst);
        let mut stream = Box::pin(stream);
        while let Some(ev) = stream.next().await {
            let Ok(mut m) = self.templates.write() else {
                return;
            };
            match ev {
                Ok(WatchEvent::Added(t)) | Ok(WatchEvent::Modified(t)) => {
                    m.insert(key(&t), t);
                }
                Ok(WatchEvent::Deleted(t)) => {
                    m.remove(&key(&t));
                }
                Ok(WatchEvent::Bookmark(_)) => {}
                Ok(WatchEvent::Error(_)) | Err(_) => return,
            }
        }
    }

    /// Whether the watch knows `want` (the webhook's, with its spec, not marked unused) to
    /// exist now.
    fn known(&self, want: &ResourceClaimTemplate) -> bool {
        self.synced.load(Ordering::SeqCst)
            && self.templates.read().is_ok_and(|m| {
                m.get(&key(want))
                    .is_some_and(|t| gpuslice_dra::claim_shape::is_ours(t, want) && !is_marked(t))
            })
    }

    async fn refresh(&self) {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let read = api.list(&ListParams::default()).await;
        let Ok(mut w) = self.inventory.write() else {
            return;
        };
        match read {
            Ok(list) => *w = Ok(Arc::new(PublishedGpus::from_slices(&list.items))),
            // An unreachable API server keeps the last inventory (pods are then checked
            // against it); before the first, the reason is kept for the refusal.
            Err(e) if w.is_err() => *w = Err(format!("listing ResourceSlices: {e}")),
            Err(_) => {}
        }
    }

    /// The API server client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The last inventory read; an error until one read succeeded.
    pub fn inventory(&self) -> Result<Arc<PublishedGpus>, ClusterError> {
        match self.inventory.read() {
            Ok(r) => r
                .clone()
                .map_err(|detail| ClusterError::NoInventory { detail }),
            Err(_) => Err(ClusterError::NoInventory {
                detail: "the inventory's lock is poisoned".into(),
            }),
        }
    }

    /// Whether `namespace` is labelled `gpuslice.io/hami-compat=true`.
    pub async fn hami_namespace(&self, namespace: &str) -> Result<bool, ClusterError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = api
            .get(namespace)
            .await
            .map_err(|e| ClusterError::Namespace {
                namespace: namespace.to_string(),
                detail: e.to_string(),
            })?;
        Ok(ns
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(HAMI_LABEL.0))
            .is_some_and(|v| v == HAMI_LABEL.1))
    }

    /// Creates `want` in its namespace, or reuses the template of its name when it is the
    /// webhook's with the same spec; any other template of that name is refused.
    pub async fn ensure_template(&self, want: &ResourceClaimTemplate) -> Result<(), ClusterError> {
        if self.known(want) {
            return Ok(());
        }
        let namespace = want.metadata.namespace.clone().unwrap_or_default();
        let name = want.metadata.name.clone().unwrap_or_default();
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), &namespace);
        let err = |detail: String| ClusterError::Create {
            namespace: namespace.clone(),
            name: name.clone(),
            detail,
        };
        let check = |t: &ResourceClaimTemplate| {
            if gpuslice_dra::claim_shape::is_ours(t, want) {
                Ok(())
            } else {
                Err(ClusterError::NotOurs {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })
            }
        };
        if let Some(t) = api.get_opt(&name).await.map_err(|e| err(e.to_string()))? {
            check(&t)?;
            if !is_marked(&t) {
                return Ok(());
            }
            // Marked unused by the sweep: clear the mark (a new version, so that a delete of
            // the version marked fails); if the sweep deleted it meanwhile, create it again.
            match api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(mark_patch(None)),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(err(e.to_string())),
            }
        }
        match api.create(&PostParams::default(), want).await {
            Ok(_) => Ok(()),
            // Another replica (or admission) created it meanwhile.
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let t = api.get(&name).await.map_err(|e| err(e.to_string()))?;
                check(&t)
            }
            Err(e) => Err(err(e.to_string())),
        }
    }
}
