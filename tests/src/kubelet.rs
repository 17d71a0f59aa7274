//! The kubelet's side of a DRA plugin, for tests without a kubelet: gRPC over the plugin's
//! unix socket (`dra.sock`), blocking calls of `NodePrepareResources` and
//! `NodeUnprepareResources` with the generated client of `gpuslice-kube`.

use std::path::Path;

use gpuslice_kube::proto::dra::dra_plugin_client::DraPluginClient;
use gpuslice_kube::proto::dra::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodeUnprepareResourceResponse,
    NodeUnprepareResourcesRequest,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel over the unix socket at `socket` (the URI is required by the API and
/// ignored by the connector).
pub async fn unix_channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// A claim as the kubelet names it in a call: namespace, name, UID.
pub fn claim(namespace: &str, name: &str, uid: &str) -> Claim {
    Claim {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
    }
}

/// A blocking DRA v1 client on one plugin's `dra.sock`.
#[derive(Debug)]
pub struct Kubelet {
    rt: tokio::runtime::Runtime,
    dra: DraPluginClient<Channel>,
}

impl Kubelet {
    /// Connects to the plugin's DRA socket.
    pub fn connect(dra_socket: &Path) -> Result<Kubelet, tonic::transport::Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let channel = rt.block_on(unix_channel(dra_socket))?;
        Ok(Kubelet {
            rt,
            dra: DraPluginClient::new(channel),
        })
    }

    /// `NodePrepareResources` of one claim: the plugin's answer for it.
    pub fn prepare(&mut self, c: Claim) -> Result<NodePrepareResourceResponse, tonic::Status> {
        let uid = c.uid.clone();
        let req = NodePrepareResourcesRequest { claims: vec![c] };
        let mut resp = self
            .rt
            .block_on(self.dra.node_prepare_resources(req))?
            .into_inner();
        resp.claims
            .remove(&uid)
            .ok_or_else(|| tonic::Status::internal(format!("no answer for claim {uid}")))
    }

    /// `NodeUnprepareResources` of one claim: the plugin's answer for it.
    pub fn unprepare(&mut self, c: Claim) -> Result<NodeUnprepareResourceResponse, tonic::Status> {
        let uid = c.uid.clone();
        let req = NodeUnprepareResourcesRequest { claims: vec![c] };
        let mut resp = self
            .rt
            .block_on(self.dra.node_unprepare_resources(req))?
            .into_inner();
        resp.claims
            .remove(&uid)
            .ok_or_else(|| tonic::Status::internal(format!("no answer for claim {uid}")))
    }
}
