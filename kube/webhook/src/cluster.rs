//! The webhook's view of the API server: the cluster's inventory (refreshed in the
//! background, so an admission waits on no list; none until one read succeeded, so that no
//! claim is written for a guessed mode), a namespace's HAMi label, and the templates it
//! creates or reuses — never one it did not write. The templates it wrote are watched, so that
//! reusing one costs no API call, and swept when no pod uses them (crate::sweep).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use gpuslice_dra::claim_shape::MANAGED_BY;

use gpuslice_dra::claim_shape::PublishedGpus;

use crate::mirror::{key, Mirror};
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

/// The API server client, the last inventory read and the webhook's templates as watched.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    /// The last inventory read, or why none was read yet.
    inventory: Arc<RwLock<Result<Arc<PublishedGpus>, String>>>,
    /// The templates labelled as the webhook's, by namespace and name.
    templates: Arc<Mirror<ResourceClaimTemplate>>,
}

impl Cluster {
    /// Reads the inventory once and keeps re-reading it every [`REFRESH`] in the background;
    /// follows the webhook's templates (crate::mirror) and sweeps those no pod used for
    /// `grace` (crate::sweep).
    pub async fn start(client: kube::Client, grace: Duration) -> Cluster {
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let c = Cluster {
            templates: Mirror::follow(client.clone(), Some(selector)),
            client,
            inventory: Arc::new(RwLock::new(Err("not read yet".into()))),
        };
        c.refresh().await;
        let bg = c.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                bg.refresh().await;
            }
        });
        tokio::spawn(crate::sweep::run(c.client.clone(), grace));
        c
    }

    /// Whether the watch knows `want` (the webhook's, with its spec, not marked unused) to
    /// exist now.
    fn known(&self, want: &ResourceClaimTemplate) -> bool {
        self.templates
            .read(|m| {
                m.get(&key(want))
                    .is_some_and(|t| gpuslice_dra::claim_shape::is_ours(t, want) && !is_marked(t))
            })
            .unwrap_or(false)
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
        // Read through its view (crate::view), as the watch reads it: other drivers' opaque
        // parameters, however deep, are no reason to refuse; a template that cannot be read
        // at all is refused naming it.
        let read = || async {
            crate::view::get_opt::<ResourceClaimTemplate>(&self.client, &namespace, &name)
                .await
                .map_err(|e| err(e.to_string()))
        };
        if let Some(t) = read().await? {
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
                let t = read()
                    .await?
                    .ok_or_else(|| err("it was created and deleted meanwhile".into()))?;
                check(&t)
            }
            Err(e) => Err(err(e.to_string())),
        }
    }
}
