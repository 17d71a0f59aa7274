//! `gpuslice kubelet-plugin`: this DRA kubelet plugin, run on this node's registry, with the
//! create path's one slice writer writing what a claim's containers get: the slice directory
//! and the same CDI edits as an annotation slice (device nodes of its GPUs and the control
//! nodes, driver libraries, the shim and `/etc/ld.so.preload`, the read-only limits file, the
//! usage file), as kind `gpuslice.io/claim` with one device named by the claim's UID, and
//! without the bind/release hooks: a claim is held from prepare to unprepare, not by a
//! container. Its one hook, `createRuntime … --claim`, records each container the claim is
//! given to, from the host. The registry's cleanup removes the claim's spec on release.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{PluginOptions, ServeError, SliceWriter, WriteError};
use clap::Args;
use gpuslice_registry::{Registry, RegistryError, Reservation};

use gpuslice_hook::create::slicewriter::{SliceWriteError, Writer};
use gpuslice_hook::node::NodeContext;
pub use gpuslice_hook::specfiles::claim_spec_path;
use gpuslice_hook::specfiles::Holder;

/// `gpuslice kubelet-plugin` flags (docs/kubernetes-dra.md).
#[derive(Debug, Args)]
pub struct KubeletPluginArgs {
    /// The Node object's name: the pool and the ResourceSlice are named after it.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// Kubeconfig of the cluster [default: the pod's in-cluster credentials].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory of the DRA socket `dra.sock`.
    #[arg(long, value_name = "DIR", default_value = crate::serve::DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// The kubelet's plugin registration directory (holds `gpuslice.io-reg.sock`).
    #[arg(long, value_name = "DIR", default_value = crate::serve::DEFAULT_REGISTRATION_DIR)]
    pub registration_dir: PathBuf,
}

/// The plugin did not start, or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum KubeletPluginError {
    #[error("cannot open the node registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Node(#[from] gpuslice_hook::node::NodeError),
    #[error("gpuslice kubelet-plugin: {0}")]
    Serve(#[from] ServeError),
}

/// The [`SliceWriter`] of this node: the create path's slice writer, on the registry the
/// plugin books in.
#[derive(Debug)]
pub struct ClaimSlices {
    node: NodeContext,
    registry: Arc<Registry>,
}

impl ClaimSlices {
    /// Fails when the `gpuslice` binary the claims' hooks run cannot be found.
    pub fn new(
        node: NodeContext,
        registry: Arc<Registry>,
    ) -> Result<ClaimSlices, gpuslice_hook::node::NodeError> {
        node.hook_binary()?;
        Ok(ClaimSlices { node, registry })
    }

    fn write_files(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, SliceWriteError> {
        let holder = Holder::Claim { uid };
        Writer::new(&self.node)?.write(&self.registry, r, holder)?;
        Ok(vec![holder.device_id()])
    }
}

impl SliceWriter for ClaimSlices {
    fn write(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, WriteError> {
        self.write_files(uid, r)
            .map_err(|e| WriteError::Failed(e.to_string()))
    }

    fn remove(&self, uid: &str) -> Result<(), WriteError> {
        let dir = &self.node.config().cdi.spec_dir;
        let path = claim_spec_path(dir, uid).ok_or_else(|| {
            WriteError::Failed(format!("claim uid `{uid}` cannot name a CDI spec file"))
        })?;
        gpuslice_cdi::remove_spec(&path).map_err(|e| WriteError::Failed(e.to_string()))
    }
}

/// Runs the plugin in the foreground until SIGTERM.
pub fn run(node: &NodeContext, args: KubeletPluginArgs) -> Result<(), KubeletPluginError> {
    let registry = Arc::new(node.open_registry()?);
    let writer = Arc::new(ClaimSlices::new(node.clone(), registry.clone())?);
    let mut options = PluginOptions::new(args.node_name);
    options.kubeconfig = args.kubeconfig;
    options.plugin_dir = args.plugin_dir;
    options.registration_dir = args.registration_dir;
    options.dra = node.config().dra;
    options.mode_file = Some(node.config().kubelet_plugin_path());
    options.health_file = Some(node.config().health_path());
    options.taint_effect = node.config().health.taint_effect;
    crate::run_until_signal(options, registry, writer)?;
    Ok(())
}
