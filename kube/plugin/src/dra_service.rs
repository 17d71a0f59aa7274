//! The kubelet's `v1.DRAPlugin` service: each claim of a call is prepared (or unprepared) on
//! its own task, so different claims proceed concurrently, and answered under its UID; a
//! failure is that claim's `error`, never the whole call's.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::booking::Plugin;
use crate::claim::ClaimRef;
use crate::proto::dra::dra_plugin_server::DraPlugin;
use crate::proto::dra::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};

/// The DRA service over a [`Plugin`].
#[derive(Debug, Clone)]
pub struct DraService {
    plugin: Arc<Plugin>,
}

impl DraService {
    pub fn new(plugin: Arc<Plugin>) -> DraService {
        DraService { plugin }
    }
}

fn claim_ref(c: &Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut tasks = tokio::task::JoinSet::new();
        for c in request.into_inner().claims {
            let plugin = self.plugin.clone();
            tasks.spawn(async move {
                let c = claim_ref(&c);
                let answer = match plugin.prepare(&c).await {
                    Ok(devices) => NodePrepareResourceResponse {
                        devices,
                        error: String::new(),
                    },
                    Err(e) => {
                        eprintln!("gpuslice kubelet-plugin: prepare failed: {e}");
                        NodePrepareResourceResponse {
                            devices: Vec::new(),
                            error: e.to_string(),
                        }
                    }
                };
                (c.uid, answer)
            });
        }
        let mut claims = HashMap::new();
        while let Some(done) = tasks.join_next().await {
            let (uid, answer) = done.map_err(|e| Status::internal(e.to_string()))?;
            claims.insert(uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut tasks = tokio::task::JoinSet::new();
        for c in request.into_inner().claims {
            let plugin = self.plugin.clone();
            tasks.spawn(async move {
                let c = claim_ref(&c);
                let error = match plugin.unprepare(&c).await {
                    Ok(()) => String::new(),
                    Err(e) => {
                        eprintln!("gpuslice kubelet-plugin: unprepare failed: {e}");
                        e.to_string()
                    }
                };
                (c.uid, NodeUnprepareResourceResponse { error })
            });
        }
        let mut claims = HashMap::new();
        while let Some(done) = tasks.join_next().await {
            let (uid, answer) = done.map_err(|e| Status::internal(e.to_string()))?;
            claims.insert(uid, answer);
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
