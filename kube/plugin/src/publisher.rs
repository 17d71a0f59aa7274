//! Publishing the node's ResourceSlices through the API server: at start, when the inventory
//! or the node paths' bookings change, and when the kubelet (re)registers the plugin (a
//! starting kubelet deletes its node's slices). Every change bumps the pool's generation.
//! An unhealthy GPU's devices carry the taint `gpuslice.io/unhealthy` (`offer::with_health`),
//! as do every GPU's while the health record cannot be read;
//! whether the API server keeps device taints (DRADeviceTaints) is asked once
//! (crate::probe).

use gpuslice_dra::slices::{build_slices, parse_device, DeviceRef, OfferedGpu, SliceError};
use gpuslice_dra::DRIVER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;

use crate::offer::{HealthTaint, UNHEALTHY_TAINT};

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
    published: Option<(Vec<OfferedGpu>, Vec<HealthTaint>)>,
    owner: Option<OwnerReference>,
}

/// The taint of `t` as a ResourceSlice device carries it.
fn device_taint(t: &HealthTaint) -> DeviceTaint {
    DeviceTaint {
        key: UNHEALTHY_TAINT.to_string(),
        value: Some(t.reason.value()),
        effect: t.effect.as_str().to_string(),
        time_added: k8s_openapi::jiff::Timestamp::from_second(t.since_s)
            .ok()
            .map(Time),
    }
}

/// Puts each taint of `taints` on the devices of its GPU in `slices`.
pub fn apply_taints(slices: &mut [ResourceSlice], taints: &[HealthTaint]) {
    for d in slices
        .iter_mut()
        .flat_map(|s| s.spec.devices.iter_mut().flatten())
    {
        let index = match parse_device(&d.name) {
            Some(DeviceRef::Gpu(i) | DeviceRef::Slot(i, _)) => i,
            None => continue,
        };
        let mine: Vec<DeviceTaint> = taints
            .iter()
            .filter(|t| t.index == index)
            .map(device_taint)
            .collect();
        d.taints = (!mine.is_empty()).then_some(mine);
    }
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

    /// Makes the API server's slices of this pool offer `gpus`, the devices of the GPUs of
    /// `taints` tainted. Without `force`, nothing is asked of the API server when that is what
    /// was last published. Returns whether anything was written.
    pub async fn sync(
        &mut self,
        gpus: &[OfferedGpu],
        taints: &[HealthTaint],
        force: bool,
    ) -> Result<bool, PublishError> {
        if !force
            && self
                .published
                .as_ref()
                .is_some_and(|(g, t)| g.as_slice() == gpus && t.as_slice() == taints)
        {
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
        apply_taints(&mut desired, taints);
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
            self.published = Some((gpus.to_vec(), taints.to_vec()));
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
        self.published = Some((gpus.to_vec(), taints.to_vec()));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offer::TaintReason;
    use gpuslice_config::TaintEffect;

    #[test]
    fn taints_go_on_every_device_of_their_gpu_only() {
        let gpu = |index: u32, slots: Option<gpuslice_dra::slices::SlotOffer>| OfferedGpu {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            model: "NVIDIA H200".into(),
            numa_node: None,
            pcie_root: None,
            memory: 16 << 30,
            cores: 100,
            slots,
        };
        let slots = gpuslice_dra::slices::SlotOffer {
            memory: 4 << 30,
            cores: 25,
            published: vec![0, 1],
        };
        let taint = HealthTaint {
            index: 1,
            reason: TaintReason::Xid(79),
            since_s: 1_796_000_000,
            effect: TaintEffect::NoExecute,
        };
        for gpus in [
            vec![gpu(0, None), gpu(1, None)],
            vec![gpu(0, Some(slots.clone())), gpu(1, Some(slots.clone()))],
        ] {
            let mut slices = build_slices("n", &gpus, 1, None).unwrap();
            apply_taints(&mut slices, std::slice::from_ref(&taint));
            let devices = slices[0].spec.devices.as_ref().unwrap();
            for d in devices {
                let on_gpu1 = d.name.starts_with("gpu-1");
                match &d.taints {
                    Some(t) => {
                        assert!(on_gpu1, "{}", d.name);
                        assert_eq!(t.len(), 1);
                        assert_eq!(t[0].key, "gpuslice.io/unhealthy");
                        assert_eq!(t[0].value.as_deref(), Some("xid-79"));
                        assert_eq!(t[0].effect, "NoExecute");
                        assert_eq!(
                            t[0].time_added.as_ref().unwrap().0.as_second(),
                            1_796_000_000
                        );
                    }
                    None => assert!(!on_gpu1, "{}", d.name),
                }
            }
        }
    }
}
