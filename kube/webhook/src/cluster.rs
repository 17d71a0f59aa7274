//! The webhook's view of the API server: the cluster's inventory (refreshed in the
//! background, so an admission waits on no list; none until one read succeeded, so that no
//! claim is written for a guessed mode), a namespace's HAMi label, and the templates it
//! creates or reuses — never one it did not write. The templates it wrote are watched, so that
//! reusing one costs no API call, and swept when no pod uses them (crate::sweep). Of the
//! templates labelled as its own the watch keeps only those named as it names them, and of
//! each only what reuse reads ([`Written`]): whoever may label a template cannot make the
//! webhook hold what they wrote.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use gpuslice_dra::claim_shape::{spec_form, PublishedGpus, MANAGED_BY, TEMPLATE_PREFIX};

use crate::mirror::{key, Kept, Key, Mirror};
use crate::sweep::{is_marked, mark_patch, webhook_name};
use crate::view::list_all;

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
    /// What is kept of the templates the webhook may have written, by namespace and name.
    templates: Arc<Mirror<ResourceClaimTemplate, Written>>,
}

/// What the watch keeps of a template labelled as the webhook's and named as it names them
/// (`gpuslice-` and 16 hexadecimal digits, crate::sweep::webhook_name): what reuse reads of
/// it, in a few bytes whatever the template holds. Any other template labelled so is ignored
/// (not kept; the first is named in the log), and reuse of a name the watch does not hold
/// asks the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The SHA-256 of its spec's canonical form (`claim_shape::spec_form`): the spec it holds,
    /// as [`claim_shape::is_ours`](gpuslice_dra::claim_shape::is_ours) compares it.
    spec: [u8; 32],
    /// Whether the sweep marked it unused (crate::sweep).
    marked: bool,
}

/// The SHA-256 of the canonical form of `t`'s spec; `None` when it has none.
fn spec_digest(t: &ResourceClaimTemplate) -> Option<[u8; 32]> {
    let form = spec_form(t)?;
    let d = ring::digest::digest(&ring::digest::SHA256, &form);
    d.as_ref().try_into().ok()
}

impl Kept<ResourceClaimTemplate> for Written {
    fn keep(t: ResourceClaimTemplate) -> Result<Written, String> {
        let name = t.metadata.name.as_deref().unwrap_or_default();
        if !webhook_name(name) {
            return Err(format!(
                "its name is not one the webhook gives ({TEMPLATE_PREFIX} and 16 hexadecimal digits)"
            ));
        }
        let labelled = t
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .is_some_and(|v| v == MANAGED_BY.1);
        if !labelled {
            return Err(format!(
                "it is not labelled {}={}",
                MANAGED_BY.0, MANAGED_BY.1
            ));
        }
        let spec = spec_digest(&t).ok_or("it has no claim spec")?;
        Ok(Written {
            spec,
            marked: is_marked(&t),
        })
    }
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
    /// exist now: a template of its name kept ([`Written`]: labelled as the webhook's, which
    /// is all `want` is labelled and annotated with) whose spec's digest is `want`'s.
    fn known(&self, want: &ResourceClaimTemplate) -> bool {
        // What a kept template is known to carry besides its spec: the label, no annotation.
        let labels = want.metadata.labels.iter().flatten();
        let plain = want
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| a.is_empty())
            && labels
                .into_iter()
                .all(|(k, v)| k == MANAGED_BY.0 && v == MANAGED_BY.1);
        let Some(spec) = spec_digest(want).filter(|_| plain) else {
            return false;
        };
        self.templates
            .read(|m| {
                m.get(&key(want))
                    .is_some_and(|t| t.spec == spec && !t.marked)
            })
            .unwrap_or(false)
    }

    /// The keys of the templates the watch keeps; `None` while it is not current.
    pub fn watched_templates(&self) -> Option<Vec<Key>> {
        self.templates.read(|m| m.keys().cloned().collect())
    }

    async fn refresh(&self) {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let read = list_all(&api, ListParams::default()).await;
        let Ok(mut w) = self.inventory.write() else {
            return;
        };
        match read {
            Ok(items) => *w = Ok(Arc::new(PublishedGpus::from_slices(&items))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_dra::claim_shape::{claim_spec, template, Mode, Shape};

    fn written(gib: u64) -> ResourceClaimTemplate {
        let shape = Shape {
            gpus: 1,
            memory: Some(gib << 30),
            ..Default::default()
        };
        template("team", claim_spec(&Mode::Capacity, &shape, "f").unwrap().0)
    }

    #[test]
    fn only_a_template_named_and_labelled_as_the_webhooks_is_kept_and_only_its_facts() {
        let want = written(2);
        let kept = Written::keep(want.clone()).unwrap();
        assert_eq!(Some(kept.spec), spec_digest(&want));
        assert!(!kept.marked);
        // Another spec under the same name is kept as what it is: not taken for `want`.
        let mut other = written(3);
        other.metadata.name = want.metadata.name.clone();
        assert_ne!(Written::keep(other).unwrap().spec, kept.spec);
        // Another name, or no label: ignored, whatever it holds.
        let mut renamed = want.clone();
        renamed.metadata.name = Some("gpuslice-tenant".into());
        let e = Written::keep(renamed).unwrap_err();
        assert!(e.contains("gpuslice- and 16 hexadecimal digits"), "{e}");
        let mut unlabelled = want;
        unlabelled.metadata.labels = None;
        assert!(Written::keep(unlabelled).is_err());
    }
}
