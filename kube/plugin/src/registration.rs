//! The kubelet's plugin-registration service: who we are (a DRA plugin named `gpuslice.io`,
//! serving `v1.DRAPlugin` at the DRA socket), and the kubelet's verdict, which also asks the
//! publisher to republish (a starting kubelet has deleted the node's slices).

use std::sync::{Arc, Mutex};

use gpuslice_dra::DRIVER;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::proto::registration::registration_server::Registration;
use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The plugin type the kubelet expects of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The gRPC service versions served at the DRA socket.
pub const SUPPORTED_VERSIONS: &[&str] = &["v1.DRAPlugin"];

/// What the kubelet last said about the registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Registered,
    Refused(String),
}

/// The registration service.
#[derive(Debug)]
pub struct RegistrationService {
    endpoint: String,
    verdict: Arc<Mutex<Option<Verdict>>>,
    republish: Arc<Notify>,
}

impl RegistrationService {
    /// Serves `endpoint` (the DRA socket's absolute path); `republish` is notified when the
    /// kubelet registers the plugin.
    pub fn new(endpoint: String, republish: Arc<Notify>) -> RegistrationService {
        RegistrationService {
            endpoint,
            verdict: Arc::new(Mutex::new(None)),
            republish,
        }
    }

    /// A handle on the kubelet's last verdict.
    pub fn verdict(&self) -> Arc<Mutex<Option<Verdict>>> {
        self.verdict.clone()
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER.to_string(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        let verdict = if s.plugin_registered {
            eprintln!("gpuslice kubelet-plugin: registered with the kubelet");
            self.republish.notify_one();
            Verdict::Registered
        } else {
            eprintln!(
                "gpuslice kubelet-plugin: the kubelet refused the registration: {}",
                s.error
            );
            Verdict::Refused(s.error)
        };
        if let Ok(mut v) = self.verdict.lock() {
            *v = Some(verdict);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
