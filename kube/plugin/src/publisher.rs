//! Publishing the node's ResourceSlices through the API server: at start, when the inventory
//! or the node paths' bookings change, and when the kubelet (re)registers the plugin (a
//! starting kubelet deletes its node's slices). Every change bumps the pool's generation.

use gpuslice_dra::slices::{build_slices, OfferedGpu, SliceError};
use gpuslice_dra::DRIVER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;

/// A publication that did not complete (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0}")]
    Slice(#[from] SliceError),
    #[error("cannot {op} ResourceSlice {name}: {source}")]
    Api {
        op: &'static str,
        name: String,
        source: kube::Error,
    },
}

/// The publisher of one node's pool.
pub struct Publisher {
    client: kube::Client,
    node: String,
    generation: i64,
    published: Option<Vec<OfferedGpu>>,
    owner: Option<OwnerReference>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Publisher {
    pub fn new(client: kube::Client, node: String) -> Publisher {
        Publisher {
            client,
            node,
            generation: 0,
            published: None,
            owner: None,
        }
    }

    /// The API server client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The pool generation last written.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Makes the API server's slices of this pool offer `gpus`. Without `force`, nothing is
    /// asked of the API server when `gpus` is what was last published. Returns whether
    /// anything was written.
    pub async fn sync(&mut self, gpus: &[OfferedGpu], force: bool) -> Result<bool, PublishError> {
        if !force && self.published.as_deref() == Some(gpus) {
            return Ok(false);
        }
        if self.owner.is_none() {
            // The slices go with the Node object; without it (no such Node yet, or no right to
            // read it) they are published unowned.
            let nodes: Api<Node> = Api::all(self.client.clone());
            if let Ok(Some(n)) = nodes.get_opt(&self.node).await {
                self.owner = n.metadata.uid.map(|uid| OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node.clone(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: None,
                });
            }
        }
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let list = ListParams::default()
            .fields(&format!("spec.nodeName={},spec.driver={DRIVER}", self.node));
        let existing: Vec<ResourceSlice> = api
            .list(&list)
            .await
            .map_err(|source| PublishError::Api {
                op: "list",
                name: format!("of node {}", self.node),
                source,
            })?
            .items
            .into_iter()
            .filter(|s| {
                s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(self.node.as_str())
            })
            .collect();
        let newest = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0)
            .max(self.generation);
        let mut desired = build_slices(&self.node, gpus, newest, self.owner.as_ref())?;
        let same = desired.len() == existing.len()
            && desired.iter().all(|d| {
                existing.iter().any(|e| {
                    e.metadata.name == d.metadata.name
                        && e.spec.pool == d.spec.pool
                        && e.spec.devices == d.spec.devices
                })
            });
        if same {
            self.generation = newest;
            self.published = Some(gpus.to_vec());
            return Ok(false);
        }
        let generation = newest + 1;
        for d in &mut desired {
            d.spec.pool.generation = generation;
        }
        for d in desired.iter_mut() {
            let name = d.metadata.name.clone().unwrap_or_default();
            let old = existing.iter().find(|e| e.metadata.name == d.metadata.name);
            let done = match old {
                Some(old) => {
                    d.metadata.resource_version = old.metadata.resource_version.clone();
                    api.replace(&name, &PostParams::default(), d)
                        .await
                        .map(|_| ())
                }
                None => api.create(&PostParams::default(), d).await.map(|_| ()),
            };
            done.map_err(|source| PublishError::Api {
                op: if old.is_some() { "update" } else { "create" },
                name: name.clone(),
                source,
            })?;
        }
        for e in &existing {
            if !desired.iter().any(|d| d.metadata.name == e.metadata.name) {
                let name = e.metadata.name.clone().unwrap_or_default();
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(PublishError::Api {
                            op: "delete",
                            name,
                            source,
                        })
                    }
                }
            }
        }
        self.generation = generation;
        self.published = Some(gpus.to_vec());
        Ok(true)
    }
}
